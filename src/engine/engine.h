// The step engine: what one rank does in a training step, whatever the parallel layout. The loop
// (train/trainer.cpp) drives every layout through this one type and never asks which it is.
//
//   chunks     the parts of the model this rank holds (ModelChunk): the whole model on a
//              data-parallel replica; a contiguous run of blocks on a pipeline stage (v of them
//              with the interleaved schedule; the embedding with the first virtual stage, the
//              head and the loss with the last: pipeline/stage_layers.h). Each chunk has its
//              Model, its Optimizer (over this rank's ZeRO-1 shard, or all of it) and its GradSync
//              over the stage's data-parallel group.
//   schedule   one action list (pipeline/schedule.h) run over the chunks: F, B (or BI and W), and
//              the messages between stages. A replica runs the one-stage 1F1B list F0 B0 F1 B1 ...
//              over parallel.microbatches micro-batches: gradient accumulation (one micro-batch,
//              F0 B0, without it). The layout is data, not code: the same executor runs both.
//   gradients  every backward adds into its chunk's gradient; micro-batch m's loss gradient is
//              scaled by rows_m / rows (1/M for equal micro-batches), so after the schedule each
//              gradient is the mean over the rank's batch. A chunk's last backward (B, or W when
//              split) hands finished gradient prefixes to its sync (grads_ready(k)), which starts
//              bucket collectives during it; the tied embedding's two copies (first and last
//              stage) have their gradients summed over the embedding group before the sync.
//   norm       global-norm clipping sums each chunk's squares (the tied matrix once; ZeRO-1:
//              this rank's pieces) on the device, reads them once, and sums over the pipeline (or,
//              with ZeRO-1, the world), so every rank scales by the same factor.
//   update     each chunk's optimizer reads its gradients times the clip factor (ZeRO-1: this
//              rank's piece of each bucket, then the bucket all-gathered). A replica of one rank
//              with one micro-batch and no ZeRO-1 lets the update itself decide the factor and a
//              non-finite skip on the device, before the step's one readback (docs/DESIGN.md "Data
//              flow of one step").
//   messages   through the pipeline's StageLink (comm/stage_link.h: MPI from backend memory, MPI
//              through page-locked host buffers on a GPU, or NCCL send/receive with sync "nccl"):
//              a receive is posted where the list has it, straight into the micro-batch's
//              Activations, and waited for only when its compute starts; a send is waited for
//              before its activation slot is reused and at the end of the step. Tag = (receiver's
//              virtual stage, micro-batch, direction); NCCL matches by posting order instead
//              (its waits are on the device: wait_ms stays near 0 and the compute times include
//              them).
//   memory     a chunk keeps as many Activations as its schedule has micro-batches in flight
//              (activation_peak: one for a replica, S - s for 1F1B, M for GPipe), plus one
//              whenever every free slot still has a send in flight (a step never waits for a send
//              before its end: above MPI's eager limit a send waits for its receiver, which may
//              wait for us). zb-h1's BI keeps each dense layer's output gradient in the slot until
//              its W (per slot about 2·C + fc + qkv floats per token and layer).
//   tensor     with parallel.tp > 1 each chunk's Model holds this rank's shard of its layers
//              (tensor_shard; model/transformer.h "Tensor parallelism") and calls its group's
//              collectives (comm/tensor_group.h) inside forward and backward: the schedule, the
//              messages and the sync are the same code (the sync runs over the shard's
//              data-parallel group). The loss and evaluation sums count tp_rank 0's only.
//   state      checkpoints hold the whole model by name, whatever the layout: each rank writes
//              the values of the whole tensors it owns (state_ranges: a shard's rows or columns,
//              ZeRO-1's pieces of the moments; each value once over the world) and reads the
//              values it holds (checkpoint/sharded.h), so a checkpoint of one layout resumes in
//              another, with another tp too, and no rank holds more than its own state.
//
// Errors: a bad layout is an Error thrown by the constructor, before any collective call.
#pragma once
#include <mpi.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "comm/grad_sync.h"
#include "comm/stage_link.h"
#include "model/memory_estimate.h"
#include "model/transformer.h"
#include "optim/optimizer.h"
#include "pipeline/schedule.h"
#include "runtime/config.h"
#include "runtime/parallel_groups.h"

