// Fused attention on tensor cores, for runtime.precision=bf16 and tf32
// (kernels/flash_attention_mma.cuh; called by flash_attention_forward/backward in
// flash_attention.cu). The same structure as the fp32 kernels there, with the matrix products as
// PTX mma.sync instructions (sm_80 and later; kernels/mma_sync.cuh gives the fragment layouts),
// one template over the operand type (Bf16Operands: m16n8k16, operands rounded by
// __float2bfloat16_rn, round to nearest even; Tf32Operands: m16n8k8, operands rounded by
// cvt.rna.tf32.f32, ties away from zero). Operands are rounded when they are staged into shared
// memory, P and dS when they become the next product's operand; softmax statistics, rescaling,
// lse, D, dS and every accumulation stay fp32. The rounding points and the base-2 scores with an
// integer running maximum: backend/flash_bf16.h (the CPU backend emulates exactly these; it is
// the oracle of tests/test_cuda_flash_bf16.cpp and of tools/cuda_cpu_sim, which runs these
// kernels on the CPU).
//
// Blocks of 4 warps (128 threads); a warp owns 16 rows of a 64-row tile. Scores, probabilities,
// dP, dS and the output accumulators never leave registers: an accumulator fragment of one mma
// (rows g, g+8; columns 2t, 2t+1 of each 8-column slice) is the A operand of the next (to_a
// below: bf16 packs two columns to a register; tf32 permutes the contraction index,
// Tf32Operands), as in FlashAttention-2. A row's statistics are reduced over the 4 lanes that
// hold it (shuffles). Only the staged Q/K/V/dO tiles live in shared memory, a tile that is a B
// operand with its contraction index contiguous (K for Q K^T; V^T, Q^T, dO^T, K^T staged
// transposed for the P V, dS^T Q, P^T dO and dS K products), so every operand is read as pairs
// without bank conflicts (rows of HS + 8 or 64 + 8 elements). Below, bf16(x) stands for the
// operand type's rounding (round_tf32 in tf32).
//
//   forward   one block per (b, h, 64 query rows), the last rows' blocks first (causal: the
//             longest); the Q tile staged once, key tiles of 64 keys (K, V^T staged; causal:
//             only up to the block's last row). Per tile and warp:
//               S = Q_w K^T (16 x 64) -> t = c S, masked -> -inf
//               per row: M' = max(M, ceil(max t)), l = l 2^(M - M') + Σ 2^(t - M'),
//                 l_r = l_r 2^(M - M') + Σ bf16(2^(t - M')), P = bf16(2^(t - M')) keep,
//                 O_row *= 2^(M - M') (exact: a power of two)
//               O_w += P V
//             out = O (1/(1-p)) / l_r, lse = (M + log2 l) ln 2 (no visible key: out 0, lse -inf).
//   backward  D_i = dO_i · out_i by the caller, then (FlashAttention-2 without atomics):
//             dK, dV: one block per (b, kv head g, 64 keys), the K/V tile staged once; the
//               group's query heads IN ORDER, query tiles of 64 (causal: from the block's first
//               key); per tile and warp (16 keys): S^T = K_w Q^T, dP~^T = V_w dO^T,
//               P = 2^(c S - lse log2 e), P~ = P keep/(1-p), dS' = sc (P~ dP~ - P D),
//               then dV_w += bf16(P~)^T dO, dK_w += bf16(dS')^T Q; finally added to dqkv.
//             dQ: one block per (b, h, 64 query rows), the last rows' blocks first, key tiles of
//               64: the same S, dP~, dS', and dQ_w += bf16(dS') K; then added to dqkv.
// One warp owns each output element and the mma order is fixed: bitwise deterministic run to run.
//
// Head size: HS = 32, 64 or 128 (hs <= HS zero-padded). Shared memory (dynamic, opt-in above
// 48 KB), bf16: forward 18 / 28 / 53 KB, dK/dV 32 / 55 / 104 KB, dQ 28 / 46 / 86 KB for HS = 32 /
// 64 / 128 (forward_smem, dkdv_smem, dq_smem); tf32 twice that (dK/dV at 128: 208 KB, which an
// H100 has and an A100 has not). On a device below sm_80 (which cuda_available() already
// refuses) or with less opt-in shared memory, flash_mma_applies() is false and the caller runs
// the fp32 kernels.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda_ops.h"
#include "backend/dropout_hash.h"
#include "backend/flash_bf16.h"
#include "cuda_common.cuh"
#include "flash_attention_args.cuh"
#include "flash_attention_mma.cuh"
#include "mma_sync.cuh"
#include "runtime/error.h"

namespace llmpi::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kTile = 64;        // rows of every staged tile (query rows, keys)
constexpr int kThreads = 128;    // 4 warps, 16 rows each
constexpr int kLdT = kTile + 8;  // [HS][72]: a transposed tile (V^T, Q^T, dO^T, K^T)
template <int HS>
__host__ __device__ constexpr int ld_h() { return HS + 8; }  // [64][HS + 8]: Q, K, V, dO

// bf16(lo) in the low half, bf16(hi) in the high half: an mma operand register.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16;
}

