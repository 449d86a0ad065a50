// The bf16 fused attention on tensor cores through the WMMA API (docs/GPU.md "What has been
// verified, on which card"), kept beside its mma.sync rewrite (flash_attention_mma.cu); it runs
// when that path is switched off
// (LLMPI_CUDA_OFF=mma_attention, kernels/cuda_paths.cu). The kernels are that day's, unchanged;
// only the entry points are renamed (flash_wmma_*) and the shared-memory opt-in is the backend's
// allow_smem. Delete this file when a card has shown the mma.sync kernels correct and faster.
//
// Fused attention on tensor cores, for runtime.precision=bf16 (kernels/flash_attention_wmma.cuh;
// called by flash_attention_forward/backward in flash_attention.cu). The same structure as the
// fp32 kernels there, with the matrix products through the portable WMMA API (nvcuda::wmma,
// 16x16x16 bf16 fragments, fp32 accumulators; sm_80 and later): operands are rounded to bf16
// (__float2bfloat16_rn, round to nearest even) when they are staged into shared memory; softmax
// statistics, rescaling, lse, D, dS and every accumulation stay fp32. The rounding points and the
// base-2 scores with an integer running maximum: backend/flash_bf16.h (the CPU backend emulates
// exactly these; it is the oracle of tests/test_cuda_flash_bf16.cpp).
//
// Blocks of 4 warps (128 threads); a warp owns 16 rows of a 64-row tile, and every tile a warp
// writes and then reads again (scores, P, dS, its rows of O) is its own, so only the staged
// Q/K/V/dO tiles need block-wide barriers.
//
//   forward   one block per (b, h, 64 query rows); the Q tile staged once, key tiles of 64 keys
//             (K, V staged; causal: only up to the block's last row). Per tile and warp:
//               S = Q_w K^T (16 x 64, tensor cores) -> t = c S, masked -> -inf
//               per row (two lanes, interleaved columns): M' = max(M, ceil(max t)),
//                 l = l 2^(M - M') + Σ 2^(t - M'),  l_r = l_r 2^(M - M') + Σ bf16(2^(t - M')),
//                 P = bf16(2^(t - M')) keep,  O_row *= 2^(M - M') (exact: a power of two)
//               O_w += P V (tensor cores; O kept in shared memory, fp32)
//             out = O (1/(1-p)) / l_r, lse = (M + log2 l) ln 2 (no visible key: out 0, lse -inf).
//   backward  D_i = dO_i · out_i by the caller, then (FlashAttention-2 without atomics):
//             dK, dV: one block per (b, kv head g, 64 keys), the K/V tile staged once; the
//               group's query heads IN ORDER, query tiles of 64 (causal: from the block's first
//               key); per tile and warp (16 keys): S^T = K_w Q^T, dP~^T = V_w dO^T (tensor
//               cores), P = 2^(c S - lse log2 e), P~ = P keep/(1-p), dS' = sc (P~ dP~ - P D),
//               then dV_w += bf16(P~)^T dO, dK_w += bf16(dS')^T Q with accumulator fragments held
//               in registers over the whole loop; finally added to dqkv.
//             dQ: one block per (b, h, 64 query rows), key tiles of 64: the same S, dP~, dS', and
//               dQ_w += bf16(dS') K in registers; then added to dqkv.
// One warp owns each output element and the mma order is fixed: bitwise deterministic run to run.
//
// Head size: HS = 32, 64 or 128 (hs <= HS zero-padded). Shared memory (dynamic, opt-in above
// 48 KB): forward 52 / 72 / 113 KB, dK/dV 75 / 91 / 124 KB, dQ 65 / 82 / 114 KB for HS = 32 / 64
// / 128. On a device below sm_80 (which cuda_available() already refuses) or with less opt-in
// shared memory, flash_wmma_applies() is false and the caller runs the fp32 kernels.
#include <cuda_bf16.h>
#include <mma.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda_ops.h"
#include "backend/dropout_hash.h"
#include "backend/flash_bf16.h"
#include "cuda_common.cuh"
#include "flash_attention_args.cuh"
#include "flash_attention_wmma.cuh"
#include "runtime/error.h"