namespace llmpi {

struct Tracer;
struct Watchdog;

struct ModelChunk {
  int vstage = 0;          // virtual stage (0 on a replica)
  ModelPart part;
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> opt;
  std::unique_ptr<GradSync> sync;
  std::vector<std::unique_ptr<Activations>> slots;
  bool tied = false;       // holds a copy of the tied token embedding shared with another stage
  bool tied_copy = false;  // ... and it is the head's copy (counted once: the embedding's is)
  size_t ready_cap = 0;    // gradient prefix handed to the sync during backward (before the tied sum)
  size_t counted() const { return tied_copy ? ready_cap : model->table.numel; }  // for the global norm
  // The ranges of the gradient this rank counts in the global norm: [0, counted()), or with tensor
  // parallelism on a rank other than the group's first only its shards' (the whole tensors, the
  // same on every rank of the group, are counted once).
  std::vector<std::pair<size_t, size_t>> norm_ranges;
};

// What the loop needs from a step, on this rank.
struct StepResult {
  double local_loss = 0;   // this rank's mean loss over its batch (0 on a stage without the head)
  double grad_norm = 0;    // the global gradient norm before clipping
  bool finite = true;      // this rank's loss and the norm are finite (and no target was out of range)
  bool updated = false;    // the update already ran, deciding the skip on the device (update_allowed)
  // Times (ms). forward_ms, backward_ms and sync_end_ms are final after end_step (a GPU's come from
  // marks on its stream, read once the step has ended).
  double forward_ms = 0, backward_ms = 0;  // compute of the forward and of the backward actions
  double wait_ms = 0;      // waiting for activations / gradients from neighbouring stages
  double sync_end_ms = 0;  // when the gradient sync ended (now_ms clock): the update's phase starts
  SyncStats sync;          // summed over chunks (after end_step: with ZeRO-1's all-gather and "weights" averaging)
};

// Evaluation of one batch of the validation split on this rank, to be summed over ranks and
// batches: the mean loss is Σ loss_sum / Σ loss_weight.
struct EvalSums {
  double loss_sum = 0;     // a replica: Σ of its rows' losses; a pipeline's last stage: its replica's mean
  double loss_weight = 0;  // a replica: its rows; a pipeline's last stage: 1
  int64_t rows = 0;        // rows evaluated here, counted on the stage with the head only
  std::vector<int> labels, predictions;  // classifier: those rows' labels and predicted classes
};

// The chunks a rank of `stage` holds with S stages, M micro-batches a step, v chunks a stage and
// blocks per virtual stage `layer_counts` (split_layers), under the schedule `kind`: each chunk's
// part and the activation slots its schedule keeps at once (activation_peak, at least one), as the
// Engine builds them. The second form takes the layout from the configuration (S = pp_stages).
// For the memory estimate before anything is allocated (model/memory_estimate.h RankChunks; the
// caller sets its tensor-parallel place).
RankChunks rank_chunks(const std::vector<int>& layer_counts, ScheduleKind kind, int S, int M, int v, int stage);
RankChunks rank_chunks(const ModelDesc& d, const ParallelConfig& pc, int T, int stage);

struct EngineOptions {
  OptimizerKind optimizer = OptimizerKind::adamw;
  int local_batch = 1;   // sequences per step on this rank (a pipeline: per replica)
  int T = 1;
  uint64_t seed = 0;
  GemmPrecision precision = GemmPrecision::fp32;
  Recompute recompute = Recompute::none;  // runtime.recompute, given to every chunk's model
  bool host_clip = false;  // tests: the clip factor and the skip decided on the host also where the device could
  Tracer* tracer = nullptr;
  Watchdog* watchdog = nullptr;  // told the phase the step is in (runtime/watchdog.h)
};

struct Engine {
  const ParallelGroups& g;
  const Ops& ops;
  ModelDesc desc;
  ScheduleKind kind;           // the schedule run (one_f_one_b on a replica)
  int S, M, v;                 // pipeline stages, micro-batches per step, chunks per stage
  int micro_batch;             // rows of a full micro-batch
  int T;
  uint64_t seed;
  std::vector<int> layer_counts;      // blocks per virtual stage
  std::vector<Action> actions;        // this rank's schedule for a full batch
  std::vector<ModelChunk> chunks;     // chunk c = virtual stage c·S + stage
  std::unique_ptr<StageLink> link;    // messages between stages (S > 1; connected by connect())
  ParamTable whole_table;             // the whole model's table (checkpoints are by name)
  EngineOptions opt;
  double clip_scale = 1.0;            // the last step's clip factor
  // Called after each compute action (F, B, BI, W): tests look at the gradients between actions.
  std::function<void(const Action&)> after_compute;

