// The op interface between the model and a compute backend.
//
// The model (src/model/) calls only these functions, through a table of function pointers, so a
// backend is one table: cpu_ops() here (OpenBLAS + OpenMP), cuda_ops() later, beside it. Every
// pointer argument lives in the backend's memory (host memory for the CPU backend).
//
// Shape letters: B batch, T sequence length, C channels (d_model), NH heads, hs = C/NH head size,
// V vocabulary, N = B*T rows, OC output channels. All tensors are row-major and contiguous.
//
// Gradient convention (as in llm.c): every backward function ADDS (+=) into each gradient it
// writes, parameter gradients and input gradients alike. Callers zero gradient buffers once per
// step; residual branches and the tied embedding/output matrix then accumulate for free.
#pragma once
#include <cstddef>
#include <cstdint>

namespace llmpi {

struct Ops {
  const char* name;  // "cpu", "cuda"

  // ---- memory ----
  void* (*alloc)(size_t bytes);  // zero-filled, aligned to at least 64 bytes
  void (*free)(void* p);
  void (*zero)(void* p, size_t bytes);
  void (*copy_to_device)(void* dst, const void* src_host, size_t bytes);
  void (*copy_to_host)(void* dst_host, const void* src, size_t bytes);

  // ---- embeddings: out[b,t,:] = wte[inp[b,t],:] + wpe[t,:] ----
  void (*embedding_forward)(float* out, const int32_t* inp, const float* wte, const float* wpe,
                            int B, int T, int C);
  void (*embedding_backward)(float* dwte, float* dwpe, const float* dout, const int32_t* inp,
                             int B, int T, int C);

  // ---- LayerNorm over the last dimension, eps = 1e-5; mean/rstd [N] saved for backward ----
  void (*layernorm_forward)(float* out, float* mean, float* rstd, const float* inp,
                            const float* weight, const float* bias, int N, int C);
  void (*layernorm_backward)(float* dinp, float* dweight, float* dbias, const float* dout,
                             const float* inp, const float* weight, const float* mean,
                             const float* rstd, int N, int C);

  // ---- dense layer: out[N,OC] = inp[N,C] · weight[OC,C]^T + bias[OC] (bias may be null) ----
  void (*matmul_forward)(float* out, const float* inp, const float* weight, const float* bias,
                         int N, int C, int OC);
  // dinp [N,C] += dout·weight; dweight [OC,C] += dout^T·inp; dbias [OC] += Σ_n dout.
  // dinp and dbias may be null (skipped).
  void (*matmul_backward)(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, int N, int C, int OC);

  // ---- causal self-attention ----
  // qkv [B,T,3C]: q = qkv[..., 0:C], k = qkv[..., C:2C], v = qkv[..., 2C:3C], head h is the
  // slice [h*hs, (h+1)*hs) of each. out [B,T,C] (heads concatenated). att [B,NH,T,T] receives
  // the softmax probabilities (row i: keys j <= i; entries j > i are 0) for backward.
  void (*attention_forward)(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
  // dqkv [B,T,3C] += ...; scratch holds at least B*NH*T*T floats (its content is overwritten).
  void (*attention_backward)(float* dqkv, float* scratch, const float* dout, const float* qkv,
                             const float* att, int B, int T, int C, int NH);

  // ---- GELU, tanh approximation (as GPT-2) ----
  void (*gelu_forward)(float* out, const float* inp, size_t n);
  void (*gelu_backward)(float* dinp, const float* inp, const float* dout, size_t n);

  // ---- out = a + b ----
  void (*residual_forward)(float* out, const float* a, const float* b, size_t n);

  // ---- fused softmax + cross-entropy over the vocabulary ----
  // logits [N,V], targets [N] in [0,V). losses[n] = -log softmax(logits[n])[targets[n]].
  // If grad_scale != 0, logits is overwritten in place with grad_scale * (softmax - onehot),
  // i.e. dloss/dlogits for a loss of grad_scale * Σ_n losses[n].
  void (*softmax_xent)(float* logits, float* losses, const int32_t* targets, int N, int V,
                       float grad_scale);

  // ---- optimizer and gradient utilities ----
  // AdamW (decoupled weight decay) for one tensor of n elements; step t >= 1 (bias correction):
  //   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g²;  mhat = m/(1-b1^t);  vhat = v/(1-b2^t)
  //   p -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * p)
  void (*adamw_update)(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                       float beta1, float beta2, float eps, float weight_decay, int t);
  // Plain SGD with decoupled weight decay: p -= lr * (g + weight_decay * p).
  void (*sgd_update)(float* params, const float* grads, size_t n, float lr, float weight_decay);
  double (*sum_squares)(const float* x, size_t n);  // Σ x², accumulated in double
  void (*scale)(float* x, float s, size_t n);       // x *= s
};

// The CPU backend (src/backend/cpu/): OpenBLAS sgemm for the GEMMs, OpenMP for the loops.
const Ops& cpu_ops();

}  // namespace llmpi