// The two operand types. T: a staged element; kK: the contraction of one mma; round: the value
// the tensor cores multiply; put4 / put_pair_t: 4 values to a row of a row-major tile, two rows'
// values of one column to a transposed tile; load_a / load_b: the fragments (kernels/mma_sync.cuh
// has the layouts) — A from rows [0, 16) and columns [k0, k0 + kK) of a row-major tile, B with
// B[k][n] = tile[(n0 + n) ld + k0 + k] (a tile holding B^T row-major); to_a: the A operand of
// k-step k of a 16 x 64 matrix held as accumulator fragments (v[n]: columns 8n..8n+7), rounded.
// Every operand read is a pair at column k0 + 2t of a row (t = lane % 4), 4-byte (bf16) or 8-byte
// (tf32) aligned, and with rows HS + 8 or 64 + 8 elements long a warp's reads meet no bank twice.
//
// bf16 (m16n8k16): the fragment layout of an accumulator is, two columns to a register, that of
// an A operand (FlashAttention-2's reuse).
struct Bf16Operands {
  using T = bf16;
  static constexpr int kK = 16;
  __device__ static float round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
  __device__ static T to(float x) { return __float2bfloat16_rn(x); }
  __device__ static void put4(T* p, float4 v) {  // 8 bytes
    *reinterpret_cast<uint2*>(p) = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
  }
  __device__ static void put_pair_t(T* p, float a, float b) { *reinterpret_cast<uint32_t*>(p) = pack_bf16x2(a, b); }
  __device__ static uint32_t pair(const T* p) { return *reinterpret_cast<const uint32_t*>(p); }
  __device__ static void load_a(uint32_t (&a)[4], const T* rows, int ld, int k0) {
    const int lane = threadIdx.x % 32;
    const T* p = rows + (lane >> 2) * ld + k0 + 2 * (lane & 3);
    a[0] = pair(p);
    a[1] = pair(p + 8 * ld);
    a[2] = pair(p + 8);
    a[3] = pair(p + 8 * ld + 8);
  }
  __device__ static void load_b(uint32_t (&b)[2], const T* tile, int ld, int n0, int k0) {
    const int lane = threadIdx.x % 32;
    const T* p = tile + (n0 + (lane >> 2)) * ld + k0 + 2 * (lane & 3);
    b[0] = pair(p);
    b[1] = pair(p + 8);
  }
  __device__ static void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    mma_m16n8k16_bf16(d, a, b);
  }
  __device__ static void to_a(uint32_t (&a)[4], const float (&v)[kTile / 8][4], int k) {
    a[0] = pack_bf16x2(v[2 * k][0], v[2 * k][1]);
    a[1] = pack_bf16x2(v[2 * k][2], v[2 * k][3]);
    a[2] = pack_bf16x2(v[2 * k + 1][0], v[2 * k + 1][1]);
    a[3] = pack_bf16x2(v[2 * k + 1][2], v[2 * k + 1][3]);
  }
};

// tf32 (m16n8k8), with the contraction index permuted within each step of 8 — the same
// permutation in A and B, so the product is unchanged: slot t holds column 2t and slot t + 4
// column 2t + 1. Then an operand is again a pair of adjacent columns (one 8-byte load), and an
// accumulator's registers (columns 2t, 2t + 1 of rows g, g + 8) are an A operand as they stand.
struct Tf32Operands {
  using T = float;
  static constexpr int kK = 8;
  __device__ static float round(float x) { return round_tf32(x); }
  __device__ static T to(float x) { return round_tf32(x); }
  __device__ static void put4(T* p, float4 v) {  // 16 bytes
    *reinterpret_cast<float4*>(p) = make_float4(round_tf32(v.x), round_tf32(v.y), round_tf32(v.z), round_tf32(v.w));
  }
  __device__ static void put_pair_t(T* p, float a, float b) {
    *reinterpret_cast<float2*>(p) = make_float2(round_tf32(a), round_tf32(b));
  }
  __device__ static void load_a(uint32_t (&a)[4], const T* rows, int ld, int k0) {
    const int lane = threadIdx.x % 32;
    const T* p = rows + (lane >> 2) * ld + k0 + 2 * (lane & 3);
    const float2 lo = *reinterpret_cast<const float2*>(p), hi = *reinterpret_cast<const float2*>(p + 8 * ld);
    a[0] = __float_as_uint(lo.x);
    a[1] = __float_as_uint(hi.x);
    a[2] = __float_as_uint(lo.y);
    a[3] = __float_as_uint(hi.y);
  }
  __device__ static void load_b(uint32_t (&b)[2], const T* tile, int ld, int n0, int k0) {
    const int lane = threadIdx.x % 32;
    const float2 v = *reinterpret_cast<const float2*>(tile + (n0 + (lane >> 2)) * ld + k0 + 2 * (lane & 3));
    b[0] = __float_as_uint(v.x);
    b[1] = __float_as_uint(v.y);
  }
  __device__ static void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    mma_m16n8k8_tf32(d, a, b);
  }
  __device__ static void to_a(uint32_t (&a)[4], const float (&v)[kTile / 8][4], int k) {
    a[0] = __float_as_uint(round_tf32(v[k][0]));
    a[1] = __float_as_uint(round_tf32(v[k][2]));
    a[2] = __float_as_uint(round_tf32(v[k][1]));
    a[3] = __float_as_uint(round_tf32(v[k][3]));
  }
};

