// The one list of what a part of the model keeps and scratches for one micro-batch: the tensors
// of its Activations (laid out by Activations::allocate in this order), the output gradients an
// input-only backward keeps (Model::kept_floats), and the backward's scratch
// (Model::ensure_scratch). The memory estimate (memory_estimate.h) and llmpi-plan count these
// same lists, so what they say is what is allocated.
//
// Counts are in floats; a tensor of 2-byte values (bf16) is planned as half as many floats,
// rounded up. They are exact products of the description's and the batch's ints (128-bit
// PlanCount), so a count int64 cannot hold is refused by the estimate instead of wrapping.
//
// What an Activations keeps (with tensor parallelism H, QKV, FC, F and the vocabulary rows V are
// this rank's; with sequence parallelism the residual stream's tensors hold Nr = N / tp rows):
//   before the blocks   input, dresidual (Nr·C), tmp (N·C); SP: gathered N·C, scattered Nr·C;
//                       the embedding norm's sum Nr·C, mean, rstd (Nr) with the embedding
//   per block           norm1, mean, rstd, qkv N·QKV, atty N·H·hd, att B·H·T² (fused: lse B·H·T),
//                       res_attn, norm2, mean, rstd, fc N·FC, act N·F, res_mlp, post-norm's out
//                       (N·C-sized ones on the residual rows). A bf16 model with bf16 operands keeps
//                       act only in bf16, and a pre-norm one (without SP, whose gathers take fp32)
//                       its norms' outputs too
//   recomputation       `shared` tensors are held once, by the first block, the others pointing
//                       at them: selective: act, att, pre-norm's norm outputs; full: all but the
//                       block's output
//   LM head             the final norm's output, mean, rstd; the chunk buffer R·ld (R =
//                       lm_head_chunk_rows, ld = lm_logits_row_stride(V); all_logits: N·V);
//                       losses N; bf16 (tp = 1, not all_logits): the logits gradient's bf16
//                       chunk R·ld; tp > 1: xent_stats 3·R
//   classifier          cls, pooled_pre, pooled, pooled_drop B·C; logits B·K; losses B
// Every tensor starts 256-byte aligned (activation_floats_aligned); the ids (4·N int32) and the
// step's scalars are one more allocation (ids_bytes).
#pragma once
#include <cstdint>
#include <vector>

#include "model/transformer.h"

namespace llmpi {

using PlanCount = unsigned __int128;

// B sequences of T tokens as the kernels' row count N = B·T; throws Error naming the keys
// (parallel.microbatches, train.global_batch, model.seq_len) when N exceeds INT_MAX.
int token_rows_checked(int B, int T);

// One tensor: which pointer of the Activations (or of each block's Layer) it is, exactly one of
// the four set, and its floats.
struct PlannedTensor {
  float* Activations::*f32 = nullptr;
  uint16_t* Activations::*f16 = nullptr;
  float* Activations::Layer::*layer32 = nullptr;
  uint16_t* Activations::Layer::*layer16 = nullptr;
  PlanCount floats = 0;
  bool shared = false;  // a block's tensor held once, by the first block (recomputation)
};

struct ActivationPlan {
  std::vector<PlannedTensor> before;  // in layout order
  std::vector<PlannedTensor> block;   // one block's, in layout order; repeated for each block
  std::vector<PlannedTensor> after;   // the head's
  int blocks = 0;
  int lm_rows = 0;    // rows of the LM head's chunk buffer (0 without an LM head)
  int logits_ld = 0;  // its row stride (classifier: the labels)
  PlanCount ids_bytes = 0;
  // Floats of every tensor, each rounded up to activation_floats_aligned, plus ids_bytes in bytes.
  PlanCount bytes() const;
};

// Rows of the LM head's chunk buffer for B x T tokens (0 for a part without an LM head): every
// row's with all_logits, else lm_head_chunk_rows. ActivationPlan::lm_rows.
int plan_lm_rows(const ModelDesc& d, const ModelPart& part, int B, int T, bool all_logits);

// What Activations::allocate lays out for part of a model described by d, with B x T tokens, the
// dense layers' precision, recomputation, and the Activations' bf16_operands / all_logits
// (transformer.h).
ActivationPlan plan_activations(const ModelDesc& d, const ModelPart& part, int B, int T, GemmPrecision precision,
                                Recompute recompute, bool bf16_operands, bool all_logits);

// Floats an input-only backward keeps for part (Model::kept_floats): per block the output
// gradients of the MLP's projection and first layer, attention's output projection and QKV; the
// classifier's pooler (the classifier's own is the logits gradient; the LM head's is recomputed).
PlanCount plan_kept_floats(const ModelDesc& d, const ModelPart& part, int B, int T);

// The backward's scratch (Model::ensure_scratch), in its order: d_a, d_b N·C; d_qkv N·QKV; d_fc
// N·FC; d_act N·F (GELU tanh: 0, its backward is one op); d_att B·H·T² (fused: 0); d_small 3·B·C;
// SP: d_full N·C and d_norm 2·C (else 0). Each rounded up to 16 floats where it is placed.
constexpr int kScratchBuffers = 9;
struct ScratchPlan {
  PlanCount floats[kScratchBuffers];
  PlanCount total() const;  // Σ of each rounded up to 16
};
ScratchPlan plan_backward_scratch(const ModelDesc& d, int B, int T);

}  // namespace llmpi
