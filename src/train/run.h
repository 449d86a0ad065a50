// Everything a training run holds, and the pieces of the run around the step loop
// (train/trainer.cpp): set-up (train/setup.cpp), checkpoints and resume (train/checkpointing.cpp),
// evaluation and what the run reports (train/report.cpp). Each rank holds one Run.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend/cpu/onednn_gemm.h"
#include "checkpoint/sharded.h"
#include "data/sampler.h"
#include "engine/engine.h"
#include "metrics/metrics.h"
#include "metrics/tensorboard.h"
#include "metrics/trace.h"
#include "model/memory_estimate.h"
#include "runtime/config.h"
#include "runtime/parallel_groups.h"
#include "runtime/watchdog.h"
#include "train/resume_contract.h"
#include "train/run_dir.h"
#include "train/train_data.h"
#include "train/trainer.h"

namespace llmpi {

// Host memory a checkpoint's values are copied into before they are written (page-locked on a GPU,
// so the copy runs at full speed): kept from one save to the next, so that only the first pays for
// allocating and faulting in its pages; grows to the largest save (train/checkpointing.cpp).
struct CheckpointStaging {
  float* data = nullptr;
  size_t floats = 0;
  bool pinned = false;
  CheckpointStaging() = default;
  CheckpointStaging(const CheckpointStaging&) = delete;
  CheckpointStaging& operator=(const CheckpointStaging&) = delete;
  ~CheckpointStaging() { release(); }
  // At least n floats (the contents are not kept when it grows), their pages touched.
  float* reserve(size_t n, bool pin);
  void release();
};

// A checkpoint being written (train/checkpointing.cpp): the values this rank writes, copied to
// host staging with their rectangles, and the file's creation, opening through MPI-IO, writes,
// sync and close over `comm` (ParallelGroups::checkpoint), with checkpoint.async on a thread of
// its own.
// finish_checkpoint completes it; destroyed unfinished (a run stopping on an error) it waits for
// its thread and leaves NAME.tmp, which no reader takes for a checkpoint.
struct PendingCheckpoint {
  std::string path, tmp;
  CheckpointInfo info;                      // the file's attributes
  MPI_Comm comm = MPI_COMM_NULL;            // not owned
  std::vector<RectWrite> writes;            // this rank's rectangles: in Run::staging, or in the
                                            // engine's own host buffers (a synchronous save on the CPU)
  std::vector<uint64_t> offsets;            // of every dataset in the file (create_sharded_file)
  MPI_File fh = MPI_FILE_NULL;             // open on every rank or on none
  std::thread writer;
  std::string error;  // this rank's write error, "" when none
  ~PendingCheckpoint() {
    if (writer.joinable()) writer.join();
  }
};

struct Run {
  Config cfg;                 // train.steps resolved from train.epochs
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, world = 1, threads = 1;
  const Ops* ops = nullptr;
  bool on_gpu = false;
  std::optional<cpu::ScopedCpuBf16Gemm> cpu_bf16_gemm;  // runtime.cpu_bf16_gemm for the run (CPU); restored after
  std::optional<cpu::ScopedCpuFp32Gemm> cpu_fp32_gemm;  // runtime.cpu_fp32_gemm for the run (CPU); restored after
  DataSplit train_data, val_data;
  bool has_val = false;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<ParallelGroups> groups;  // the topology: DP × PP (runtime/parallel_groups.h)
  std::unique_ptr<Engine> engine;          // the model on this rank and its step (engine/engine.h)
  Tracer tracer;
  std::unique_ptr<JsonlWriter> metrics, evals;
  std::unique_ptr<TensorboardWriter> tensorboard;  // metrics.tensorboard: rank 0's curves (metrics/tensorboard.h)
  std::unique_ptr<Watchdog> watchdog;
  std::string ckpt_dir;
  int64_t start_step = 0;
  std::string resumed_from;                   // checkpoint path, "" when starting fresh
  nlohmann::json resumed_runtime;             // the checkpoint's runtime.* (resolved configuration), null when fresh
  std::string data_json;                      // identity of the train and val files (stored in checkpoints)
  RunDirClaim claim;                          // rank 0: run.dir's lock, held for the life of the run
  std::string lineage;                        // this run's lineage id, kept across resumes
  std::vector<ContractRow> accepted_changes;  // resume-contract changes --resume-override accepted (logged)
  std::vector<int> node_ranks;                // the world ranks on this rank's node
  MemoryEstimate memory;                      // this rank's estimate (model/memory_estimate.h)
  std::string memory_note;                    // what the node has, for the start-up lines
  double rss_before_model = -1;               // peak RSS before the model was allocated
  int64_t saved_at = 0;                       // the state after this many steps is on disk, being written, or the start
  CheckpointStaging staging;                  // a save's host copy of what this rank writes
  std::unique_ptr<PendingCheckpoint> pending; // the checkpoint being written, if any (reads `staging`)
  int skipped_in_a_row = 0;                   // train.on_nonfinite skip: non-finite steps since the last finite one
};

// ---- set-up (train/setup.cpp) ----
// Everything up to the first step, collective over comm: run directory, topology, device, data,
// memory check, the engine, --init-from, resume, logs. A problem is a CollectiveError with one
// agreed message on every rank.
void start_run(Run& r, const Config& cfg, MPI_Comm comm, const TrainOptions& o);

// ---- checkpoints (train/checkpointing.cpp) ----
// Restore parameters, optimizer state and the step from a checkpoint, after checking that it
// belongs to this model and configuration (an Error naming the difference otherwise).
void resume_from(Run& r, const std::string& path, const std::vector<std::string>& overrides);
// --resume auto: rank 0 chooses the newest checkpoint of the run's lineage (run.dir/lineage) that
// verifies (damaged ones and other runs' are skipped with a warning; another refusal stops); every
// rank loads that file from its run.dir, and they start together or fail together (an Error on
// every rank naming the rank that could not). No checkpoint: a fresh start. Collective over r.comm.
void resume_auto(Run& r, const std::vector<std::string>& overrides);
// The state after `steps_done` steps into run.dir/checkpoints (checkpoint/sharded.h): every rank
// copies what it writes to r.staging (a synchronous save on the CPU writes straight from the
// engine's buffers instead); with checkpoint.async (and MPI_THREAD_MULTIPLE) the
// checksums, the file's creation and the writes run on a thread while training goes on, else
// before it returns. The file is renamed into
// place once every rank's part is written and synced: a checkpoint exists only once complete.
// Collective; every rank continues or stops together (CollectiveError). Returns the path it will have.
std::string save_checkpoint(Run& r, int64_t steps_done);
// Waits for the checkpoint being written, if any, and puts it in place (then prunes the old ones).
// Collective; CollectiveError on every rank when any rank's write failed.
void finish_checkpoint(Run& r);
// Whether saves are written behind the steps (checkpoint.async, and MPI_THREAD_MULTIPLE).
bool checkpoints_behind(const Run& r);
// The floats this rank writes in a checkpoint (Engine::state_ranges), i.e. its staging.
size_t checkpoint_share_floats(const Run& r);

// ---- evaluation and reports (train/report.cpp) ----
struct EvalResult {
  float loss = 0;
  double accuracy = -1;      // < 0: not a classifier
  double f1 = -1, mcc = -1;  // two-label classifiers only
  int64_t counted = 0;       // samples evaluated, over all ranks
};
// The validation split in global batches, in file order (train/report.cpp says how it is shared).
EvalResult evaluate(Run& r, int64_t step);
// Evaluates, records in res, eval.jsonl and the TensorBoard file, and prints (rank 0).
void evaluate_and_log(Run& r, int64_t step, TrainResult& res, bool print);
// The TensorBoard scalars of one eval.jsonl line: eval/val_loss, and eval/accuracy, eval/f1,
// eval/mcc where the line has them.
std::vector<std::pair<std::string, double>> eval_scalars(const nlohmann::json& line);
// The engine of a CPU run's dense-layer GEMMs in its precision (runtime.cpu_fp32_gemm or
// runtime.cpu_bf16_gemm): its word ("openblas", "onednn", "emulate") and the banner's description;
// both "" on a GPU.
std::pair<std::string, std::string> cpu_gemm_engine(const Run& r);
// The start-up lines (rank 0): ranks and device, model, data, schedule, layout and sync, memory,
// resume; with a pipeline every rank's topology line (collective).
void print_start(const Run& r, const TrainOptions& o, const TrainResult& res);
// One metrics.jsonl line and one printed line for step `step`.
struct StepLog {
  int64_t step = 0;
  float loss = 0;
  double lr = 0, grad_norm = 0, data_ms = 0, optim_ms = 0, step_ms = 0, tokens = 0;
  bool skipped = false;
};
void log_step(Run& r, const StepLog& s, const StepResult& st, const TrainResult& res, bool print);
// After the last step: summary.json, the closing line, the trace, the peak RSS of every rank
// (collective).
void finish_run(Run& r, TrainResult& res, const TrainOptions& o);

}  // namespace llmpi
