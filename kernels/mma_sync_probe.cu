// A self-test of kernels/mma_sync.cuh on the card (backend/cuda_ops.h cuda_mma_probe,
// cuda_round_tf32; tests/test_cuda_mma.cpp): one warp loads A and B by the fragment layouts the
// header states — written out again here, element by element, independently of the attention
// kernels' loaders — runs one mma instruction and stores D by the accumulator layout. If the
// hardware's layouts were not the ones the PTX ISA documents (and tools/cuda_cpu_sim emulates),
// this product would not equal A B, and the fused-attention tests' failures would have a name.
#include <cuda_bf16.h>

#include <vector>

#include "backend/cuda_ops.h"
#include "cuda_common.cuh"
#include "mma_sync.cuh"
#include "runtime/error.h"

namespace llmpi::cuda {
namespace {

__device__ uint32_t bf16_pair(float lo, float hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16;
}

// A [16][K], B [K][8], D [16][8], row-major; K = 16 (bf16) or 8 (tf32). One warp.
__global__ void mma_probe_kernel(bool bf16, const float* A, const float* B, float* D) {
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  uint32_t a[4], b[2];
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (bf16) {
    for (int r = 0; r < 4; r++) {  // a[r] = A[g + 8 (r & 1)][2t + 8 (r >> 1) + {0, 1}]
      const float* p = A + (g + (r & 1) * 8) * 16 + 2 * t + (r >> 1) * 8;
      a[r] = bf16_pair(p[0], p[1]);
    }
    for (int r = 0; r < 2; r++) {  // b[r] = B[2t + 8r + {0, 1}][g]
      const int k = 2 * t + r * 8;
      b[r] = bf16_pair(B[k * 8 + g], B[(k + 1) * 8 + g]);
    }
    mma_m16n8k16_bf16(d, a, b);
  } else {
    for (int r = 0; r < 4; r++) a[r] = __float_as_uint(round_tf32(A[(g + (r & 1) * 8) * 8 + t + (r >> 1) * 4]));
    for (int r = 0; r < 2; r++) b[r] = __float_as_uint(round_tf32(B[(t + r * 4) * 8 + g]));
    mma_m16n8k8_tf32(d, a, b);
  }
  for (int e = 0; e < 4; e++) D[(g + (e >> 1) * 8) * 8 + 2 * t + (e & 1)] = d[e];
}

__global__ void round_tf32_kernel(const float* in, float* out, size_t n) {
  for (size_t i = grid_first(); i < n; i += grid_stride()) out[i] = round_tf32(in[i]);
}

}  // namespace
}  // namespace llmpi::cuda

namespace llmpi {

void cuda_mma_probe(GemmPrecision prec, const float* A, const float* B, float* D) {
  if (prec == GemmPrecision::fp32) fail("cuda_mma_probe: the instructions are bf16 and tf32");
  const bool bf16 = prec == GemmPrecision::bf16;
  const int K = bf16 ? 16 : 8;
  float* a = static_cast<float*>(cuda::alloc(16 * K * sizeof(float)));
  float* b = static_cast<float*>(cuda::alloc(K * 8 * sizeof(float)));
  float* d = static_cast<float*>(cuda::alloc(16 * 8 * sizeof(float)));
  cuda::copy_to_device(a, A, 16 * K * sizeof(float));
  cuda::copy_to_device(b, B, K * 8 * sizeof(float));
  cuda::mma_probe_kernel<<<1, 32, 0, cuda::compute_stream()>>>(bf16, a, b, d);
  LLMPI_LAUNCH_CHECK("mma_probe");
  cuda::copy_to_host(D, d, 16 * 8 * sizeof(float));
  cuda::free(a);
  cuda::free(b);
  cuda::free(d);
}

void cuda_round_tf32(const float* in, float* out, size_t n) {
  if (n == 0) return;
  float* x = static_cast<float*>(cuda::alloc(n * sizeof(float)));
  float* y = static_cast<float*>(cuda::alloc(n * sizeof(float)));
  cuda::copy_to_device(x, in, n * sizeof(float));
  cuda::round_tf32_kernel<<<cuda::grid_for(n, 256), 256, 0, cuda::compute_stream()>>>(x, y, n);
  LLMPI_LAUNCH_CHECK("round_tf32");
  cuda::copy_to_host(out, y, n * sizeof(float));
  cuda::free(x);
  cuda::free(y);
}

}  // namespace llmpi
