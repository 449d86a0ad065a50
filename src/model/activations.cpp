// Activations: one micro-batch's tensors on one Model (transformer.h), laid out in one allocation.
#include "model/activation_plan.h"
#include "model/transformer.h"
#include "runtime/error.h"

namespace llmpi {

Activations::~Activations() {
  if (model) {
    model->ops->free(mem_);
    model->ops->free(ids_);
    model->ops->free(input_only.kept);
  }
}

void Activations::reserve_kept(size_t floats) {
  if (!model) fail("internal: reserve_kept before allocate");
  if (floats <= input_only.kept_floats) return;
  model->ops->free(input_only.kept);
  bytes_ -= input_only.kept_floats * sizeof(float);
  input_only.kept = static_cast<float*>(model->ops->alloc(floats * sizeof(float)));
  input_only.kept_floats = floats;
  bytes_ += floats * sizeof(float);
}

// The layout is plan_activations' (model/activation_plan.h), in its order. Called by every
// load_batch: the plan is made only when the layout changes.
void Activations::allocate(const Model& m, int B_, int T_) {
  const ModelDesc& d = m.desc;
  if (T_ > d.max_seq_len)
    fail("sequence length ", T_, " exceeds the model's max_seq_len ", d.max_seq_len);
  if (model == &m && B == B_ && T == T_ && attention == d.attention &&
      lm_rows == plan_lm_rows(d, m.part, B_, T_, all_logits) && bf16_planned_ == bf16_operands &&
      recompute_planned_ == m.recompute)
    return;
  const ActivationPlan plan =
      plan_activations(d, m.part, B_, T_, m.precision, m.recompute, bf16_operands, all_logits);
  if (model) {
    model->ops->free(mem_);
    model->ops->free(ids_);
    model->ops->free(input_only.kept);
  }
  input_only = {};
  model = &m;
  B = B_;
  T = T_;
  attention = d.attention;
  lm_rows = plan.lm_rows;
  logits_ld = plan.logits_ld;
  head_pass = {};
  bf16_planned_ = bf16_operands;
  recompute_planned_ = m.recompute;
  shared_layer = -1;
  for (float* Activations::*f : {&Activations::input, &Activations::dresidual, &Activations::tmp,
                                 &Activations::gathered, &Activations::scattered, &Activations::emb_sum,
                                 &Activations::emb_mean, &Activations::emb_rstd, &Activations::final_norm,
                                 &Activations::final_mean, &Activations::final_rstd, &Activations::logits,
                                 &Activations::losses, &Activations::xent_stats, &Activations::cls,
                                 &Activations::pooled_pre, &Activations::pooled, &Activations::pooled_drop})
    this->*f = nullptr;
  final_norm_bf16 = logits_grad_bf16 = nullptr;
  layers.assign(plan.blocks, {});
  const size_t total = static_cast<size_t>(plan.bytes()) - static_cast<size_t>(plan.ids_bytes);
  mem_ = static_cast<float*>(m.ops->alloc(total));
  size_t off = 0;
  auto place = [&](const PlannedTensor& t, Layer* L) {
    float* at = mem_ + off;
    off += activation_floats_aligned(static_cast<size_t>(t.floats));  // (every tensor 256-byte aligned)
    uint16_t* at16 = reinterpret_cast<uint16_t*>(at);
    if (t.f32) this->*t.f32 = at;
    else if (t.f16) this->*t.f16 = at16;
    else if (t.layer32) L->*t.layer32 = at;
    else L->*t.layer16 = at16;
  };
  for (const PlannedTensor& t : plan.before) place(t, nullptr);
  for (size_t i = 0; i < layers.size(); i++)
    for (const PlannedTensor& t : plan.block) {
      if (i == 0 || !t.shared) place(t, &layers[i]);
      else if (t.layer32) layers[i].*t.layer32 = layers[0].*t.layer32;
      else layers[i].*t.layer16 = layers[0].*t.layer16;
    }
  for (const PlannedTensor& t : plan.after) place(t, nullptr);
  for (Layer& L : layers)
    if (d.pre_norm) L.out = L.res_mlp;
  // The ids, then the step's scalars (zero: no bad target yet; 4·N int32 keep them 8-byte aligned).
  const size_t N = static_cast<size_t>(B) * T;
  ids_ = static_cast<int32_t*>(m.ops->alloc(static_cast<size_t>(plan.ids_bytes)));
  tokens = ids_;
  targets = ids_ + N;
  token_types = ids_ + 2 * N;
  attn_mask = ids_ + 3 * N;
  scalars = reinterpret_cast<StepScalars*>(ids_ + 4 * N);
  losses_host.resize(m.rows_for_loss(B, T));
  bytes_ = static_cast<size_t>(plan.bytes());
}

}  // namespace llmpi
