// llmpi-train: the SPMD training program. Every rank runs this main:
//   mpiexec -n 8 llmpi-train --config run.json [--set key.path=value]...
#include <CLI/CLI.hpp>
#include <cstdio>
#include <new>
#include <string>
#include <vector>

#include "backend/cpu/gemm_auto.h"
#include "hf/hf_import.h"
#include "runtime/config.h"
#include "runtime/config_keys.h"
#include "runtime/mpi_env.h"
#include "runtime/signals.h"
#include "train/trainer.h"

using namespace llmpi;

// The footer of --help: every key with its default and description (runtime/config_keys.h), then
// what holds across keys.
static std::string keys_help() {
  return config_keys_help() +
         "\nA key set where it has no effect is named in a start-up warning. The reference with each key's\n"
         "layout is docs/CONFIG.md (llmpi-train --help-keys-markdown prints its table).\n"
         "run.dir is locked by the run (run.dir/LOCK); a new run in a directory holding an earlier one needs\n"
         "--resume auto, another run.dir, or --overwrite.\n"
         "Writes run.dir/config.json (resolved), metrics.jsonl (per logged step) and eval.jsonl.\n";
}

int main(int argc, char** argv) {
  set_program_name("llmpi-train");
  // OpenBLAS's generic kernels on a CPU it does not recognise: start again on fitting ones.
  cpu::exec_with_fitting_openblas_kernels(argv);
  MpiEnv env(&argc, &argv);
  if (argc == 2 && std::string(argv[1]) == "--help-keys-markdown") {  // docs/CONFIG.md's table
    if (env.rank == 0) std::fputs(config_keys_markdown().c_str(), stdout);
    return 0;
  }

  CLI::App app{"llmpi-train: train a transformer (gpt2, llama or bert family) on HDF5 token files across MPI ranks.\n"
               "Usage: mpiexec -n N llmpi-train --config run.json [--set key.path=value]..."};
  std::string config_path;
  std::vector<std::string> sets;
  app.add_option("--config", config_path, "JSON configuration file")->required();
  app.add_option("--set", sets, "override one key, e.g. --set train.lr=1e-3 (repeatable)");
  TrainOptions opts;
  opts.time_cpu_gemms = cpu::time_dense_layers;  // runtime.cpu_*_gemm "auto": the faster engine, timed
  app.add_option("--resume", opts.resume,
                 "continue from a checkpoint: 'auto' = the newest in run.dir/checkpoints (start fresh if none), "
                 "or a checkpoint file");
  app.add_option("--resume-override", opts.resume_overrides,
                 "with --resume: accept a deliberate change of this key (train.global_batch, train.seed, ...) "
                 "that resuming would refuse; recorded in the log and metrics.jsonl (repeatable)");
  app.add_flag("--overwrite", opts.overwrite,
               "start a new run in a run.dir that holds an earlier one, moving its files into "
               "run.dir/previous-<date>/ (nothing is deleted)");
  app.add_option("--init-from", opts.init_from,
                 "start from the weights of a Hugging Face model directory (config.json + model.safetensors or "
                 "model.safetensors.index.json; GPT-2, LLaMA or BERT): its config.json sets model.*")
      ->type_name("DIR");
  app.add_flag("--dry-run", opts.dry_run,
               "check the configuration, data, world size (and checkpoint) on every rank, then exit without training");
  app.footer(keys_help());
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = 0;
    if (env.rank == 0) code = app.exit(e);
    else code = e.get_exit_code();
    return code;  // --help: 0 on every rank; a bad command line: non-zero on every rank
  }

  // SIGTERM / SIGUSR1: checkpoint at the next step boundary, exit 0 (before any compute thread starts)
  install_preemption_handlers();
  try {
    std::string err;
    Config cfg;
    try {
      if (opts.init_from.empty()) {
        cfg = load_config(config_path, sets);
      } else {
        const HfConfig hf = read_hf_config(opts.init_from);
        cfg = load_config(config_path, sets, &hf.source);
      }
    } catch (const Error& e) {
      err = e.what();
    }
    err = agree_on_error(MPI_COMM_WORLD, err);
    if (!err.empty()) throw CollectiveError(err);
    train(cfg, MPI_COMM_WORLD, opts);
  } catch (const CollectiveError& e) {
    // Every rank knows the same error: rank 0 says it once, every rank exits non-zero.
    if (env.rank == 0) std::fprintf(stderr, "llmpi-train: error: %s\n", e.what());
    std::fflush(stderr);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 2;
  } catch (const Error& e) {
    fatal(e.what());  // one rank mid-run: abort the whole job
  } catch (const std::bad_alloc&) {
    // One rank mid-run (start-up allocations are agreed in train()): a clean message, then end the job.
    fatal("out of memory (std::bad_alloc) on this rank: use a smaller train.global_batch, model.seq_len or model, "
          "or fewer ranks per node (--dry-run prints the memory estimate)");
  }
  return 0;
}