// Rows [r0, r0 + n) of a strided fp32 [T, ld] matrix's hs columns from col, rounded to the
// operand type, zero-padded (rows >= n, columns >= hs): into `tile` ([64][HS + 8], row-major)
// and/or `tile_t` ([HS][64 + 8], transposed); either may be null. All kThreads threads of the block.
// When hs = HS and the rows' columns are 16-byte aligned (GPT-2: hs 64, rows of 3C or C floats):
// 16-byte loads, a thread's HS/8 of them (HS = 64: all 8) issued before the first is used — for
// HS = 128 in batches — so a tile costs a few trips to memory instead of one per element (the
// first GPU run measured the one-element-per-iteration loop as the bulk of the kernels' time,
// bench/results/gpu-first-run-h100-2026-11-24.json). Row-major only: a thread's float4 is 4 columns of one row,
// one store. With the transposed tile: a thread takes 4 columns of two rows (r, r + 1), so each
// column's pair is one store to tile_t; lanes 0-15 take 16 row pairs and lanes 16-31 the next 4
// columns, which spreads a warp's stores over all 32 banks (one element per thread and store, as
// before, was an 8-way conflict at HS = 64 in bf16, 16-way at 128: a desk review's bank model).
// Otherwise (a padded head, an unaligned row) one element per thread and iteration.
template <class Op, int HS>
__device__ __forceinline__ void stage(typename Op::T* tile, typename Op::T* tile_t, const float* base, int ld,
                                      int col, int r0, int n, int hs) {
  const bool fast = hs == HS && ld % 4 == 0 && col % 4 == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0;
  auto row4 = [&](int r, int d) {  // columns d..d+3 of tile row r (0 beyond the n rows)
    return r < n ? *reinterpret_cast<const float4*>(base + static_cast<size_t>(r0 + r) * ld + col + d)
                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  };
  if (fast && tile_t == nullptr) {
    constexpr int kPerRow = HS / 4, kLoads = kTile * kPerRow / kThreads;  // float4s: per row, per thread
    constexpr int kBatch = HS >= 128 ? 2 : kLoads < 8 ? kLoads : 8;       // loads in flight at once
    static_assert(kTile * kPerRow % kThreads == 0 && kLoads % kBatch == 0, "whole batches of float4 loads");
#pragma unroll 1  // one batch after the other: unrolled, the compiler would issue all the loads at once
    for (int b0 = 0; b0 < kLoads; b0 += kBatch) {
      float4 v[kBatch];
#pragma unroll
      for (int it = 0; it < kBatch; it++) {
        const int k = threadIdx.x + (b0 + it) * kThreads;
        v[it] = row4(k / kPerRow, k % kPerRow * 4);
      }
#pragma unroll
      for (int it = 0; it < kBatch; it++) {
        const int k = threadIdx.x + (b0 + it) * kThreads;
        Op::put4(tile + (k / kPerRow) * ld_h<HS>() + k % kPerRow * 4, v[it]);
      }
    }
    return;
  }
  if (fast) {
    // units of (row pair, 4 columns): 32 pairs x HS/4 column groups, a warp's 32 units are 16
    // pairs x 2 adjacent column groups
    constexpr int kUnits = kTile / 2 * (HS / 4) / kThreads;  // per thread: HS = 32, 64, 128: 2, 4, 8
    constexpr int kBatch = 2;  // units (2 float4 each) in flight: 4 of them spilled (ptxas)
    static_assert(kTile / 2 * (HS / 4) % kThreads == 0 && kUnits % kBatch == 0, "whole batches of units");
    const int lane = threadIdx.x % 32;
#pragma unroll 1
    for (int b0 = 0; b0 < kUnits; b0 += kBatch) {
      float4 v[kBatch][2];
#pragma unroll
      for (int it = 0; it < kBatch; it++) {
        const int grp = (threadIdx.x + (b0 + it) * kThreads) / 32;
        const int r = ((grp % 2) * 16 + lane % 16) * 2, d = ((grp / 2) * 2 + lane / 16) * 4;
        v[it][0] = row4(r, d);
        v[it][1] = row4(r + 1, d);
      }
#pragma unroll
      for (int it = 0; it < kBatch; it++) {
        const int grp = (threadIdx.x + (b0 + it) * kThreads) / 32;
        const int r = ((grp % 2) * 16 + lane % 16) * 2, d = ((grp / 2) * 2 + lane / 16) * 4;
        const float4 a = v[it][0], b = v[it][1];
        if (tile != nullptr) {
          Op::put4(tile + r * ld_h<HS>() + d, a);
          Op::put4(tile + (r + 1) * ld_h<HS>() + d, b);
        }
        typename Op::T* t = tile_t + d * kLdT + r;  // r even: the pair is aligned
        Op::put_pair_t(t, a.x, b.x);
        Op::put_pair_t(t + kLdT, a.y, b.y);
        Op::put_pair_t(t + 2 * kLdT, a.z, b.z);
        Op::put_pair_t(t + 3 * kLdT, a.w, b.w);
      }
    }
    return;
  }
  for (int k = threadIdx.x; k < kTile * HS; k += blockDim.x) {
    const int r = k / HS, d = k % HS;
    const float x = r < n && d < hs ? base[static_cast<size_t>(r0 + r) * ld + col + d] : 0.0f;
    if (tile != nullptr) tile[r * ld_h<HS>() + d] = Op::to(x);
    if (tile_t != nullptr) tile_t[d * kLdT + r] = Op::to(x);
  }
}

