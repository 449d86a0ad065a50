#include "model/memory_estimate.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <vector>

#include "params/buckets.h"
#include "runtime/error.h"
#include "runtime/host_memory.h"
#include "model/activation_plan.h"
#include "model/transformer.h"

namespace llmpi {

namespace {

// The host's page (x86-64 Linux): ZeRO-2 releases the gradient in whole pages.
constexpr size_t kPageBytes = 4096;

// The counts below are computed in 128 bits: products of the batch's and the description's ints
// (check_model_sizes bounds its widths) are exact there, so a count that int64 cannot hold is
// refused (bytes_of) instead of wrapping.
using Wide = PlanCount;

// `bytes` as a size; an Error naming the keys that make it when int64 cannot hold it.
size_t bytes_of(Wide bytes, const char* what, int B, int T) {
  if (bytes > Wide(INT64_MAX))
    fail("the ", what, " of one micro-batch of ", B, " sequences x ", T, " tokens take more than 2^63 bytes, more "
         "than 64-bit sizes count: use more parallel.microbatches, a smaller train.global_batch, a shorter "
         "model.seq_len or a smaller model");
  return static_cast<size_t>(bytes);
}

}  // namespace

size_t activation_bytes(const ModelDesc& d, int B, int T, GemmPrecision precision, Recompute recompute) {
  return activation_bytes(d, ModelPart::whole(), B, T, precision, recompute);
}

// plan_activations' tensors (Activations::allocate, with bf16_operands and without all_logits),
// the ids and the step's scalars, and the host loss row (Model::rows_for_loss).
size_t activation_bytes(const ModelDesc& d, const ModelPart& part, int B, int T, GemmPrecision precision,
                        Recompute recompute) {
  const ActivationPlan plan = plan_activations(d, part, B, T, precision, recompute, true, false);
  const Wide loss_rows = d.head == HeadKind::lm ? Wide(B) * T : Wide(B);
  return bytes_of(plan.bytes() + loss_rows * sizeof(float), "activations", B, T);
}

size_t kept_bytes(const ModelDesc& d, const ModelPart& part, int B, int T) {
  return bytes_of(plan_kept_floats(d, part, B, T) * sizeof(float), "kept output gradients (zb-h1)", B, T);
}

size_t backward_scratch_bytes(const ModelDesc& d, int B, int T) {
  return bytes_of(plan_backward_scratch(d, B, T).total() * sizeof(float), "backward scratch", B, T);
}

// A bf16 dense layer's rounded operands (backend/cpu/matmul.cpp, kernels/matmul.cu): per call all of
// them side by side in one buffer (its forward inp·W^T, its backward dout, W and inp), each but the
// last padded to 16 floats (CPU: fp32 copies) or 128 bf16 values (CUDA, whose workspace also takes
// a quarter of headroom when it grows, and whose copy of dout has rows of a multiple of 8 values).
// The Model hands every call its bf16 weight copy (model/transformer.h), the LM head's calls their
// logits gradient in bf16, and the calls whose input is kept only in bf16 (a pre-norm model's
// norm outputs, the MLP's activation output) that input: CUDA reads them in place, so they take no
// scratch there; the CPU widens them into its fp32 scratch. The buffer grows to the largest call.
size_t gemm_operand_scratch_bytes(const ModelDesc& d, int B, int T, GemmPrecision precision, bool on_gpu) {
  if (precision != GemmPrecision::bf16) return 0;
  const int rows = token_rows_checked(B, T);
  const Wide pad = on_gpu ? 128 : 16;
  auto span = [&](Wide n) { return (n + pad - 1) / pad * pad; };
  Wide most = 0;
  // CUDA pads a bf16 output gradient's rows to a multiple of 8 values (bf16_row_stride, backend/gemm_precision.h)
  auto ld = [&](Wide out) { return on_gpu ? Wide(bf16_row_stride(static_cast<int>(out))) : out; };
  // inp_given / dout_given: the call's input / output gradient comes in bf16: no copy on CUDA
  auto dense = [&](Wide n_rows, Wide in, Wide out, bool inp_given = false, bool dout_given = false) {
    const Wide w = on_gpu ? 0 : out * in;  // the weight's scratch copy (none on CUDA: the Model's copy)
    const Wide x = on_gpu && inp_given ? 0 : n_rows * in;
    const Wide dout = on_gpu && dout_given ? 0 : n_rows * ld(out);
    most = std::max({most, span(x) + w, span(dout) + span(w) + x});
  };
  const Wide N = Wide(rows), C = Wide(d.d_model), AY = Wide(d.heads()) * d.head_dim();
  // (Activations::bf16_operands; the MLP's activation always; sequence parallelism gathers the
  // norms' outputs in fp32)
  const bool norms16 = d.pre_norm && !d.seq_shards();
  dense(N, C, Wide(d.qkv_dim()), norms16);
  dense(N, AY, C);
  dense(N, C, Wide(d.fc_dim()), norms16);
  dense(N, Wide(d.ffn()), C, true);
  if (d.head == HeadKind::lm) {  // (this rank's vocabulary rows; tensor parallelism: an fp32 gradient)
    dense(Wide(lm_head_chunk_rows(d, rows)), C, Wide(d.vocab_rows()), norms16 && d.final_norm, d.tp == 1);
  } else {
    dense(Wide(B), C, C);
    dense(Wide(B), C, Wide(d.num_labels));
  }
  return bytes_of(on_gpu ? most * 2 * 5 / 4 : most * sizeof(float), "bf16 GEMM operand scratch", B, T);
}

double checkpoint_write_floats(const ModelDesc& desc, const ModelPart& part, const ParamTable& table, bool zero,
                               const std::vector<ShardPiece>& pieces, bool adamw, bool per_rank, int dp, int dp_rank,
                               int tp, int tp_rank) {
  // (a tied LM head's copy of the embedding is written by the embedding's stage)
  const bool tied_copy = desc.head == HeadKind::lm && desc.tie_embeddings && part.head && !part.embedding;
  double n = 0;
  for (int which = 0; which < (adamw ? 3 : 1); which++) {
    const bool own_pieces = which != 0 && zero;
    for (size_t i = 0; i + (tied_copy ? 1 : 0) < table.slices.size(); i++) {
      const ParamSlice& s = table.slices[i];
      if (!writes_tensor(i, s.sharded(), own_pieces || per_rank, dp, dp_rank, tp, tp_rank)) continue;
      if (!own_pieces) {
        n += (double)s.numel;
        continue;
      }
      for (const ShardPiece& p : pieces) {
        const size_t lo = std::max(p.begin, s.offset), hi = std::min(p.end, s.offset + s.numel);
        if (lo < hi) n += (double)(hi - lo);
      }
    }
  }
  return n;
}

MemoryEstimate estimate_memory(const ModelDesc& desc, int local_batch, int seq_len, const Config& cfg, int world,
                               int rank, bool on_gpu, const RankChunks* chunks) {
  const RankChunks whole_model;
  const RankChunks& rc = chunks ? *chunks : whole_model;
  MemoryEstimate e;
  e.on_gpu = on_gpu;
  e.local_batch = local_batch;
  e.seq_len = seq_len;
  const GemmPrecision precision = cfg.runtime.precision;
  const bool adamw = cfg.train.optimizer == OptimizerKind::adamw;
  const bool nccl = cfg.parallel.sync == SyncMethod::nccl, grad_bf16 = cfg.parallel.grad_dtype == GradDtype::bf16;
  const bool zero = cfg.parallel.zero && world > 1;
  const bool per_rank = cfg.parallel.sync == SyncMethod::weights && world > 1;
  // One micro-batch is alive at a time in each slot: with gradient accumulation (parallel.microbatches
  // M) the activations and the backward's scratch are those of ceil(local_batch / M) sequences.
  const int micro = micro_batch_rows(local_batch, cfg.parallel.microbatches);
  e.micro_batch = micro;
  // Each chunk: its parameter table, buckets (its own gradient sync), ZeRO-1 shard and slots.
  double n = 0, mine = 0, write_floats = 0, grad_floats = 0, param_floats = 0;
  size_t largest_bucket = 0, largest_piece = 0;
  for (size_t c = 0; c < rc.parts.size(); c++) {
    const ModelPart& part = rc.parts[c];
    const ParamTable table = build_param_table(desc, part);
    n += (double)table.numel;
    if (precision == GemmPrecision::bf16) {  // the Model's bf16 weight copy (its tensors 256-byte aligned)
      std::vector<size_t> offsets;
      e.params += (double)aligned_copy_layout(table, &offsets) * sizeof(uint16_t);
    }
    const std::vector<Bucket> buckets = make_buckets(
        table, cfg.parallel.bucket_mb, cfg.parallel.overlap ? cfg.parallel.first_bucket_mb : cfg.parallel.bucket_mb,
        cfg.parallel.zero >= 3);
    for (const Bucket& b : buckets) {
      largest_bucket = std::max(largest_bucket, b.end - b.begin);
      largest_piece = std::max(largest_piece, (b.end - b.begin + world - 1) / world);
    }
    const std::vector<ShardPiece> pieces = zero ? shard_pieces(buckets, world, rank) : std::vector<ShardPiece>{};
    for (const ShardPiece& p : pieces) mine += (double)(p.end - p.begin);
    const bool head_writes_last = part.head && desc.head == HeadKind::lm && desc.tie_embeddings;
    const bool each_micro = cfg.parallel.zero_reduce == ZeroReduce::micro_batch && cfg.parallel.pp_stages == 1;
    grad_floats += cfg.parallel.zero < 2 || !zero ? (double)table.numel
                   : on_gpu ? device_zero2_grad_floats(table, buckets, pieces, cfg.parallel.microbatches, each_micro,
                                                       kDeviceChunkBytes / sizeof(float))
                            : zero2_grad_floats(buckets, pieces, table.numel, cfg.parallel.overlap,
                                                cfg.parallel.microbatches, each_micro, head_writes_last,
                                                kPageBytes / sizeof(float));
    param_floats += cfg.parallel.zero < 3 || !zero ? (double)table.numel
                    : on_gpu ? device_zero3_param_floats(table, buckets, pieces, kDeviceChunkBytes / sizeof(float))
                             : zero3_param_floats(table, buckets, pieces, cfg.parallel.overlap, kPageBytes / sizeof(float));
    write_floats += checkpoint_write_floats(desc, part, table, zero, pieces, adamw, per_rank, world, rank, rc.tp,
                                            rc.tp_rank);
    const int slots = c < rc.slots.size() ? std::max(1, rc.slots[c]) : 1;
    double slot = (double)activation_bytes(desc, part, micro, seq_len, precision, cfg.runtime.recompute);
    if (rc.keeps_input_grads) slot += (double)kept_bytes(desc, part, micro, seq_len);
    e.activations += slots * slot;
  }
  const double nb = n * sizeof(float);
  e.n_params = (int64_t)n;
  e.params += param_floats * sizeof(float);
  e.grads = grad_floats * sizeof(float);
  e.optimizer = adamw ? 2 * (zero ? mine * sizeof(float) : nb) : 0;
  if (zero) {
    if (nccl) {  // ZeRO-1 over NCCL: W padded pieces on the device, fp32 and, for a bf16 gradient, bf16
      e.nccl_buffers = (double)world * largest_piece * (sizeof(float) + (grad_bf16 ? sizeof(uint16_t) : 0));
    } else {  // ... MPI: a reduce-scatter receive piece, and with allreduce the all-gather's padded
              // send piece and W padded pieces (comm/mpi_exchange.cpp)
      if (cfg.parallel.sync != SyncMethod::gather_scatter) e.sync_buffers += (double)(world + 1) * largest_piece * sizeof(float);
      e.sync_buffers += (double)largest_piece * sizeof(float);
    }
  } else if (nccl && world > 1 && grad_bf16) {
    e.nccl_buffers = (double)largest_bucket * sizeof(uint16_t);  // the largest bucket rounded to bf16
  }
  e.scratch = (double)backward_scratch_bytes(desc, micro, seq_len);
  e.scratch += (double)gemm_operand_scratch_bytes(desc, micro, seq_len, precision, on_gpu);
  // Gradient synchronisation.
  const SyncMethod sync = cfg.parallel.sync;
  if (world > 1 && sync == SyncMethod::gather_scatter && rank == 0) e.sync_buffers += 2.0 * world * largest_bucket * sizeof(float);
  if (world > 1 && on_gpu && sync != SyncMethod::nccl) e.sync_buffers += nb;  // pinned staging copy
  // Checkpoints (train/checkpointing.cpp): the staging a save keeps, or a resume's one state.
  const bool staged = cfg.checkpoint.every > 0 && (cfg.checkpoint.async || on_gpu);
  e.checkpoint_save = staged ? write_floats * sizeof(float) : 0.0;
  // (ZeRO-3 on the CPU reads its parameters in place: a resume holds only the moments' pieces)
  const bool params_in_place = cfg.parallel.zero >= 3 && zero && !on_gpu;
  e.checkpoint_staging = std::max(e.checkpoint_save, params_in_place ? mine * sizeof(float) : nb);
  // The batch on the host: inputs and targets (LM) or the example rows (classifier), plus a window.
  e.data = 5.0 * local_batch * (seq_len + 1.0) * sizeof(int32_t);
  return e;
}

std::string MemoryEstimate::describe() const {
  std::string s = "params " + format_bytes(params) + " + grads " + format_bytes(grads);
  if (optimizer > 0) s += " + AdamW state " + format_bytes(optimizer);
  s += " + activations " + format_bytes(activations) + " (" + std::to_string(micro_batch) + " × " +
       std::to_string(seq_len) + " tokens) + backward scratch " + format_bytes(scratch);
  if (nccl_buffers > 0) s += " + NCCL buffers " + format_bytes(nccl_buffers);
  if (on_gpu) s += " = " + format_bytes(device_bytes()) + " on the GPU; host: ";
  else s += " + ";
  if (sync_buffers > 0) s += "sync buffers " + format_bytes(sync_buffers) + " + ";
  s += "checkpoint staging (save or resume) " + format_bytes(checkpoint_staging) + " + batch " + format_bytes(data) +
       " = " + format_bytes(host_bytes());
  return s;
}

}  // namespace llmpi
