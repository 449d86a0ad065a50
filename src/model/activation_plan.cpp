#include "model/activation_plan.h"

#include <climits>

#include "runtime/error.h"

namespace llmpi {

int token_rows_checked(int B, int T) {
  const int64_t N = int64_t(B) * T;
  if (N > INT_MAX)
    fail("one micro-batch of ", B, " sequences x ", T, " tokens (model.seq_len) is ", N, " token rows, more than ",
         INT_MAX, ", the most the kernels take (an int): use more parallel.microbatches, a smaller "
         "train.global_batch or a shorter model.seq_len");
  return static_cast<int>(N);
}

namespace {

using Layer = Activations::Layer;

PlanCount half(PlanCount values) { return (values + 1) / 2; }  // 2-byte values, in floats
PlanCount aligned16(PlanCount floats) { return (floats + 15) / 16 * 16; }  // the model's 64-byte alignment
PlanCount aligned64(PlanCount floats) { return (floats + 63) / 64 * 64; }  // activation_floats_aligned

PlannedTensor top(float* Activations::*f, PlanCount floats) {
  PlannedTensor t;
  t.f32 = f;
  t.floats = floats;
  return t;
}
PlannedTensor top16(uint16_t* Activations::*f, PlanCount values) {
  PlannedTensor t;
  t.f16 = f;
  t.floats = half(values);
  return t;
}

// One block's tensors, in layout order, with the ones recomputation holds once marked shared.
std::vector<PlannedTensor> block_tensors(const ModelDesc& d, int B, int T, Recompute recompute, bool bf16,
                                         bool norms16) {
  const PlanCount N = PlanCount(B) * T, C = PlanCount(d.d_model), Nr = PlanCount(d.residual_rows(int(N)));
  const PlanCount heads = PlanCount(B) * d.heads() * T;  // rows of attention's state
  const PlanCount AY = PlanCount(d.heads()) * d.head_dim();
  // the block's output (the next block's input) is the one tensor full recomputation keeps per block
  auto is_output = [&](float* Layer::*f) { return f == (d.pre_norm ? &Layer::res_mlp : &Layer::out); };
  auto selective = [&](float* Layer::*f32, uint16_t* Layer::*f16) {
    const bool norm = f32 == &Layer::norm1 || f32 == &Layer::norm2 || f16 == &Layer::norm1_bf16 ||
                      f16 == &Layer::norm2_bf16;
    return f32 == &Layer::act || f32 == &Layer::att || f16 == &Layer::act_bf16 || (d.pre_norm && norm);
  };
  std::vector<PlannedTensor> list;
  auto add = [&](float* Layer::*f32, uint16_t* Layer::*f16, PlanCount floats) {
    PlannedTensor t;
    t.layer32 = f32;
    t.layer16 = f16;
    t.floats = floats;
    t.shared = recompute == Recompute::full        ? !(f32 && is_output(f32))
               : recompute == Recompute::selective ? selective(f32, f16)
                                                   : false;
    list.push_back(t);
  };
  auto norm = [&](float* Layer::*f32, uint16_t* Layer::*f16) {  // a norm's output: fp32, or only bf16
    if (norms16) add(nullptr, f16, half(Nr * C));
    else add(f32, nullptr, Nr * C);
  };
  norm(&Layer::norm1, &Layer::norm1_bf16);
  add(&Layer::norm1_mean, nullptr, Nr);
  add(&Layer::norm1_rstd, nullptr, Nr);
  add(&Layer::qkv, nullptr, N * PlanCount(d.qkv_dim()));
  add(&Layer::atty, nullptr, N * AY);
  if (d.attention == AttentionImpl::fused) add(&Layer::lse, nullptr, heads);
  else add(&Layer::att, nullptr, heads * T);
  add(&Layer::res_attn, nullptr, Nr * C);
  norm(&Layer::norm2, &Layer::norm2_bf16);
  add(&Layer::norm2_mean, nullptr, Nr);
  add(&Layer::norm2_rstd, nullptr, Nr);
  add(&Layer::fc, nullptr, N * PlanCount(d.fc_dim()));
  if (bf16) add(nullptr, &Layer::act_bf16, half(N * PlanCount(d.ffn())));
  else add(&Layer::act, nullptr, N * PlanCount(d.ffn()));
  add(&Layer::res_mlp, nullptr, Nr * C);
  if (!d.pre_norm) add(&Layer::out, nullptr, Nr * C);  // (pre-norm: out is res_mlp)
  return list;
}

}  // namespace

int plan_lm_rows(const ModelDesc& d, const ModelPart& part, int B, int T, bool all_logits) {
  if (!part.head || d.head != HeadKind::lm) return 0;
  const int rows = token_rows_checked(B, T);
  return all_logits ? rows : lm_head_chunk_rows(d, rows);
}

ActivationPlan plan_activations(const ModelDesc& d, const ModelPart& part, int B, int T, GemmPrecision precision,
                                Recompute recompute, bool bf16_operands, bool all_logits) {
  using A = Activations;
  const int rows = token_rows_checked(B, T);
  const PlanCount N = PlanCount(rows), C = PlanCount(d.d_model), Nr = PlanCount(d.residual_rows(rows));
  // bf16 operands ("bf16 weight copy" in transformer.h): the MLP's activation output and a
  // pre-norm model's norm outputs (not with sequence parallelism, whose gathers take fp32) kept
  // only in bf16, the LM head's logits gradient in bf16
  const bool bf16 = precision == GemmPrecision::bf16 && bf16_operands;
  const bool norms16 = bf16 && d.pre_norm && !d.seq_shards();
  const bool lm = part.head && d.head == HeadKind::lm;
  ActivationPlan p;
  p.blocks = (part.l1 < 0 ? d.n_layer : part.l1) - part.l0;
  p.lm_rows = plan_lm_rows(d, part, B, T, all_logits);
  p.logits_ld = !part.head ? 0
                : lm       ? (all_logits ? d.vocab_rows() : lm_logits_row_stride(d.vocab_rows()))
                           : d.num_labels;
  p.before = {top(&A::input, Nr * C), top(&A::dresidual, Nr * C), top(&A::tmp, N * C)};
  if (d.seq_shards()) p.before.insert(p.before.end(), {top(&A::gathered, N * C), top(&A::scattered, Nr * C)});
  if (part.embedding && d.embedding_norm)
    p.before.insert(p.before.end(), {top(&A::emb_sum, Nr * C), top(&A::emb_mean, Nr), top(&A::emb_rstd, Nr)});
  if (p.blocks > 0) p.block = block_tensors(d, B, T, recompute, bf16, norms16);
  if (lm) {
    const PlanCount chunk = PlanCount(p.lm_rows) * p.logits_ld;
    p.after.push_back(norms16 ? top16(&A::final_norm_bf16, Nr * C) : top(&A::final_norm, Nr * C));
    p.after.insert(p.after.end(), {top(&A::final_mean, Nr), top(&A::final_rstd, Nr), top(&A::logits, chunk),
                                   top(&A::losses, N)});
    if (bf16 && !all_logits && d.tp == 1) p.after.push_back(top16(&A::logits_grad_bf16, chunk));
    if (d.tp > 1) p.after.push_back(top(&A::xent_stats, 3 * PlanCount(p.lm_rows)));
  } else if (part.head) {
    const PlanCount BC = PlanCount(B) * C;
    p.after = {top(&A::cls, BC),    top(&A::pooled_pre, BC), top(&A::pooled, BC), top(&A::pooled_drop, BC),
               top(&A::logits, PlanCount(B) * d.num_labels), top(&A::losses, PlanCount(B))};
  }
  // the ids (tokens, targets, token types, mask), then the step's scalars
  p.ids_bytes = 4 * N * sizeof(int32_t) + sizeof(StepScalars);
  return p;
}

PlanCount ActivationPlan::bytes() const {
  PlanCount floats = 0, block_all = 0, block_own = 0;
  for (const PlannedTensor& t : before) floats += aligned64(t.floats);
  for (const PlannedTensor& t : after) floats += aligned64(t.floats);
  for (const PlannedTensor& t : block) {
    block_all += aligned64(t.floats);
    if (!t.shared) block_own += aligned64(t.floats);
  }
  if (blocks > 0) floats += block_all + PlanCount(blocks - 1) * block_own;
  return floats * sizeof(float) + ids_bytes;
}

PlanCount plan_kept_floats(const ModelDesc& d, const ModelPart& part, int B, int T) {
  const PlanCount N = PlanCount(token_rows_checked(B, T)), C = PlanCount(d.d_model);
  const int blocks = (part.l1 < 0 ? d.n_layer : part.l1) - part.l0;
  PlanCount n = PlanCount(blocks) * (2 * aligned16(N * C) + aligned16(N * PlanCount(d.fc_dim())) +
                                     aligned16(N * PlanCount(d.qkv_dim())));
  if (part.head && d.head == HeadKind::classifier) n += aligned16(PlanCount(B) * C);
  return n;
}

ScratchPlan plan_backward_scratch(const ModelDesc& d, int B, int T) {
  const PlanCount N = PlanCount(token_rows_checked(B, T)), C = PlanCount(d.d_model);
  const PlanCount att = d.attention == AttentionImpl::fused ? 0 : PlanCount(B) * d.heads() * T * T;
  const PlanCount act = d.mlp == MlpKind::gelu_tanh ? 0 : N * PlanCount(d.ffn());
  const bool sp = d.seq_shards();
  return {{N * C, N * C, N * PlanCount(d.qkv_dim()), N * PlanCount(d.fc_dim()), act, att, 3 * PlanCount(B) * C,
           sp ? N * C : 0, sp ? 2 * C : 0}};
}

PlanCount ScratchPlan::total() const {
  PlanCount t = 0;
  for (PlanCount f : floats) t += aligned16(f);
  return t;
}

}  // namespace llmpi
