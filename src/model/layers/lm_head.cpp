// The LM head ("Chunked LM head", "Fused LM head" and "Tensor parallelism" in transformer.h):
//
//   forward   xf = N_f(x) (families with a final norm); per chunk of R rows:
//             z = xf_c·W^T (W = wte when tied, else lm_head; this rank's vocabulary rows)
//             loss_n = logsumexp(z_n) - z_n[y_n]        (over the group's shards with tp > 1)
//             dz = grad_scale / N · (softmax(z) - onehot(y))   with need_grad
//   backward  per chunk, last to first (the logits recomputed unless the buffer holds them):
//             dxf_c += dz·W, dW += dz^T·xf_c; then N_f's backward into a.dresidual
#include <algorithm>

#include "model/layers/norm.h"
#include "model/transformer.h"
#include "runtime/error.h"

namespace llmpi {

void Model::lm_head_forward(Activations& a, bool need_grad, float grad_scale, bool fused) const {
  const Ops& o = *ops;
  const ModelDesc& d = desc;
  const int C = d.d_model, N = a.B * a.T, Nr = d.residual_rows(N);
  const float* x = a.output();
  const float* xf = x;
  const uint16_t* xf16 = nullptr;  // a bf16 model's final norm output, kept only in bf16
  if (d.final_norm) {
    norm_forward(o, d, a.final_norm, a.final_norm_bf16, a.final_mean, a.final_rstd, x, pe[kFinalNormW],
                 pe[kFinalNormB], Nr);
    xf = a.final_norm;
    xf16 = a.final_norm_bf16;
  }
  xf = regions(a).enter_column(xf, a.gathered);  // (SP: every row's xf, kept there until head_backward)
  const float* W = d.tie_embeddings ? pe[kTokEmb] : pe[kLmHead];
  const int V = d.vocab_rows();  // this rank's vocabulary rows (all of them without tensor parallelism)
  const GemmMode head_gemm = gemm_rounding(W, static_cast<size_t>(V) * C);  // once for every chunk
  const int R = a.lm_rows;
  if (fused) {
    // Fused ("Fused LM head" in transformer.h): the recomputing backward itself, run now with
    // nothing to reuse — every chunk's logits, loss (and target check) and gradient, then its
    // dxf and dW — into a.tmp (d xf, zeroed here; the forward's scratch is free after the
    // blocks) and the head weight's gradient: the same bits as a backward would add.
    a.head_pass.last_chunk_grad = false;
    o.zero(a.tmp, static_cast<size_t>(N) * C * sizeof(float));
    lm_head_backward_chunks(a, a.tmp, ge[d.tie_embeddings ? kTokEmb : kLmHead]);
  } else {
    // Chunked ("Chunked LM head" in transformer.h): per chunk of R rows, logits = xf·W^T, then
    // the loss per row (with need_grad the gradient too, as the unchunked head computed it, so
    // the losses are the same bits; head_backward recomputes it).
    for (int r0 = 0; r0 < N; r0 += R) {
      const int rn = std::min(R, N - r0);
      GemmMode chunk_gemm = head_gemm;
      chunk_gemm.inp_bf16 = xf16 ? xf16 + static_cast<size_t>(r0) * C : nullptr;
      chunk_gemm.out_ld = a.logits_ld;
      o.matmul_forward(a.logits, xf ? xf + static_cast<size_t>(r0) * C : nullptr, W, nullptr, rn, C, V, chunk_gemm);
      lm_xent(a, r0, rn, need_grad ? grad_scale / static_cast<float>(N) : 0.0f);
    }
  }
}

void Model::lm_head_backward(Activations& a, const ReadyFn& ready) {
  const Ops& o = *ops;
  const ModelDesc& d = desc;
  const int C = d.d_model, N = a.B * a.T;
  const size_t NC = static_cast<size_t>(N) * C;
  const float* x = a.output();
  const bool tied = d.tie_embeddings;
  const int wrole = tied ? kTokEmb : kLmHead;
  if (a.head_pass.mode == HeadMode::fused) {
    // The fused head's forward ran its backward: a.tmp = d xf, dW added (see transformer.h).
    if (mode_ != BackwardMode::whole) fail("internal: an input-only backward after a fused LM head forward");
    if (!(tied && part.embedding)) finished(0, {wrole}, ready);
  } else if (mode_ == BackwardMode::whole) {
    // The chunked head (see transformer.h): d_a_ = d xf now; dW now, or in weight_backward after
    // an input-only pass (recomputing the logits there too: nothing N x V is kept).
    o.zero(d_a_, NC * sizeof(float));
    lm_head_backward_chunks(a, d_a_, ge[wrole]);
    // A tied matrix held with the embedding gets its embedding gradient later in a whole pass.
    if (!(tied && part.embedding)) finished(0, {wrole}, ready);
  } else {
    if (input_only_pass_ != &a) fail("internal: an input-only backward continued on other activations");
    o.zero(d_a_, NC * sizeof(float));
    lm_head_backward_chunks(a, d_a_, nullptr);
    a.input_only.deferred.push_back({0, wrole, -1, nullptr, nullptr, nullptr, N, C, d.vocab_rows()});
  }
  const float* dxf = a.head_pass.mode == HeadMode::fused ? a.tmp : d_a_;
  const int Nr = d.residual_rows(N);
  const size_t NrC = static_cast<size_t>(Nr) * C;
  if (d.seq_shards()) {  // each rank's partial d xf of every row, summed onto this rank's rows
    tensor.reduce_scatter(dxf, a.scattered, NrC);
    dxf = a.scattered;
  }
  o.zero(a.dresidual, NrC * sizeof(float));
  if (d.final_norm) {
    norm_backward_rows(a.dresidual, ge[kFinalNormW], ge[kFinalNormB], dxf, x, pe[kFinalNormW], a.final_mean,
                       a.final_rstd, Nr);
    finished(0, {kFinalNormW, kFinalNormB}, ready);
  } else {
    o.copy(a.dresidual, dxf, NrC * sizeof(float));
  }
}

void Model::lm_head_backward_chunks(Activations& a, float* dxf, float* dW) const {
  const Ops& o = *ops;
  const ModelDesc& d = desc;
  const int N = a.B * a.T, C = d.d_model, V = d.vocab_rows(), R = a.lm_rows;
  // (sequence parallelism: every row's xf, gathered by the head forward)
  const float* xf = d.seq_shards() ? a.gathered : d.final_norm ? a.final_norm : a.output();
  const uint16_t* xf16 = d.final_norm ? a.final_norm_bf16 : nullptr;  // (xf null then)
  const float* W = d.tie_embeddings ? pe[kTokEmb] : pe[kLmHead];
  GemmMode head_gemm = gemm_reading(W);  // the head forward rounded W
  head_gemm.out_ld = head_gemm.dout_ld = a.logits_ld;
  // the logits gradient is written in bf16, and the GEMMs read it so
  if (a.logits_grad_bf16) head_gemm.dout_bf16 = a.logits_grad_bf16;
  // Per chunk [r0, r0 + rn), last to first: z = xf_c·W^T; z <- d loss/d z = grad_scale/N ·
  // (softmax(z) - onehot(y)) (the losses rewritten with the values head_forward wrote), unless the
  // buffer still holds it (the last chunk after the forward, or the only one; the same bits either
  // way); dxf_c += z·W; dW += z^T·xf_c.
  const int chunks = (N + R - 1) / R;
  const bool reuse = a.head_pass.last_chunk_grad;
  for (int c = chunks - 1; c >= 0; c--) {
    const int r0 = c * R, rn = std::min(R, N - r0);
    const float* xc = xf ? xf + static_cast<size_t>(r0) * C : nullptr;
    GemmMode chunk_gemm = head_gemm;
    chunk_gemm.inp_bf16 = xf16 ? xf16 + static_cast<size_t>(r0) * C : nullptr;
    if (!(reuse && c == chunks - 1)) {
      o.matmul_forward(a.logits, xc, W, nullptr, rn, C, V, chunk_gemm);
      lm_xent(a, r0, rn, a.head_pass.grad_scale / static_cast<float>(N));  // (a fused forward's target check too)
    }
    o.matmul_backward(dxf ? dxf + static_cast<size_t>(r0) * C : nullptr, dW, nullptr,
                      a.logits_grad_bf16 ? nullptr : a.logits, xc, W, rn, C, V, chunk_gemm);
  }
  a.head_pass.last_chunk_grad = chunks == 1;  // the buffer holds chunk 0's gradient now
  // each rank's vocabulary rows' share of d xf, summed (sequence parallelism: head_backward
  // reduce-scatters it instead)
  if (dxf && !d.seq_shards() && d.tp > 1) tensor.sum(dxf, static_cast<size_t>(N) * C);
}

void Model::lm_xent(Activations& a, int r0, int rn, float scale) const {
  const Ops& o = *ops;
  const ModelDesc& d = desc;
  uint64_t* bad = &a.scalars->bad_target;
  if (d.tp == 1) {
    if (scale != 0.0f && a.logits_grad_bf16)
      o.softmax_xent_bf16_grad(a.logits, a.logits_ld, a.losses + r0, a.targets + r0, rn, d.vocab_size, scale,
                               a.logits_grad_bf16, bad, r0);
    else
      o.softmax_xent_record(a.logits, a.logits_ld, a.losses + r0, a.targets + r0, rn, d.vocab_size, scale, bad, r0);
    return;
  }
  // Over the group's vocabulary shards ("Tensor parallelism" in transformer.h), the logits never
  // gathered: the rows' maximum (a max over the group), then Σ exp(z - max) and the target's logit
  // (one sum over the group: the target's shard gives it, the others 0), then each rank's losses
  // (the same on every rank) and its columns of the gradient. The ids were checked on the host.
  float* mx = a.xent_stats;
  float* sums = a.xent_stats + a.lm_rows;  // [2 rn]: Σ exp, then the target logits
  const int V = d.vocab_rows(), v0 = d.vocab_begin();
  o.vocab_xent_max(mx, a.logits, a.logits_ld, rn, V);
  tensor.max(mx, static_cast<size_t>(rn));
  o.vocab_xent_sums(sums, a.logits, a.logits_ld, mx, a.targets + r0, v0, rn, V);
  tensor.sum(sums, 2 * static_cast<size_t>(rn));
  o.vocab_xent_finish(a.logits, a.logits_ld, a.losses + r0, mx, sums, a.targets + r0, v0, rn, V, scale);
}

}  // namespace llmpi
