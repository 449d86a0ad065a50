// llmpi-train: the SPMD training program. Every rank runs this main:
//   mpiexec -n 8 llmpi-train --config run.json [--set key.path=value]...
#include <CLI/CLI.hpp>
#include <cstdio>
#include <new>
#include <string>
#include <vector>

#include "hf/hf_import.h"
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
       "parallel.grad_dtype: \"fp32\" | \"bf16\" (gradients exchanged as bfloat16: half the bytes; with\n"
       "parallel.sync \"allreduce\", zero 0 or 1, and \"nccl\").\n"
       "runtime.precision: the dense layers' GEMMs: \"fp32\" | \"bf16\" (operands rounded to bf16, fp32 accumulation;\n"
       "weights, gradients, optimizer and every other op stay fp32) | \"tf32\" (CUDA tensor cores only).\n"
       "runtime.cpu_bf16_gemm: the CPU's bf16 GEMMs: \"auto\" (oneDNN where the CPU has bf16 instructions, else\n"
       "\"emulate\") | \"onednn\" | \"emulate\" (operands rounded to bf16, then an fp32 sgemm: the exact oracle).\n"
       "runtime.cpu_fp32_gemm: the CPU's fp32 GEMMs: \"auto\" (= \"openblas\", OpenBLAS sgemm) | \"onednn\" (oneDNN's\n"
       "fp32 matmul) | \"openblas\". The two agree up to the order of the fp32 sums.\n"
       "train.optimizer: \"adamw\" | \"sgd\". train.on_nonfinite: \"abort\" | \"skip\" (at most\n"
       "train.max_consecutive_skips in a row; a run whose last validation loss is not finite fails).\n"
       "Also: --resume auto|PATH, --dry-run.\n"
       "Which keys act in which layout: parallel.schedule, parallel.virtual_stages and parallel.stage_layers\n"
       "shape pipelines (parallel.pp_stages > 1); parallel.microbatches is a pipeline's micro-batches, or with\n"
       "pp_stages 1 gradient accumulation (micro-batches per step, one gradient sync); parallel.average_every\n"
       "acts with parallel.sync \"weights\" only; parallel.first_bucket_mb and parallel.poll_us with\n"
       "parallel.overlap; train.eval_every and train.eval_batches with data.val; train.beta1/beta2/eps with adamw.\n"
       "A key set where it has no effect is named in a start-up warning.\n"
       "runtime.memory_check: refuse (at start-up) a configuration whose memory estimate exceeds what the node has.\n"
       "runtime.attention: \"auto\" (fused on cuda for head sizes <= 128, else full) | \"full\" (stores the T x T\n"
       "probabilities per layer) | \"fused\" (flash-attention style: one log-sum-exp per query row, never a T x T\n"
       "matrix; the same results to rounding).\n"
       "runtime.lm_head_chunk_rows: rows per chunk of the LM head, which never stores all N x V logits\n"
       "(0 = as many rows as fit 256 MiB of fp32 logits).\n"
       "run.dir is locked by the run (run.dir/LOCK); a new run in a directory holding an earlier one needs\n"
       "--resume auto, another run.dir, or --overwrite.\n"
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
  } catch (const std::bad_alloc&) {
    // One rank mid-run (start-up allocations are agreed in train()): a clean message, then end the job.
    fatal("out of memory (std::bad_alloc) on this rank: use a smaller train.global_batch, model.seq_len or model, "
          "or fewer ranks per node (--dry-run prints the memory estimate)");
  }
  return 0;
}
