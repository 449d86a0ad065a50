// Token + position embedding.
#include <omp.h>

#include "backend/cpu/cpu_ops.h"

namespace llmpi::cpu {

// out[b,t,c] = wte[inp[b,t], c] + wpe[t, c]
void embedding_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                       int T, int C) {
  const long long N = static_cast<long long>(B) * T;
#pragma omp parallel for schedule(static) if (N * C > (1 << 16))
  for (long long n = 0; n < N; n++) {
    const long long t = n % T;
    float* o = out + n * C;
    const float* we = wte + static_cast<long long>(inp[n]) * C;
    const float* pe = wpe + t * C;
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = we[c] + pe[c];
  }
}

// dwte[inp[b,t], c] += dout[b,t,c];  dwpe[t, c] += dout[b,t,c]
// Two rows can carry the same token, so the scatter-add is split over channels, not rows: each
// thread owns a channel range and walks all rows in order. Every element thus receives its terms
// in row order, whatever the thread count (deterministic, bitwise).
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B,
                        int T, int C) {
  const long long N = static_cast<long long>(B) * T;
  const bool par = N * C > (1 << 16) && C >= 32;
#pragma omp parallel if (par)
  {
    const int nt = omp_get_num_threads(), it = omp_get_thread_num();
    // Channel ranges in multiples of 16 floats (one 64-byte line) to avoid false sharing.
    const size_t lines = (static_cast<size_t>(C) + 15) / 16;
    size_t l0, l1;
    split_range(lines, nt, it, &l0, &l1);
    const int c0 = static_cast<int>(l0 * 16);
    const int c1 = static_cast<int>(l1 * 16 < static_cast<size_t>(C) ? l1 * 16 : C);
    for (long long n = 0; n < N; n++) {
      const long long t = n % T;
      const float* d = dout + n * C;
      float* gw = dwte + static_cast<long long>(inp[n]) * C;
      float* gp = dwpe + t * C;
#pragma omp simd
      for (int c = c0; c < c1; c++) {
        gw[c] += d[c];
        gp[c] += d[c];
      }
    }
  }
}

}  // namespace llmpi::cpu