namespace llmpi::cuda {

namespace {

using bf16 = __nv_bfloat16;
namespace wmma = nvcuda::wmma;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

constexpr int kTile = 64;     // rows of every staged tile (query rows, keys)
constexpr int kThreads = 128;  // 4 warps, 16 rows each
constexpr int kLdT = kTile + 8;  // bf16 [64][72]: P, dS (a row of 64 keys / queries)
constexpr int kLdS = kTile + 4;  // fp32 [64][68]: scores, dP
template <int HS>
__host__ __device__ constexpr int ld_h() { return HS + 8; }  // bf16 [64][HS + 8]: Q, K, V, dO
template <int HS>
__host__ __device__ constexpr int ld_o() { return HS + 4; }  // fp32 [64][HS + 4]: O

// Rows [r0, r0 + n) of a strided fp32 [T, ld] matrix's hs columns from col, rounded to bf16 into
// a [64][HS + 8] tile, zero-padded (rows >= n, columns >= hs). All kThreads threads of the block.
// When hs = HS and the rows' columns are 16-byte aligned (GPT-2: hs 64, rows of 3C or C floats):
// 16-byte loads, every thread's HS/2 (HS = 64: 8) of them issued before the first is used, so a
// tile costs one trip to memory instead of one per element — the first GPU run measured the
// one-element-per-iteration loop as the bulk of these kernels' time (ncu: ~11 TFLOP/s forward,
// bench/results/gpu-first-run-h100-2026-11-24.json). Otherwise one element per thread and iteration.
template <int HS>
__device__ __forceinline__ void stage_bf16(bf16* tile, const float* base, int ld, int col, int r0,
                                           int n, int hs) {
  constexpr int kPerRow = HS / 4, kLoads = kTile * kPerRow / kThreads;  // float4s: per row, per thread
  static_assert(kTile * kPerRow % kThreads == 0, "whole float4 loads per thread");
  if (hs == HS && ld % 4 == 0 && col % 4 == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0) {
    float4 v[kLoads];
#pragma unroll
    for (int it = 0; it < kLoads; it++) {
      const int k = threadIdx.x + it * kThreads, r = k / kPerRow, d = k % kPerRow * 4;
      v[it] = r < n ? *reinterpret_cast<const float4*>(base + static_cast<size_t>(r0 + r) * ld + col + d)
                    : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int it = 0; it < kLoads; it++) {
      const int k = threadIdx.x + it * kThreads, r = k / kPerRow, d = k % kPerRow * 4;
      bf16* t = tile + r * ld_h<HS>() + d;  // 8-byte aligned: (HS + 8) and d are multiples of 4
      t[0] = __float2bfloat16_rn(v[it].x);
      t[1] = __float2bfloat16_rn(v[it].y);
      t[2] = __float2bfloat16_rn(v[it].z);
      t[3] = __float2bfloat16_rn(v[it].w);
    }
    return;
  }
  for (int k = threadIdx.x; k < kTile * HS; k += blockDim.x) {
    const int r = k / HS, d = k % HS;
    const float x = r < n && d < hs ? base[static_cast<size_t>(r0 + r) * ld + col + d] : 0.0f;
    tile[r * ld_h<HS>() + d] = __float2bfloat16_rn(x);
  }
}

// C (16 x 64, fp32, row-major at out with ld kLdS) = A (16 x HS rows of a [.][HS+8] bf16 tile)
// times B^T, B being 64 rows of another such tile: the 16 x 64 block of A B^T.
template <int HS>
__device__ __forceinline__ void mma_abt_16x64(float* out, const bf16* A, const bf16* B) {
#pragma unroll
  for (int n = 0; n < kTile / 16; n++) {
    FragC c;
    wmma::fill_fragment(c, 0.0f);
#pragma unroll
    for (int k = 0; k < HS / 16; k++) {
      FragA fa;
      FragBCol fb;  // B^T as a column-major K x N matrix: element (k, n) at B[n ld + k]
      wmma::load_matrix_sync(fa, A + k * 16, ld_h<HS>());
      wmma::load_matrix_sync(fb, B + n * 16 * ld_h<HS>() + k * 16, ld_h<HS>());
      wmma::mma_sync(c, fa, fb, c);
    }
    wmma::store_matrix_sync(out + n * 16, c, kLdS, wmma::mem_row_major);
  }
}

// acc[n] += A (16 x 64 bf16, ld kLdT) times the 64 x HS tile V (ld HS + 8), n over HS/16.
template <int HS>
__device__ __forceinline__ void mma_acc_16xhs(FragC (&acc)[HS / 16], const bf16* A, const bf16* V) {
#pragma unroll
  for (int k = 0; k < kTile / 16; k++) {
    FragA fa;
    wmma::load_matrix_sync(fa, A + k * 16, kLdT);
#pragma unroll
    for (int n = 0; n < HS / 16; n++) {
      FragBRow fb;
      wmma::load_matrix_sync(fb, V + k * 16 * ld_h<HS>() + n * 16, ld_h<HS>());
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// dst[r, col + d] += acc (16 rows from row r0, HS columns; rows >= T and columns >= hs skipped),
// staged fragment by fragment through the warp's 16 x 16 fp32 scratch (ld kLdS).
template <int HS>
__device__ __forceinline__ void add_rows(float* dst, int ld, int col, int r0, int T, int hs,
                                         FragC (&acc)[HS / 16], float* scratch) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < HS / 16; n++) {
    wmma::store_matrix_sync(scratch, acc[n], kLdS, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) {
      const int r = e / 16, d = n * 16 + e % 16;
      if (r0 + r < T && d < hs) dst[static_cast<size_t>(r0 + r) * ld + col + d] += scratch[r * kLdS + e % 16];
    }
    __syncwarp();
  }
}

template <int HS>
constexpr size_t forward_smem() {
  return 3 * kTile * ld_h<HS>() * sizeof(bf16) + kTile * kLdS * sizeof(float) +
         kTile * kLdT * sizeof(bf16) + kTile * ld_o<HS>() * sizeof(float) + 2 * kTile * sizeof(float);
}
template <int HS>
constexpr size_t dkdv_smem() {
  return 4 * kTile * ld_h<HS>() * sizeof(bf16) + 2 * kTile * kLdS * sizeof(float) +
         2 * kTile * kLdT * sizeof(bf16) + 3 * kTile * sizeof(float);
}
template <int HS>
constexpr size_t dq_smem() {
  return 4 * kTile * ld_h<HS>() * sizeof(bf16) + 2 * kTile * kLdS * sizeof(float) +
         kTile * kLdT * sizeof(bf16) + 3 * kTile * sizeof(float);
}

// ---- forward --------------------------------------------------------------------------------------

template <int HS>
__global__ void __launch_bounds__(kThreads)
    flash_bf16_forward_kernel(float* __restrict__ out, float* __restrict__ lse,
                              const float* __restrict__ qkv, const int32_t* __restrict__ mask,
                              FlashArgs a) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  constexpr int LDH = ld_h<HS>(), LDO = ld_o<HS>();
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);        // [64][LDH]
  bf16* Ks = Qs + kTile * LDH;                     // [64][LDH]
  bf16* Vs = Ks + kTile * LDH;                     // [64][LDH]
  float* Ss = reinterpret_cast<float*>(Vs + kTile * LDH);  // [64][kLdS] scores t
  bf16* Ps = reinterpret_cast<bf16*>(Ss + kTile * kLdS);   // [64][kLdT] bf16(2^(t-M)) keep
  float* Os = reinterpret_cast<float*>(Ps + kTile * kLdT);  // [64][LDO] output accumulator
  float* Fs = Os + kTile * LDO;                    // [64] final factor (1/(1-p)) / l_r per row
  int* Mk = reinterpret_cast<int*>(Fs + kTile);   // [64] key valid under the padding mask