  // Builds the chunks (initialised from the seed), their optimizers, syncs and activation slots
  // for `pc` (pp_stages = g.pp; microbatches; schedule; virtual stages; stage_layers). Not
  // collective. Throws Error for a layout that cannot run.
  Engine(const ModelDesc& d, const Ops& ops, const ParallelGroups& g, const ParallelConfig& pc, const SyncOptions& so,
         const EngineOptions& o);
  // Collective: the tensor group's collectives (tensor parallelism), each chunk's
  // GradSync::connect(), then the StageLink's.
  void connect();

  // Forward and backward of this rank's batch (batch.B rows: the local batch, or fewer on an
  // epoch's short last step of a replica) by the schedule, the tied sum, the gradient sync, the
  // global norm; and on one rank with one micro-batch, the update (StepResult::updated).
  StepResult step(int64_t step, const Batch& batch, double lr, const TrainConfig& tc);
  // The update after a step whose every rank was finite (not after one the device updated).
  void update(double lr, const TrainConfig& tc);
  // A step the device updated was not finite on some rank: it did not count (AdamW's t).
  void discard_device_update();
  // End of the step: the device is idle, r's times are final; "weights" averages parameters every
  // average_every steps.
  void end_step(int64_t step, StepResult& r);

  // Validation: forward only, no dropout. A replica evaluates any rows (chunked to its slots); a
  // pipeline evaluates whole replica batches, micro-batch by micro-batch along the pipeline.
  EvalSums evaluate(const Batch& batch);
  bool pipelined() const { return S > 1; }
  // ZeRO-2/3 on a GPU: the most gradient (parameter: ZeRO-3) bytes backed at once so far, over
  // this rank's chunks (0 otherwise; comm/grad_sync.h).
  size_t grad_pages_peak() const;
  size_t param_pages_peak() const;
  // Rows this rank evaluates of the validation batch of `g_rows` samples starting at `first`
  // (ids into the split; empty when none): the share of the data-parallel replica, which every
  // stage of a pipeline reads alike.
  std::vector<int64_t> eval_rows(int64_t first, int64_t g_rows) const;

