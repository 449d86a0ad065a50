// Token + position embedding, and the added embedding of a second table (BERT's token types).
//
//   embedding      forward   out[b,t,c] = wte[inp[b,t], c] + wpe[t, c]      (no wpe: + 0)
//                  backward  dwpe[t, c] += Σ_b dout[b,t,c]                   (skipped without dwpe)
//                            dwte[v, c] += Σ_{(b,t): inp[b,t] = v} dout[b,t,c]
//   embedding_add  forward   out[n, c] += table[ids[n], c]
//                  backward  dtable[v, c] += Σ_{n: ids[n] = v} dout[n, c]
//
// The scatter-adds into dwte / dtable (scatter_add_rows) are done without atomics,
// deterministically and in the CPU backend's order:
//   1. positions n = 0..N-1 are sorted by index with CUB's stable radix sort (keys = ids,
//      values = n), so each index's positions form one run, in increasing n;
//   2. one block per run (the block whose sorted index starts a run; the others exit at once)
//      walks the run in order, each thread owning channels c, c+blockDim, ...:
//        acc = dst[v, c];  for n in run: acc += src[n, c];  dst[v, c] = acc
// Every dst element thus receives its terms in row order, exactly as the CPU loop adds them, so
// the two backends agree bit for bit. Cost: a 32-bit radix sort of N ints (a few microseconds at
// N = 8192) plus one read of src; a very frequent index makes one long run (serial over its rows,
// parallel over C), which is fine at these sizes (BERT's token-type table has 2 rows: two runs).
#include <climits>

#include <cub/device/device_radix_sort.cuh>

#include "cuda_common.cuh"

namespace llmpi::cuda {

namespace {

constexpr int kThreads = 256;

// out[n, c] = wte[inp[n], c] + (wpe ? wpe[n % T, c] : 0)
__global__ void embedding_forward_kernel(float* __restrict__ out, const int32_t* __restrict__ inp,
                                         const float* __restrict__ wte,
                                         const float* __restrict__ wpe, int N, int T, int C) {
  const size_t total = static_cast<size_t>(N) * C;
  for (size_t i = grid_first(); i < total; i += grid_stride()) {
    const size_t n = i / C;
    const int c = static_cast<int>(i - n * C);
    float v = wte[static_cast<size_t>(inp[n]) * C + c];
    if (wpe != nullptr) {
      const int t = static_cast<int>(n % T);
      v += wpe[static_cast<size_t>(t) * C + c];
    }
    out[i] = v;
  }
}

// dwpe[t, c] += Σ_b dout[b, t, c], b in order (one thread per (t, c)).
__global__ void embedding_dwpe_kernel(float* __restrict__ dwpe, const float* __restrict__ dout,
                                      int B, int T, int C) {
  const size_t total = static_cast<size_t>(T) * C;
  for (size_t i = grid_first(); i < total; i += grid_stride()) {
    float acc = dwpe[i];
    for (int b = 0; b < B; b++) acc += dout[static_cast<size_t>(b) * total + i];
    dwpe[i] = acc;
  }
}

// out[n, c] += table[ids[n], c]
__global__ void embedding_add_forward_kernel(float* __restrict__ out,
                                             const int32_t* __restrict__ ids,
                                             const float* __restrict__ table, int N, int C) {
  const size_t total = static_cast<size_t>(N) * C;
  for (size_t i = grid_first(); i < total; i += grid_stride()) {
    const size_t n = i / C;
    const int c = static_cast<int>(i - n * C);
    out[i] += table[static_cast<size_t>(ids[n]) * C + c];
  }
}

__global__ void iota_kernel(int32_t* __restrict__ v, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) v[i] = i;
}

// Block i handles the run of equal indices that starts at sorted position i (if one starts there);
// indices >= limit are not rows of dst (a vocabulary shard's other tokens) and are skipped.
__global__ void scatter_add_runs_kernel(float* __restrict__ dst, const float* __restrict__ src,
                                        const int32_t* __restrict__ ids_sorted,
                                        const int32_t* __restrict__ pos_sorted, int N, int C, int limit) {
  const int i = blockIdx.x;
  const int32_t v = ids_sorted[i];
  if (v >= limit || (i > 0 && ids_sorted[i - 1] == v)) return;
  int end = i + 1;
  while (end < N && ids_sorted[end] == v) end++;
  float* g = dst + static_cast<size_t>(v) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = g[c];
    for (int j = i; j < end; j++) acc += src[static_cast<size_t>(pos_sorted[j]) * C + c];
    g[c] = acc;
  }
}

// A vocabulary shard's row of each id: id - v0 in [0, Vn), else Vn (skipped by the runs kernel).
__global__ void shard_rows_kernel(int32_t* __restrict__ rows, const int32_t* __restrict__ ids, int n, int v0,
                                  int Vn) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int r = ids[i] - v0;
    rows[i] = r >= 0 && r < Vn ? r : Vn;
  }
}