// s (16 x 64, accumulator fragments: s[n] holds columns 8n..8n+7) = A B^T, A the 16 rows of a
// [.][HS + 8] tile at `rows`, B the 64 rows of another such tile.
template <class Op, int HS>
__device__ __forceinline__ void mma_abt_16x64(float (&s)[kTile / 8][4], const typename Op::T* rows,
                                              const typename Op::T* B) {
#pragma unroll
  for (int n = 0; n < kTile / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int k = 0; k < HS / Op::kK; k++) {
    uint32_t a[4];
    Op::load_a(a, rows, ld_h<HS>(), k * Op::kK);
#pragma unroll
    for (int n = 0; n < kTile / 8; n++) {
      uint32_t b[2];
      Op::load_b(b, B, ld_h<HS>(), n * 8, k * Op::kK);
      Op::mma(s[n], a, b);
    }
  }
}

// acc (16 x HS) += round(P) (16 x 64, held as accumulator fragments) times the 64 x HS matrix held
// transposed in tile_t ([HS][kLdT]: tile_t[d][k] is row k, column d).
template <class Op, int HS>
__device__ __forceinline__ void mma_acc_16xhs(float (&acc)[HS / 8][4], const float (&P)[kTile / 8][4],
                                              const typename Op::T* tile_t) {
#pragma unroll
  for (int k = 0; k < kTile / Op::kK; k++) {
    uint32_t a[4];
    Op::to_a(a, P, k);
#pragma unroll
    for (int n = 0; n < HS / 8; n++) {
      uint32_t b[2];
      Op::load_b(b, tile_t, kLdT, n * 8, k * Op::kK);
      Op::mma(acc[n], a, b);
    }
  }
}

// dst[r, col + d] += acc (16 rows from row r0, HS columns; rows >= T and columns >= hs skipped).
template <int HS>
__device__ __forceinline__ void add_rows(float* dst, int ld, int col, int r0, int T, int hs,
                                         const float (&acc)[HS / 8][4]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int e = 0; e < 4; e++) {
    const int r = r0 + (lane >> 2) + (e >> 1) * 8;
    if (r >= T) continue;
    float* row = dst + static_cast<size_t>(r) * ld + col;
#pragma unroll
    for (int n = 0; n < HS / 8; n++) {
      const int d = n * 8 + 2 * (lane & 3) + (e & 1);
      if (d < hs) row[d] += acc[n][e];
    }
  }
}

// flags[jj] = key j0 + jj is in the tile (jj < n) and visible under the padding mask (none: all).
// All kThreads threads of the block.
__device__ __forceinline__ void stage_key_flags(int* flags, const int32_t* mask, int b, int T, int j0, int n) {
  for (int jj = threadIdx.x; jj < kTile; jj += blockDim.x)
    flags[jj] = jj < n && (mask == nullptr || mask[static_cast<size_t>(b) * T + j0 + jj] != 0);
}

// Lb[r] = lse log2 e and Ds[r] = D of query row i0 + r of head row block bh (r < n; beyond the
// tile: -inf, which no key sees, and 0). All kThreads threads of the block.
__device__ __forceinline__ void stage_row_stats(float* Lb, float* Ds, const float* lse, const float* D, size_t bh,
                                                int T, int i0, int n) {
  for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
    Lb[r] = r < n ? lse[bh * T + i0 + r] * kFlashLog2e : -INFINITY;
    Ds[r] = r < n ? D[bh * T + i0 + r] : 0.0f;
  }
}

template <class Op, int HS>
constexpr size_t forward_smem() {  // Q, K; V^T; the key mask
  return (2 * kTile * ld_h<HS>() + HS * kLdT) * sizeof(typename Op::T) + kTile * sizeof(int);
}
template <class Op, int HS>
constexpr size_t dkdv_smem() {  // K, V, Q, dO; Q^T, dO^T; lse, D, the key mask
  return (4 * kTile * ld_h<HS>() + 2 * HS * kLdT) * sizeof(typename Op::T) + 3 * kTile * sizeof(float);
}
template <class Op, int HS>
constexpr size_t dq_smem() {  // Q, dO, K, V; K^T; lse, D, the key mask
  return (4 * kTile * ld_h<HS>() + HS * kLdT) * sizeof(typename Op::T) + 3 * kTile * sizeof(float);
}

// Blocks per SM the backward kernels' register allocation must allow (__launch_bounds__): as
// many as the shared memory of the architecture compiled for holds (an SM's 228 KB on sm_90, 164
// KB on sm_80, 1 KB reserved per block), at most 3. ptxas (CUDA 13.0), sm_90, HS = 64: dK/dV
// and dQ 168 registers for 3 blocks, spilling 16 and 100 bytes (loads; without the bound dK/dV
// took 176 registers, which allows only 2 blocks). On sm_80 dK/dV at HS = 64 fits 2 blocks only:
// asking for 3 there just spilled (a desk review). The forward has no bound: 138 registers on
// sm_90 at HS = 64 (3 blocks), and a bound made ptxas spill.
__host__ __device__ constexpr int min_blocks(size_t smem_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  constexpr size_t kSmPerSm = 164 * 1024;
#else
  constexpr size_t kSmPerSm = 228 * 1024;
#endif
  const size_t fit = kSmPerSm / (smem_bytes + 1024);
  return fit >= 3 ? 3 : fit >= 1 ? static_cast<int>(fit) : 1;
}

// ---- forward --------------------------------------------------------------------------------------

