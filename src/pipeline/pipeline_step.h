// Pipeline-parallel training step: one rank runs one stage of a pipeline (one model chunk, or v
// chunks with the interleaved schedule) by executing the stage's action list from
// pipeline/schedule.h.
//
//   layers     the n_layer blocks are cut into S·v contiguous virtual stages, by
//              parallel.stage_layers or balanced by estimated cost (split_layers); virtual stage 0
//              also holds the embedding, the last one the final norm, the head and the loss. A
//              tied LM head on a stage without the embedding holds its own copy of the token
//              embedding; the two copies start equal (initialisation is keyed by name), their
//              gradients are summed over the embedding group before the data-parallel sync, so
//              they stay bit-identical.
//   messages   RecvAct/RecvGrad post MPI_Irecv straight into the micro-batch's Activations
//              (input / dresidual), SendAct/SendGrad post MPI_Isend from them; a compute waits only
//              for its own receive. Sends are waited for before their activation slot is reused
//              and at the end of the step. Tag = (receiver's virtual stage, micro-batch, direction).
//   gradients  every backward adds into the chunk's gradient; the loss gradient of each
//              micro-batch is scaled by 1/M, so after the schedule the gradient is the mean over
//              the replica's batch. The last backward of a chunk hands finished buckets to the
//              chunk's GradSync (over the data-parallel group), except the tied matrix, which is
//              handed over after the embedding-group sum; finish() completes the average.
//   clipping   the global norm sums every chunk's squares over the pipeline (the tied matrix
//              once), so every stage scales by the same factor and sees the same non-finite norm;
//              the optimizers read each gradient times that factor (Optimizer::step's grad_scale).
//   memory     a chunk keeps as many Activations as its schedule has micro-batches in flight
//              (activation_peak): S - s for 1F1B, M for GPipe; plus one whenever every free slot
//              still has a send in flight: a step never waits for a send before its end (above
//              MPI's eager limit a send waits for its receiver, which may wait for us: deadlock).
//   zb-h1      BI is the model's input-only backward (model/transformer.h "Split backward"): the
//              hidden-state gradient the previous stage waits for, with the norms' and embeddings'
//              parameter gradients; the dense layers' weight and bias gradients (half their
//              FLOPs) wait in the micro-batch's Activations, with a copy of each layer's output
//              gradient, until its W adds them. W is where the chunk's last gradients become
//              final, so the last W (not the last BI) hands buckets to the sync. The kept output
//              gradients cost per slot about 2·C + fc + qkv floats per token and layer, counted in
//              the slot's bytes.
//   device     CPU backend only so far: messages go straight from backend memory, which on a GPU
//              would need CUDA-aware MPI or host staging (refused with that message).
#pragma once
#include <mpi.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "comm/grad_sync.h"
#include "model/transformer.h"
#include "optim/optimizer.h"
#include "pipeline/schedule.h"
#include "runtime/config.h"
#include "runtime/parallel_groups.h"