// out[n, c] = (wte[inp[n] - v0, c] for a token of the shard, else 0) + (wpe ? wpe[n % T, c] : 0)
__global__ void vocab_embedding_forward_kernel(float* __restrict__ out, const int32_t* __restrict__ inp,
                                               const float* __restrict__ wte, int v0, int Vn,
                                               const float* __restrict__ wpe, int N, int T, int C) {
  const size_t total = static_cast<size_t>(N) * C;
  for (size_t i = grid_first(); i < total; i += grid_stride()) {
    const size_t n = i / C;
    const int c = static_cast<int>(i - n * C);
    const int r = inp[n] - v0;
    const float w = r >= 0 && r < Vn ? wte[static_cast<size_t>(r) * C + c] : 0.0f;
    const float p = wpe != nullptr ? wpe[static_cast<size_t>(n % T) * C + c] : 0.0f;
    out[i] = w + p;
  }
}

}  // namespace

void scatter_add_rows(float* dst, const float* src, const int32_t* ids, int N, int C, int v0, int Vn) {
  if (N <= 0 || C <= 0) return;
  cudaStream_t s = compute_stream();
  // Stable sort of positions by index (a shard's: by its row, the other tokens last).
  int32_t* keys_out = static_cast<int32_t*>(workspace(kWsSortKeys, sizeof(int32_t) * N));
  const bool shard = Vn >= 0;
  int32_t* vals_in =
      static_cast<int32_t*>(workspace(kWsSortVals, (shard ? 3 : 2) * sizeof(int32_t) * static_cast<size_t>(N)));
  int32_t* vals_out = vals_in + N;
  if (shard) {
    int32_t* rows = vals_in + 2 * static_cast<size_t>(N);
    shard_rows_kernel<<<grid_for(N, kThreads), kThreads, 0, s>>>(rows, ids, N, v0, Vn);
    LLMPI_LAUNCH_CHECK("shard_rows");
    ids = rows;
  }
  iota_kernel<<<grid_for(N, kThreads), kThreads, 0, s>>>(vals_in, N);
  LLMPI_LAUNCH_CHECK("iota");
  size_t temp_bytes = 0;
  LLMPI_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, ids, keys_out, vals_in,
                                                   vals_out, N, 0, 32, s));
  void* temp = workspace(kWsSortTemp, temp_bytes);
  LLMPI_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, ids, keys_out, vals_in,
                                                   vals_out, N, 0, 32, s));
  const int threads = C >= kThreads ? kThreads : (C + 31) / 32 * 32;
  scatter_add_runs_kernel<<<N, threads, 0, s>>>(dst, src, keys_out, vals_out, N, C, shard ? Vn : INT_MAX);
  LLMPI_LAUNCH_CHECK("scatter_add_runs");
}

void embedding_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                       int T, int C) {
  const int N = B * T;
  if (N <= 0 || C <= 0) return;
  embedding_forward_kernel<<<grid_for(static_cast<size_t>(N) * C, kThreads), kThreads, 0,
                             compute_stream()>>>(out, inp, wte, wpe, N, T, C);
  LLMPI_LAUNCH_CHECK("embedding_forward");
}

namespace {
// embedding_backward over the tokens of rows [v0, v0 + Vn) (Vn < 0: every token, the whole table)
void embedding_backward_rows(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int v0, int Vn, int B,
                             int T, int C) {
  const int N = B * T;
  if (N <= 0 || C <= 0) return;
  if (dwpe != nullptr) {
    embedding_dwpe_kernel<<<grid_for(static_cast<size_t>(T) * C, kThreads), kThreads, 0,
                            compute_stream()>>>(dwpe, dout, B, T, C);
    LLMPI_LAUNCH_CHECK("embedding_dwpe");
  }
  scatter_add_rows(dwte, dout, inp, N, C, v0, Vn);
}
}  // namespace

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B,
                        int T, int C) {
  embedding_backward_rows(dwte, dwpe, dout, inp, 0, -1, B, T, C);
}

void embedding_add_forward(float* out, const int32_t* ids, const float* table, int N, int C) {
  if (N <= 0 || C <= 0) return;
  embedding_add_forward_kernel<<<grid_for(static_cast<size_t>(N) * C, kThreads), kThreads, 0,
                                 compute_stream()>>>(out, ids, table, N, C);
  LLMPI_LAUNCH_CHECK("embedding_add_forward");
}

void embedding_add_backward(float* dtable, const float* dout, const int32_t* ids, int N, int C) {
  scatter_add_rows(dtable, dout, ids, N, C);
}

void vocab_embedding_forward(float* out, const int32_t* inp, const float* wte, int v0, int Vn, const float* wpe,
                             int B, int T, int C) {
  const int N = B * T;
  if (N <= 0 || C <= 0) return;
  vocab_embedding_forward_kernel<<<grid_for(static_cast<size_t>(N) * C, kThreads), kThreads, 0, compute_stream()>>>(
      out, inp, wte, v0, Vn, wpe, N, T, C);
  LLMPI_LAUNCH_CHECK("vocab_embedding_forward");
}

void vocab_embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int v0, int Vn,
                              int B, int T, int C) {
  embedding_backward_rows(dwte, dwpe, dout, inp, v0, Vn, B, T, C);
}

}  // namespace llmpi::cuda
