// Normalisation over the last dimension (C): LayerNorm (biased variance) and RMSNorm.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace llmpi::cpu {

namespace {
// Rows per chunk for the dweight/dbias partial sums (fixed, so the result does not depend on the
// thread count).
constexpr int kChunkRows = 128;
// Rows times channels above which the loops are split over OpenMP threads.
constexpr long long kParMin = 1 << 15;

// Where row n of a norm's output is computed: out's row, or (out null: only the bf16 output is
// kept) this thread's scratch. The same loop writes either, so the bits are the same.
float* output_row(float* out, int n, int C) {
  return out != nullptr ? out + static_cast<size_t>(n) * C : thread_scratch(static_cast<size_t>(C));
}

// The bf16 bits of a computed row into out_bf16's row n (when given).
void store_bf16_row(uint16_t* out_bf16, const float* o, int n, int C) {
  if (out_bf16 != nullptr) store_bf16_bits(out_bf16 + static_cast<size_t>(n) * C, o, static_cast<size_t>(C));
}
}  // namespace

// For each row x = inp[n, :]:
//   mean = Σ_c x_c / C;  var = Σ_c (x_c - mean)² / C;  rstd = 1 / sqrt(var + eps)
//   out_c = (x_c - mean) * rstd * weight_c + bias_c
// Two passes over the row (it sits in L1) instead of E[x²] - mean², which cancels badly.
// out_bf16: the rounded output too (out may then be null).
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps, uint16_t* out_bf16) {
#pragma omp parallel for schedule(static) if (static_cast<long long>(N) * C > kParMin)
  for (int n = 0; n < N; n++) {
    const float* x = inp + static_cast<size_t>(n) * C;
    float* o = output_row(out, n, C);
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < C; c++) s += x[c];
    const float m = s / C;
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; c++) {
      const float d = x[c] - m;
      v += d * d;
    }
    const float r = 1.0f / std::sqrt(v / C + eps);
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = (x[c] - m) * r * weight[c] + bias[c];
    store_bf16_row(out_bf16, o, n, C);
    mean[n] = m;
    rstd[n] = r;
  }
}

// Per row, with norm_c = (x_c - mean) * rstd and g_c = weight_c * dout_c:
//   dinp_c    += rstd * (g_c - mean_c'(g) - norm_c * mean_c'(g * norm))
//   dweight_c += Σ_n norm_c * dout_c;   dbias_c += Σ_n dout_c
// The column sums are accumulated per chunk of kChunkRows rows (in parallel), then added to
// dweight/dbias chunk by chunk in order.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
  const int nchunks = (N + kChunkRows - 1) / kChunkRows;
  std::vector<float> part(static_cast<size_t>(nchunks) * 2 * C, 0.0f);
#pragma omp parallel for schedule(static) if (static_cast<long long>(N) * C > kParMin)
  for (int k = 0; k < nchunks; k++) {
    float* pw = part.data() + static_cast<size_t>(k) * 2 * C;
    float* pb = pw + C;
    const int n1 = (k + 1) * kChunkRows < N ? (k + 1) * kChunkRows : N;
    for (int n = k * kChunkRows; n < n1; n++) {
      const float* x = inp + static_cast<size_t>(n) * C;
      const float* dy = dout + static_cast<size_t>(n) * C;
      float* dx = dinp + static_cast<size_t>(n) * C;
      const float m = mean[n], r = rstd[n];
      float sg = 0.0f, sgn = 0.0f;
#pragma omp simd reduction(+ : sg, sgn)
      for (int c = 0; c < C; c++) {
        const float nrm = (x[c] - m) * r;
        const float g = weight[c] * dy[c];
        sg += g;
        sgn += g * nrm;
      }
      const float mg = sg / C, mgn = sgn / C;
#pragma omp simd
      for (int c = 0; c < C; c++) {
        const float nrm = (x[c] - m) * r;
        const float g = weight[c] * dy[c];
        dx[c] += r * (g - mg - nrm * mgn);
        pw[c] += nrm * dy[c];
        pb[c] += dy[c];
      }
    }
  }
  for (int k = 0; k < nchunks; k++) {
    const float* pw = part.data() + static_cast<size_t>(k) * 2 * C;
    const float* pb = pw + C;
#pragma omp simd
    for (int c = 0; c < C; c++) {
      dweight[c] += pw[c];
      dbias[c] += pb[c];
    }
  }
}

// For each row x = inp[n, :]:
//   ms = Σ_c x_c² / C;  rstd = 1 / sqrt(ms + eps);  out_c = x_c * rstd * weight_c
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps, uint16_t* out_bf16) {
#pragma omp parallel for schedule(static) if (static_cast<long long>(N) * C > kParMin)
  for (int n = 0; n < N; n++) {
    const float* x = inp + static_cast<size_t>(n) * C;
    float* o = output_row(out, n, C);
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; c++) ss += x[c] * x[c];
    const float r = 1.0f / std::sqrt(ss / C + eps);
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = x[c] * r * weight[c];
    store_bf16_row(out_bf16, o, n, C);
    rstd[n] = r;
  }
}

// Per row, with norm_c = x_c * rstd and g_c = weight_c * dout_c. Since d rstd / d x_c =
// -rstd³ x_c / C:
//   dinp_c    += rstd * (g_c - norm_c * mean_c'(g * norm))
//   dweight_c += Σ_n norm_c * dout_c
// The column sums are accumulated per chunk of kChunkRows rows (in parallel), then added to
// dweight chunk by chunk in order (as in layernorm_backward).
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C) {
  const int nchunks = (N + kChunkRows - 1) / kChunkRows;
  std::vector<float> part(static_cast<size_t>(nchunks) * C, 0.0f);
#pragma omp parallel for schedule(static) if (static_cast<long long>(N) * C > kParMin)
  for (int k = 0; k < nchunks; k++) {
    float* pw = part.data() + static_cast<size_t>(k) * C;
    const int n1 = (k + 1) * kChunkRows < N ? (k + 1) * kChunkRows : N;
    for (int n = k * kChunkRows; n < n1; n++) {
      const float* x = inp + static_cast<size_t>(n) * C;
      const float* dy = dout + static_cast<size_t>(n) * C;
      float* dx = dinp + static_cast<size_t>(n) * C;
      const float r = rstd[n];
      float sgn = 0.0f;
#pragma omp simd reduction(+ : sgn)
      for (int c = 0; c < C; c++) sgn += weight[c] * dy[c] * (x[c] * r);
      const float mgn = sgn / C;
#pragma omp simd
      for (int c = 0; c < C; c++) {
        const float nrm = x[c] * r;
        dx[c] += r * (weight[c] * dy[c] - nrm * mgn);
        pw[c] += nrm * dy[c];
      }
    }
  }
  for (int k = 0; k < nchunks; k++) {
    const float* pw = part.data() + static_cast<size_t>(k) * C;
#pragma omp simd
    for (int c = 0; c < C; c++) dweight[c] += pw[c];
  }
}

}  // namespace llmpi::cpu
