// The attention branch of a block ("Tensor parallelism" in transformer.h for the shards):
//
//   forward   qkv = h·Wqkv^T + bqkv                      column-parallel: this rank's heads
//             q, k = rope(q), rope(k)                    (families without learned positions)
//             y = softmax(q·k^T / √hs + mask) · v        full: P [B, H, T, T] kept; fused: lse per row
//             out = y·Wo^T + bo                          row-parallel: each rank's partial sum, bo on rank 0
//   backward  dy = dout·Wo, dWo += dout^T·y, dbo += Σ dout
//             dqkv = attention's backward (from P, or from lse with the scores recomputed), rope^T
//             dh = dqkv·Wqkv, dWqkv += dqkv^T·h, dbqkv += Σ dqkv
#include "model/layers/dropout_keys.h"
#include "model/transformer.h"

namespace llmpi {

const float* Model::attention_forward(Activations& a, int l, const float* h, const uint16_t* h16) const {
  const Ops& o = *ops;
  const ModelDesc& d = desc;
  const int B = a.B, T = a.T, C = d.d_model, N = B * T, NH = d.heads(), NKV = d.kv_heads(), hs = d.head_dim();
  const int QKV = d.qkv_dim(), AY = NH * hs;
  const BlockTensors& w = pb[l - part.l0];
  Activations::Layer& L = a.layers[l - part.l0];
  const float pa = a.dropout.training ? d.attn_dropout : 0.0f;
  h = regions(a).enter_column(h, a.gathered);
  GemmMode qkv_gemm = gemm_rounding(w[kQkvW], static_cast<size_t>(QKV) * C);
  qkv_gemm.inp_bf16 = h16;
  o.matmul_forward(L.qkv, h, w[kQkvW], w[kQkvB], N, C, QKV, qkv_gemm);
  if (!d.learned_positions) {
    o.rope_forward(L.qkv, B, T, NH, hs, QKV, static_cast<float>(d.rope_theta));
    o.rope_forward(L.qkv + AY, B, T, NKV, hs, QKV, static_cast<float>(d.rope_theta));
  }
  const int32_t* mask = a.has_mask ? a.attn_mask : nullptr;
  if (d.attention == AttentionImpl::fused)
    o.flash_attention_forward(L.atty, L.lse, L.qkv, mask, B, T, NH, NKV, hs, d.causal, pa, attn_drop_key(a, l),
                              precision);
  else
    o.attention_forward(L.atty, L.att, L.qkv, mask, B, T, NH, NKV, hs, d.causal, pa, attn_drop_key(a, l));
  o.matmul_forward(a.tmp, L.atty, w[kAttnOutW], d.tp_rank == 0 ? w[kAttnOutB] : nullptr, N, AY, C,
                   gemm_rounding(w[kAttnOutW], static_cast<size_t>(C) * AY));
  return branch_output(a, l, kDropAttnOut);
}

// Full attention's P again from the kept qkv (the forward's op and dropout key: the same bits);
// its output, the kept y's bits, goes to the free forward scratch a.tmp. Fused attention keeps
// no P: nothing to do.
void Model::attention_recompute(Activations& a, int l) const {
  const ModelDesc& d = desc;
  if (d.attention != AttentionImpl::full) return;
  const Activations::Layer& L = a.layers[l - part.l0];
  const float pa = a.dropout.training ? d.attn_dropout : 0.0f;
  ops->attention_forward(a.tmp, L.att, L.qkv, a.has_mask ? a.attn_mask : nullptr, a.B, a.T, d.heads(), d.kv_heads(),
                         d.head_dim(), d.causal, pa, attn_drop_key(a, l));
}

const float* Model::attention_backward(Activations& a, const BlockPass& p, const float* dout, const float* h,
                                       const uint16_t* h16, InputGrad ig) {
  const Ops& o = *ops;
  const ModelDesc& d = desc;
  const int B = a.B, T = a.T, C = d.d_model, N = B * T, NH = d.heads(), NKV = d.kv_heads(), hs = d.head_dim();
  const int QKV = d.qkv_dim(), AY = NH * hs;
  const Activations::Layer& L = a.layers[p.l - part.l0];
  const ParallelRegions pr = regions(a);
  const float pa = a.dropout.training ? d.attn_dropout : 0.0f;
  const int32_t* mask = a.has_mask ? a.attn_mask : nullptr;
  const float* dy_out = pr.leave_row_backward(dout, d_full_);
  o.zero(d_a_, pr.all_floats * sizeof(float));  // d_a_ = dy
  block_dense(a, p, d_a_, dy_out, L.atty, nullptr, kAttnOutW, kAttnOutB, AY, C);
  o.zero(p.d_qkv, static_cast<size_t>(N) * QKV * sizeof(float));
  if (d.attention == AttentionImpl::fused)  // (atty is the dropped output)
    o.flash_attention_backward(p.d_qkv, d_a_, L.atty, L.lse, L.qkv, mask, B, T, NH, NKV, hs, d.causal, pa,
                               attn_drop_key(a, p.l), precision);
  else
    o.attention_backward(p.d_qkv, d_att_, d_a_, L.qkv, L.att, mask, B, T, NH, NKV, hs, d.causal, pa,
                         attn_drop_key(a, p.l));
  if (!d.learned_positions) {
    o.rope_backward(p.d_qkv, B, T, NH, hs, QKV, static_cast<float>(d.rope_theta));
    o.rope_backward(p.d_qkv + AY, B, T, NKV, hs, QKV, static_cast<float>(d.rope_theta));
  }
  const float* hg = pr.enter_column(h, a.gathered);  // (gathered again for the weight gradient)
  return pr.enter_column_backward(ig.part, ig.rows, ig.acc, o, [&](float* dh) {
    block_dense(a, p, dh, p.d_qkv, hg, h16, kQkvW, kQkvB, C, QKV);
  });
}

}  // namespace llmpi
