// Activations: one micro-batch's tensors on one Model (transformer.h), laid out in one allocation.
#include <algorithm>

#include "model/transformer.h"
#include "runtime/error.h"

namespace llmpi {

Activations::~Activations() {
  if (model) {
    model->ops->free(mem_);
    model->ops->free(ids_);
    model->ops->free(kept);
  }
}

void Activations::reserve_kept(size_t floats) {
  if (!model) fail("internal: reserve_kept before allocate");
  if (floats <= kept_floats) return;
  model->ops->free(kept);
  bytes_ -= kept_floats * sizeof(float);
  kept = static_cast<float*>(model->ops->alloc(floats * sizeof(float)));
  kept_floats = floats;
  bytes_ += floats * sizeof(float);
}

void Activations::allocate(const Model& m, int B_, int T_) {
  const ModelDesc& d = m.desc;
  if (T_ > d.max_seq_len)
    fail("sequence length ", T_, " exceeds the model's max_seq_len ", d.max_seq_len);
  const int lm_rows_ = m.part.head && d.head == HeadKind::lm
                          ? (all_logits ? B_ * T_ : lm_head_chunk_rows(d, B_ * T_)) : 0;
  if (model == &m && B == B_ && T == T_ && attention == d.attention && lm_rows == lm_rows_ &&
      bf16_planned_ == bf16_operands && recompute_planned_ == m.recompute)
    return;
  if (model) {
    model->ops->free(mem_);
    model->ops->free(ids_);
    model->ops->free(kept);
  }
  kept = nullptr;
  kept_floats = kept_used = 0;
  deferred.clear();
  weight_grads_pending = false;
  model = &m;
  B = B_;
  T = T_;
  attention = d.attention;
  lm_rows = lm_rows_;
  head_grad = false;
  bf16_planned_ = bf16_operands;
  recompute_planned_ = m.recompute;
  shared_layer = -1;
  // bf16 operands ("bf16 weight copy" in transformer.h): the pre-norm norms' outputs and the MLP's
  // activation output (read only by GEMMs) kept only in bf16, the LM head's logits gradient in
  // bf16. Their buffers are planned in floats (2 values each) through `half`, whose pointers
  // become the uint16 ones after the allocation.
  const bool bf16 = m.precision == GemmPrecision::bf16 && bf16_operands;
  // (with sequence parallelism the norms' outputs are gathered as fp32: kept in fp32)
  const bool norms16 = bf16 && d.pre_norm && !d.seq_shards();
  std::vector<std::pair<uint16_t**, float*>> half;
  half.reserve(3 * (m.part.l1 - m.part.l0) + 2);
  final_norm = nullptr;
  final_norm_bf16 = logits_grad_bf16 = nullptr;
  // Full attention keeps P [B, NH, T, T] per layer, fused attention one lse per query row.
  const bool fused = attention == AttentionImpl::fused;
  const size_t N = static_cast<size_t>(B) * T, C = d.d_model;
  // The residual stream's rows: all N, or with sequence parallelism this rank's Nr = N / tp.
  const size_t Nr = static_cast<size_t>(d.residual_rows(static_cast<int>(N)));
  const size_t att = fused ? 0 : static_cast<size_t>(B) * d.heads() * T * T;
  const size_t lse = fused ? static_cast<size_t>(B) * d.heads() * T : 0;
  const size_t QKV = d.qkv_dim(), FC = d.fc_dim(), F = d.ffn(), AY = static_cast<size_t>(d.heads()) * d.head_dim();
  std::vector<std::pair<float**, size_t>> plan = {{&input, Nr * C}, {&dresidual, Nr * C}, {&tmp, N * C}};
  gathered = scattered = nullptr;
  if (d.seq_shards()) plan.insert(plan.end(), {{&gathered, N * C}, {&scattered, Nr * C}});
  if (m.part.embedding && d.embedding_norm)
    plan.insert(plan.end(), {{&emb_sum, Nr * C}, {&emb_mean, Nr}, {&emb_rstd, Nr}});
  // n values of 2 bytes, planned in floats
  auto plan_half = [&](uint16_t** p, size_t n) {
    half.push_back({p, nullptr});
    plan.push_back({&half.back().second, (n + 1) / 2});
  };
  // a norm's output: fp32, or only bf16
  auto plan_norm = [&](float** p, uint16_t** p16) {
    if (norms16) plan_half(p16, Nr * C);
    else plan.push_back({p, Nr * C});
  };
  // Recomputation ("Activation recomputation" in transformer.h): a shared tensor is planned for
  // the first block only, and the other blocks point at it.
  using F32 = float* Layer::*;
  using F16 = uint16_t* Layer::*;
  std::vector<F32> shared32;
  std::vector<F16> shared16;
  if (m.recompute == Recompute::selective) {
    shared32 = {&Layer::act, &Layer::att};
    shared16 = {&Layer::act_bf16};
    if (d.pre_norm) {
      shared32.insert(shared32.end(), {&Layer::norm1, &Layer::norm2});
      shared16.insert(shared16.end(), {&Layer::norm1_bf16, &Layer::norm2_bf16});
    }
  } else if (m.recompute == Recompute::full) {  // all but the block's output
    shared32 = {&Layer::norm1, &Layer::norm1_mean, &Layer::norm1_rstd, &Layer::qkv, &Layer::atty, &Layer::att,
                &Layer::lse, &Layer::res_attn, &Layer::norm2, &Layer::norm2_mean, &Layer::norm2_rstd, &Layer::fc,
                &Layer::act};
    if (!d.pre_norm) shared32.push_back(&Layer::res_mlp);  // (pre-norm: res_mlp is the output)
    shared16 = {&Layer::norm1_bf16, &Layer::norm2_bf16, &Layer::act_bf16};
  }
  auto is_shared32 = [&](F32 f) { return std::find(shared32.begin(), shared32.end(), f) != shared32.end(); };
  auto is_shared16 = [&](F16 f) { return std::find(shared16.begin(), shared16.end(), f) != shared16.end(); };
  layers.assign(m.part.l1 - m.part.l0, {});
  for (size_t i = 0; i < layers.size(); i++) {
    Layer& L = layers[i];
    auto f32 = [&](F32 f, size_t n) {
      if (i == 0 || !is_shared32(f)) plan.push_back({&(L.*f), n});
    };
    auto f16 = [&](F16 f, size_t n) {
      if (i == 0 || !is_shared16(f)) plan_half(&(L.*f), n);
    };
    auto norm = [&](F32 f, F16 f_bf16) {  // a norm's output: fp32, or only bf16
      if (norms16) f16(f_bf16, Nr * C);
      else f32(f, Nr * C);
    };
    norm(&Layer::norm1, &Layer::norm1_bf16);
    f32(&Layer::norm1_mean, Nr);
    f32(&Layer::norm1_rstd, Nr);
    f32(&Layer::qkv, N * QKV);
    f32(&Layer::atty, N * AY);
    if (fused) f32(&Layer::lse, lse);
    else f32(&Layer::att, att);
    f32(&Layer::res_attn, Nr * C);
    norm(&Layer::norm2, &Layer::norm2_bf16);
    f32(&Layer::norm2_mean, Nr);
    f32(&Layer::norm2_rstd, Nr);
    f32(&Layer::fc, N * FC);
    if (bf16) f16(&Layer::act_bf16, N * F);
    else f32(&Layer::act, N * F);
    f32(&Layer::res_mlp, Nr * C);
    if (!d.pre_norm) f32(&Layer::out, Nr * C);
  }
  // A bf16 LM head's logits gradient in bf16; the chunk buffers' rows padded (logits_ld).
  const bool bf16_grad = bf16 && m.part.head && d.head == HeadKind::lm && !all_logits && d.tp == 1;
  logits_ld = !m.part.head ? 0
              : d.head == HeadKind::lm ? (all_logits ? d.vocab_rows() : lm_logits_row_stride(d.vocab_rows()))
                                       : d.num_labels;
  if (m.part.head) {
    if (d.head == HeadKind::lm) {
      plan_norm(&final_norm, &final_norm_bf16);
      plan.insert(plan.end(), {{&final_mean, Nr}, {&final_rstd, Nr},
                               {&logits, static_cast<size_t>(lm_rows) * logits_ld}, {&losses, N}});
      if (bf16_grad) plan_half(&logits_grad_bf16, static_cast<size_t>(lm_rows) * logits_ld);
      if (d.tp > 1) plan.push_back({&xent_stats, 3 * static_cast<size_t>(lm_rows)});
    } else {
      const size_t BC = static_cast<size_t>(B) * C;
      plan.insert(plan.end(), {{&cls, BC}, {&pooled_pre, BC}, {&pooled, BC}, {&pooled_drop, BC},
                               {&logits, static_cast<size_t>(B) * d.num_labels}, {&losses, static_cast<size_t>(B)}});
    }
  }
  size_t total = 0;
  for (auto& e : plan) total += activation_floats_aligned(e.second);  // every tensor 256-byte aligned
  mem_ = static_cast<float*>(m.ops->alloc(total * sizeof(float)));
  size_t off = 0;
  for (auto& e : plan) {
    *e.first = mem_ + off;
    off += activation_floats_aligned(e.second);
  }
  for (auto& h : half) *h.first = reinterpret_cast<uint16_t*>(h.second);
  for (size_t i = 1; i < layers.size(); i++) {
    for (F32 f : shared32) layers[i].*f = layers[0].*f;
    for (F16 f : shared16) layers[i].*f = layers[0].*f;
  }
  for (Layer& L : layers)
    if (d.pre_norm) L.out = L.res_mlp;
  // The ids, then the step's scalars (zero: no bad target yet; 4·N int32 keep them 8-byte aligned).
  ids_ = static_cast<int32_t*>(m.ops->alloc(4 * N * sizeof(int32_t) + sizeof(StepScalars)));
  tokens = ids_;
  targets = ids_ + N;
  token_types = ids_ + 2 * N;
  attn_mask = ids_ + 3 * N;
  scalars = reinterpret_cast<StepScalars*>(ids_ + 4 * N);
  losses_host.resize(m.rows_for_loss(B, T));
  bytes_ = total * sizeof(float) + 4 * N * sizeof(int32_t) + sizeof(StepScalars);
}
}  // namespace llmpi
