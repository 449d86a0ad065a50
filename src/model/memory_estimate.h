// How much memory one rank of a run needs, estimated before anything is allocated, and how much
// the node (and the GPU) has, so that a configuration that cannot fit is refused with the numbers
// instead of dying of std::bad_alloc or the out-of-memory killer.
//
//   parameters, gradients      n floats each (n from the parameter table, exact); with
//                              parallel.zero 2 on the CPU the gradient at its peak:
//                              zero2_grad_floats (params/buckets.h: the pieces, the buckets whole
//                              at once, their edge pages; whole with micro-batches); on a GPU
//                              device_zero2_grad_floats (the limit of the backed device pages);
//                              with parallel.zero 3 the parameters too: zero3_param_floats (the
//                              tensors outside the blocks, the pieces, one or two blocks whole); with
//                              runtime.precision bf16 the parameters also count the Model's bf16
//                              weight copy, 2 bytes each
//   optimizer                  AdamW: m and v, 2n floats; SGD: none. With parallel.zero 1 only this
//                              rank's shard (about 2n/world floats: exactly its pieces of every
//                              bucket, comm/grad_sync.h)
//   activations                one micro-batch of B sequences × T tokens (B = the local batch, or
//                              with gradient accumulation over M micro-batches ceil(local/M)); in a
//                              pipeline (RankChunks) each chunk's slots of it: the micro-batches its
//                              schedule keeps at once (activation_peak), with zb-h1's kept input
//                              gradients (kept_bytes), exactly the tensors
//                              Activations::allocate lays out: plan_activations
//                              (model/activation_plan.h; per layer about 12·N·C + N·(QKV + FC + F)
//                              + B·H·T² floats, N = B·T; with runtime.recompute the recomputed
//                              ones once), the device copies of the ids and the host loss row
//   backward scratch           what Model::ensure_scratch allocates for one backward
//                              (plan_backward_scratch), plus with
//                              runtime.precision bf16 the dense layers' rounded operands
//                              (gemm_operand_scratch_bytes)
//   sync buffers               gather_scatter: rank 0 gathers and scatters world × the largest
//                              bucket; an MPI method on the GPU: one pinned host copy (n floats);
//                              ZeRO-1 over MPI: the reduce-scatter's and all-gather's pieces
//   NCCL buffers               device memory of NcclComm (comm/nccl.h): ZeRO-1's world padded
//                              pieces of the largest bucket in fp32, and as many bf16 values for a
//                              bf16 gradient; without ZeRO-1 a bf16 gradient's copy of the
//                              largest bucket
//   checkpoint staging         the larger of what a save and a resume hold on the host. A save
//                              with checkpoint.async, or from a GPU, copies the values this rank
//                              writes (its turn of the tensors, params and its m and v:
//                              writes_tensor, params/buckets.h) into memory kept for the run; a
//                              synchronous save on the CPU writes from the buffers themselves. A
//                              resume reads one state (params, m or v) of this rank's chunks at a
//                              time into a host buffer (ZeRO-3 on the CPU: its parameters in place,
//                              so only the moments' pieces).
//   data                       the batch on the host (ids, targets, ...)
//
// On the CPU backend everything is host memory. On CUDA, parameters, gradients, optimizer state,
// activations, scratch and the NCCL buffers are device memory; the rest is host memory. Not
// counted: the MPI, OpenBLAS, HDF5 and CUDA libraries' own buffers and the program itself (already
// resident when the estimate is compared with MemAvailable), and NCCL's internal buffers.
//
// The parameter, gradient, optimizer, activation and scratch byte counts equal what the code
// allocates (tests/test_memory_estimate.cpp counts the real allocations); the peak RSS of a step
// is within the tolerance stated there.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/activation_plan.h"
#include "model/model_desc.h"
#include "model/transformer.h"
#include "params/buckets.h"
#include "runtime/config.h"
#include "runtime/host_memory.h"

