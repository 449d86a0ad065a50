// Shared by the model tests: descriptions of tiny models of each family, random batches, and
// host views of a model's parameters and gradients.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "model/transformer.h"
#include "runtime/config.h"
#include "runtime/rng.h"

namespace llmpi::test {

// The description the configuration gives for `family` with these sizes (plus extra model.* sets,
// e.g. "model.n_kv_head=1").
inline ModelDesc desc_of(const std::string& family, int n_layer, int n_head, int d_model, int seq_len, int vocab,
                         const std::vector<std::string>& extra = {}) {
  std::vector<std::string> sets = {"data.train=-", "model.family=" + family, "model.n_layer=" + std::to_string(n_layer),
                                   "model.n_head=" + std::to_string(n_head), "model.d_model=" + std::to_string(d_model),
                                   "model.seq_len=" + std::to_string(seq_len)};
  if (family == "bert") sets.insert(sets.end(), {"model.dropout=0", "model.attn_dropout=0"});
  sets.insert(sets.end(), extra.begin(), extra.end());
  return model_desc_from_config(parse_config("{}", "test", sets).model, vocab);
}

// Owns the host arrays of a random batch for a model of description d: LM tokens/targets, or
// classification tokens, token types (two segments), a padding mask (sequence b keeps
// T - b % (T/2) tokens) and labels.
struct RandomBatch {
  std::vector<int32_t> tokens, targets, types, mask, labels;
  Batch b;
  RandomBatch(const ModelDesc& d, int B, int T, uint64_t seed) {
    Rng rng(seed);
    tokens.resize((size_t)B * T);
    for (auto& x : tokens) x = (int32_t)rng.below(d.vocab_size);
    b.B = B;
    b.T = T;
    b.tokens = tokens.data();
    if (d.head == HeadKind::lm) {
      targets.resize((size_t)B * T);
      for (auto& x : targets) x = (int32_t)rng.below(d.vocab_size);
      b.targets = targets.data();
    } else {
      types.resize((size_t)B * T);
      mask.resize((size_t)B * T);
      labels.resize(B);
      for (int i = 0; i < B; i++) {
        const int len = T - i % std::max(1, T / 2);
        for (int t = 0; t < T; t++) {
          types[(size_t)i * T + t] = t >= len / 2 ? 1 : 0;
          mask[(size_t)i * T + t] = t < len ? 1 : 0;
        }
        labels[i] = (int32_t)rng.below(d.num_labels);
      }
      b.token_types = types.data();
      b.attn_mask = mask.data();
      b.labels = labels.data();
    }
  }
};

// Losses of `steps` AdamW steps (clip at 1, weight decay on the decayed tensors) over a fixed set
// of 4 random batches (B 4, T 16), from the same initial parameters, on the CPU backend with the
// GEMMs in `prec` (test_precision.cpp, test_flash_bf16.cpp).
inline std::vector<float> training_losses(const ModelDesc& d, GemmPrecision prec, int steps) {
  const int B = 4, T = 16;
  Model m(d, cpu_ops(), ModelPart::whole(), prec);
  Activations a(m, B, T);
  m.init_params(21);
  std::vector<RandomBatch> data;
  data.reserve(4);  // a RandomBatch's Batch points into its own vectors: never reallocate
  for (int k = 0; k < 4; k++) data.emplace_back(d, B, T, 30 + k);
  const size_t n = m.table.numel;
  std::vector<float> mom(n, 0.0f), vel(n, 0.0f);
  std::vector<float> losses;
  for (int step = 1; step <= steps; step++) {
    m.zero_grads();
    losses.push_back(m.forward(a, data[step % 4].b, HeadMode::train));
    m.backward(a);
    const double norm = std::sqrt(cpu_ops().sum_squares(m.grads, n));
    if (norm > 1.0) cpu_ops().scale(m.grads, static_cast<float>(1.0 / norm), n);
    for (const ParamSlice& s : m.table.slices)
      cpu_ops().adamw_update(m.params + s.offset, m.grads + s.offset, mom.data() + s.offset, vel.data() + s.offset,
                             s.numel, 3e-3f, 0.9f, 0.95f, 1e-8f, s.decay ? 0.1f : 0.0f, step);
  }
  return losses;
}

// Whether weight_backward adds all of slice s's gradient in part m (an input-only backward adds
// none of it): a dense layer's weight or bias, the embedding's tensors (its whole backward waits
// for the weight pass), or the token embedding of a part holding the tied LM head without the
// embedding (test_backward_split.cpp, test_mpi_pipeline.cpp).
inline bool added_by_weight_pass(const Model& m, const ParamSlice& s) {
  switch (s.role) {
    case kQkvW: case kQkvB: case kAttnOutW: case kAttnOutB: case kFcW: case kFcB: case kProjW: case kProjB:
    case kLmHead: case kClsW: case kClsB: case kPoolerW: case kPoolerB:
      return true;
    case kPosEmb: case kTypeEmb: case kEmbNormW: case kEmbNormB:
      return m.part.embedding;
    case kTokEmb:
      return m.part.embedding ||
             (m.part.head && m.desc.head == HeadKind::lm && m.desc.tie_embeddings);
    default:
      return false;
  }
}

// How far a loss curve strays from a reference one: per step |other - ref| / ref, the largest
// of them, and whether the two curves are the same bits (a precision mode that changed nothing).
// (A loss is a mean of positive row losses: relative to it nothing cancels. The bound each caller
// holds it to is the caller's, derived beside the check.)
struct CurveGap {
  std::vector<double> per_step;
  double worst = 0;
  bool identical = true;
};
inline CurveGap curve_gap(const std::vector<float>& ref, const std::vector<float>& other) {
  CurveGap g;
  for (size_t s = 0; s < ref.size() && s < other.size(); s++) {
    g.per_step.push_back(std::fabs(static_cast<double>(other[s]) - ref[s]) / ref[s]);
    g.worst = std::max(g.worst, g.per_step.back());
    g.identical = g.identical && other[s] == ref[s];
  }
  g.identical = g.identical && ref.size() == other.size();
  return g;
}

// ---- a model's gradients: the magnitude of what they sum ----------------------------------------------

// Σ_b |g_b| / B per parameter, g_b the gradient of example b's loss alone (the batch's gradient is
// the mean of the g_b): the magnitude of what each gradient sums over the batch. Where the
// examples' parts cancel (a classifier bias on near-uniform predictions) the gradient is far
// smaller than what was summed, and so is its own norm against the rounding. `dropout` keys each
// example's masks (off by default: the magnitudes of the same model without dropout).
inline std::vector<double> gradient_magnitude(Model& m, const Batch& batch, int B, int T,
                                              const DropoutContext& dropout = {}) {
  std::vector<double> mag(m.table.numel, 0.0);
  for (int b = 0; b < B; b++) {
    Batch one = batch;
    one.B = 1;
    one.tokens += (size_t)b * T;
    if (one.targets) one.targets += (size_t)b * T;
    if (one.token_types) one.token_types += (size_t)b * T;
    if (one.attn_mask) one.attn_mask += (size_t)b * T;
    if (one.labels) one.labels += b;
    Activations a(m, 1, T);
    a.dropout = dropout;
    m.zero_grads();
    m.forward(a, one, HeadMode::train);
    m.backward(a);
    const std::vector<float> g = m.grads_host();
    for (size_t i = 0; i < g.size(); i++) mag[i] += std::fabs((double)g[i]) / B;
  }
  m.zero_grads();
  return mag;
}

// ‖a − b‖ / ‖m‖ over n values (Euclidean norms): a difference against the magnitude of what was
// summed (the absolute difference where m is 0).
inline double rel_to_magnitude(const float* a, const float* b, const double* m, size_t n) {
  double d = 0, mm = 0;
  for (size_t i = 0; i < n; i++) {
    d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    mm += m[i] * m[i];
  }
  return mm > 0 ? std::sqrt(d / mm) : std::sqrt(d);
}

}  // namespace llmpi::test
