// Fused softmax + cross-entropy over the vocabulary, and its backward, in place.
//
// One block per row n, logits z (length V), target y:
//   mx = max_j z_j;  S = Σ_j exp(z_j - mx)            (every term in (0, 1])
//   loss_n = log S + mx - z_y                          (= -log softmax(z)_y, no overflow)
//   if grad_scale != 0:  z_j <- grad_scale * (exp(z_j - mx) / S - [j == y])
// Two passes over the row (an online max and sum; the write). The first is "online softmax"
// (Milakov & Gimelshein 2018): each thread keeps its running maximum m and its sum s of
// exp(z - m) over its elements, rescaling s by exp(m_old - m_new) when the maximum grows (one exp
// per element either way); then the block's maximum M and S = Σ_threads s_t·exp(m_t - M). A NaN
// logit makes S (so the loss) NaN, as the three-pass kernel did; a -inf one adds nothing.
// z_y is read before any write. Targets outside [0, V) are recorded, never read: the kernel keeps
// the first bad row (and its target) in a 64-bit key, max-combined (an integer atomicMax: the
// result does not depend on the order; backend/step_scalars.h encode_bad_target).
//
// Two kernels, one per row either way, the same arithmetic per element:
//   softmax_xent_row_kernel  (when V floats fit in a block's shared memory beside its 128 bytes of
//       reduction slots: an H100 gives 227 KB, V up to 58,080, so GPT-2's 50,257 and LLaMA 2's
//       32,000; an A100 163 KB, V up to 41,696) keeps the row
//       in shared memory between the passes, so the logits are read from global memory once,
//       with 16-byte loads where the row is 16-byte aligned (the LM head's padded rows). 1024
//       threads; thread t owns the groups of four logits q = t, t + 1024, ... (z[4q..4q+3], in
//       order), then the last V % 4 logits one each (threads 0..2): the same order whether the
//       row is aligned or not, so a row gives the same bits in place (rows of V) and into bf16
//       (padded rows). Why shared memory: rows of 201 KB in flight (GPT-2's vocabulary, ~530 rows at
//       4 blocks of 512 threads per SM) do not stay in a 50 MB L2, so a second pass would read
//       the row from global memory again (the two-pass kernel below; LLMPI_CUDA_OFF=softmax_row_smem).
//   softmax_xent_kernel  (larger V) 512 threads, thread t owns logits t, t + 512, ...; the row is
//       read twice from global memory.
//   softmax_xent         the checked op: the key in a workspace flag, waited for and read back
//                        after the kernel, an out-of-range target raises the CPU backend's error
//   softmax_xent_record  no host wait: the key goes to the caller's flag (a training step's
//                        StepScalars), which the step reads once with the loss and gradient norm
//   softmax_xent_bf16_grad  softmax_xent_record writing the gradient as bf16 into another buffer
//                        (a bf16 LM head's GEMM operand; rows padded with zeros)
// The last two take the rows' stride ld >= V (the LM head's padded logits rows; the padding is
// neither read nor, in the logits, written).
#include <cuda_bf16.h>

#include <type_traits>

#include "cuda_common.cuh"
#include "runtime/error.h"
#include "vector_access.cuh"