  const int bh = blockIdx.x, b = bh / a.NH, h = bh % a.NH, g = h / a.G;
  const int i0 = blockIdx.y * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rw = warp * 16;                          // the warp's first row
  const int rl = rw + lane / 2, half = lane & 1;     // this lane's row; its columns half, half+2..
  const int i = i0 + rl;
  const bool row_in = i < a.T;
  const float* qkv_b = qkv + static_cast<size_t>(b) * a.T * a.W;

  stage_bf16<HS>(Qs, qkv_b, a.W, h * a.hs, i0, min(kTile, a.T - i0), a.hs);
  for (int k = threadIdx.x; k < kTile * LDO; k += blockDim.x) Os[k] = 0.0f;

  // m: an integer (or -inf), the running ceil(max t); l = Σ 2^(t - m) (for lse), l_r = Σ
  // bf16(2^(t - m)) (the normaliser of the rounded weights the P V product uses)
  float m = -INFINITY, l = 0.0f, l_r = 0.0f;
  float* srow = Ss + rl * kLdS;
  bf16* prow = Ps + rl * kLdT;
  float* orow = Os + rl * LDO;
  const int jmax = a.causal ? min(a.T, i0 + kTile) : a.T;  // the same for the whole block
  for (int j0 = 0; j0 < jmax; j0 += kTile) {
    const int nj = min(kTile, jmax - j0);
    __syncthreads();  // the previous tile is no longer read (first pass: Q and O are ready)
    stage_bf16<HS>(Ks, qkv_b, a.W, (a.NH + g) * a.hs, j0, nj, a.hs);
    stage_bf16<HS>(Vs, qkv_b, a.W, (a.NH + a.NKV + g) * a.hs, j0, nj, a.hs);
    for (int jj = threadIdx.x; jj < kTile; jj += blockDim.x)
      Mk[jj] = jj < nj && (mask == nullptr || mask[static_cast<size_t>(b) * a.T + j0 + jj] != 0);
    __syncthreads();

    mma_abt_16x64<HS>(Ss + rw * kLdS, Qs + rw * LDH, Ks);  // S = Q_w K^T
    __syncwarp();
    float tmax = -INFINITY;
    for (int jj = half; jj < kTile; jj += 2) {
      const int j = j0 + jj;
      const bool vis = row_in && Mk[jj] && (!a.causal || j <= i);
      const float t = vis ? srow[jj] * a.c : -INFINITY;
      srow[jj] = t;
      tmax = fmaxf(tmax, t);
    }
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));  // the row's two lanes agree
    const bool any = tmax != -INFINITY;
    const float mnew = any ? fmaxf(m, ceilf(tmax)) : m;
    // 2^(m - mnew), a power of two, so the rescaling is exact: 0 on the first visible tile
    const float scale =
        !any ? 1.0f : m == -INFINITY ? 0.0f : ldexpf(1.0f, static_cast<int>(fmaxf(m - mnew, -200.0f)));
    float sum = 0.0f, sum_r = 0.0f;  // of e = 2^(t - M'), and of bf16(e)
    for (int jj = half; jj < kTile; jj += 2) {
      const float t = srow[jj];
      bf16 w = __float2bfloat16_rn(0.0f);
      if (t != -INFINITY) {
        const float e = exp2f(t - mnew);
        const bf16 er = __float2bfloat16_rn(e);
        sum += e;
        sum_r += __bfloat162float(er);
        if (kept(a, b, h, i, j0 + jj)) w = er;
      }
      prow[jj] = w;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum_r += __shfl_xor_sync(0xffffffffu, sum_r, 1);
    if (any) {
      l = l * scale + sum;
      l_r = l_r * scale + sum_r;
      m = mnew;
      if (scale != 1.0f)
        for (int d = half; d < HS; d += 2) orow[d] *= scale;
    }
    __syncwarp();
    FragC o[HS / 16];
#pragma unroll
    for (int n = 0; n < HS / 16; n++)
      wmma::load_matrix_sync(o[n], Os + rw * LDO + n * 16, LDO, wmma::mem_row_major);
    mma_acc_16xhs<HS>(o, Ps + rw * kLdT, Vs);  // O_w += P_w V
#pragma unroll
    for (int n = 0; n < HS / 16; n++)
      wmma::store_matrix_sync(Os + rw * LDO + n * 16, o[n], LDO, wmma::mem_row_major);
  }
  if (half == 0) {
    Fs[rl] = l_r > 0.0f ? a.inv_keep / l_r : 0.0f;
    if (row_in) lse[static_cast<size_t>(bh) * a.T + i] = l > 0.0f ? (m + log2f(l)) * kFlashLn2 : -INFINITY;
  }
  __syncwarp();
  // the warp's 16 rows, coalesced along the head's columns
  for (int e = lane; e < 16 * HS; e += 32) {
    const int r = rw + e / HS, d = e % HS;
    if (i0 + r < a.T && d < a.hs)
      out[(static_cast<size_t>(b) * a.T + i0 + r) * a.C + h * a.hs + d] = Os[r * LDO + d] * Fs[r];
  }
#else
  __trap();  // never launched: flash_bf16_applies() requires compute capability 8.0
#endif
}