namespace llmpi {

// Where in the layout a rank is, for its estimate: the chunks of the model it holds (a pipeline
// stage's parts, pipeline/stage_layers.h, and for each the activation slots its schedule needs)
// and its tensor-parallel place (which tensors it writes to a checkpoint). The default is one
// chunk of the whole model with one slot, tp 1.
struct RankChunks {
  std::vector<ModelPart> parts{ModelPart::whole()};
  std::vector<int> slots{1};
  bool keeps_input_grads = false;  // zb-h1: each slot keeps its input-only backward's outputs
  int tp = 1, tp_rank = 0;
};

struct MemoryEstimate {
  // Bytes on this rank.
  double params = 0, grads = 0, optimizer = 0, activations = 0, scratch = 0;  // backend memory
  double nccl_buffers = 0;                                                    // device memory
  double sync_buffers = 0, checkpoint_staging = 0, data = 0;                  // host memory
  double checkpoint_save = 0;  // of checkpoint_staging, what a save keeps (0: none); the rest is a resume's
  bool on_gpu = false;
  int local_batch = 0, seq_len = 0;
  int micro_batch = 0;  // the sequences of one micro-batch (local_batch without accumulation)
  int64_t n_params = 0;
  double device_bytes() const { return on_gpu ? params + grads + optimizer + activations + scratch + nccl_buffers : 0; }
  double host_bytes() const {
    return (on_gpu ? 0 : params + grads + optimizer + activations + scratch) + sync_buffers + checkpoint_staging + data;
  }
  // One line: "params 3.4 MB + grads 3.4 MB + AdamW 6.7 MB + activations ... = 45.1 MB"
  std::string describe() const;
};

// The rows of the largest micro-batch when `local_batch` rows are cut into `microbatches` (as
// evenly as they go): ceil(local_batch / microbatches).
inline int micro_batch_rows(int local_batch, int microbatches) {
  return microbatches > 1 ? (local_batch + microbatches - 1) / microbatches : local_batch;
}

// What one rank of this run needs: the model `desc`, `local_batch` sequences of `seq_len` tokens,
// and the configuration's optimizer, sync method and checkpointing. With tensor parallelism `desc`
// is the rank's shard (tensor_shard, model_desc.h): its parameter table, its heads, MLP channels
// and vocabulary rows (the N·C activations stay whole on every rank), no bf16 logits gradient, the
// cross-entropy's statistics. `world` and `rank` are those of the data-parallel group (ZeRO-1's
// shard, the gather buffers).
// `chunks`: this rank's chunks (RankChunks; null: the whole model, one slot).
MemoryEstimate estimate_memory(const ModelDesc& desc, int local_batch, int seq_len, const Config& cfg, int world,
                               int rank, bool on_gpu, const RankChunks* chunks = nullptr);

// The floats the rank at (dp_rank of dp, tp_rank of tp) writes of one chunk of the model (`part`,
// its parameter table `table`) to a checkpoint, as Engine::state_ranges picks them (writes_tensor,
// params/buckets.h): params and, for AdamW, m and v; with ZeRO-1 (`zero`) the moments are its
// `pieces` of the chunk's buckets; `per_rank`: sync "weights", every rank writes its own copy.
double checkpoint_write_floats(const ModelDesc& desc, const ModelPart& part, const ParamTable& table, bool zero,
                               const std::vector<ShardPiece>& pieces, bool adamw, bool per_rank, int dp, int dp_rank,
                               int tp, int tp_rank);

// The bytes of one micro-batch's Activations, and of one backward's scratch (as the model allocates).
// These and kept_bytes, gemm_operand_scratch_bytes: counted in 128 bits; an Error naming the keys
// (token_rows_checked's, or the count int64 cannot hold) instead of a wrapped count.
// With precision bf16 the activations also hold the LM head's bf16 logits-gradient chunk, and a
// pre-norm model's norm outputs are bf16 (Activations::bf16_operands).
// With recompute selective or full (model/transformer.h "Activation recomputation") the tensors
// backward recomputes are counted once, not per layer.
size_t activation_bytes(const ModelDesc& desc, int B, int T, GemmPrecision precision = GemmPrecision::fp32,
                        Recompute recompute = Recompute::none);
size_t backward_scratch_bytes(const ModelDesc& desc, int B, int T);
// The scratch the dense layers' GEMMs use for their bf16 operands (0 unless precision is bf16):
// the largest call's operands, as fp32 copies on the CPU, bf16 on the GPU.
size_t gemm_operand_scratch_bytes(const ModelDesc& desc, int B, int T, GemmPrecision precision, bool on_gpu);

// The same for a part of the model (a pipeline chunk: model/transformer.h ModelPart), as
// Activations::allocate lays it out for that part: the embedding norm only with the embedding, the
// head's tensors only with the head. activation_bytes(d, B, T) equals the whole part's value.
size_t activation_bytes(const ModelDesc& desc, const ModelPart& part, int B, int T,
                        GemmPrecision precision = GemmPrecision::fp32, Recompute recompute = Recompute::none);
// What an input-only backward (zb-h1's BI) keeps per micro-batch in Activations::kept for that
// part: Model::kept_floats (per block 2·N·C + N·fc + N·qkv floats, each rounded to 16; the
// classifier head's pooler output gradient), in bytes.
size_t kept_bytes(const ModelDesc& desc, const ModelPart& part, int B, int T);

}  // namespace llmpi
