// The classifier head (bert): the first token's hidden state through a pooler and a linear layer.
//
//   forward   cls = x[:, 0]; pooled = tanh(cls·Wp^T + bp); logits = drop(pooled)·Wc^T + bc
//             loss_b = logsumexp(logits_b) - logits_b[label_b]; dlogits = grad_scale / B · (softmax - onehot)
//   backward  dpooled = dlogits·Wc (dWc, dbc), the dropout mask, dpre = (1 - pooled²) ⊙ dpooled,
//             dcls = dpre·Wp (dWp, dbp), then dx[:, 0] = dcls and 0 elsewhere
#include "model/layers/dropout_keys.h"
#include "model/transformer.h"

namespace llmpi {

void Model::classifier_forward(Activations& a, bool need_grad, float grad_scale) const {
  const Ops& o = *ops;
  const ModelDesc& d = desc;
  const int B = a.B, T = a.T, C = d.d_model;
  const float* x = a.output();
  uint64_t* bad = &a.scalars->bad_target;
  const size_t BC = static_cast<size_t>(B) * C;
  x = regions(a).enter_column(x, a.gathered);  // (SP: every sequence's first row from the gathered rows)
  o.first_token_forward(a.cls, x, B, T, C);
  o.matmul_forward(a.pooled_pre, a.cls, pe[kPoolerW], pe[kPoolerB], B, C, C,
                   gemm_rounding(pe[kPoolerW], static_cast<size_t>(C) * C));
  o.tanh_forward(a.pooled, a.pooled_pre, BC);
  const float* pd = a.pooled;
  if (a.dropout.training && d.dropout > 0) {
    o.dropout_forward(a.pooled_drop, a.pooled, BC, d.dropout, drop_key(a, d.n_layer, kDropPooler));
    pd = a.pooled_drop;
  }
  o.matmul_forward(a.logits, pd, pe[kClsW], pe[kClsB], B, C, d.num_labels,
                   gemm_rounding(pe[kClsW], static_cast<size_t>(d.num_labels) * C));
  o.softmax_xent_record(a.logits, d.num_labels, a.losses, a.targets, B, d.num_labels,
                        need_grad ? grad_scale / static_cast<float>(B) : 0.0f, bad, 0);
}

void Model::classifier_backward(Activations& a, const ReadyFn& ready) {
  const Ops& o = *ops;
  const ModelDesc& d = desc;
  const int B = a.B, T = a.T, C = d.d_model, N = B * T;
  const size_t NC = static_cast<size_t>(N) * C;
  const size_t BC = static_cast<size_t>(B) * C;
  float *dpd = d_small_, *dpre = d_small_ + BC, *ddrop = d_small_ + 2 * BC;
  const bool drop = a.dropout.training && d.dropout > 0;
  o.zero(dpd, BC * sizeof(float));
  dense_backward(a, dpd, a.logits, true, drop ? a.pooled_drop : a.pooled, nullptr, 0, kClsW, kClsB, B, C, d.num_labels, true,
                 ready);
  if (drop) {
    o.zero(ddrop, BC * sizeof(float));
    o.dropout_backward(ddrop, dpd, BC, d.dropout, drop_key(a, d.n_layer, kDropPooler));
    dpd = ddrop;
  }
  o.zero(dpre, BC * sizeof(float));
  o.tanh_backward(dpre, a.pooled, dpd, BC);
  float* dcls = d_small_;  // dpd is consumed
  o.zero(dcls, BC * sizeof(float));
  dense_backward(a, dcls, dpre, false, a.cls, nullptr, 0, kPoolerW, kPoolerB, B, C, C, true, ready);
  if (!d.seq_shards()) {
    o.zero(a.dresidual, NC * sizeof(float));
    o.first_token_backward(a.dresidual, dcls, B, T, C);
  } else {  // every row's gradient (the same on every rank), then this rank's rows of it
    const int Nr = d.residual_rows(N);
    o.zero(a.tmp, NC * sizeof(float));
    o.first_token_backward(a.tmp, dcls, B, T, C);
    o.copy(a.dresidual, a.tmp + static_cast<size_t>(d.tp_rank) * Nr * C, static_cast<size_t>(Nr) * C * sizeof(float));
  }
}

}  // namespace llmpi
