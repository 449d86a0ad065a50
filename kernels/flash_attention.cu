// Fused attention (flash-attention style): the ops flash_attention_forward/backward of
// backend/op_list.h. Same contract as attention.cu (qkv layout, K/V head g = h / G for query head
// h, G = NH / NKV, causal and/or key padding mask, dropout_keep on the element index
// e = ((b NH + h) T + i) T + j, sc = 1/sqrt(hs)), but P is never stored: the forward keeps
// lse [B, NH, T] per query row, the backward recomputes P from it. Memory O(B NH T), never T x T.
// Plain fp32 on CUDA cores, written for correctness first, not speed. With
// prec == bf16 or tf32 both ops run the tensor-core kernels of flash_attention_mma.cu instead,
// where flash_mma_applies(prec, hs) (hs <= 128, compute capability >= 8.0, enough shared memory);
// fp32 runs these.
//
//   forward   one block per (b, h, tile of kFwdRows query rows), one thread per query row; key
//             tiles of kFwdKeys rows of K and V staged in shared memory. Per tile, each thread
//             computes its scores (kept in shared memory), the tile max over its visible keys,
//             and updates an online softmax in fp32:
//               m' = max(m, max_j S_j);  l = l e^{m-m'} + Σ_j e^{S_j-m'};
//               acc = acc e^{m-m'} + Σ_j e^{S_j-m'} keep_e/(1-p) v_j
//             out = acc / l, lse = m + log l (a row with no visible key: out = 0, lse = -inf).
//   backward  (FlashAttention-2, without atomics)
//             1. D_i = Σ_d dO_id out_id, one thread per (b, h, i), into a [B, NH, T] workspace.
//             2. dK, dV: one block per (b, kv head g, tile of kBwdKeys keys), one thread per key
//                j (k_j, v_j in registers, its dK/dV rows in shared memory). It loops over the
//                G query heads of the group IN HEAD ORDER and, per head, over tiles of query rows
//                (Q, dO, lse, D staged in shared memory), recomputing for each visible (i, j)
//                  P = e^{S_ij - lse_i}, P~ = P keep/(1-p), dP~ = dO_i·v_j, dS = P~ dP~ - P D_i
//                  dV_j += P~ dO_i;  dK_j += sc dS q_i
//                then adds its rows to dqkv. One thread owns each (b, g, j): no atomics, and
//                the terms arrive in a fixed order (heads, then query rows, in order).
//             3. dQ: one block per (b, h, tile of kDqRows query rows), one thread per query row
//                (q_i, dO_i in registers, its dQ row in shared memory), looping over tiles of
//                kDqKeys keys (K, V staged): the same P and dS, dQ_i += sc dS k_j; then adds it
//                to dqkv.
// Bitwise deterministic run to run (no atomics, fixed loop orders).
//
// Head size: kernels are instantiated for HS = 16, 32, 64, 128 (the smallest >= hs is used; the
// columns hs..HS-1 are zero-padded in registers and shared memory, so every hs <= 128 works and
// hs = 64, GPT-2's and LLaMA's, wastes nothing). hs > 128 is refused with an error naming
// runtime.attention=full. (HS = 128 keeps 2 x 128 floats per thread: register spills, correct
// but slow.)
#include <cmath>

#include "backend/dropout_hash.h"
#include "cuda_common.cuh"
#include "flash_attention_args.cuh"
#include "cudnn_attention.cuh"
#include "flash_attention_mma.cuh"
#include "flash_attention_wmma.cuh"
#include "runtime/error.h"