template <class Op, int HS>
__global__ void __launch_bounds__(kThreads)
    flash_mma_forward_kernel(float* __restrict__ out, float* __restrict__ lse,
                              const float* __restrict__ qkv, const int32_t* __restrict__ mask,
                              FlashArgs a) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  using T = typename Op::T;
  constexpr int LDH = ld_h<HS>();
  extern __shared__ __align__(128) unsigned char smem[];
  T* Qs = reinterpret_cast<T*>(smem);  // [64][LDH]
  T* Ks = Qs + kTile * LDH;               // [64][LDH]
  T* Vt = Ks + kTile * LDH;               // [HS][kLdT] V transposed
  int* Mk = reinterpret_cast<int*>(Vt + HS * kLdT);  // [64] key valid under the padding mask

  const int bh = blockIdx.x, b = bh / a.NH, h = bh % a.NH, g = h / a.G;
  const int i0 = query_tile_start(a, kTile);  // (the last tiles first: flash_attention_args.cuh)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rw = warp * 16;                    // the warp's first row
  const int gid = lane >> 2, tq = lane & 3;    // this lane: rows rw + gid (+ 8), columns 2 tq (+ 1) of each 8
  const int irow[2] = {i0 + rw + gid, i0 + rw + gid + 8};
  const float* qkv_b = qkv + static_cast<size_t>(b) * a.T * a.W;

  stage<Op, HS>(Qs, nullptr, qkv_b, a.W, h * a.hs, i0, min(kTile, a.T - i0), a.hs);

  // per row r (irow[r]): m, an integer (or -inf), the running ceil(max t); l = Σ 2^(t - m) (for
  // lse), l_r = Σ bf16(2^(t - m)) (the normaliser of the rounded weights the P V product uses)
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, l_r[2] = {0.0f, 0.0f};
  float o[HS / 8][4];
#pragma unroll
  for (int n = 0; n < HS / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  const int jmax = a.causal ? min(a.T, i0 + kTile) : a.T;  // the same for the whole block
  for (int j0 = 0; j0 < jmax; j0 += kTile) {
    const int nj = min(kTile, jmax - j0);
    __syncthreads();  // the previous tile is no longer read
    stage<Op, HS>(Ks, nullptr, qkv_b, a.W, (a.NH + g) * a.hs, j0, nj, a.hs);
    stage<Op, HS>(nullptr, Vt, qkv_b, a.W, (a.NH + a.NKV + g) * a.hs, j0, nj, a.hs);
    stage_key_flags(Mk, mask, b, a.T, j0, nj);
    __syncthreads();  // (first pass: Q is ready too)

    float s[kTile / 8][4];
    mma_abt_16x64<Op, HS>(s, Qs + rw * LDH, Ks);  // S = Q_w K^T
    float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kTile / 8; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int jj = n * 8 + 2 * tq + (e & 1), i = irow[e >> 1];
        const bool vis = i < a.T && Mk[jj] && (!a.causal || j0 + jj <= i);
        s[n][e] = vis ? s[n][e] * a.c : -INFINITY;
        tmax[e >> 1] = fmaxf(tmax[e >> 1], s[n][e]);
      }
    float mnew[2], scale[2], sum[2] = {0.0f, 0.0f}, sum_r[2] = {0.0f, 0.0f};  // sums of e = 2^(t - M'), of bf16(e)
    bool any[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {  // the row's four lanes agree
      tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 1));
      tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 2));
      any[r] = tmax[r] != -INFINITY;
      mnew[r] = any[r] ? fmaxf(m[r], ceilf(tmax[r])) : m[r];
      // 2^(m - mnew), a power of two, so the rescaling is exact: 0 on the first visible tile
      scale[r] = !any[r] ? 1.0f
                 : m[r] == -INFINITY ? 0.0f
                                     : ldexpf(1.0f, static_cast<int>(fmaxf(m[r] - mnew[r], -200.0f)));
    }
#pragma unroll
    for (int n = 0; n < kTile / 8; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int r = e >> 1;
        const float t = s[n][e];
        float w = 0.0f;
        if (t != -INFINITY) {
          const float ex = exp2f(t - mnew[r]);
          const float er = Op::round(ex);
          sum[r] += ex;
          sum_r[r] += er;
          if (kept(a, b, h, irow[r], j0 + n * 8 + 2 * tq + (e & 1))) w = er;
        }
        s[n][e] = w;  // already rounded: to_a's rounding keeps it
      }
#pragma unroll
    for (int r = 0; r < 2; r++) {
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
      sum_r[r] += __shfl_xor_sync(0xffffffffu, sum_r[r], 1);
      sum_r[r] += __shfl_xor_sync(0xffffffffu, sum_r[r], 2);
      if (any[r]) {
        l[r] = l[r] * scale[r] + sum[r];
        l_r[r] = l_r[r] * scale[r] + sum_r[r];
        m[r] = mnew[r];
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
          o[n][2 * r] *= scale[r];
          o[n][2 * r + 1] *= scale[r];
        }
      }
    }
    mma_acc_16xhs<Op, HS>(o, s, Vt);  // O_w += P_w V
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int i = irow[r];
    if (i >= a.T) continue;
    if (tq == 0) lse[static_cast<size_t>(bh) * a.T + i] = l[r] > 0.0f ? (m[r] + log2f(l[r])) * kFlashLn2 : -INFINITY;
    const float f = l_r[r] > 0.0f ? a.inv_keep / l_r[r] : 0.0f;
    float* orow = out + (static_cast<size_t>(b) * a.T + i) * a.C + h * a.hs;
