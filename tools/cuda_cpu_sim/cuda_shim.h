// A stand-in for the small part of CUDA that kernels/flash_attention_mma.cu's kernels use, so that
// their source runs unchanged on the CPU (tools/cuda_cpu_sim/README.md). Not an emulator of a GPU:
//   - a block is 128 real threads (std::thread), __syncthreads and __syncwarp are real barriers
//     (std::barrier), __shfl_xor_sync goes through a per-warp exchange array between two barriers;
//   - blocks run one after another; `extern __shared__` arrays resolve to one static buffer that is
//     filled with NaN bytes before every block, so a read of shared memory nobody wrote shows;
//   - mma_m16n8k16_bf16 and mma_m16n8k8_tf32 (kernels/mma_sync.cuh: the PTX mma.sync with bf16 or
//     tf32 operands and fp32 accumulators) are a warp-collective exchange: every lane deposits
//     its operand registers, each rebuilds A and B from the documented fragment layouts and
//     computes its own four outputs, summing a product's 16 terms in fp32 in index
//     order (with -DLLMPI_SIM_TRUNCATE_MMA: exactly, then rounded toward zero, as tensor cores
//     may). A kernel that put an element in the wrong lane or register half gets a wrong product;
//     the layouts themselves are the PTX ISA's ("Matrix Fragments for mma.m16n8k16");
//   - bf16 conversions are backend/bf16.h's round to nearest even, round_tf32 backend/tf32.h's.
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
#include "backend/tf32.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
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
  uint32_t mma_a[kWarps][32][4], mma_b[kWarps][32][2];  // each lane's mma operand registers
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
struct float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
struct uint2 {
  uint32_t x, y;
};
inline uint2 make_uint2(uint32_t x, uint32_t y) { return {x, y}; }

struct __nv_bfloat16 {
  uint16_t bits;
};
inline __nv_bfloat16 __float2bfloat16_rn(float x) { return {llmpi::float_to_bf16_bits(x)}; }
inline float __bfloat162float(__nv_bfloat16 b) { return llmpi::bf16_bits_to_float(b.bits); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.bits; }
inline unsigned __float_as_uint(float x) {
  unsigned u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

namespace llmpi::cuda {

namespace sim_mma {
inline float as_float(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
// d[e] += Σ_k A[m][k] B[k][n] for this lane's four outputs (m = g or g + 8, n = 2t or 2t + 1), the
// K terms in index order in fp32 (-DLLMPI_SIM_TRUNCATE_MMA: exactly, then rounded toward zero)
template <int K>
void accumulate(float (&d)[4], const float (&A)[16][K], const float (&B)[K][8]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  for (int e = 0; e < 4; e++) {
    const int m = g + (e >> 1) * 8, n = 2 * t + (e & 1);
#ifdef LLMPI_SIM_TRUNCATE_MMA
    double s = d[e];
    for (int k = 0; k < K; k++) s += static_cast<double>(A[m][k]) * B[k][n];
    float f = static_cast<float>(s);
    if (std::fabs(static_cast<double>(f)) > std::fabs(s)) f = std::nextafter(f, 0.0f);
    d[e] = f;
#else
    float s = d[e];
    for (int k = 0; k < K; k++) s += A[m][k] * B[k][n];
    d[e] = s;
#endif
  }
}
// every lane's operand registers, between two warp barriers
inline void exchange(const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  auto& blk = *llmpi::sim::g_block;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = 0; r < 4; r++) blk.mma_a[w][lane][r] = a[r];
  for (int r = 0; r < 2; r++) blk.mma_b[w][lane][r] = b[r];
  __syncwarp();
}
}  // namespace sim_mma

// D (16 x 8) += A (16 x 16) B (16 x 8), bf16, the whole warp together; g = lane / 4, t = lane % 4:
// a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1], a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9];
// b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g]; d[0], d[1] = D[g][2t, 2t+1], d[2], d[3] = D[g+8][..];
// the lower index in a register's low 16 bits.
inline void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  const auto& blk = *llmpi::sim::g_block;
  const int w = threadIdx.x / 32;
  sim_mma::exchange(a, b);
  auto lo = [](uint32_t v) { return llmpi::bf16_bits_to_float(static_cast<uint16_t>(v & 0xffffu)); };
  auto hi = [](uint32_t v) { return llmpi::bf16_bits_to_float(static_cast<uint16_t>(v >> 16)); };
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; l++) {
    const int g = l / 4, t = l % 4;
    for (int r = 0; r < 4; r++) {
      const int row = g + (r & 1) * 8, col = 2 * t + (r >> 1) * 8;
      A[row][col] = lo(blk.mma_a[w][l][r]);
      A[row][col + 1] = hi(blk.mma_a[w][l][r]);
    }
    for (int r = 0; r < 2; r++) {
      const int k = 2 * t + r * 8;
      B[k][g] = lo(blk.mma_b[w][l][r]);
      B[k + 1][g] = hi(blk.mma_b[w][l][r]);
    }
  }
  __syncwarp();  // every lane has read the others' registers
  sim_mma::accumulate<16>(d, A, B);
}

// D (16 x 8) += A (16 x 8) B (8 x 8), tf32: a[0] = A[g][t], a[1] = A[g+8][t], a[2] = A[g][t+4],
// a[3] = A[g+8][t+4]; b[0] = B[t][g], b[1] = B[t+4][g]. The tensor cores read a tf32 operand's top
// 19 bits; the kernels round every operand first (round_tf32), and a value with low bits left
// stops the run here, so an unrounded operand cannot pass unnoticed.
inline void mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  const auto& blk = *llmpi::sim::g_block;
  const int w = threadIdx.x / 32;
  sim_mma::exchange(a, b);
  auto tf = [](uint32_t v) {
    if ((v & 0x1fffu) != 0 && (v & 0x7f800000u) != 0x7f800000u) llmpi::sim::die("a tf32 mma operand that is not rounded");
    return sim_mma::as_float(v);
  };
  float A[16][8], B[8][8];
  for (int l = 0; l < 32; l++) {
    const int g = l / 4, t = l % 4;
    for (int r = 0; r < 4; r++) A[g + (r & 1) * 8][t + (r >> 1) * 4] = tf(blk.mma_a[w][l][r]);
    for (int r = 0; r < 2; r++) B[t + r * 4][g] = tf(blk.mma_b[w][l][r]);
  }
  __syncwarp();
  sim_mma::accumulate<8>(d, A, B);
}

inline float round_tf32(float x) { return llmpi::round_to_tf32(x); }

}  // namespace llmpi::cuda
