// The norms of every family (LayerNorm or RMSNorm, by desc.norm), forward beside backward; the
// ops are the backend's (kernels/ and backend/cpu/ hold the math). Model::norm_backward_rows,
// the sequence-parallel form of the backward, is in norm.cpp.
#pragma once
#include <cstdint>

#include "backend/ops.h"
#include "model/model_desc.h"

namespace llmpi {

// out = norm(x) over N rows of d_model, its statistics into mean (LayerNorm) and rstd; out16: the
// output in bf16 too (with out null: only there), a bf16 GEMM's input.
void norm_forward(const Ops& o, const ModelDesc& d, float* out, uint16_t* out16, float* mean, float* rstd,
                  const float* x, const float* w, const float* b, int N);
// res = a + b, then out = norm(res): one fused op (one pass over each row on the GPU).
void residual_norm_forward(const Ops& o, const ModelDesc& d, float* res, float* out, uint16_t* out16, float* mean,
                           float* rstd, const float* a, const float* b, const float* w, const float* bias, int N);
// dx += d norm(x) / dx · dout, dw += ..., db += ... (db: LayerNorm only)
void norm_backward(const Ops& o, const ModelDesc& d, float* dx, float* dw, float* db, const float* dout,
                   const float* x, const float* w, const float* mean, const float* rstd, int N);

}  // namespace llmpi