// ---- backward: dK, dV ------------------------------------------------------------------------------

template <int HS>
__global__ void __launch_bounds__(kThreads)
    flash_bf16_dkdv_kernel(float* __restrict__ dqkv, const float* __restrict__ dout,
                           const float* __restrict__ lse, const float* __restrict__ D,
                           const float* __restrict__ qkv, const int32_t* __restrict__ mask,
                           FlashArgs a) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  constexpr int LDH = ld_h<HS>();
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Ks = reinterpret_cast<bf16*>(smem);  // [64][LDH] the block's keys
  bf16* Vs = Ks + kTile * LDH;
  bf16* Qs = Vs + kTile * LDH;               // [64][LDH] the query tile
  bf16* dOs = Qs + kTile * LDH;
  float* St = reinterpret_cast<float*>(dOs + kTile * LDH);  // [64 keys][kLdS] S^T
  float* dPt = St + kTile * kLdS;                            // [64 keys][kLdS] dP~^T
  bf16* Pt = reinterpret_cast<bf16*>(dPt + kTile * kLdS);   // [64 keys][kLdT] bf16(P~)^T
  bf16* dSt = Pt + kTile * kLdT;                             // [64 keys][kLdT] bf16(dS')^T
  float* Lb = reinterpret_cast<float*>(dSt + kTile * kLdT);  // [64] lse log2 e
  float* Ds = Lb + kTile;                                    // [64] D
  int* Kv = reinterpret_cast<int*>(Ds + kTile);              // [64] key in range and unmasked

  const int bg = blockIdx.x, b = bg / a.NKV, g = bg % a.NKV;
  const int j0 = blockIdx.y * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kw = warp * 16;                       // the warp's first key
  const int kl = kw + lane / 2, half = lane & 1;  // this lane's key; its query columns half, +2..
  const int j = j0 + kl;
  const float* qkv_b = qkv + static_cast<size_t>(b) * a.T * a.W;
  const float* dout_b = dout + static_cast<size_t>(b) * a.T * a.C;

  const int nk = min(kTile, a.T - j0);
  stage_bf16<HS>(Ks, qkv_b, a.W, (a.NH + g) * a.hs, j0, nk, a.hs);
  stage_bf16<HS>(Vs, qkv_b, a.W, (a.NH + a.NKV + g) * a.hs, j0, nk, a.hs);
  for (int jj = threadIdx.x; jj < kTile; jj += blockDim.x)
    Kv[jj] = jj < nk && (mask == nullptr || mask[static_cast<size_t>(b) * a.T + j0 + jj] != 0);

  FragC dK[HS / 16], dV[HS / 16];
