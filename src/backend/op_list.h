// The one list of backend ops. Every op is written here once, as
//
//   X(return type, name, (parameters))
//
// and this list generates the rest: the function-pointer members of `Ops` (backend/ops.h), the
// declarations of each backend's functions (backend/cpu/cpu_ops.h, kernels/cuda_common.cuh), and
// each backend's table (cpu_ops.cpp, cuda_ops.cu). Adding an op means: a line here, a function in
// every backend, a test against the CPU op (and, for the CPU op, against finite differences).
//
// Contract of every op (the CPU backend is the reference):
//   - pointers live in the backend's memory (host memory for cpu, device memory for cuda);
//   - shape letters: B batch, T sequence length, C channels, N = B*T rows, OC output channels,
//     NH query heads, NKV key/value heads (NH % NKV == 0), hs head size, V vocabulary;
//     all tensors are row-major and contiguous unless a stride is given;
//   - every backward ADDS (+=) into each gradient it writes, parameter and input gradients alike
//     (llm.c's convention): callers zero gradient buffers once per step, and residual branches,
//     tied matrices and shared inputs accumulate for free;
//   - results are deterministic: the same inputs give the same bits, whatever the thread count.
//
// Dropout masks are a pure function of (key, element index): keep element i when
// dropout_keep(key, i, p) (backend/dropout_hash.h), so forward and backward agree without storing
// a mask and the CPU and CUDA backends drop the same elements.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/gemm_precision.h"
#include "backend/step_scalars.h"

