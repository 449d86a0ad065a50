// GPT-2 family transformer over a backend's Ops (fp32).
//
//   x0 = wte[tokens] + wpe[positions]
//   for each layer:  x = x + attn_proj(attention(qkv(LN1(x))))
//                    x = x + fc_proj(gelu(fc(LN2(x))))
//   logits = LN_f(x) · wte^T                       (output head tied to the token embedding)
//   loss   = mean over positions of cross-entropy(softmax(logits), next token)
//
// Parameters live in ONE flat buffer described by a table of named slices (Hugging Face GPT-2
// names). Slices are laid out in the order backward finishes them — ln_f, then the last layer
// down to the first, then wpe and wte — so the gradients finished so far are always a prefix
// [0, k) of the flat gradient buffer, and a bucket of them is one contiguous range.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/ops.h"

namespace llmpi {

struct ModelShape {
  int n_layer, n_head, d_model, max_seq_len, vocab_size;
};

struct ParamSlice {
  std::string name;        // e.g. "h.3.mlp.c_fc.weight"
  std::vector<int> shape;  // row-major, [out, in] for dense weights
  size_t offset, numel;
  bool decay;              // AdamW weight decay applies (2-D weights and embeddings)
};

struct ParamTable {
  std::vector<ParamSlice> slices;
  size_t numel = 0;
  const ParamSlice& at(const std::string& name) const;  // throws Error for an unknown name
};

ParamTable gpt2_param_table(const ModelShape& s);

// Training FLOPs per token: 6 × parameters + 12 × layers × seq_len × d_model (attention).
double gpt2_flops_per_token(const ModelShape& s, int seq_len);

// Pointers into a flat buffer (parameters or gradients) for each tensor.
struct LayerTensors {
  float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
};
struct ModelTensors {
  float *wte, *wpe, *lnfw, *lnfb;
  std::vector<LayerTensors> layers;
};

struct Gpt2 {
  ModelShape shape;
  const Ops* ops;
  ParamTable table;
  float* params = nullptr;  // table.numel floats, backend memory
  float* grads = nullptr;   // same layout
  ModelTensors p, g;

  Gpt2(const ModelShape& shape, const Ops& ops);
  ~Gpt2();
  Gpt2(const Gpt2&) = delete;
  Gpt2& operator=(const Gpt2&) = delete;

  // GPT-2 initialisation from (seed): weights N(0, std), residual projections N(0, std/sqrt(2L)),
  // biases 0, LayerNorm weights 1. Deterministic: every rank gets the same parameters.
  void init_params(uint64_t seed, double std);

  // Forward over inputs/targets [B,T] (host arrays of token ids). Returns the mean loss. With
  // need_grad the logits buffer is turned into d(mean loss)/d(logits) · grad_scale (the fused
  // softmax + cross-entropy backward), ready for backward(). grad_scale lets a caller average over
  // more positions than this batch holds; 1 means d(mean loss of this batch).
  float forward(const int32_t* inputs, const int32_t* targets, int B, int T, bool need_grad,
                float grad_scale = 1.0f);

  // Backward for the last forward(need_grad). ADDS into grads (zero them first with zero_grads).
  // grads_ready(k) is called whenever the gradient prefix [0, k) of the flat buffer is final:
  // after ln_f, after each of a layer's six parameter groups (mlp.c_proj, mlp.c_fc, ln_2,
  // attn.c_proj, attn.c_attn, ln_1), and at the end with k = table.numel.
  void backward(const std::function<void(size_t)>& grads_ready = {});
  void zero_grads();

  size_t activation_bytes() const { return act_floats_ * sizeof(float); }

 private:
  int B_ = 0, T_ = 0;
  size_t act_floats_ = 0;
  float* act_ = nullptr;        // all activations, one allocation
  int32_t* tokens_ = nullptr;   // inputs then targets, backend memory
  struct LayerActs {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch,
        *fch_gelu, *res3;
  };
  std::vector<LayerActs> la_;
  float *encoded_, *lnf_, *lnf_mean_, *lnf_rstd_, *logits_, *losses_, *proj_;
  // backward scratch
  float *dresidual_, *dln_, *datty_, *dqkv_, *dfch_, *dfch_gelu_, *datt_scratch_;
  std::vector<float> losses_host_;
  // ready_[l][i]: the gradient prefix that is final after group i of layer l's backward.
  std::vector<std::array<size_t, 6>> ready_;
  void ensure_activations(int B, int T);
};

}  // namespace llmpi