#pragma unroll
  for (int n = 0; n < HS / 16; n++) {
    wmma::fill_fragment(dK[n], 0.0f);
    wmma::fill_fragment(dV[n], 0.0f);
  }
  const int istart = a.causal ? j0 : 0;  // earlier queries see none of the block's keys
  for (int h = g * a.G; h < (g + 1) * a.G; h++) {  // the group's query heads, in order
    const size_t bh = static_cast<size_t>(b) * a.NH + h;
    for (int i0 = istart; i0 < a.T; i0 += kTile) {
      const int ni = min(kTile, a.T - i0);
      __syncthreads();  // the previous query tile is no longer read (first pass: K, V ready)
      stage_bf16<HS>(Qs, qkv_b, a.W, h * a.hs, i0, ni, a.hs);
      stage_bf16<HS>(dOs, dout_b, a.C, h * a.hs, i0, ni, a.hs);
      for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
        Lb[r] = r < ni ? lse[bh * a.T + i0 + r] * kFlashLog2e : -INFINITY;
        Ds[r] = r < ni ? D[bh * a.T + i0 + r] : 0.0f;
      }
      __syncthreads();

      mma_abt_16x64<HS>(St + kw * kLdS, Ks + kw * LDH, Qs);    // S^T = K_w Q^T
      mma_abt_16x64<HS>(dPt + kw * kLdS, Vs + kw * LDH, dOs);  // dP~^T = V_w dO^T
      __syncwarp();
      const bool key = Kv[kl] != 0;
      for (int r = half; r < kTile; r += 2) {
        const int i = i0 + r;
        float pt = 0.0f, ds = 0.0f;
        if (key && Lb[r] != -INFINITY && (!a.causal || j <= i)) {  // Lb = -inf also for r >= ni
          const float p = exp2f(St[kl * kLdS + r] * a.c - Lb[r]);
          pt = kept(a, b, h, i, j) ? p * a.inv_keep : 0.0f;
          ds = a.sc * (pt * dPt[kl * kLdS + r] - p * Ds[r]);
        }
        Pt[kl * kLdT + r] = __float2bfloat16_rn(pt);
        dSt[kl * kLdT + r] = __float2bfloat16_rn(ds);
      }
      __syncwarp();
      mma_acc_16xhs<HS>(dV, Pt + kw * kLdT, dOs);  // dV_w += P~^T dO
      mma_acc_16xhs<HS>(dK, dSt + kw * kLdT, Qs);  // dK_w += dS'^T Q
    }
  }
  float* scratch = St + kw * kLdS;  // the warp's own rows
  add_rows<HS>(dqkv + static_cast<size_t>(b) * a.T * a.W, a.W, (a.NH + g) * a.hs, j0 + kw, a.T,
               a.hs, dK, scratch);
  add_rows<HS>(dqkv + static_cast<size_t>(b) * a.T * a.W, a.W, (a.NH + a.NKV + g) * a.hs, j0 + kw,
               a.T, a.hs, dV, scratch);
