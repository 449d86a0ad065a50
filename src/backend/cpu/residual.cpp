// Residual connection (out = a + b) and the first-token slice (BERT's [CLS] pooling input).
#include "backend/cpu/cpu_ops.h"

namespace llmpi::cpu {

// out[i] = a[i] + b[i]   (elementwise, so out may alias a or b)
void residual_forward(float* out, const float* a, const float* b, size_t n) {
  const long long nn = static_cast<long long>(n);
#pragma omp parallel for simd schedule(static) if (nn > (1 << 16))
  for (long long i = 0; i < nn; i++) out[i] = a[i] + b[i];
}

// res = a + b; out = LayerNorm(res) / RMSNorm(res): the two ops in turn (the reference; the CUDA
// op fuses them into one pass over each row and must give these bits on the GPU's own ops).
void residual_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* a, const float* b,
                                const float* weight, const float* bias, int N, int C, float eps, uint16_t* out_bf16) {
  residual_forward(res, a, b, static_cast<size_t>(N) * C);
  layernorm_forward(out, mean, rstd, res, weight, bias, N, C, eps, out_bf16);
}

void residual_rmsnorm_forward(float* res, float* out, float* rstd, const float* a, const float* b,
                              const float* weight, int N, int C, float eps, uint16_t* out_bf16) {
  residual_forward(res, a, b, static_cast<size_t>(N) * C);
  rmsnorm_forward(out, rstd, res, weight, N, C, eps, out_bf16);
}

// out[b, c] = inp[b, 0, c]   (inp [B,T,C], out [B,C]; B*C floats: no threads needed)
void first_token_forward(float* out, const float* inp, int B, int T, int C) {
  for (int b = 0; b < B; b++) {
    const float* x = inp + static_cast<size_t>(b) * T * C;
    float* o = out + static_cast<size_t>(b) * C;
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = x[c];
  }
}

// dinp[b, 0, c] += dout[b, c]   (the other positions receive nothing from this op)
void first_token_backward(float* dinp, const float* dout, int B, int T, int C) {
  for (int b = 0; b < B; b++) {
    float* dx = dinp + static_cast<size_t>(b) * T * C;
    const float* d = dout + static_cast<size_t>(b) * C;
#pragma omp simd
    for (int c = 0; c < C; c++) dx[c] += d[c];
  }
}

}  // namespace llmpi::cpu