#pragma unroll
    for (int n = 0; n < HS / 8; n++) {
      const int d = n * 8 + 2 * tq;
      if (d < a.hs) orow[d] = o[n][2 * r] * f;
      if (d + 1 < a.hs) orow[d + 1] = o[n][2 * r + 1] * f;
    }
  }
#else
  __trap();  // never launched: flash_mma_applies() requires compute capability 8.0
#endif
}

// ---- backward: dK, dV ------------------------------------------------------------------------------

template <class Op, int HS>
__global__ void __launch_bounds__(kThreads, min_blocks(dkdv_smem<Op, HS>()))
    flash_mma_dkdv_kernel(float* __restrict__ dqkv, const float* __restrict__ dout,
                           const float* __restrict__ lse, const float* __restrict__ D,
                           const float* __restrict__ qkv, const int32_t* __restrict__ mask,
                           FlashArgs a) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  using T = typename Op::T;
  constexpr int LDH = ld_h<HS>();
  extern __shared__ __align__(128) unsigned char smem[];
  T* Ks = reinterpret_cast<T*>(smem);  // [64][LDH] the block's keys
  T* Vs = Ks + kTile * LDH;
  T* Qs = Vs + kTile * LDH;   // [64][LDH] the query tile
  T* dOs = Qs + kTile * LDH;
  T* Qt = dOs + kTile * LDH;  // [HS][kLdT] the query tile transposed
  T* dOt = Qt + HS * kLdT;
  float* Lb = reinterpret_cast<float*>(dOt + HS * kLdT);  // [64] lse log2 e
  float* Ds = Lb + kTile;                                 // [64] D
  int* Kv = reinterpret_cast<int*>(Ds + kTile);           // [64] key in range and unmasked

  const int bg = blockIdx.x, b = bg / a.NKV, g = bg % a.NKV;
  const int j0 = blockIdx.y * kTile;  // (the first key tiles, with the most queries, start first)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kw = warp * 16;                  // the warp's first key
  const int gid = lane >> 2, tq = lane & 3;  // this lane: keys kw + gid (+ 8), queries 2 tq (+ 1) of each 8
  const float* qkv_b = qkv + static_cast<size_t>(b) * a.T * a.W;
  const float* dout_b = dout + static_cast<size_t>(b) * a.T * a.C;

  const int nk = min(kTile, a.T - j0);
  stage<Op, HS>(Ks, nullptr, qkv_b, a.W, (a.NH + g) * a.hs, j0, nk, a.hs);
  stage<Op, HS>(Vs, nullptr, qkv_b, a.W, (a.NH + a.NKV + g) * a.hs, j0, nk, a.hs);
  stage_key_flags(Kv, mask, b, a.T, j0, nk);

  float dK[HS / 8][4], dV[HS / 8][4];
#pragma unroll
  for (int n = 0; n < HS / 8; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) dK[n][e] = dV[n][e] = 0.0f;
  const int istart = a.causal ? j0 : 0;  // earlier queries see none of the block's keys
  for (int h = g * a.G; h < (g + 1) * a.G; h++) {  // the group's query heads, in order
    const size_t bh = static_cast<size_t>(b) * a.NH + h;
    for (int i0 = istart; i0 < a.T; i0 += kTile) {
      const int ni = min(kTile, a.T - i0);
      __syncthreads();  // the previous query tile is no longer read
      stage<Op, HS>(Qs, Qt, qkv_b, a.W, h * a.hs, i0, ni, a.hs);
      stage<Op, HS>(dOs, dOt, dout_b, a.C, h * a.hs, i0, ni, a.hs);
      stage_row_stats(Lb, Ds, lse, D, bh, a.T, i0, ni);
      __syncthreads();  // (first pass: K, V and the key flags are ready too)

      float st[kTile / 8][4], dpt[kTile / 8][4];
      mma_abt_16x64<Op, HS>(st, Ks + kw * LDH, Qs);    // S^T = K_w Q^T
      mma_abt_16x64<Op, HS>(dpt, Vs + kw * LDH, dOs);  // dP~^T = V_w dO^T
#pragma unroll
      for (int n = 0; n < kTile / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int kl = kw + gid + (e >> 1) * 8, r = n * 8 + 2 * tq + (e & 1);
          const int j = j0 + kl, i = i0 + r;
          float pt = 0.0f, ds = 0.0f;
          if (Kv[kl] && Lb[r] != -INFINITY && (!a.causal || j <= i)) {  // Lb = -inf also for r >= ni
            const float p = exp2f(st[n][e] * a.c - Lb[r]);
            pt = kept(a, b, h, i, j) ? p * a.inv_keep : 0.0f;
            ds = a.sc * (pt * dpt[n][e] - p * Ds[r]);
          }
          st[n][e] = pt;
          dpt[n][e] = ds;
        }
      mma_acc_16xhs<Op, HS>(dV, st, dOt);  // dV_w += rnd(P~)^T dO
      mma_acc_16xhs<Op, HS>(dK, dpt, Qt);  // dK_w += rnd(dS')^T Q
    }
  }
  float* dqkv_b = dqkv + static_cast<size_t>(b) * a.T * a.W;
  add_rows<HS>(dqkv_b, a.W, (a.NH + g) * a.hs, j0 + kw, a.T, a.hs, dK);
  add_rows<HS>(dqkv_b, a.W, (a.NH + a.NKV + g) * a.hs, j0 + kw, a.T, a.hs, dV);