#else
  __trap();
#endif
}

// ---- backward: dQ ---------------------------------------------------------------------------------

template <int HS>
__global__ void __launch_bounds__(kThreads)
    flash_bf16_dq_kernel(float* __restrict__ dqkv, const float* __restrict__ dout,
                         const float* __restrict__ lse, const float* __restrict__ D,
                         const float* __restrict__ qkv, const int32_t* __restrict__ mask,
                         FlashArgs a) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  constexpr int LDH = ld_h<HS>();
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);  // [64][LDH] the block's query rows
  bf16* dOs = Qs + kTile * LDH;
  bf16* Ks = dOs + kTile * LDH;              // [64][LDH] the key tile
  bf16* Vs = Ks + kTile * LDH;
  float* Ss = reinterpret_cast<float*>(Vs + kTile * LDH);  // [64][kLdS] S
  float* dPs = Ss + kTile * kLdS;                           // [64][kLdS] dP~
  bf16* dSs = reinterpret_cast<bf16*>(dPs + kTile * kLdS);  // [64][kLdT] bf16(dS')
  float* Lb = reinterpret_cast<float*>(dSs + kTile * kLdT);  // [64] lse log2 e
  float* Ds = Lb + kTile;                                    // [64] D
  int* Mk = reinterpret_cast<int*>(Ds + kTile);              // [64] key valid

  const int bh = blockIdx.x, b = bh / a.NH, h = bh % a.NH, g = h / a.G;
  const int i0 = blockIdx.y * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rw = warp * 16;
  const int rl = rw + lane / 2, half = lane & 1;
  const int i = i0 + rl;
  const float* qkv_b = qkv + static_cast<size_t>(b) * a.T * a.W;
  const int ni = min(kTile, a.T - i0);
  stage_bf16<HS>(Qs, qkv_b, a.W, h * a.hs, i0, ni, a.hs);
  stage_bf16<HS>(dOs, dout + static_cast<size_t>(b) * a.T * a.C, a.C, h * a.hs, i0, ni, a.hs);
  for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
    Lb[r] = r < ni ? lse[static_cast<size_t>(bh) * a.T + i0 + r] * kFlashLog2e : -INFINITY;
    Ds[r] = r < ni ? D[static_cast<size_t>(bh) * a.T + i0 + r] : 0.0f;
  }
  FragC dQ[HS / 16];