namespace llmpi::cuda {

namespace {

constexpr int kThreads = 512;     // softmax_xent_kernel
constexpr int kRowThreads = 1024;  // softmax_xent_row_kernel
constexpr int kCopyBatch = 4;      // its 16-byte loads in flight per thread

__device__ __forceinline__ void store_grad(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_grad(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// One logit x into a thread's running maximum m and sum st of exp(z - m) (m = -inf at first:
// expf(-inf) = 0; a NaN x makes st NaN and keeps it so).
__device__ __forceinline__ void online_add(float x, float& m, float& st) {
  if (x > m) {
    st = st * expf(m - x) + 1.0f;
    m = x;
  } else {
    st += x == -INFINITY ? 0.0f : expf(x - m);  // NaN stays NaN
  }
}

// The block's maximum mx and sum S from every thread's (m, st) (a thread that saw only -inf adds
// 0; one that saw a NaN, even with m = -inf, adds NaN). Ends with barriers: every thread's earlier
// reads and shared-memory writes are done.
__device__ __forceinline__ void row_statistics(float m, float st, float* sh, float* mx, float* s) {
  *mx = block_max(m, sh);
  *s = block_sum(m == -INFINITY && st == 0.0f ? 0.0f : st * expf(m - *mx), sh);
}

// The gradient of logit j with value x: e·f, then − grad_scale on the target (its products rounded
// explicitly, as the CPU rounds them; no contraction into an FMA).
__device__ __forceinline__ float grad_value(int j, float x, int y, float mx, float f, float grad_scale) {
  const float e = __fmul_rn(expf(x - mx), f);
  return j == y ? __fsub_rn(e, grad_scale) : e;
}

// A row whose target is outside [0, V): recorded, loss NaN, nothing written (true: skip the row)
__device__ __forceinline__ bool bad_row(int y, int V, int n, int row0, unsigned long long* bad, float* losses) {
  if (y >= 0 && y < V) return false;
  if (threadIdx.x == 0) {
    atomicMax(bad, static_cast<unsigned long long>(encode_bad_target(row0 + n, y)));
    losses[n] = __int_as_float(0x7fc00000);  // NaN
  }
  return true;
}

// Rows are ld >= V values apart, in the logits and in grad. G = float: the gradient over the
// logits (grad = logits; the padding untouched); G = __nv_bfloat16: into grad [N, ld] as bf16,
// padding columns zero, logits only read. One template, so the gradient's value is the same
// expression in both.
template <typename G>
__global__ void softmax_xent_kernel(const float* logits, G* grad, int ld,  // (they alias for G = float)
                                    float* __restrict__ losses, const int32_t* __restrict__ targets,
                                    unsigned long long* __restrict__ bad, int V, int row0,
                                    float grad_scale) {
  __shared__ float sh[32];
  const int n = blockIdx.x;
  const float* z = logits + static_cast<size_t>(n) * ld;
  const int y = targets[n];
  if (bad_row(y, V, n, row0, bad, losses)) return;
  const float zy = z[y];
  float m = -INFINITY, st = 0.0f;  // this thread's running maximum and Σ exp(z - m)
  for (int j = threadIdx.x; j < V; j += blockDim.x) online_add(z[j], m, st);
  float mx, s;
  row_statistics(m, st, sh, &mx, &s);  // (its barriers: every thread has read z[y] and all of z
  if (threadIdx.x == 0) losses[n] = logf(s) + (mx - zy);  //  before anyone writes, in place)
  if (grad_scale != 0.0f) {
    const float f = grad_scale / s;
    G* g = grad + static_cast<size_t>(n) * ld;
    for (int j = threadIdx.x; j < V; j += blockDim.x) store_grad(g + j, grad_value(j, z[j], y, mx, f, grad_scale));
    if constexpr (!std::is_same_v<G, float>)
      for (int j = V + threadIdx.x; j < ld; j += blockDim.x) store_grad(g + j, 0.0f);
  }
}

// The same with the row kept in shared memory (dynamic: V floats, rounded up to whole float4s)
// between the passes; groups of four logits per thread as in the comment at the top.
template <typename G>
__global__ void __launch_bounds__(kRowThreads)
    softmax_xent_row_kernel(const float* logits, G* grad, int ld,  // (they alias for G = float)
                            float* __restrict__ losses, const int32_t* __restrict__ targets,
                            unsigned long long* __restrict__ bad, int V, int row0, float grad_scale) {
  extern __shared__ float4 row4[];
  float* row = reinterpret_cast<float*>(row4);
  __shared__ float sh[32];
  const int n = blockIdx.x;
  const float* z = logits + static_cast<size_t>(n) * ld;
  const int y = targets[n];
  if (bad_row(y, V, n, row0, bad, losses)) return;
  const int groups = V / 4, rest = V - 4 * groups;  // groups of four, then rest < 4 logits
  // The copy into shared memory first, kCopyBatch groups per thread at a time: their loads are
  // predicated, not behind a branch each, so they are all in flight together; then the statistics
  // over this thread's own logits, which it wrote itself (no barrier needed), in the order of the
  // comment at the top.
  const bool z16 = reinterpret_cast<uintptr_t>(z) % 16 == 0;
  for (int q0 = threadIdx.x; q0 < groups; q0 += kCopyBatch * blockDim.x) {
    float4 v[kCopyBatch];
#pragma unroll
    for (int u = 0; u < kCopyBatch; u++) {
      const int q = q0 + u * blockDim.x;
      const float* p = z + 4 * q;
      v[u] = q >= groups ? make_float4(0.0f, 0.0f, 0.0f, 0.0f)
             : z16       ? *reinterpret_cast<const float4*>(p)
                         : make_float4(p[0], p[1], p[2], p[3]);
    }
#pragma unroll
    for (int u = 0; u < kCopyBatch; u++)
      if (q0 + u * blockDim.x < groups) row4[q0 + u * blockDim.x] = v[u];
  }
  if (threadIdx.x < rest) row[4 * groups + threadIdx.x] = z[4 * groups + threadIdx.x];
  float m = -INFINITY, st = 0.0f;
  for (int q = threadIdx.x; q < groups; q += blockDim.x) {
    const float4 v = row4[q];
    online_add(v.x, m, st);
    online_add(v.y, m, st);
    online_add(v.z, m, st);
    online_add(v.w, m, st);
  }
  if (threadIdx.x < rest) online_add(row[4 * groups + threadIdx.x], m, st);
  float mx, s;
  row_statistics(m, st, sh, &mx, &s);  // (its barriers: the row is in shared memory, and every
  const float zy = row[y];             //  read of z is done before anyone writes, in place)
  if (threadIdx.x == 0) losses[n] = logf(s) + (mx - zy);
  if (grad_scale == 0.0f) return;
  const float f = grad_scale / s;
  G* g = grad + static_cast<size_t>(n) * ld;
  // whole-group stores: 16 bytes (fp32) or 8 (bf16) where g's row is that aligned
  const bool g_vec = reinterpret_cast<uintptr_t>(g) % (4 * sizeof(G)) == 0;
  for (int q = threadIdx.x; q < groups; q += blockDim.x) {
    const float4 v = row4[q];
    const int j = 4 * q;
    Floats<4> o;
    o.v[0] = grad_value(j, v.x, y, mx, f, grad_scale);
    o.v[1] = grad_value(j + 1, v.y, y, mx, f, grad_scale);
    o.v[2] = grad_value(j + 2, v.z, y, mx, f, grad_scale);
    o.v[3] = grad_value(j + 3, v.w, y, mx, f, grad_scale);
    if (g_vec) {
      if constexpr (std::is_same_v<G, float>)
        store_floats<4>(g + j, o);
      else
        store_floats_bf16<4>(nullptr, g + j, o);
    } else {
#pragma unroll
      for (int k = 0; k < 4; k++) store_grad(g + j + k, o.v[k]);
    }
  }
  if (threadIdx.x < rest) {
    const int j = 4 * groups + threadIdx.x;
    store_grad(g + j, grad_value(j, row[j], y, mx, f, grad_scale));
  }
  if constexpr (!std::is_same_v<G, float>)
    for (int j = V + threadIdx.x; j < ld; j += blockDim.x) store_grad(g + j, 0.0f);
}

// The row kernel's shared memory for V, or 0 when the bound device cannot give a block that much
// beside its 32 reduction slots (then softmax_xent_kernel runs).
size_t row_kernel_smem(int V) {
  const size_t bytes = (static_cast<size_t>(V) + 3) / 4 * sizeof(float4);
  return bytes + 32 * sizeof(float) <= static_cast<size_t>(device_smem_optin()) ? bytes : 0;
}

// One of the two kernels over N rows (grad may alias logits for G = float).
template <typename G>
void launch_softmax_xent(const float* logits, G* grad, int ld, float* losses, const int32_t* targets,
                         unsigned long long* bad, int N, int V, int row0, float grad_scale) {
  cudaStream_t s = compute_stream();
  const size_t smem = path_on(Path::softmax_row_smem) ? row_kernel_smem(V) : 0;
  if (smem == 0) {
    softmax_xent_kernel<G><<<N, kThreads, 0, s>>>(logits, grad, ld, losses, targets, bad, V, row0, grad_scale);
    return;
  }
  static size_t allowed = 0;  // the dynamic shared memory this instantiation has been opted in to
  allow_smem(softmax_xent_row_kernel<G>, smem, &allowed);
  softmax_xent_row_kernel<G><<<N, kRowThreads, smem, s>>>(logits, grad, ld, losses, targets, bad, V, row0, grad_scale);
}

}  // namespace

void softmax_xent_record(float* logits, int ld, float* losses, const int32_t* targets, int N, int V,
                         float grad_scale, uint64_t* bad, int row0) {
  if (ld < V) fail("internal: softmax_xent_record with ld ", ld, " < V ", V);
  if (N <= 0) return;
  static_assert(sizeof(unsigned long long) == sizeof(uint64_t), "atomicMax on the 64-bit key");
  launch_softmax_xent<float>(logits, logits, ld, losses, targets, reinterpret_cast<unsigned long long*>(bad), N, V,
                             row0, grad_scale);
  LLMPI_LAUNCH_CHECK("softmax_xent");
}

void softmax_xent_bf16_grad(const float* logits, int ld, float* losses, const int32_t* targets, int N, int V,
                            float grad_scale, uint16_t* grad, uint64_t* bad, int row0) {
  if (grad_scale == 0.0f || ld < V) fail("internal: softmax_xent_bf16_grad needs grad_scale != 0 and ld >= V");
  if (N <= 0) return;
  launch_softmax_xent<__nv_bfloat16>(logits, reinterpret_cast<__nv_bfloat16*>(grad), ld, losses, targets,
                                     reinterpret_cast<unsigned long long*>(bad), N, V, row0, grad_scale);
  LLMPI_LAUNCH_CHECK("softmax_xent_bf16_grad");
}

void softmax_xent(float* logits, float* losses, const int32_t* targets, int N, int V,
                  float grad_scale) {
  count_readback();
  if (N <= 0) return;
  cudaStream_t s = compute_stream();
  uint64_t* bad = static_cast<uint64_t*>(workspace(kWsFlag, sizeof(uint64_t)));
  LLMPI_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof(uint64_t), s));
  softmax_xent_record(logits, V, losses, targets, N, V, grad_scale, bad, 0);
  uint64_t key = 0;
  LLMPI_CUDA_CHECK(cudaMemcpyAsync(&key, bad, sizeof(uint64_t), cudaMemcpyDeviceToHost, s));
  wait_for_stream();
  if (key != 0)
    fail("softmax_xent: target ", bad_target_value(key), " at row ", bad_target_row(key),
         " is outside the vocabulary [0, ", V, "); check the data set's vocab_size against the model's");
}

// ---- a vocabulary shard's cross-entropy (tensor parallelism; op_list.h vocab_xent_*) ----
// One block of kThreads per row; the group's max and sums run between the three kernels.
namespace {

__global__ void vocab_xent_max_kernel(float* __restrict__ rowmax, const float* __restrict__ logits, int ld, int Vn) {
  __shared__ float sh[32];
  const float* z = logits + static_cast<size_t>(blockIdx.x) * ld;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < Vn; j += blockDim.x) m = fmaxf(m, z[j]);
  m = block_max(m, sh);
  if (threadIdx.x == 0) rowmax[blockIdx.x] = m;
}

__global__ void vocab_xent_sums_kernel(float* __restrict__ sums, const float* __restrict__ logits, int ld,
                                       const float* __restrict__ rowmax, const int32_t* __restrict__ targets,
                                       int v0, int N, int Vn) {
  __shared__ float sh[32];
  const int n = blockIdx.x;
  const float* z = logits + static_cast<size_t>(n) * ld;
  const float mx = rowmax[n];
  float st = 0.0f;
  for (int j = threadIdx.x; j < Vn; j += blockDim.x) st += expf(z[j] - mx);
  st = block_sum(st, sh);
  if (threadIdx.x == 0) {
    sums[n] = st;
    const int y = targets[n] - v0;
    sums[N + n] = y >= 0 && y < Vn ? z[y] : 0.0f;
  }
}

__global__ void vocab_xent_finish_kernel(float* __restrict__ logits, int ld, float* __restrict__ losses,
                                         const float* __restrict__ rowmax, const float* __restrict__ sums,
                                         const int32_t* __restrict__ targets, int v0, int N, int Vn,
                                         float grad_scale) {
  const int n = blockIdx.x;
  const float mx = rowmax[n], s = sums[n];
  if (threadIdx.x == 0) losses[n] = logf(s) + (mx - sums[N + n]);
  if (grad_scale == 0.0f) return;
  float* z = logits + static_cast<size_t>(n) * ld;
  const int y = targets[n] - v0;
  const float f = grad_scale / s;
  for (int j = threadIdx.x; j < Vn; j += blockDim.x) z[j] = grad_value(j, z[j], y, mx, f, grad_scale);
}

}  // namespace

void vocab_xent_max(float* rowmax, const float* logits, int ld, int N, int Vn) {
  if (N <= 0) return;
  vocab_xent_max_kernel<<<N, kThreads, 0, compute_stream()>>>(rowmax, logits, ld, Vn);
  LLMPI_LAUNCH_CHECK("vocab_xent_max");
}

void vocab_xent_sums(float* sums, const float* logits, int ld, const float* rowmax, const int32_t* targets, int v0,
                     int N, int Vn) {
  if (N <= 0) return;
  vocab_xent_sums_kernel<<<N, kThreads, 0, compute_stream()>>>(sums, logits, ld, rowmax, targets, v0, N, Vn);
  LLMPI_LAUNCH_CHECK("vocab_xent_sums");
}

void vocab_xent_finish(float* logits, int ld, float* losses, const float* rowmax, const float* sums,
                       const int32_t* targets, int v0, int N, int Vn, float grad_scale) {
  if (N <= 0) return;
  vocab_xent_finish_kernel<<<N, kThreads, 0, compute_stream()>>>(logits, ld, losses, rowmax, sums, targets, v0, N,
                                                                 Vn, grad_scale);
  LLMPI_LAUNCH_CHECK("vocab_xent_finish");
}

}  // namespace llmpi::cuda
