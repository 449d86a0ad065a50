// Token + position embedding.
//
//   forward   out[b,t,c] = wte[inp[b,t], c] + wpe[t, c]
//   backward  dwpe[t, c]        += Σ_b dout[b,t,c]
//             dwte[v, c]        += Σ_{(b,t): inp[b,t] = v} dout[b,t,c]
//
// The dwte scatter-add is done without atomics, deterministically and in the CPU backend's order:
//   1. positions n = 0..N-1 are sorted by token with CUB's stable radix sort (keys = inp,
//      values = n), so each token's positions form one run, in increasing n;
//   2. one block per run (the block whose sorted index starts a run; the others exit at once)
//      walks the run in order, each thread owning channels c, c+blockDim, ...:
//        acc = dwte[v, c];  for n in run: acc += dout[n, c];  dwte[v, c] = acc
// Every dwte element thus receives its terms in row order, exactly as the CPU loop adds them, so
// the two backends agree bit for bit on this op. Cost: a 32-bit radix sort of N ints (a few
// microseconds at N = 8192) plus one read of dout; a very frequent token makes one long run
// (serial over its rows, parallel over C), which is fine at GPT-2 sizes.
#include <cub/device/device_radix_sort.cuh>

#include "cuda_common.cuh"

namespace llmpi::cuda {

namespace {

__global__ void embedding_forward_kernel(float* __restrict__ out, const int32_t* __restrict__ inp,
                                         const float* __restrict__ wte,
                                         const float* __restrict__ wpe, int N, int T, int C) {
  const size_t total = static_cast<size_t>(N) * C;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t n = i / C;
    const int c = static_cast<int>(i - n * C);
    const int t = static_cast<int>(n % T);
    out[i] = wte[static_cast<size_t>(inp[n]) * C + c] + wpe[static_cast<size_t>(t) * C + c];
  }
}

// dwpe[t, c] += Σ_b dout[b, t, c], b in order (one thread per (t, c)).
__global__ void embedding_dwpe_kernel(float* __restrict__ dwpe, const float* __restrict__ dout,
                                      int B, int T, int C) {
  const size_t total = static_cast<size_t>(T) * C;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float acc = dwpe[i];
    for (int b = 0; b < B; b++) acc += dout[static_cast<size_t>(b) * T * C + i];
    dwpe[i] = acc;
  }
}

__global__ void iota_kernel(int32_t* __restrict__ v, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) v[i] = i;
}

// Block i handles the run of equal tokens that starts at sorted index i (if one starts there).
__global__ void embedding_dwte_kernel(float* __restrict__ dwte, const float* __restrict__ dout,
                                      const int32_t* __restrict__ tok_sorted,
                                      const int32_t* __restrict__ pos_sorted, int N, int C) {
  const int i = blockIdx.x;
  const int32_t v = tok_sorted[i];
  if (i > 0 && tok_sorted[i - 1] == v) return;
  int end = i + 1;
  while (end < N && tok_sorted[end] == v) end++;
  float* g = dwte + static_cast<size_t>(v) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = g[c];
    for (int j = i; j < end; j++) acc += dout[static_cast<size_t>(pos_sorted[j]) * C + c];
    g[c] = acc;
  }
}

}  // namespace

void embedding_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                       int T, int C) {
  const int N = B * T;
  if (N <= 0 || C <= 0) return;
  embedding_forward_kernel<<<grid_for(static_cast<size_t>(N) * C, 256), 256, 0,
                             compute_stream()>>>(out, inp, wte, wpe, N, T, C);
  LLMPI_LAUNCH_CHECK("embedding_forward");
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B,
                        int T, int C) {
  const int N = B * T;
  if (N <= 0 || C <= 0) return;
  cudaStream_t s = compute_stream();
  embedding_dwpe_kernel<<<grid_for(static_cast<size_t>(T) * C, 256), 256, 0, s>>>(dwpe, dout, B,
                                                                                   T, C);
  LLMPI_LAUNCH_CHECK("embedding_dwpe");

  // Stable sort of positions by token.
  int32_t* keys_out = static_cast<int32_t*>(workspace(kWsSortKeys, sizeof(int32_t) * N));
  int32_t* vals_in = static_cast<int32_t*>(workspace(kWsSortVals, 2 * sizeof(int32_t) * N));
  int32_t* vals_out = vals_in + N;
  iota_kernel<<<grid_for(N, 256), 256, 0, s>>>(vals_in, N);
  LLMPI_LAUNCH_CHECK("iota");
  size_t temp_bytes = 0;
  LLMPI_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, inp, keys_out, vals_in,
                                                   vals_out, N, 0, 32, s));
  void* temp = workspace(kWsSortTemp, temp_bytes);
  LLMPI_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, inp, keys_out, vals_in,
                                                   vals_out, N, 0, 32, s));

  const int threads = C >= 256 ? 256 : (C + 31) / 32 * 32;
  embedding_dwte_kernel<<<N, threads, 0, s>>>(dwte, dout, keys_out, vals_out, N, C);
  LLMPI_LAUNCH_CHECK("embedding_dwte");
}

}  // namespace llmpi::cuda
