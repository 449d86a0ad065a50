// A stand-in for the small part of CUDA that kernels/flash_attention_bf16.cu's kernels use, so that
// their source runs unchanged on the CPU (tools/cuda_cpu_sim/README.md). Not an emulator of a GPU:
//   - a block is 128 real threads (std::thread), __syncthreads and __syncwarp are real barriers
//     (std::barrier), __shfl_xor_sync goes through a per-warp exchange array between two barriers;
//   - blocks run one after another; `extern __shared__` arrays resolve to one static buffer that is
//     filled with NaN bytes before every block, so a read of shared memory nobody wrote shows;
//   - WMMA (16x16x16, bf16 inputs, fp32 accumulators) keeps every fragment as a full 16x16 matrix
//     in each thread (the real fragments are spread over the warp's lanes; the kernels only use
//     them through load / store / fill / mma, so that does not show), checks that every fragment
//     pointer is 32-byte aligned and every ldm a multiple of 16 bytes (the documented rules), and
//     sums a product's 16 terms in fp32 in index order (with -DLLMPI_SIM_TRUNCATE_MMA: exactly, then
//     rounded toward zero, as tensor cores may);
//   - bf16 conversions are backend/bf16.h's round to nearest even.
// What it cannot show: timing, occupancy, bank conflicts, the hardware's own rounding, memory
// ordering between blocks, and anything in code that does not compile against this header.
#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "backend/bf16.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __restrict__ __restrict
#define __align__(n)
#define __shared__

namespace llmpi::sim {

constexpr int kBlockThreads = 128;  // the flash kernels' block: 4 warps
constexpr int kWarps = kBlockThreads / 32;

struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};

struct BlockContext {
  std::barrier<> block{kBlockThreads};
  std::barrier<> warp[kWarps] = {std::barrier<>(32), std::barrier<>(32), std::barrier<>(32), std::barrier<>(32)};
  float exchange[kWarps][32];
};
inline thread_local BlockContext* g_block = nullptr;

[[noreturn]] inline void die(const char* what) {
  std::fprintf(stderr, "cuda_cpu_sim: %s\n", what);
  std::abort();
}

}  // namespace llmpi::sim

inline thread_local llmpi::sim::Dim3 threadIdx, blockIdx;
inline llmpi::sim::Dim3 blockDim{llmpi::sim::kBlockThreads, 1, 1};

inline void __syncthreads() { llmpi::sim::g_block->block.arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { llmpi::sim::g_block->warp[threadIdx.x / 32].arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  llmpi::sim::g_block->exchange[w][l] = v;
  __syncwarp();
  const float r = llmpi::sim::g_block->exchange[w][l ^ lane_mask];
  __syncwarp();
  return r;
}
inline void __trap() { llmpi::sim::die("__trap"); }
using std::min;

struct float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

struct __nv_bfloat16 {
  uint16_t bits;
};
inline __nv_bfloat16 __float2bfloat16_rn(float x) { return {llmpi::float_to_bf16_bits(x)}; }
inline float __bfloat162float(__nv_bfloat16 b) { return llmpi::bf16_bits_to_float(b.bits); }

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  float x[16][16];  // [row][col] of A, [k][n] of B, [m][n] of an accumulator
};

inline void check_operand(const void* p, unsigned ldm, int elem_bytes) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0) llmpi::sim::die("a WMMA pointer that is not 32-byte aligned");
  if ((ldm * elem_bytes) % 16 != 0) llmpi::sim::die("a WMMA ldm that is not a multiple of 16 bytes");
}

template <class L>
inline void load_matrix_sync(fragment<matrix_a, 16, 16, 16, __nv_bfloat16, L>& f, const __nv_bfloat16* p,
                             unsigned ldm) {
  static_assert(std::is_same_v<L, row_major>, "the kernels load A row-major");
  check_operand(p, ldm, 2);
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) f.x[r][c] = __bfloat162float(p[r * ldm + c]);
}
inline void load_matrix_sync(fragment<matrix_b, 16, 16, 16, __nv_bfloat16, row_major>& f, const __nv_bfloat16* p,
                             unsigned ldm) {
  check_operand(p, ldm, 2);
  for (int k = 0; k < 16; k++)
    for (int n = 0; n < 16; n++) f.x[k][n] = __bfloat162float(p[k * ldm + n]);
}
inline void load_matrix_sync(fragment<matrix_b, 16, 16, 16, __nv_bfloat16, col_major>& f, const __nv_bfloat16* p,
                             unsigned ldm) {
  check_operand(p, ldm, 2);
  for (int k = 0; k < 16; k++)
    for (int n = 0; n < 16; n++) f.x[k][n] = __bfloat162float(p[n * ldm + k]);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm, layout_t l) {
  check_operand(p, ldm, 4);
  if (l != mem_row_major) llmpi::sim::die("the kernels keep accumulators row-major");
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) f.x[r][c] = p[r * ldm + c];
}
// Every lane holds the whole tile here: lane 0 writes it, between two warp barriers (a warp's
// store is collective).
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm, layout_t l) {
  check_operand(p, ldm, 4);
  if (l != mem_row_major) llmpi::sim::die("the kernels keep accumulators row-major");
  __syncwarp();
  if (threadIdx.x % 32 == 0)
    for (int r = 0; r < 16; r++)
      for (int c = 0; c < 16; c++) p[r * ldm + c] = f.x[r][c];
  __syncwarp();
}
inline void fill_fragment(fragment<accumulator, 16, 16, 16, float>& f, float v) {
  for (auto& row : f.x)
    for (float& e : row) e = v;
}
template <class A, class B>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const A& a, const B& b,
                     const fragment<accumulator, 16, 16, 16, float>& c) {
  float t[16][16];
  for (int m = 0; m < 16; m++)
    for (int n = 0; n < 16; n++) {
#ifdef LLMPI_SIM_TRUNCATE_MMA
      double s = c.x[m][n];
      for (int k = 0; k < 16; k++) s += static_cast<double>(a.x[m][k]) * b.x[k][n];
      float f = static_cast<float>(s);
      if (std::fabs(static_cast<double>(f)) > std::fabs(s)) f = std::nextafter(f, 0.0f);
      t[m][n] = f;
#else
      float s = c.x[m][n];
      for (int k = 0; k < 16; k++) s += a.x[m][k] * b.x[k][n];
      t[m][n] = s;
#endif
    }
  std::memcpy(d.x, t, sizeof t);
}

}  // namespace nvcuda::wmma
