// Shared by the recomputation tests (test_recompute.cpp on the CPU, test_cuda_recompute.cpp on
// the CUDA backend): tiny models of every family, and one training forward and backward of a whole
// model (two micro-batches) or of a part without the embedding, with a given runtime.recompute.
#pragma once
#include <cstring>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "model_test_util.h"

namespace llmpi::test {

struct RecomputeCase {
  std::string name, family;
  std::vector<std::string> extra;
  AttentionImpl attention = AttentionImpl::full;
  GemmPrecision precision = GemmPrecision::fp32;
};

inline std::vector<RecomputeCase> recompute_cases() {
  return {
      {"gpt2 dropout", "gpt2", {"model.dropout=0.1"}},
      {"gpt2 fused bf16", "gpt2", {"model.dropout=0.1"}, AttentionImpl::fused, GemmPrecision::bf16},
      {"gpt2 bf16", "gpt2", {}, AttentionImpl::full, GemmPrecision::bf16},
      {"llama kv1", "llama", {"model.n_kv_head=1"}},
      {"llama fused bf16", "llama", {"model.n_kv_head=1"}, AttentionImpl::fused, GemmPrecision::bf16},
      {"bert dropout", "bert", {"model.dropout=0.1", "model.attn_dropout=0.1"}},
      {"bert fused bf16", "bert", {"model.dropout=0.1", "model.attn_dropout=0.1"}, AttentionImpl::fused,
       GemmPrecision::bf16},
  };
}

constexpr int kLayers = 3, kB = 2, kT = 9;

inline ModelDesc recompute_desc(const RecomputeCase& c) {
  ModelDesc d = llmpi::test::desc_of(c.family, kLayers, 2, 16, kT, 31, c.extra);
  d.attention = c.attention;
  return d;
}

inline void set_dropout(Activations& a, int micro_batch) {
  a.dropout.training = true;
  a.dropout.seed = 5;
  a.dropout.step = 2;
  a.dropout.micro_batch = micro_batch;
}

struct RecomputeRun {
  std::vector<float> losses, grads;
  size_t act_bytes = 0;
};

// Two micro-batches, both forwards before either backward (a pipeline's order: the shared buffers
// hold the other micro-batch's last block when the first one's backward starts), gradients summed.
inline RecomputeRun run_whole(const Ops& ops, const RecomputeCase& c, Recompute rc) {
  const ModelDesc d = recompute_desc(c);
  Model m(d, ops, ModelPart::whole(), c.precision, rc);
  m.init_params(3);
  m.zero_grads();
  RandomBatch b0(d, kB, kT, 11), b1(d, kB, kT, 12);
  Activations a0(m, kB, kT), a1(m, kB, kT);
  set_dropout(a0, 0);
  set_dropout(a1, 1);
  RecomputeRun r;
  r.losses.push_back(m.forward(a0, b0.b, HeadMode::train, 0.5f));
  r.losses.push_back(m.forward(a1, b1.b, HeadMode::fused, 0.5f));  // (an LM head fused into it)
  m.backward(a0);
  m.backward(a1);
  r.grads = m.grads_host();
  r.act_bytes = a0.bytes();
  return r;
}

// A part holding blocks [1, L) and the head: its input is handed in (the whole model's hidden
// state after block 0, from a forward without dropout).
inline RecomputeRun run_part(const Ops& ops, const RecomputeCase& c, Recompute rc) {
  const ModelDesc d = recompute_desc(c);
  RandomBatch b(d, kB, kT, 13);
  Model whole(d, ops, ModelPart::whole(), c.precision);
  whole.init_params(3);
  Activations aw(whole, kB, kT);
  whole.forward(aw, b.b, HeadMode::eval);
  const std::vector<float> hidden = [&] {
    std::vector<float> h((size_t)kB * kT * d.d_model);
    ops.copy_to_host(h.data(), aw.layers[0].out, h.size() * sizeof(float));
    return h;
  }();
  ModelPart part;
  part.l0 = 1;
  part.embedding = false;
  Model m(d, ops, part, c.precision, rc);
  m.init_params(3);
  m.zero_grads();
  Activations a(m, kB, kT);
  set_dropout(a, 0);
  m.load_batch(a, b.b);
  ops.copy_to_device(a.input, hidden.data(), hidden.size() * sizeof(float));
  m.blocks_forward(a, m.l0(), m.l1());
  RecomputeRun r;
  m.head_forward(a, HeadMode::train);
  r.losses.push_back(m.read_loss(a));
  m.begin_backward();
  m.head_backward(a, {});
  m.blocks_backward(a, m.l0(), m.l1(), {});
  r.grads = m.grads_host();
  std::vector<float> dinput(hidden.size());
  ops.copy_to_host(dinput.data(), a.dresidual, dinput.size() * sizeof(float));
  r.grads.insert(r.grads.end(), dinput.begin(), dinput.end());  // the gradient handed to the stage before
  return r;
}

// For the exact comparisons: recomputation repeats the same operations on the same values in the
// same order, so every bit (a zero's sign, a NaN's payload) must match.
inline bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

}  // namespace llmpi::test