#else
  __trap();
#endif
}

// ---- backward: dQ ---------------------------------------------------------------------------------

template <class Op, int HS>
__global__ void __launch_bounds__(kThreads, min_blocks(dq_smem<Op, HS>()))
    flash_mma_dq_kernel(float* __restrict__ dqkv, const float* __restrict__ dout,
                         const float* __restrict__ lse, const float* __restrict__ D,
                         const float* __restrict__ qkv, const int32_t* __restrict__ mask,
                         FlashArgs a) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  using T = typename Op::T;
  constexpr int LDH = ld_h<HS>();
  extern __shared__ __align__(128) unsigned char smem[];
  T* Qs = reinterpret_cast<T*>(smem);  // [64][LDH] the block's query rows
  T* dOs = Qs + kTile * LDH;
  T* Ks = dOs + kTile * LDH;  // [64][LDH] the key tile
  T* Vs = Ks + kTile * LDH;
  T* Kt = Vs + kTile * LDH;   // [HS][kLdT] the key tile transposed
  float* Lb = reinterpret_cast<float*>(Kt + HS * kLdT);  // [64] lse log2 e
  float* Ds = Lb + kTile;                                // [64] D
  int* Mk = reinterpret_cast<int*>(Ds + kTile);          // [64] key valid

  const int bh = blockIdx.x, b = bh / a.NH, h = bh % a.NH, g = h / a.G;
  const int i0 = query_tile_start(a, kTile);  // (the last tiles first: flash_attention_args.cuh)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rw = warp * 16;
  const int gid = lane >> 2, tq = lane & 3;  // this lane: rows rw + gid (+ 8), keys 2 tq (+ 1) of each 8
  const float* qkv_b = qkv + static_cast<size_t>(b) * a.T * a.W;
  const int ni = min(kTile, a.T - i0);
  stage<Op, HS>(Qs, nullptr, qkv_b, a.W, h * a.hs, i0, ni, a.hs);
  stage<Op, HS>(dOs, nullptr, dout + static_cast<size_t>(b) * a.T * a.C, a.C, h * a.hs, i0, ni, a.hs);
  stage_row_stats(Lb, Ds, lse, D, static_cast<size_t>(bh), a.T, i0, ni);
  float dQ[HS / 8][4];
#pragma unroll
  for (int n = 0; n < HS / 8; n++) dQ[n][0] = dQ[n][1] = dQ[n][2] = dQ[n][3] = 0.0f;
  const int jmax = a.causal ? min(a.T, i0 + kTile) : a.T;
  for (int j0 = 0; j0 < jmax; j0 += kTile) {
    const int nj = min(kTile, jmax - j0);
    __syncthreads();  // the previous key tile is no longer read
    stage<Op, HS>(Ks, Kt, qkv_b, a.W, (a.NH + g) * a.hs, j0, nj, a.hs);
    stage<Op, HS>(Vs, nullptr, qkv_b, a.W, (a.NH + a.NKV + g) * a.hs, j0, nj, a.hs);
    stage_key_flags(Mk, mask, b, a.T, j0, nj);
    __syncthreads();  // (first pass: Q, dO, Lb, Ds are ready too)

    float s[kTile / 8][4], dp[kTile / 8][4];
    mma_abt_16x64<Op, HS>(s, Qs + rw * LDH, Ks);    // S = Q_w K^T
    mma_abt_16x64<Op, HS>(dp, dOs + rw * LDH, Vs);  // dP~ = dO_w V^T
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int rl = rw + gid + (e >> 1) * 8, i = i0 + rl;
      const float L = Lb[rl], Di = Ds[rl];
#pragma unroll
      for (int n = 0; n < kTile / 8; n++) {
        const int jj = n * 8 + 2 * tq + (e & 1), j = j0 + jj;
        float ds = 0.0f;
        if (L != -INFINITY && Mk[jj] && (!a.causal || j <= i)) {
          const float p = exp2f(s[n][e] * a.c - L);
          const float pt = kept(a, b, h, i, j) ? p * a.inv_keep : 0.0f;
          ds = a.sc * (pt * dp[n][e] - p * Di);
        }
        s[n][e] = ds;
      }
    }
    mma_acc_16xhs<Op, HS>(dQ, s, Kt);  // dQ_w += rnd(dS') K
  }
  add_rows<HS>(dqkv + static_cast<size_t>(b) * a.T * a.W, a.W, h * a.hs, i0 + rw, a.T, a.hs, dQ);
#else
  __trap();
#endif
}

// ---- launch -------------------------------------------------------------------------------------------

int head_case(int hs) { return hs <= 32 ? 32 : hs <= 64 ? 64 : hs <= 128 ? 128 : 0; }

unsigned tiles(int T) { return static_cast<unsigned>((T + kTile - 1) / kTile); }

template <class Op, int HS>
void launch_forward(float* out, float* lse, const float* qkv, const int32_t* mask, const FlashArgs& a) {
  static size_t allowed = 0;
  constexpr size_t smem = forward_smem<Op, HS>();
  allow_smem(flash_mma_forward_kernel<Op, HS>, smem, &allowed);
  const dim3 grid(static_cast<unsigned>(a.B * a.NH), tiles(a.T));
  flash_mma_forward_kernel<Op, HS><<<grid, kThreads, smem, compute_stream()>>>(out, lse, qkv, mask, a);
  LLMPI_LAUNCH_CHECK("flash_attention_forward (tensor cores)");
}

