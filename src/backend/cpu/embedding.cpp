// Embedding lookups: token + position (position optional, as in LLaMA, which has none), and the
// added lookup of BERT's token-type embedding.
#include <omp.h>

#include <climits>

#include "backend/cpu/cpu_ops.h"

namespace llmpi::cpu {

namespace {

// Rows times channels above which the loops are split over OpenMP threads.
constexpr long long kParMin = 1 << 16;

// The channel range [c0, c1) of thread `it` of `nt`, in multiples of 16 floats (one 64-byte line,
// so that no two threads write the same cache line).
void thread_channels(int C, int nt, int it, int* c0, int* c1) {
  const size_t lines = (static_cast<size_t>(C) + 15) / 16;
  size_t l0, l1;
  split_range(lines, nt, it, &l0, &l1);
  *c0 = static_cast<int>(l0 * 16);
  *c1 = static_cast<int>(l1 * 16 < static_cast<size_t>(C) ? l1 * 16 : C);
}

}  // namespace

// out[b,t,c] = wte[inp[b,t], c] + wpe[t, c]   (wpe null: out[b,t,c] = wte[inp[b,t], c])
void embedding_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                       int T, int C) {
  const long long N = static_cast<long long>(B) * T;
#pragma omp parallel for schedule(static) if (N * C > kParMin)
  for (long long n = 0; n < N; n++) {
    float* o = out + n * C;
    const float* we = wte + static_cast<long long>(inp[n]) * C;
    if (wpe != nullptr) {
      const float* pe = wpe + (n % T) * C;
#pragma omp simd
      for (int c = 0; c < C; c++) o[c] = we[c] + pe[c];
    } else {
#pragma omp simd
      for (int c = 0; c < C; c++) o[c] = we[c];
    }
  }
}

namespace {

// dwte[inp[b,t] - v0, c] += dout[b,t,c] for the tokens in [v0, v0 + Vn);  dwpe[t, c] += dout[b,t,c]
// (dwpe null: skipped). Two rows can carry the same token, so the scatter-add is split over
// channels, not rows: each thread owns a channel range and walks all rows in order. Every element
// thus receives its terms in row order, whatever the thread count (deterministic, bitwise).
void embedding_backward_rows(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int v0, int Vn, int B,
                             int T, int C) {
  const long long N = static_cast<long long>(B) * T;
  const bool par = N * C > kParMin && C >= 32;
#pragma omp parallel if (par)
  {
    int c0, c1;
    thread_channels(C, omp_get_num_threads(), omp_get_thread_num(), &c0, &c1);
    for (long long n = 0; n < N; n++) {
      const float* d = dout + n * C;
      const int r = inp[n] - v0;
      float* gw = r >= 0 && r < Vn ? dwte + static_cast<long long>(r) * C : nullptr;
      if (dwpe != nullptr) {
        float* gp = dwpe + (n % T) * C;
        if (gw) {
#pragma omp simd
          for (int c = c0; c < c1; c++) {
            gw[c] += d[c];
            gp[c] += d[c];
          }
        } else {
#pragma omp simd
          for (int c = c0; c < c1; c++) gp[c] += d[c];
        }
      } else if (gw) {
#pragma omp simd
        for (int c = c0; c < c1; c++) gw[c] += d[c];
      }
    }
  }
}

}  // namespace

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T, int C) {
  embedding_backward_rows(dwte, dwpe, dout, inp, 0, INT_MAX, B, T, C);
}

// A vocabulary shard's (tensor parallelism): rows [v0, v0 + Vn) of the whole table are dwte's.
void vocab_embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int v0, int Vn,
                              int B, int T, int C) {
  embedding_backward_rows(dwte, dwpe, dout, inp, v0, Vn, B, T, C);
}

// out[n, c] += table[ids[n], c]   (rows are independent: split over rows)
void embedding_add_forward(float* out, const int32_t* ids, const float* table, int N, int C) {
#pragma omp parallel for schedule(static) if (static_cast<long long>(N) * C > kParMin)
  for (int n = 0; n < N; n++) {
    float* o = out + static_cast<size_t>(n) * C;
    const float* e = table + static_cast<size_t>(ids[n]) * C;
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] += e[c];
  }
}

// dtable[ids[n], c] += dout[n, c]
// A scatter-add like embedding_backward's, split over channels for the same reason: each element
// of dtable receives its terms in row order, whatever the thread count.
void embedding_add_backward(float* dtable, const float* dout, const int32_t* ids, int N, int C) {
  const bool par = static_cast<long long>(N) * C > kParMin && C >= 32;
#pragma omp parallel if (par)
  {
    int c0, c1;
    thread_channels(C, omp_get_num_threads(), omp_get_thread_num(), &c0, &c1);
    for (int n = 0; n < N; n++) {
      const float* d = dout + static_cast<size_t>(n) * C;
      float* g = dtable + static_cast<size_t>(ids[n]) * C;
#pragma omp simd
      for (int c = c0; c < c1; c++) g[c] += d[c];
    }
  }
}


// A vocabulary shard's lookup (tensor parallelism): rows [v0, v0 + Vn) of the whole table are
// wte's rows [0, Vn); a token outside them contributes 0.
void vocab_embedding_forward(float* out, const int32_t* inp, const float* wte, int v0, int Vn, const float* wpe,
                             int B, int T, int C) {
  const long long N = static_cast<long long>(B) * T;
#pragma omp parallel for schedule(static) if (N * C > kParMin)
  for (long long n = 0; n < N; n++) {
    float* o = out + n * C;
    const int r = inp[n] - v0;
    const float* we = r >= 0 && r < Vn ? wte + static_cast<long long>(r) * C : nullptr;
    const float* pe = wpe != nullptr ? wpe + (n % T) * C : nullptr;
    for (int c = 0; c < C; c++) o[c] = (we ? we[c] : 0.0f) + (pe ? pe[c] : 0.0f);
  }
}

}  // namespace llmpi::cpu