namespace llmpi::cuda {

namespace {

constexpr int kFwdRows = 64;  // forward: query rows (threads) per block
constexpr int kFwdKeys = 32;  // forward: keys per shared-memory tile
constexpr int kBwdKeys = 32;  // dK/dV: keys (threads) per block
constexpr int kDqRows = 32;   // dQ: query rows (threads) per block
constexpr int kDqKeys = 16;   // dQ: keys per shared-memory tile
// dK/dV: query rows per shared-memory tile (fewer for wide heads: the block's shared memory
// stays under the 48 KB of a static allocation)
template <int HS>
__host__ __device__ constexpr int bwd_rows() { return HS <= 64 ? 16 : 8; }

// The attention weight actually applied to v_j: P~ = P keep_e/(1-p) (P without dropout).
__device__ __forceinline__ float dropped(const FlashArgs& a, float p, int b, int h, int i, int j) {
  if (a.p == 0.0f) return p;
  return kept(a, b, h, i, j) ? p * a.inv_keep : 0.0f;
}

// Loads rows [r0, r0 + n) of a strided [T, ld] matrix's hs columns starting at col into a
// [R][HS] shared tile, zero-padded (rows >= n, columns >= hs). All threads of the block take part.
template <int R, int HS>
__device__ __forceinline__ void load_tile(float (*tile)[HS], const float* base, int ld, int col,
                                          int r0, int n, int hs) {
  for (int k = threadIdx.x; k < R * HS; k += blockDim.x) {
    const int r = k / HS, d = k % HS;
    tile[r][d] = r < n && d < hs ? base[static_cast<size_t>(r0 + r) * ld + col + d] : 0.0f;
  }
}

// ---- forward --------------------------------------------------------------------------------------

template <int HS>
__global__ void __launch_bounds__(kFwdRows)
    flash_forward_kernel(float* __restrict__ out, float* __restrict__ lse,
                         const float* __restrict__ qkv, const int32_t* __restrict__ mask,
                         FlashArgs a) {
  __shared__ float Ks[kFwdKeys][HS], Vs[kFwdKeys][HS];
  __shared__ float Ss[kFwdRows][kFwdKeys + 1];  // each thread's scores of the tile
  __shared__ int Ms[kFwdKeys];                  // key valid under the padding mask
  const int bh = blockIdx.x, b = bh / a.NH, h = bh % a.NH, g = h / a.G;
  const int i0 = query_tile_start(a, kFwdRows);  // (the last tiles first: flash_attention_args.cuh)
  const int t = threadIdx.x, i = i0 + t;
  const bool row = i < a.T;
  const float* qkv_b = qkv + static_cast<size_t>(b) * a.T * a.W;
  float q[HS], acc[HS];
#pragma unroll
  for (int d = 0; d < HS; d++) {
    q[d] = row && d < a.hs ? qkv_b[static_cast<size_t>(i) * a.W + h * a.hs + d] : 0.0f;
    acc[d] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int jmax = a.causal ? min(a.T, i0 + kFwdRows) : a.T;  // the same for the whole block
  for (int j0 = 0; j0 < jmax; j0 += kFwdKeys) {
    const int nj = min(kFwdKeys, jmax - j0);
    load_tile<kFwdKeys, HS>(Ks, qkv_b, a.W, (a.NH + g) * a.hs, j0, nj, a.hs);
    load_tile<kFwdKeys, HS>(Vs, qkv_b, a.W, (a.NH + a.NKV + g) * a.hs, j0, nj, a.hs);
    for (int jj = t; jj < kFwdKeys; jj += blockDim.x)
      Ms[jj] = jj < nj && (mask == nullptr || mask[static_cast<size_t>(b) * a.T + j0 + jj] != 0);
    __syncthreads();
    float tmax = -INFINITY;
    for (int jj = 0; jj < nj; jj++) {
      const int j = j0 + jj;
      float s = -INFINITY;
      if (row && Ms[jj] && (!a.causal || j <= i)) {
        float dot = 0.0f;
#pragma unroll
        for (int d = 0; d < HS; d++) dot += q[d] * Ks[jj][d];
        s = dot * a.sc;
      }
      Ss[t][jj] = s;
      tmax = fmaxf(tmax, s);
    }
    if (tmax != -INFINITY) {
      const float mnew = fmaxf(m, tmax);
      const float rescale = expf(m - mnew);  // 0 on the first visible tile (m = -inf)
      l *= rescale;
#pragma unroll
      for (int d = 0; d < HS; d++) acc[d] *= rescale;
      for (int jj = 0; jj < nj; jj++) {
        const float s = Ss[t][jj];
        if (s == -INFINITY) continue;
        const float e = expf(s - mnew);
        l += e;
        const float w = dropped(a, e, b, h, i, j0 + jj);
        if (w != 0.0f) {
#pragma unroll
          for (int d = 0; d < HS; d++) acc[d] += w * Vs[jj][d];
        }
      }
      m = mnew;
    }
    __syncthreads();  // the tiles are reloaded next
  }
  if (!row) return;
  float* o = out + (static_cast<size_t>(b) * a.T + i) * a.C + h * a.hs;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int d = 0; d < HS; d++)
    if (d < a.hs) o[d] = acc[d] * inv;
  lse[static_cast<size_t>(bh) * a.T + i] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// ---- backward ---------------------------------------------------------------------------------------

// D[b,h,i] = Σ_d dout[b,i,h hs + d] out[b,i,h hs + d]. One warp per (b, i, h), taken in memory
// order (h fastest): lane l sums d = l, l + 32, ... (each load a warp's 128 contiguous bytes),
// then the lanes' sums are added by warp_sum. (A thread per (b, h, i) walking its hs values read
// 32 rows C floats apart per load: 0.061 ms per GPT-2 124M layer at B = 8 on an H100, ~0.8 TB/s.)
constexpr int kRowdotWarps = 8;  // per block of flash_rowdot_kernel
__global__ void flash_rowdot_kernel(float* __restrict__ D, const float* __restrict__ dout,
                                    const float* __restrict__ out, FlashArgs a) {
  const size_t rows = static_cast<size_t>(a.B) * a.T * a.NH;
  const int lane = threadIdx.x & 31;
  const size_t first = static_cast<size_t>(blockIdx.x) * kRowdotWarps + (threadIdx.x >> 5);
  for (size_t r = first; r < rows; r += static_cast<size_t>(gridDim.x) * kRowdotWarps) {
    const int h = static_cast<int>(r % a.NH);
    const size_t bi = r / a.NH;  // b T + i
    const size_t off = bi * a.C + static_cast<size_t>(h) * a.hs;
    float s = 0.0f;
    for (int d = lane; d < a.hs; d += 32) s += dout[off + d] * out[off + d];
    s = warp_sum(s);
    if (lane == 0) {
      const size_t b = bi / a.T, i = bi % a.T;
      D[(b * a.NH + h) * a.T + i] = s;
    }
  }
}

// The same D with a thread per (b, h, i) walking its hs values in order (the kernel verified on an
// H100, 2026-11-24; runs when Path::rowdot_warp is off).
__global__ void flash_rowdot_thread_kernel(float* __restrict__ D, const float* __restrict__ dout,
                                           const float* __restrict__ out, FlashArgs a) {
  const size_t rows = static_cast<size_t>(a.B) * a.NH * a.T;
  for (size_t r = grid_first(); r < rows; r += grid_stride()) {
    const int i = static_cast<int>(r % a.T);
    const size_t bh = r / a.T;
    const int h = static_cast<int>(bh % a.NH);
    const size_t b = bh / a.NH;
    const size_t off = (b * a.T + i) * a.C + static_cast<size_t>(h) * a.hs;
    float s = 0.0f;
    for (int d = 0; d < a.hs; d++) s += dout[off + d] * out[off + d];
    D[r] = s;
  }
}

template <int HS>
__global__ void __launch_bounds__(kBwdKeys)
    flash_dkdv_kernel(float* __restrict__ dqkv, const float* __restrict__ dout,
                      const float* __restrict__ lse, const float* __restrict__ D,
                      const float* __restrict__ qkv, const int32_t* __restrict__ mask,
                      FlashArgs a) {
  constexpr int R = bwd_rows<HS>();
  __shared__ float Qs[R][HS], dOs[R][HS];
  __shared__ float Ls[R], Ds[R];
  __shared__ float dKs[kBwdKeys][HS + 1], dVs[kBwdKeys][HS + 1];  // thread t's rows (padded)
  const int bg = blockIdx.x, b = bg / a.NKV, g = bg % a.NKV;
  const int j0 = blockIdx.y * kBwdKeys, t = threadIdx.x, j = j0 + t;
  const float* qkv_b = qkv + static_cast<size_t>(b) * a.T * a.W;
  const float* dout_b = dout + static_cast<size_t>(b) * a.T * a.C;
  const bool key = j < a.T && (mask == nullptr || mask[static_cast<size_t>(b) * a.T + j] != 0);
  float k[HS], v[HS];
#pragma unroll
  for (int d = 0; d < HS; d++) {
    const bool in = j < a.T && d < a.hs;
    k[d] = in ? qkv_b[static_cast<size_t>(j) * a.W + (a.NH + g) * a.hs + d] : 0.0f;
    v[d] = in ? qkv_b[static_cast<size_t>(j) * a.W + (a.NH + a.NKV + g) * a.hs + d] : 0.0f;
    dKs[t][d] = 0.0f;
    dVs[t][d] = 0.0f;
  }
  // Queries before the block's first key see none of its keys under a causal mask.
  const int istart = a.causal ? j0 : 0;
  for (int h = g * a.G; h < (g + 1) * a.G; h++) {  // the group's query heads, in order
    const size_t bh = static_cast<size_t>(b) * a.NH + h;
    for (int i0 = istart; i0 < a.T; i0 += R) {
      const int ni = min(R, a.T - i0);
      load_tile<R, HS>(Qs, qkv_b, a.W, h * a.hs, i0, ni, a.hs);
      load_tile<R, HS>(dOs, dout_b, a.C, h * a.hs, i0, ni, a.hs);
      for (int r = t; r < R; r += blockDim.x) {
        Ls[r] = r < ni ? lse[bh * a.T + i0 + r] : -INFINITY;
        Ds[r] = r < ni ? D[bh * a.T + i0 + r] : 0.0f;
      }
      __syncthreads();
      if (key) {
        for (int r = 0; r < ni; r++) {
          const int i = i0 + r;
          if ((a.causal && j > i) || Ls[r] == -INFINITY) continue;
          float s = 0.0f, dp = 0.0f;
#pragma unroll
          for (int d = 0; d < HS; d++) {
            s += Qs[r][d] * k[d];
            dp += dOs[r][d] * v[d];
          }
          const float p = expf(s * a.sc - Ls[r]);
          const float pt = dropped(a, p, b, h, i, j);
          const float ds = pt * dp - p * Ds[r];
#pragma unroll
          for (int d = 0; d < HS; d++) {
            dVs[t][d] += pt * dOs[r][d];
            dKs[t][d] += a.sc * ds * Qs[r][d];
          }
        }
      }
      __syncthreads();  // the tiles are reloaded next
    }
  }
  if (j >= a.T) return;
  float* dk = dqkv + (static_cast<size_t>(b) * a.T + j) * a.W + (a.NH + g) * a.hs;
  float* dv = dqkv + (static_cast<size_t>(b) * a.T + j) * a.W + (a.NH + a.NKV + g) * a.hs;
  for (int d = 0; d < a.hs; d++) {
    dk[d] += dKs[t][d];
    dv[d] += dVs[t][d];
  }
}

template <int HS>
__global__ void __launch_bounds__(kDqRows)
    flash_dq_kernel(float* __restrict__ dqkv, const float* __restrict__ dout,
                    const float* __restrict__ lse, const float* __restrict__ D,
                    const float* __restrict__ qkv, const int32_t* __restrict__ mask,
                    FlashArgs a) {
  __shared__ float Ks[kDqKeys][HS], Vs[kDqKeys][HS];
  __shared__ int Ms[kDqKeys];
  __shared__ float dQs[kDqRows][HS + 1];  // thread t's row (padded)
  const int bh = blockIdx.x, b = bh / a.NH, h = bh % a.NH, g = h / a.G;
  const int i0 = query_tile_start(a, kDqRows);
  const int t = threadIdx.x, i = i0 + t;
  const float* qkv_b = qkv + static_cast<size_t>(b) * a.T * a.W;
  const float L = i < a.T ? lse[static_cast<size_t>(bh) * a.T + i] : -INFINITY;
  const bool row = L != -INFINITY;  // in range, with at least one visible key
  const float Di = row ? D[static_cast<size_t>(bh) * a.T + i] : 0.0f;
  float q[HS], dO[HS];
#pragma unroll
  for (int d = 0; d < HS; d++) {
    const bool in = row && d < a.hs;
    q[d] = in ? qkv_b[static_cast<size_t>(i) * a.W + h * a.hs + d] : 0.0f;
    dO[d] = in ? dout[(static_cast<size_t>(b) * a.T + i) * a.C + h * a.hs + d] : 0.0f;
    dQs[t][d] = 0.0f;
  }
  const int jmax = a.causal ? min(a.T, i0 + kDqRows) : a.T;  // the same for the whole block
  for (int j0 = 0; j0 < jmax; j0 += kDqKeys) {
    const int nj = min(kDqKeys, jmax - j0);
    load_tile<kDqKeys, HS>(Ks, qkv_b, a.W, (a.NH + g) * a.hs, j0, nj, a.hs);
    load_tile<kDqKeys, HS>(Vs, qkv_b, a.W, (a.NH + a.NKV + g) * a.hs, j0, nj, a.hs);
    for (int jj = t; jj < kDqKeys; jj += blockDim.x)
      Ms[jj] = jj < nj && (mask == nullptr || mask[static_cast<size_t>(b) * a.T + j0 + jj] != 0);
    __syncthreads();
    if (row) {
      for (int jj = 0; jj < nj; jj++) {
        const int j = j0 + jj;
        if (!Ms[jj] || (a.causal && j > i)) continue;
        float s = 0.0f, dp = 0.0f;
#pragma unroll
        for (int d = 0; d < HS; d++) {
          s += q[d] * Ks[jj][d];
          dp += dO[d] * Vs[jj][d];
        }
        const float p = expf(s * a.sc - L);
        const float pt = dropped(a, p, b, h, i, j);
        const float ds = pt * dp - p * Di;
#pragma unroll
        for (int d = 0; d < HS; d++) dQs[t][d] += a.sc * ds * Ks[jj][d];
      }
    }
    __syncthreads();
  }
  if (!row) return;
  float* dq = dqkv + (static_cast<size_t>(b) * a.T + i) * a.W + h * a.hs;
  for (int d = 0; d < a.hs; d++) dq[d] += dQs[t][d];
}

// ---- launch -----------------------------------------------------------------------------------------

// The kernel instance for head size hs: HS = 16, 32, 64 or 128 (0: unsupported).
// (kFusedAttentionMaxHeadDimCuda in model/model_desc.h is the largest: keep the two together.)
int head_case(int hs) { return hs <= 16 ? 16 : hs <= 32 ? 32 : hs <= 64 ? 64 : hs <= 128 ? 128 : 0; }

void check_flash_args(const char* op, int NH, int NKV, int hs, float p) {
  check_dropout_p(op, p);
  if (NKV <= 0 || NH % NKV != 0)
    fail(op, ": ", NH, " query heads cannot be grouped over ", NKV, " K/V heads (NH % NKV != 0)");
  if (head_case(hs) == 0)
    fail(op, ": head size ", hs, " is above 128, the largest the fused attention kernels support; "
         "set runtime.attention=full");
}

unsigned tiles(int T, int per) { return static_cast<unsigned>((T + per - 1) / per); }

FlashArgs flash_args(int B, int T, int NH, int NKV, int hs, bool causal, float p, uint64_t key) {
  FlashArgs a = make_flash_args(B, T, NH, NKV, hs, causal, p, key);
  a.last_first = path_on(Path::attention_tile_order);
  return a;
}

// Which tensor-core kernels run for prec and hs: the mma.sync ones (flash_attention_mma.cu), the
// WMMA ones verified on an H100 (flash_attention_wmma.cu, bf16 only) when Path::mma_attention is
// off, or none (the fp32 kernels here). tf32 runs the fp32 kernels when Path::tf32_attention is off.
enum class TensorKernel { none, mma, wmma };
TensorKernel tensor_kernel(GemmPrecision prec, int hs) {
  if (prec == GemmPrecision::tf32 && !path_on(Path::tf32_attention)) return TensorKernel::none;
  if (prec == GemmPrecision::bf16 && !path_on(Path::mma_attention))
    return flash_wmma_applies(hs) ? TensorKernel::wmma : TensorKernel::none;
  return flash_mma_applies(prec, hs) ? TensorKernel::mma : TensorKernel::none;
}

template <int HS>
void launch_forward(float* out, float* lse, const float* qkv, const int32_t* mask,
                    const FlashArgs& a) {
  const dim3 grid(static_cast<unsigned>(a.B * a.NH), tiles(a.T, kFwdRows));
  flash_forward_kernel<HS><<<grid, kFwdRows, 0, compute_stream()>>>(out, lse, qkv, mask, a);
  LLMPI_LAUNCH_CHECK("flash_attention_forward");
}

template <int HS>
void launch_backward(float* dqkv, const float* dout, const float* lse, const float* D,
                     const float* qkv, const int32_t* mask, const FlashArgs& a) {
  const dim3 gkv(static_cast<unsigned>(a.B * a.NKV), tiles(a.T, kBwdKeys));
  flash_dkdv_kernel<HS><<<gkv, kBwdKeys, 0, compute_stream()>>>(dqkv, dout, lse, D, qkv, mask, a);
  LLMPI_LAUNCH_CHECK("flash_attention_backward (dK, dV)");
  const dim3 gq(static_cast<unsigned>(a.B * a.NH), tiles(a.T, kDqRows));
  flash_dq_kernel<HS><<<gq, kDqRows, 0, compute_stream()>>>(dqkv, dout, lse, D, qkv, mask, a);
  LLMPI_LAUNCH_CHECK("flash_attention_backward (dQ)");
}

}  // namespace

void flash_attention_forward(float* out, float* lse, const float* qkv, const int32_t* mask, int B,
                             int T, int NH, int NKV, int hs, bool causal, float dropout_p,
                             uint64_t dropout_key, GemmPrecision prec) {
  check_flash_args("flash_attention_forward", NH, NKV, hs, dropout_p);
  if (B <= 0 || T <= 0 || NH <= 0 || hs <= 0) return;
  if (mask == nullptr && cudnn_attention_applies(prec, NH, NKV, hs, dropout_p) &&
      cudnn_attention_forward(out, lse, qkv, B, T, NH, NKV, hs, causal))
    return;
  switch (tensor_kernel(prec, hs)) {  // bf16, tf32: tensor cores
    case TensorKernel::mma:
      flash_mma_forward(prec, out, lse, qkv, mask, B, T, NH, NKV, hs, causal, dropout_p, dropout_key);
      return;
    case TensorKernel::wmma:
      flash_wmma_forward(out, lse, qkv, mask, B, T, NH, NKV, hs, causal, dropout_p, dropout_key);
      return;
    case TensorKernel::none: break;
  }
  const FlashArgs a = flash_args(B, T, NH, NKV, hs, causal, dropout_p, dropout_key);
  switch (head_case(hs)) {
    case 16: launch_forward<16>(out, lse, qkv, mask, a); break;
    case 32: launch_forward<32>(out, lse, qkv, mask, a); break;
    case 64: launch_forward<64>(out, lse, qkv, mask, a); break;
    default: launch_forward<128>(out, lse, qkv, mask, a); break;
  }
}

void flash_attention_backward(float* dqkv, const float* dout, const float* out, const float* lse,
                              const float* qkv, const int32_t* mask, int B, int T, int NH,
                              int NKV, int hs, bool causal, float dropout_p,
                              uint64_t dropout_key, GemmPrecision prec) {
  check_flash_args("flash_attention_backward", NH, NKV, hs, dropout_p);
  if (B <= 0 || T <= 0 || NH <= 0 || hs <= 0) return;
  if (mask == nullptr && cudnn_attention_applies(prec, NH, NKV, hs, dropout_p) &&
      cudnn_attention_backward(dqkv, dout, out, lse, qkv, B, T, NH, NKV, hs, causal))
    return;
  const FlashArgs a = flash_args(B, T, NH, NKV, hs, causal, dropout_p, dropout_key);
  const size_t rows = static_cast<size_t>(B) * NH * T;
  float* D = static_cast<float*>(workspace(kWsAttn, rows * sizeof(float)));
  if (path_on(Path::rowdot_warp))
    flash_rowdot_kernel<<<grid_for(rows, kRowdotWarps), kRowdotWarps * 32, 0, compute_stream()>>>(D, dout, out, a);
  else
    flash_rowdot_thread_kernel<<<grid_for(rows, 256), 256, 0, compute_stream()>>>(D, dout, out, a);
  LLMPI_LAUNCH_CHECK("flash_attention_backward (D)");
  switch (tensor_kernel(prec, hs)) {
    case TensorKernel::mma:
      flash_mma_backward(prec, dqkv, dout, lse, D, qkv, mask, B, T, NH, NKV, hs, causal, dropout_p, dropout_key);
      return;
    case TensorKernel::wmma:
      flash_wmma_backward(dqkv, dout, lse, D, qkv, mask, B, T, NH, NKV, hs, causal, dropout_p, dropout_key);
      return;
    case TensorKernel::none: break;
  }
  switch (head_case(hs)) {
    case 16: launch_backward<16>(dqkv, dout, lse, D, qkv, mask, a); break;
    case 32: launch_backward<32>(dqkv, dout, lse, D, qkv, mask, a); break;
    case 64: launch_backward<64>(dqkv, dout, lse, D, qkv, mask, a); break;
    default: launch_backward<128>(dqkv, dout, lse, D, qkv, mask, a); break;
  }
}

}  // namespace llmpi::cuda

namespace llmpi {

const char* cuda_flash_attention_kernel(GemmPrecision prec, int head_size) {
  if (cuda::cudnn_attention_applies(prec, 1, 1, head_size, 0.0f)) return "cudnn-sdpa-bf16";
  switch (cuda::tensor_kernel(prec, head_size)) {
    case cuda::TensorKernel::mma: return prec == GemmPrecision::bf16 ? "flash-bf16-mma" : "flash-tf32-mma";
    case cuda::TensorKernel::wmma: return "flash-bf16-wmma";
    case cuda::TensorKernel::none: break;
  }
  return "flash-fp32";
}

}  // namespace llmpi