template <class Op, int HS>
void launch_backward(float* dqkv, const float* dout, const float* lse, const float* D,
                     const float* qkv, const int32_t* mask, const FlashArgs& a) {
  static size_t allowed_kv = 0, allowed_q = 0;
  constexpr size_t smem_kv = dkdv_smem<Op, HS>(), smem_q = dq_smem<Op, HS>();
  allow_smem(flash_mma_dkdv_kernel<Op, HS>, smem_kv, &allowed_kv);
  allow_smem(flash_mma_dq_kernel<Op, HS>, smem_q, &allowed_q);
  const dim3 gkv(static_cast<unsigned>(a.B * a.NKV), tiles(a.T));
  flash_mma_dkdv_kernel<Op, HS><<<gkv, kThreads, smem_kv, compute_stream()>>>(dqkv, dout, lse, D, qkv, mask, a);
  LLMPI_LAUNCH_CHECK("flash_attention_backward (tensor cores: dK, dV)");
  const dim3 gq(static_cast<unsigned>(a.B * a.NH), tiles(a.T));
  flash_mma_dq_kernel<Op, HS><<<gq, kThreads, smem_q, compute_stream()>>>(dqkv, dout, lse, D, qkv, mask, a);
  LLMPI_LAUNCH_CHECK("flash_attention_backward (tensor cores: dQ)");
}

// The largest of a head-size case's three kernels' shared memory (dK/dV's).
template <class Op>
size_t largest_smem(int HS) {
  return HS == 32 ? dkdv_smem<Op, 32>() : HS == 64 ? dkdv_smem<Op, 64>() : dkdv_smem<Op, 128>();
}

template <class Op>
void forward_case(int HS, float* out, float* lse, const float* qkv, const int32_t* mask, const FlashArgs& a) {
  switch (HS) {
    case 32: launch_forward<Op, 32>(out, lse, qkv, mask, a); break;
    case 64: launch_forward<Op, 64>(out, lse, qkv, mask, a); break;
    default: launch_forward<Op, 128>(out, lse, qkv, mask, a); break;
  }
}

template <class Op>
void backward_case(int HS, float* dqkv, const float* dout, const float* lse, const float* D, const float* qkv,
                   const int32_t* mask, const FlashArgs& a) {
  switch (HS) {
    case 32: launch_backward<Op, 32>(dqkv, dout, lse, D, qkv, mask, a); break;
    case 64: launch_backward<Op, 64>(dqkv, dout, lse, D, qkv, mask, a); break;
    default: launch_backward<Op, 128>(dqkv, dout, lse, D, qkv, mask, a); break;
  }
}

// The head-size case of a call the caller has checked with flash_mma_applies (an internal error
// otherwise).
int kernel_case(const char* op, GemmPrecision prec, int hs) {
  const int HS = head_case(hs);
  if (HS == 0 || prec == GemmPrecision::fp32)
    fail(op, " (tensor cores): head size ", hs, " or precision ", gemm_precision_name(prec), " has no such kernel");
  return HS;
}

}  // namespace

bool flash_mma_applies(GemmPrecision prec, int hs) {
  const int HS = head_case(hs);
  if (HS == 0 || prec == GemmPrecision::fp32) return false;
  // the device's compute capability, read once per bound device (a process binds one)
  static int cached_dev = -1, major = 0;
  const int dev = cuda_device();
  if (dev != cached_dev) {
    LLMPI_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    cached_dev = dev;
  }
  const size_t need = prec == GemmPrecision::bf16 ? largest_smem<Bf16Operands>(HS) : largest_smem<Tf32Operands>(HS);
  return major >= 8 && static_cast<size_t>(device_smem_optin()) >= need;
}

void flash_mma_forward(GemmPrecision prec, float* out, float* lse, const float* qkv, const int32_t* mask, int B,
                       int T, int NH, int NKV, int hs, bool causal, float dropout_p, uint64_t dropout_key) {
  FlashArgs a = make_flash_args(B, T, NH, NKV, hs, causal, dropout_p, dropout_key);
  a.c = flash_bf16_score_scale(hs);
  a.last_first = path_on(Path::attention_tile_order);
  const int HS = kernel_case("flash_attention_forward", prec, hs);
  if (prec == GemmPrecision::bf16) forward_case<Bf16Operands>(HS, out, lse, qkv, mask, a);
  else forward_case<Tf32Operands>(HS, out, lse, qkv, mask, a);
}

void flash_mma_backward(GemmPrecision prec, float* dqkv, const float* dout, const float* lse, const float* D,
                        const float* qkv, const int32_t* mask, int B, int T, int NH, int NKV, int hs, bool causal,
                        float dropout_p, uint64_t dropout_key) {
  FlashArgs a = make_flash_args(B, T, NH, NKV, hs, causal, dropout_p, dropout_key);
  a.c = flash_bf16_score_scale(hs);
  a.last_first = path_on(Path::attention_tile_order);
  const int HS = kernel_case("flash_attention_backward", prec, hs);
  if (prec == GemmPrecision::bf16) backward_case<Bf16Operands>(HS, dqkv, dout, lse, D, qkv, mask, a);
  else backward_case<Tf32Operands>(HS, dqkv, dout, lse, D, qkv, mask, a);
}

}  // namespace llmpi::cuda
