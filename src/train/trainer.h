// The training loop, as a library call so tests can run it in-process on any communicator:
//
//   HDF5 shard → sampler (this rank's windows) → batch → forward → loss → backward, handing
//   finished gradient prefixes to the sync method → average → clip → AdamW → metrics
//
// Start-up problems (config, data, world size, run directory) are agreed across ranks and thrown
// as StartupError on every rank; problems later on one rank are thrown as Error on that rank.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <vector>

#include "runtime/config.h"
#include "runtime/error.h"

namespace llmpi {

struct StartupError : Error {
  using Error::Error;
};

struct TrainOptions {
  bool print = true;          // rank 0 prints progress lines
  bool write_run_dir = true;  // rank 0 writes config.json, metrics.jsonl, eval.jsonl
};

struct TrainResult {
  std::vector<float> losses;               // global mean training loss of every step
  std::vector<int64_t> eval_steps;         // steps after which validation ran
  std::vector<float> val_losses;           // the validation loss at each
  std::vector<double> step_ms;             // wall time of each step on this rank
  double tokens_per_s_median = 0;          // global tokens/s, median over steps after the first
  int64_t n_params = 0;
  double flops_per_token = 0;
  std::vector<float> final_params;         // filled when requested (tests)
};

TrainResult train(const Config& cfg, MPI_Comm comm, const TrainOptions& opt = {},
                  bool return_params = false);

}  // namespace llmpi