// clang-format off
#define LLMPI_OPS(X)                                                                               \
  /* ---- memory: alloc is zero-filled and aligned to >= 256 bytes ---- */                         \
  X(void*, alloc, (size_t bytes))                                                                  \
  X(void, free, (void* p))                                                                         \
  X(void, zero, (void* p, size_t bytes))                                                           \
  X(void, copy_to_device, (void* dst, const void* src_host, size_t bytes))                         \
  /* copy_to_device without a host wait: the bytes go through the backend's page-locked staging    \
     (CUDA: a ring of slots, each rewritten only after the stream has passed its last copy), so    \
     src_host may be reused at once; ordered with the ops like a kernel. The CPU: a memcpy. */     \
  X(void, copy_to_device_async, (void* dst, const void* src_host, size_t bytes))                   \
  X(void, copy_to_host, (void* dst_host, const void* src, size_t bytes))                           \
  X(void, copy, (void* dst, const void* src, size_t bytes)) /* within the backend's memory */      \
  /* dst[i] = bf16 bits of src[i], i < n (round to nearest even, backend/bf16.h): a bf16 Model's   \
     weight copy (GemmMode::weight_bf16), in the backend's memory */                               \
  X(void, bf16_copy, (uint16_t* dst, const float* src, size_t n))                                  \
                                                                                                   \
  /* ---- embeddings: out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]  (wpe may be null: no positions) */ \
  X(void, embedding_forward, (float* out, const int32_t* inp, const float* wte, const float* wpe,  \
                              int B, int T, int C))                                                \
  /* dwte[inp[b,t],:] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:] (dwpe may be null) */               \
  X(void, embedding_backward, (float* dwte, float* dwpe, const float* dout, const int32_t* inp,    \
                               int B, int T, int C))                                               \
  /* a vocabulary shard's lookup (tensor parallelism): out[b,t,:] = wte[inp[b,t]-v0,:] when        \
     v0 <= inp[b,t] < v0+Vn, else 0; + wpe[t,:] (wpe may be null). wte holds the Vn rows */         \
  X(void, vocab_embedding_forward, (float* out, const int32_t* inp, const float* wte, int v0,      \
                                    int Vn, const float* wpe, int B, int T, int C))                \
  /* dwte[inp[b,t]-v0,:] += dout[b,t,:] for the tokens of the shard; dwpe[t,:] += dout[b,t,:] */    \
  X(void, vocab_embedding_backward, (float* dwte, float* dwpe, const float* dout,                  \
                                     const int32_t* inp, int v0, int Vn, int B, int T, int C))     \
  /* out[n,:] += table[ids[n],:]  (BERT's token-type embedding); N rows */                         \
  X(void, embedding_add_forward, (float* out, const int32_t* ids, const float* table, int N,       \
                                  int C))                                                          \
  X(void, embedding_add_backward, (float* dtable, const float* dout, const int32_t* ids, int N,    \
                                   int C))                                                         \
                                                                                                   \
  /* ---- LayerNorm over the last dimension: y = (x - mean) * rstd * w + b,                        \
          rstd = 1/sqrt(var + eps); mean/rstd [N] are saved for backward ---- */                   \
  X(void, layernorm_forward, (float* out, float* mean, float* rstd, const float* inp,              \
                              const float* weight, const float* bias, int N, int C, float eps,     \
                              uint16_t* out_bf16))                                                 \
  X(void, layernorm_backward, (float* dinp, float* dweight, float* dbias, const float* dout,       \
                               const float* inp, const float* weight, const float* mean,           \
                               const float* rstd, int N, int C))                                   \
  /* ---- RMSNorm: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps); rstd [N] saved ---- */        \
  X(void, rmsnorm_forward, (float* out, float* rstd, const float* inp, const float* weight,        \
                            int N, int C, float eps, uint16_t* out_bf16))                          \
  X(void, rmsnorm_backward, (float* dinp, float* dweight, const float* dout, const float* inp,     \
                             const float* weight, const float* rstd, int N, int C))                \
  /* ---- fused residual + norm (pre-norm blocks): res = a + b, then out = LayerNorm / RMSNorm     \
          (res) with mean/rstd saved; the same bits as residual_forward then layernorm_forward /   \
          rmsnorm_forward (res may alias a or b) ----                                              \
     Every norm's forward: out_bf16 (may be null) receives the output as bf16 bits (round to       \
     nearest even, rows of C values), each the rounding of the fp32 value out receives; out may    \
     be null when out_bf16 is not (a bf16 GEMM's input kept only in bf16: GemmMode::inp_bf16) */   \
  X(void, residual_layernorm_forward, (float* res, float* out, float* mean, float* rstd,           \
                                       const float* a, const float* b, const float* weight,        \
                                       const float* bias, int N, int C, float eps,                 \
                                       uint16_t* out_bf16))                                        \
  X(void, residual_rmsnorm_forward, (float* res, float* out, float* rstd, const float* a,          \
                                     const float* b, const float* weight, int N, int C, float eps, \
                                     uint16_t* out_bf16))                                          \
                                                                                                   \
  /* ---- dense layer: out[N,OC] = inp[N,C] . weight[OC,C]^T + bias[OC] (bias may be null) ----   \
     gemm.prec: the GEMMs' operand precision (backend/gemm_precision.h; fp32 accumulation and      \
     outputs always; bias and dbias are fp32 sums); tf32 throws Error on the CPU. In bf16,         \
     gemm.weight_bf16 / inp_bf16 / dout_bf16 (each may be null) are operands already rounded,      \
     read instead of weight / inp / dout (backend/gemm_precision.h GemmMode) */                    \
  X(void, matmul_forward, (float* out, const float* inp, const float* weight, const float* bias,   \
                           int N, int C, int OC, GemmMode gemm))                                   \
  /* dinp[N,C] += dout.weight; dweight[OC,C] += dout^T.inp; dbias[OC] += sum_n dout               \
     (dinp, dweight and dbias may be null: skipped; with dinp null, weight is not read, and with   \
     dweight and dbias null, inp is not: a zero-bubble pipeline computes the input gradient and    \
     the weight gradient in two calls, which equal the one call bit for bit) */                    \
  X(void, matmul_backward, (float* dinp, float* dweight, float* dbias, const float* dout,          \
                            const float* inp, const float* weight, int N, int C, int OC,           \
                            GemmMode gemm))                                                        \
  /* ---- dense layer + GELU (tanh approximation), GPT-2's MLP input layer:                        \
     pre[N,OC] = inp . weight^T + bias (bias may be null), act[N,OC] = gelu(pre); pre is the      \
     GELU's input that backward reads. Equal to matmul_forward then gelu_forward (the CPU op is   \
     exactly that; CUDA in fp32 / tf32: one cuBLASLt GEMM with the GELU_AUX(_BIAS) epilogue,      \
     cuBLASLt's own GELU, the same tanh approximation to rounding; in bf16 the GEMM with its bias \
     epilogue, then our GELU kernel). act_bf16 (may be null) receives act as bf16 bits, each the  \
     rounding of the fp32 value, as the norms' out_bf16; act may be null when it is given */     \
  X(void, matmul_gelu_forward, (float* pre, float* act, const float* inp, const float* weight,     \
                                const float* bias, int N, int C, int OC, GemmMode gemm,            \
                                uint16_t* act_bf16))                                               \
  /* dpre[N,C] = gelu'(pre) * (dout[N,OC] . weight[OC,C]): the input gradient of a dense layer     \
     whose input was gelu(pre), taken through the GELU. It OVERWRITES dpre (the one op that does   \
     not add): dpre is a caller-owned scratch holding nothing else (the model's d_fc, zeroed       \
     before every use when the op did not exist). No weight gradient: the caller runs              \
     matmul_backward with dinp null for dweight/dbias (so a zero-bubble split is unchanged).       \
     The CPU op is exactly zero(dpre); matmul_backward(dpre, null, null, dout, null, weight, ...); \
     dpre = gelu_backward of it (the same bits as the unfused sequence through a zeroed scratch);  \
     CUDA: one cuBLASLt GEMM with the DGELU epilogue (beta = 0) */                                 \
  X(void, matmul_dgelu_backward, (float* dpre, const float* dout, const float* weight,             \
                                  const float* pre, int N, int C, int OC, GemmMode gemm))          \
                                                                                                   \
  /* ---- rotary position embedding, Hugging Face rotate-half convention, IN PLACE ----           \
     x holds N = B*T rows of `stride` floats; the first nh*hs floats of a row are nh heads of hs   \
     (hs even). Row n is position t = n % T. For i < hs/2, f_i = theta^(-2i/hs), a = t*f_i:         \
       x'[i] = x[i] cos a - x[i+hs/2] sin a;   x'[i+hs/2] = x[i+hs/2] cos a + x[i] sin a           \
     backward applies the inverse rotation (angle -a) to the gradient, also in place. */           \
  X(void, rope_forward, (float* x, int B, int T, int nh, int hs, int stride, float theta))         \
  X(void, rope_backward, (float* dx, int B, int T, int nh, int hs, int stride, float theta))       \
                                                                                                   \
  /* ---- multi-head attention with grouped K/V heads ----                                         \
     qkv [B,T,(NH+2 NKV) hs]: q heads at columns [0, NH hs), k heads at [NH hs, (NH+NKV) hs),      \
     v heads after; query head h reads k/v head h / (NH/NKV) (no repeated copy).                   \
     S = Q K^T / sqrt(hs); key j is masked for query i when causal and j > i, or when              \
     mask[b,j] == 0 (mask [B,T] int32, may be null = every key valid). P = softmax(S) over the     \
     unmasked keys (a row with none: P = 0). att [B,NH,T,T] receives P (masked entries 0).         \
     With dropout_p > 0, O = (P * keep / (1-p)) V where keep for att element e is                  \
     dropout_keep(dropout_key, e, p); att still holds the undropped P. out [B,T,NH hs]. */         \
  X(void, attention_forward, (float* out, float* att, const float* qkv, const int32_t* mask,       \
                              int B, int T, int NH, int NKV, int hs, bool causal,                  \
                              float dropout_p, uint64_t dropout_key))                              \
  /* dqkv += ...; scratch holds at least B*NH*T*T floats (overwritten) */                          \
  X(void, attention_backward, (float* dqkv, float* scratch, const float* dout, const float* qkv,   \
                               const float* att, const int32_t* mask, int B, int T, int NH,        \
                               int NKV, int hs, bool causal, float dropout_p,                      \
                               uint64_t dropout_key))                                              \
  /* ---- fused attention (flash-attention style): the same S, visibility, P, dropout and out as   \
     attention_forward (same qkv layout, grouping, mask, element index e of (b,h,i,j) for          \
     dropout_keep), but P is never stored: memory O(B NH T), never T x T.                          \
     lse [B,NH,T]: lse_i = log Σ_{visible j} exp(S_ij) (so P_ij = exp(S_ij - lse_i)); a row with   \
     no visible key has out = 0 and lse = -inf (its P is 0, as in attention_forward).             \
     prec (runtime.precision): fp32 computes in fp32; bf16 and tf32 round the operands of the     \
     products (to bf16, or to tf32 with ties away from zero) at the points listed in              \
     backend/flash_bf16.h (fp32 softmax statistics and sums; base-2 scores with an integer        \
     running max). The CPU backend EMULATES that rounding (same operands, exact products, fp32    \
     sums), so CPU and GPU bf16 models with fused attention agree as their bf16 GEMMs do, and the \
     CPU op is the oracle of the CUDA tensor-core kernels; in fp32 the CPU op is unchanged. The   \
     CUDA backend falls back to its fp32 kernel where a tensor-core one does not apply (hs > 128  \
     is refused either way). */                                                                   \
  X(void, flash_attention_forward, (float* out, float* lse, const float* qkv,                      \
                                    const int32_t* mask, int B, int T, int NH, int NKV, int hs,    \
                                    bool causal, float dropout_p, uint64_t dropout_key,            \
                                    GemmPrecision prec))                                           \
  /* dqkv += the gradient of attention_forward, from out and lse of the forward (FlashAttention-2):\
       P_ij = exp(S_ij - lse_i), P~ = P keep/(1-p), dV += P~^T dO, dP~ = dO V^T,                   \
       D_i = Σ_d dO_id out_id (= Σ_j P~_ij dP~_ij = Σ_j P_ij dP_ij, out being the dropped output), \
       dS = P~ ∘ dP~ - P ∘ D  (= P ∘ (dP - D), dP = dP~ keep/(1-p)),                                \
       dQ += dS K / sqrt(hs), dK += dS^T Q / sqrt(hs) (K/V heads summed over their query heads).   \
     Scratch is the backend's own and O(B NH T) at most. */                                        \
  X(void, flash_attention_backward, (float* dqkv, const float* dout, const float* out,             \
                                     const float* lse, const float* qkv, const int32_t* mask,      \
                                     int B, int T, int NH, int NKV, int hs, bool causal,           \
                                     float dropout_p, uint64_t dropout_key, GemmPrecision prec))   \
                                                                                                   \
  /* ---- pointwise ---- */                                                                        \
  /* GELU, tanh approximation (GPT-2) */                                                           \
  X(void, gelu_forward, (float* out, const float* inp, size_t n))                                  \
  X(void, gelu_backward, (float* dinp, const float* inp, const float* dout, size_t n))             \
  /* GELU, exact: x/2 (1 + erf(x/sqrt 2)) (BERT) */                                                \
  X(void, gelu_erf_forward, (float* out, const float* inp, size_t n, uint16_t* out_bf16))          \
  X(void, gelu_erf_backward, (float* dinp, const float* inp, const float* dout, size_t n))         \
  /* SwiGLU: inp [N, 2F] = [gate | up] per row; out [N,F] = silu(gate) * up                        \
     gelu_erf_forward and swiglu_forward: out_bf16 as the norms' (may be null; the output's bf16   \
     bits, each the rounding of the fp32 value; out may be null when it is given) */               \
  X(void, swiglu_forward, (float* out, const float* inp, int N, int F, uint16_t* out_bf16))        \
  X(void, swiglu_backward, (float* dinp, const float* inp, const float* dout, int N, int F))       \
  /* tanh (BERT's pooler); backward uses the forward's output: dinp += dout (1 - out^2) */         \
  X(void, tanh_forward, (float* out, const float* inp, size_t n))                                  \
  X(void, tanh_backward, (float* dinp, const float* out, const float* dout, size_t n))             \
  /* dropout: out[i] = inp[i] * keep_i / (1-p), keep_i = dropout_keep(key, i, p); in place ok */   \
  X(void, dropout_forward, (float* out, const float* inp, size_t n, float p, uint64_t key))        \
  X(void, dropout_backward, (float* dinp, const float* dout, size_t n, float p, uint64_t key))     \
  /* out = a + b */                                                                                \
  X(void, residual_forward, (float* out, const float* a, const float* b, size_t n))                \
  /* out[b,:] = inp[b,0,:] (the first token of each sequence, BERT's [CLS]); inp [B,T,C] */        \
  X(void, first_token_forward, (float* out, const float* inp, int B, int T, int C))                \
  X(void, first_token_backward, (float* dinp, const float* dout, int B, int T, int C))             \
                                                                                                   \
  /* ---- fused softmax + cross-entropy over V classes ----                                        \
     logits [N,V], targets [N] in [0,V). losses[n] = -log softmax(logits[n])[targets[n]].          \
     If grad_scale != 0, logits is overwritten with grad_scale * (softmax - onehot). */            \
  X(void, softmax_xent, (float* logits, float* losses, const int32_t* targets, int N, int V,       \
                         float grad_scale))                                                        \
  /* the same without a host wait (a training step checks once, at its one readback): a row whose  \
     target is outside [0, V) gets loss NaN and its logits are left as they are, and               \
     *bad = max(*bad, encode_bad_target(row0 + n, target)) (backend/step_scalars.h: 0 = none;      \
     the first bad row wins). bad is backend memory; the caller reports it (read_step_scalars in   \
     model/transformer.h, with softmax_xent's message). softmax_xent itself stays the checked op:  \
     it throws at once (on a GPU after waiting for the flag). The logits' rows are ld >= V values  \
     apart (the LM head pads them, GemmMode::out_ld); the padding is neither read nor written. */  \
  X(void, softmax_xent_record, (float* logits, int ld, float* losses, const int32_t* targets,      \
                                int N, int V, float grad_scale, uint64_t* bad, int row0))          \
  /* softmax_xent_record with the gradient (grad_scale != 0) written as bf16 bits (round to        \
     nearest even) into grad [N, ld] (the padding columns 0) instead of over logits [N, ld],       \
     which is left as it is: each value the one softmax_xent_record would write, rounded (the      \
     LM head's logits gradient as a bf16 GEMM operand, GemmMode::dout_bf16). A bad row's           \
     gradient row is left as it is too. */                                                         \
  X(void, softmax_xent_bf16_grad, (const float* logits, int ld, float* losses,                     \
                                   const int32_t* targets, int N, int V, float grad_scale,         \
                                   uint16_t* grad, uint64_t* bad, int row0))                       \
  /* softmax + cross-entropy over a vocabulary shard (tensor parallelism: columns [v0, v0+Vn) of   \
     the whole vocabulary, rows ld apart), in three passes around the group's collectives:         \
       vocab_xent_max     rowmax[n] = max_j z[n,j]              (then the max over the group)      \
       vocab_xent_sums    sums[n] = sum_j exp(z[n,j] - rowmax[n]); sums[N+n] = z[n, y-v0] when the \
                          target y = targets[n] is in the shard, else 0   (then summed over it)    \
       vocab_xent_finish  losses[n] = log sums[n] + rowmax[n] - sums[N+n]; with grad_scale != 0,   \
                          z[n,j] = grad_scale (exp(z[n,j] - rowmax[n]) / sums[n] - [j == y-v0])    \
     The targets were checked on the host (every rank's shard gets every row). */                  \
  X(void, vocab_xent_max, (float* rowmax, const float* logits, int ld, int N, int Vn))             \
  X(void, vocab_xent_sums, (float* sums, const float* logits, int ld, const float* rowmax,         \
                            const int32_t* targets, int v0, int N, int Vn))                        \
  X(void, vocab_xent_finish, (float* logits, int ld, float* losses, const float* rowmax,           \
                              const float* sums, const int32_t* targets, int v0, int N, int Vn,    \
                              float grad_scale))                                                   \
                                                                                                   \
  /* ---- optimizer and gradient utilities ----                                                    \
     AdamW for n elements, step t >= 1: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;                \
     p -= lr (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd p) */                                     \
  X(void, adamw_update, (float* params, const float* grads, float* m, float* v, size_t n,          \
                         float lr, float beta1, float beta2, float eps, float weight_decay, int t))\
  /* SGD with decoupled weight decay: p -= lr (g + wd p) */                                        \
  X(void, sgd_update, (float* params, const float* grads, size_t n, float lr, float weight_decay)) \
  X(double, sum_squares, (const float* x, size_t n)) /* sum x^2 in double */                       \
  X(void, scale, (float* x, float s, size_t n))      /* x *= s */                                  \
  /* ---- a step without host synchronisation (backend/step_scalars.h): results stay in backend    \
     memory until the step's one readback ----                                                     \
     *acc += sum_squares(x, n): the same double, added on the device (no host wait) */             \
  X(void, sum_squares_add, (double* acc, const float* x, size_t n))                                \
  /* *out = sum x[i] in double (the CPU adds in index order; CUDA: a fixed two-pass tree) */       \
  X(void, sum_to_double, (double* out, const float* x, size_t n))                                  \
  /* Multi-tensor AdamW: adamw_update over every segment of the table (backend memory, nsegs       \
     rows; weight decay where segs[k].decay), each gradient read as g = grads[i] * grad_scale (one \
     float multiply, rounded: the same bits as scale() then adamw_update; grad_scale 1 = no clip). \
     The gradients are not written. One launch on a GPU.                                           \
     With scalars (a StepScalars in backend memory, filled by the ops before; null = as above) the \
     op decides on the device what the host decided from a readback: nothing at all is written    \
     unless update_allowed(*scalars), and grad_scale is replaced by clip_factor_of(*scalars,       \
     max_norm) (backend/step_scalars.h: the host's float). */                                      \
  X(void, adamw_update_segments, (float* params, const float* grads, float* m, float* v,           \
                                  const UpdateSegment* segs, int nsegs, float grad_scale,          \
                                  const StepScalars* scalars, double max_norm, float lr,           \
                                  float beta1, float beta2, float eps, float weight_decay, int t)) \
  X(void, sgd_update_segments, (float* params, const float* grads, const UpdateSegment* segs,      \
                                int nsegs, float grad_scale, const StepScalars* scalars,           \
                                double max_norm, float lr, float weight_decay))                    \
  /* How many times this backend has handed a result to the host so far: copy_to_host,             \
     sum_squares and softmax_xent (its target check) count one each (on a GPU each is a host       \
     wait). Tests pin a step's readbacks with it. */                                               \
  X(uint64_t, readback_count, ())                                                                  \
  /* How many fp32 values this backend has rounded to bf16 as weights so far: bf16_copy's n,       \
     and a dense-layer op's weight elements when it rounds the weight itself (bf16 without         \
     gemm.weight_bf16). Tests pin a bf16 step's weight rounding with it. */                        \
  X(uint64_t, bf16_weight_rounding_count, ())
// clang-format on

// Declares every op as a function of the enclosing namespace (a backend's implementation):
//   namespace llmpi::cpu { LLMPI_OPS(LLMPI_DECLARE_OP) }
#define LLMPI_DECLARE_OP(ret, name, params) ret name params;