#pragma unroll
  for (int n = 0; n < HS / 16; n++) wmma::fill_fragment(dQ[n], 0.0f);
  const int jmax = a.causal ? min(a.T, i0 + kTile) : a.T;
  for (int j0 = 0; j0 < jmax; j0 += kTile) {
    const int nj = min(kTile, jmax - j0);
    __syncthreads();  // the previous key tile is no longer read (first pass: Q, dO, Lb, Ds ready)
    stage_bf16<HS>(Ks, qkv_b, a.W, (a.NH + g) * a.hs, j0, nj, a.hs);
    stage_bf16<HS>(Vs, qkv_b, a.W, (a.NH + a.NKV + g) * a.hs, j0, nj, a.hs);
    for (int jj = threadIdx.x; jj < kTile; jj += blockDim.x)
      Mk[jj] = jj < nj && (mask == nullptr || mask[static_cast<size_t>(b) * a.T + j0 + jj] != 0);
    __syncthreads();

    mma_abt_16x64<HS>(Ss + rw * kLdS, Qs + rw * LDH, Ks);    // S = Q_w K^T
    mma_abt_16x64<HS>(dPs + rw * kLdS, dOs + rw * LDH, Vs);  // dP~ = dO_w V^T
    __syncwarp();
    const float L = Lb[rl], Di = Ds[rl];
    for (int jj = half; jj < kTile; jj += 2) {
      const int j = j0 + jj;
      float ds = 0.0f;
      if (L != -INFINITY && Mk[jj] && (!a.causal || j <= i)) {
        const float p = exp2f(Ss[rl * kLdS + jj] * a.c - L);
        const float pt = kept(a, b, h, i, j) ? p * a.inv_keep : 0.0f;
        ds = a.sc * (pt * dPs[rl * kLdS + jj] - p * Di);
      }
      dSs[rl * kLdT + jj] = __float2bfloat16_rn(ds);
    }
    __syncwarp();
    mma_acc_16xhs<HS>(dQ, dSs + rw * kLdT, Ks);  // dQ_w += dS' K
  }
  add_rows<HS>(dqkv + static_cast<size_t>(b) * a.T * a.W, a.W, h * a.hs, i0 + rw, a.T, a.hs, dQ,
               Ss + rw * kLdS);
#else
  __trap();
#endif
}

// ---- launch -------------------------------------------------------------------------------------------

int bf16_head_case(int hs) { return hs <= 32 ? 32 : hs <= 64 ? 64 : hs <= 128 ? 128 : 0; }

unsigned tiles(int T) { return static_cast<unsigned>((T + kTile - 1) / kTile); }

