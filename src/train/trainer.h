// The training loop, as a library call so tests can run it in-process on any communicator:
//
//   HDF5 shard → sampler (this rank's windows) → batch → forward → loss → backward, handing
//   finished gradient prefixes to the sync method → average → clip → optimizer → metrics
//   → evaluation → checkpoint → pre-emption check (every rank agrees at the step boundary)
//
// Problems every rank knows together — start-up checks (config, data, world size, run
// directory, checkpoint compatibility), a failed checkpoint write, a non-finite loss with
// train.on_nonfinite "abort" — are thrown as CollectiveError on every rank with one agreed
// message. A problem on one rank alone is thrown as Error on that rank (the program aborts the job).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/cpu_gemm_times.h"
#include "backend/gemm_precision.h"
#include "runtime/config.h"
#include "runtime/error.h"

namespace llmpi {

struct CollectiveError : Error {
  using Error::Error;
};

struct TrainOptions {
  bool print = true;            // rank 0 prints progress lines
  bool write_run_dir = true;    // rank 0 writes config.json, metrics.jsonl, eval.jsonl, checkpoints
  std::string resume;           // "" = start fresh, "auto" = newest checkpoint in run.dir (if any), or a path
  std::string init_from;        // a Hugging Face model directory whose weights start the run (hf/hf_import.h);
                                // cfg must have been made with its config.json (read_hf_config → ModelSource)
  bool dry_run = false;         // validate everything, train nothing
  int64_t preempt_after_step = -1;  // tests: behave as if a pre-emption signal came during this step
  bool host_clip = false;       // tests: decide the clip factor and a non-finite skip on the host from a
                                // readback before the optimizer (the world > 1 path) also at world size 1
  bool overwrite = false;       // a new run over an earlier one in run.dir: move its files aside (train/run_dir.h)
  std::vector<std::string> resume_overrides;  // resume-contract keys whose change is accepted (train/resume_contract.h)
  // Times the CPU's GEMM engines for runtime.cpu_fp32_gemm / cpu_bf16_gemm "auto" on a fresh run
  // (backend/cpu/gemm_auto.h): llmpi-train gives cpu::time_dense_layers, tests a stand-in. Empty:
  // "auto" is not timed (openblas; bf16: oneDNN where every rank can run it).
  std::function<CpuGemmTimes(GemmPrecision, const std::vector<DenseShape>&)> time_cpu_gemms;
};

struct TrainResult {
  std::vector<float> losses;               // global mean training loss of every step run here
  int64_t start_step = 0;                  // first step run (> 0 after a resume)
  int global_batch = 0;                    // the global batch the run used (train.batch_per_rank resolved)
  double peak_lr = 0;                      // the peak learning rate (train.lr after train.lr_scaling)
  std::vector<int64_t> eval_steps;         // steps after which validation ran
  std::vector<float> val_losses;           // the validation loss at each
  std::vector<double> val_accuracy;        // classifier: the validation accuracy at each
  std::vector<double> val_f1, val_mcc;     // two-label classifier: F1 of label 1, Matthews correlation
  std::vector<int64_t> val_counted;        // samples evaluated at each, over all ranks
  std::vector<double> step_ms;             // wall time of each step on this rank
  double tokens_per_s_median = 0;          // global tokens/s, median over steps after the first
  int64_t n_params = 0;
  double flops_per_token = 0;
  int64_t skipped_steps = 0;               // non-finite steps skipped (train.on_nonfinite "skip")
  bool preempted = false;                  // stopped by a pre-emption signal, after a checkpoint
  std::string last_checkpoint;             // path of the newest checkpoint written ("" = none)
  std::vector<float> final_params;         // filled when requested (tests)
  int64_t optimizer_state_floats = 0;      // AdamW m + v held by this rank (ZeRO-1: its shard's)
  double bytes_sent_last_step = 0;         // this rank's gradient (and ZeRO-1 parameter) traffic, last step
  double peak_rss_bytes = -1;              // this rank's peak resident set at the end (VmHWM)
  std::string cpu_gemm;                    // the engine of this rank's dense-layer GEMMs ("openblas", "onednn",
                                           // "emulate"; "" on a GPU)
};

TrainResult train(const Config& cfg, MPI_Comm comm, const TrainOptions& opt = {},
                  bool return_params = false);

}  // namespace llmpi