namespace llmpi {

struct Tracer;

// Blocks per virtual stage (K of them): `explicit_counts` when not empty (K counts summing to
// n_layer), else the contiguous split that minimises the most expensive stage, with the embedding
// counted on the first and the head on the last (forward FLOPs per token: 2·params + attention).
// Throws Error naming the fix when impossible.
std::vector<int> split_layers(const ModelDesc& d, int T, int K, const std::vector<int>& explicit_counts);
ModelPart virtual_stage_part(const std::vector<int>& counts, int k);

struct PipelineChunk {
  int vstage = 0;
  ModelPart part;
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> opt;
  std::unique_ptr<GradSync> sync;
  std::vector<std::unique_ptr<Activations>> slots;
  bool tied = false;       // holds a copy of the tied token embedding shared with another stage
  bool tied_copy = false;  // ... and it is the head's copy (counted once: the embedding's is)
  size_t ready_cap = 0;    // gradient prefix handed to the sync during backward (before the tied sum)
};

struct PipelineStepStats {
  double local_loss = 0;   // last stage: mean loss over the replica's batch; 0 elsewhere
  double compute_ms = 0;   // forward and backward computation
  double wait_ms = 0;      // waiting for activations / gradients from neighbours
  double tied_ms = 0;      // tied-embedding gradient sum
  double sync_ms = 0;      // data-parallel gradient sync (finish)
  SyncStats sync;          // summed over chunks
};

struct PipelineEval {
  double loss_sum = 0;     // last stage: sum over batches of the replica's mean loss
  double correct = 0, counted = 0;  // classifier
};

struct Pipeline {
  const ParallelGroups& g;
  const Ops& ops;
  ModelDesc desc;
  ScheduleKind kind;
  int S, M, v, micro_batch, T;
  uint64_t seed;
  std::vector<int> layer_counts;        // per virtual stage
  std::vector<Action> actions;          // this stage's schedule
  std::vector<PipelineChunk> chunks;    // chunk c = virtual stage c·S + stage
  ParamTable whole_table;               // the whole model's table (checkpoints are by name)
  Tracer* tracer = nullptr;
  // Called after each compute action (F, B, BI, W) of forward_backward: tests look at the
  // gradients between actions.
  std::function<void(const Action&)> after_compute;

  // Builds the chunks (initialised from seed; dense GEMMs in `precision`), their optimizers and
  // syncs. Not collective.
  Pipeline(const ModelDesc& d, const Ops& ops, const ParallelGroups& g, const ParallelConfig& pc,
           const SyncOptions& so, const std::string& optimizer, int local_batch, int T, uint64_t seed, Tracer* tracer,
           GemmPrecision precision = GemmPrecision::fp32);
  void connect();  // collective: each chunk's GradSync::connect()

  // Forward and backward of the replica's batch (batch.B = local batch rows, split into M
  // micro-batches) by the schedule, the tied sum and the data-parallel sync.
  PipelineStepStats forward_backward(int64_t step, const Batch& batch);
  // Collective over the pipeline; the norm before clipping. The clip factor (clip_factor) is kept
  // for optimizer_step, which folds it into the update (the gradients are not scaled in place).
  double clip_grad_norm(double max_norm);
  void optimizer_step(double lr, const TrainConfig& tc);
  float clip_scale = 1.0f;  // from the last clip_grad_norm
  // Forward only (no dropout), micro-batch by micro-batch along the pipeline (blocking messages
  // in (micro-batch, virtual stage) order). Accumulates into e on the last stage.
  void evaluate(const Batch& batch, PipelineEval& e);

  // Checkpoints hold the whole model by name. gather: world rank 0 receives every stage's
  // tensors of replica 0 and returns them in whole_table's layout (empty elsewhere);
  // which = 0 params, 1 Adam m, 2 Adam v. Collective over the world.
  std::vector<float> gather_whole(int which);
  // Every rank takes its tensors by name from whole-model buffers (m, v may be null).
  void load_whole(const float* params, const float* m, const float* v, int64_t optimizer_t);
  // --init-from: every rank reads its chunks' tensors by name from a Hugging Face model directory
  // (hf/hf_import.h; a tied head's copy reads the embedding), tensors the files lack keep their
  // seeded values, as on one rank. Collective over the world: an error on any rank (a tensor
  // missing for some stage) is thrown on every rank. World rank 0 gets the notes of every stage
  // of its pipeline (each once) in *notes.
  void init_from_hf(const std::string& dir, std::vector<std::string>* notes);
  int64_t optimizer_t() const { return chunks.front().opt->t; }
  size_t local_numel() const;
  std::string describe_layers() const;  // "layers [0,2) + embedding"

 private:
  int tag(int receiver_vstage, int mb, int grad) const { return (receiver_vstage * M + mb) * 2 + grad; }
  Batch micro(const Batch& b, int m) const;
};

}  // namespace llmpi