  // The whole model in one place (tests, llmpi-train's final parameters; checkpoints use
  // state_ranges instead). gather_whole: world rank 0 receives every stage's tensors of replica 0
  // and returns them in whole_table's layout (empty elsewhere); which = 0 params, 1 AdamW m, 2 v.
  // Collective over the world.
  std::vector<float> gather_whole(int which);
  // The whole model's parameters on every rank (tests, llmpi-train's final state): a replica its
  // own (ranks differ between averages under "weights"), a pipeline rank 0's gathered by name.
  // Collective over the world.
  std::vector<float> whole_params_everywhere();
  // Every rank takes its tensors by name from whole-model buffers (m, v may be null).
  void load_whole(const float* params, const float* m, const float* v, int64_t optimizer_t);
  // Sharded checkpoints (checkpoint/sharded.h): a range of one chunk's buffer of a state (which =
  // 0 params, 1 AdamW m, 2 v; with ZeRO-1 the moments' buffer holds this rank's pieces only):
  // the chunk table's slice `slice`, its values [lo, hi), at offset `at` of the buffer; `tensor`
  // is the slice's index in whole_table.
  struct StateRange {
    size_t chunk = 0, slice = 0, lo = 0, hi = 0, at = 0;
    int tensor = 0;
  };
  // reading: everything this rank holds of the state. Writing: what this rank writes, so that over
  // the world every value of the whole model is written once: a tensor-parallel shard by one
  // data-parallel replica, a tensor every rank of the tensor group holds by one of them, the
  // replicas taking tensors in turn; ZeRO-1's moments (and ZeRO-3's blocks' parameters) by the
  // rank that holds each piece; a tied
  // head's copy of the embedding never (the embedding's stage writes it). every_rank (sync
  // "weights": the replicas' states differ, each replica is written): its replica's own.
  std::vector<StateRange> state_ranges(int which, bool writing, bool every_rank) const;
  // Chunk c's buffer of a state (backend memory: on a GPU a device pointer), and setting it from a
  // host copy (host: that buffer's length).
  const float* state_buffer(size_t c, int which) const;
  void set_state(size_t c, int which, const float* host);
  // Where a reader may write state `which` of chunk c in place, at the StateRange offsets, instead
  // of into a host buffer for set_state: ZeRO-3's parameters on the CPU (its tensors outside the
  // blocks and its pieces of theirs; nothing else of them is written, so nothing else is
  // resident). Null elsewhere.
  float* state_in_place(size_t c, int which);
  // --init-from: every rank reads its chunks' tensors by name from a Hugging Face model directory
  // (hf/hf_import.h; a tied head's copy reads the embedding). Collective over the world: an error on
  // any rank is thrown on every rank. World rank 0 gets the notes of its pipeline's stages in *notes.
  void init_from_hf(const std::string& dir, std::vector<std::string>* notes);

  // Rows [first_row, first_row + rows) of a batch.
  Batch micro(const Batch& b, int first_row, int rows) const;
  // A message's tag: (receiver's virtual stage, micro-batch, direction: 1 for a gradient).
  int tag(int receiver_vstage, int mb, int grad) const { return (receiver_vstage * M + mb) * 2 + grad; }

  // Floats of one micro-batch's hidden state between stages: all its rows, or with sequence
  // parallelism this rank's (rank t of a stage sends its rows to rank t of the next).
  size_t hidden_floats() const {
    return (size_t)chunks.front().model->desc.residual_rows(micro_batch * T) * desc.d_model;
  }
  int64_t optimizer_t() const { return chunks.front().opt->t; }
  int64_t optimizer_state_floats() const;  // AdamW m + v held by this rank
  std::string describe_layers() const;     // "virtual stage 1: layers [2,4) + head, 2 activation slots (1.2 MB)"

 private:
  // The step's compute actions in order, with their ends: host times, or on a GPU that does not
  // wait between actions, marks on the compute stream (mark 0 at the start, k after the k-th).
  struct PhaseLog {
    bool marks = false;
    double start_ms = 0;
    std::vector<bool> forward;           // per action: an F (else a backward)
    std::vector<double> begin_ms, end_ms;  // host clock
    int sync_mark = -1;                  // the mark after the gradient sync (-1: host clock)
    double sync_end_ms = 0;
  } log_;
  int64_t step_ = 0;  // the step being run
  // The schedule's actions, the tied sum, the sync; returns this rank's mean loss when it read the
  // losses at each forward, or nothing: one micro-batch on one stage leaves its loss in the
  // scalars for the step's one readback (after the norm, and the update when it runs on the device).
  std::optional<double> run_schedule(int64_t step, const Batch& batch, StepResult& r);
  void sum_tied_gradients();
  std::vector<Action> schedule_for(int micro_batches) const;
  // Tensor parallelism: chunk c's values in its table's layout (this rank's shards), assembled on
  // tp_rank 0 into the layout of the chunk's part of the whole model (empty elsewhere); the
  // values themselves without tensor parallelism. Collective over the tensor group.
  std::vector<float> unshard(size_t c, std::vector<float> mine) const;
  EvalSums evaluate_here(const Batch& batch);
  bool sync_nccl_ = false;  // parallel.sync "nccl": the tensor group's collectives over NCCL too
};

// The sync options a configuration asks for.
SyncOptions sync_options(const ParallelConfig& pc);

}  // namespace llmpi
