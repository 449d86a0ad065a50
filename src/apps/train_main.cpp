// llmpi-train: the SPMD training program. Every rank runs this main:
//   mpiexec -n 8 llmpi-train --config run.json [--set key.path=value]...
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "model/model_desc.h"
#include "runtime/config.h"
#include "runtime/mpi_env.h"
#include "runtime/signals.h"
#include "train/trainer.h"

using namespace llmpi;

static std::string keys_help() {
  std::string s = "\nConfiguration keys (JSON sections and keys; --set section.key=value overrides):\n";
  auto line = [](const std::string& key, const nlohmann::json& v) {
    std::string l = "  " + key;
    l.resize(std::max<size_t>(l.size() + 1, 30), ' ');
    return l + "default " + v.dump() + "\n";
  };
  for (auto& [sec, obj] : config_defaults().items()) {
    if (sec == "model") continue;
    for (auto& [k, v] : obj.items()) s += line(sec + "." + k, v);
  }
  s += "\nModel keys by family (model.family = \"gpt2\" | \"llama\" | \"bert\"; a key of another family is an error):\n";
  for (const std::string& f : family_names()) {
    s += " " + f + (f == "gpt2" ? " (the default)" : "") + ":\n";
    const nlohmann::json keys = family_model_defaults(f);  // (items() of a temporary would dangle)
    for (auto& [k, v] : keys.items())
      if (k != "family") s += line("model." + k, v);
  }
  s += "\nmodel.vocab_size 0 takes the vocabulary from data.train; model.ffn_dim 0 = 4 x d_model (gpt2, bert) or\n"
       "8/3 x d_model rounded up to 64 (llama); model.max_seq_len 0 = seq_len; model.n_kv_head 0 = n_head.\n"
       "gpt2 and llama train a language model on a token file (llmpi-prep); bert trains a classifier on a\n"
       "classification file (input_ids, token_type_ids, attention_mask, labels) and reports accuracy.\n"
       "runtime.threads 0 = cores / ranks on the node.\n"
       "parallel.sync: \"gather_scatter\" | \"allreduce\" | \"weights\" | \"nccl\". runtime.device: \"auto\" | \"cpu\" | \"cuda\".\n"
       "train.optimizer: \"adamw\" | \"sgd\". train.on_nonfinite: \"abort\" | \"skip\". Also: --resume auto|PATH, --dry-run.\n"
       "Writes run.dir/config.json (resolved), metrics.jsonl (per logged step) and eval.jsonl.\n";
  return s;
}

int main(int argc, char** argv) {
  set_program_name("llmpi-train");
  MpiEnv env(&argc, &argv);

  CLI::App app{"llmpi-train: train a transformer (gpt2, llama or bert family) on HDF5 token files across MPI ranks.\n"
               "Usage: mpiexec -n N llmpi-train --config run.json [--set key.path=value]..."};
  std::string config_path;
  std::vector<std::string> sets;
  app.add_option("--config", config_path, "JSON configuration file")->required();
  app.add_option("--set", sets, "override one key, e.g. --set train.lr=1e-3 (repeatable)");
  TrainOptions opts;
  app.add_option("--resume", opts.resume,
                 "continue from a checkpoint: 'auto' = the newest in run.dir/checkpoints (start fresh if none), "
                 "or a checkpoint file");
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

  try {
    std::string err;
    Config cfg;
    try {
      cfg = load_config(config_path, sets);
    } catch (const Error& e) {
      err = e.what();
    }
    err = agree_on_error(MPI_COMM_WORLD, err);
    if (!err.empty()) throw CollectiveError(err);
    install_preemption_handlers();  // SIGTERM / SIGUSR1: checkpoint at the next step boundary, exit 0
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
  }
  return 0;
}