template <int HS>
void launch_forward(float* out, float* lse, const float* qkv, const int32_t* mask, const FlashArgs& a) {
  static size_t allowed = 0;
  constexpr size_t smem = forward_smem<HS>();
  allow_smem(flash_bf16_forward_kernel<HS>, smem, &allowed);
  const dim3 grid(static_cast<unsigned>(a.B * a.NH), tiles(a.T));
  flash_bf16_forward_kernel<HS><<<grid, kThreads, smem, compute_stream()>>>(out, lse, qkv, mask, a);
  LLMPI_LAUNCH_CHECK("flash_attention_forward (bf16)");
}

template <int HS>
void launch_backward(float* dqkv, const float* dout, const float* lse, const float* D,
                     const float* qkv, const int32_t* mask, const FlashArgs& a) {
  static size_t allowed_kv = 0, allowed_q = 0;
  constexpr size_t smem_kv = dkdv_smem<HS>(), smem_q = dq_smem<HS>();
  allow_smem(flash_bf16_dkdv_kernel<HS>, smem_kv, &allowed_kv);
  allow_smem(flash_bf16_dq_kernel<HS>, smem_q, &allowed_q);
  const dim3 gkv(static_cast<unsigned>(a.B * a.NKV), tiles(a.T));
  flash_bf16_dkdv_kernel<HS><<<gkv, kThreads, smem_kv, compute_stream()>>>(dqkv, dout, lse, D, qkv,
                                                                          mask, a);
  LLMPI_LAUNCH_CHECK("flash_attention_backward (bf16 dK, dV)");
  const dim3 gq(static_cast<unsigned>(a.B * a.NH), tiles(a.T));
  flash_bf16_dq_kernel<HS><<<gq, kThreads, smem_q, compute_stream()>>>(dqkv, dout, lse, D, qkv,
                                                                      mask, a);
  LLMPI_LAUNCH_CHECK("flash_attention_backward (bf16 dQ)");
}

}  // namespace

bool flash_wmma_applies(int hs) {
  const int HS = bf16_head_case(hs);
  if (HS == 0) return false;
  static int cached_dev = -1, major = 0;  // read once per bound device (a process binds one)
  const int dev = cuda_device();
  if (dev != cached_dev) {
    LLMPI_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    cached_dev = dev;
  }
  const size_t need = HS == 32    ? dkdv_smem<32>()
                      : HS == 64 ? dkdv_smem<64>()
                                 : dkdv_smem<128>();  // the largest of the three kernels
  return major >= 8 && static_cast<size_t>(device_smem_optin()) >= need;
}

void flash_wmma_forward(float* out, float* lse, const float* qkv, const int32_t* mask, int B, int T,
                        int NH, int NKV, int hs, bool causal, float dropout_p, uint64_t dropout_key) {
  FlashArgs a = make_flash_args(B, T, NH, NKV, hs, causal, dropout_p, dropout_key);
  a.c = flash_bf16_score_scale(hs);
  switch (bf16_head_case(hs)) {
    case 32: launch_forward<32>(out, lse, qkv, mask, a); break;
    case 64: launch_forward<64>(out, lse, qkv, mask, a); break;
    case 128: launch_forward<128>(out, lse, qkv, mask, a); break;
    default: fail("flash_attention_forward (bf16): head size ", hs, " is above 128");
  }
}

void flash_wmma_backward(float* dqkv, const float* dout, const float* lse, const float* D,
                         const float* qkv, const int32_t* mask, int B, int T, int NH, int NKV,
                         int hs, bool causal, float dropout_p, uint64_t dropout_key) {
  FlashArgs a = make_flash_args(B, T, NH, NKV, hs, causal, dropout_p, dropout_key);
  a.c = flash_bf16_score_scale(hs);
  switch (bf16_head_case(hs)) {
    case 32: launch_backward<32>(dqkv, dout, lse, D, qkv, mask, a); break;
    case 64: launch_backward<64>(dqkv, dout, lse, D, qkv, mask, a); break;
    case 128: launch_backward<128>(dqkv, dout, lse, D, qkv, mask, a); break;
    default: fail("flash_attention_backward (bf16): head size ", hs, " is above 128");
  }
}

}  // namespace llmpi::cuda
