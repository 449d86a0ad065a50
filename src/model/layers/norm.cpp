#include "model/layers/norm.h"

#include "model/transformer.h"

namespace llmpi {

void norm_forward(const Ops& o, const ModelDesc& d, float* out, uint16_t* out16, float* mean, float* rstd,
                  const float* x, const float* w, const float* b, int N) {
  if (d.norm == NormKind::layernorm)
    o.layernorm_forward(out, mean, rstd, x, w, b, N, d.d_model, static_cast<float>(d.norm_eps), out16);
  else
    o.rmsnorm_forward(out, rstd, x, w, N, d.d_model, static_cast<float>(d.norm_eps), out16);
}

void residual_norm_forward(const Ops& o, const ModelDesc& d, float* res, float* out, uint16_t* out16, float* mean,
                           float* rstd, const float* a, const float* b, const float* w, const float* bias, int N) {
  if (d.norm == NormKind::layernorm)
    o.residual_layernorm_forward(res, out, mean, rstd, a, b, w, bias, N, d.d_model, static_cast<float>(d.norm_eps), out16);
  else
    o.residual_rmsnorm_forward(res, out, rstd, a, b, w, N, d.d_model, static_cast<float>(d.norm_eps), out16);
}

void norm_backward(const Ops& o, const ModelDesc& d, float* dx, float* dw, float* db, const float* dout,
                   const float* x, const float* w, const float* mean, const float* rstd, int N) {
  if (d.norm == NormKind::layernorm)
    o.layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, N, d.d_model);
  else
    o.rmsnorm_backward(dx, dw, dout, x, w, rstd, N, d.d_model);
}

// (a norm's weight gradient from this rank's rows: ParallelRegions::sum_row_shares's case)
void Model::norm_backward_rows(float* dx, float* dw, float* db, const float* dout, const float* x, const float* w,
                               const float* mean, const float* rstd, int rows) {
  const ModelDesc& d = desc;
  if (!d.seq_shards()) return norm_backward(*ops, d, dx, dw, db, dout, x, w, mean, rstd, rows);
  const int C = d.d_model;
  const bool bias = d.norm == NormKind::layernorm;
  ops->zero(d_norm_, 2 * static_cast<size_t>(C) * sizeof(float));
  norm_backward(*ops, d, dx, d_norm_, bias ? d_norm_ + C : nullptr, dout, x, w, mean, rstd, rows);
  tensor.sum(d_norm_, bias ? 2 * static_cast<size_t>(C) : static_cast<size_t>(C));
  ops->residual_forward(dw, dw, d_norm_, static_cast<size_t>(C));
  if (bias) ops->residual_forward(db, db, d_norm_ + C, static_cast<size_t>(C));
}

}  // namespace llmpi
