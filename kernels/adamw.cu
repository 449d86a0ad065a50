// AdamW, SGD and the gradient utilities (global-norm clipping: sum_squares + scale, or within a
// step without host waits sum_squares_add + the clip factor folded into the segment updates).
//
//   adamw  (t >= 1; bias corrections c1 = 1/(1-b1^t), c2 = 1/(1-b2^t) computed once in double)
//          m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g²
//          p -= lr * ( (m c1) / (sqrt(v c2) + eps) + wd p )
//   sgd    p -= lr * (g + wd p)
//   scale  x *= s
//   sum_squares  Σ x² in double, deterministic two-pass reduction:
//          pass 1: a grid that depends only on n (never on the card); thread i sums x_i²,
//                  x_{i+stride}², ... in double, the block reduces with a fixed shuffle tree,
//                  part[block] = that sum;
//          pass 2: one block sums the parts with the same fixed tree.
//          Same n and same data => the same bits, run after run.
//          sum_squares waits and returns the double; sum_squares_add adds it to a double in device
//          memory (pass 2's one thread does *acc += s) and returns at once. sum_to_double is the
//          same two passes over x instead of x².
//   adamw/sgd_update_segments  one launch for a whole table of segments (backend/step_scalars.h):
//          block k updates segment k (n <= 65536 elements) in a block-stride loop, reading each
//          gradient as __fmul_rn(g, grad_scale) — a rounded product never fused into an FMA, i.e.
//          the value scale() would have stored. With scalars (the step's StepScalars in device
//          memory) every thread reads the two doubles and decides as the host would have from a
//          readback (backend/step_scalars.h, the same inline functions): the block returns before
//          writing anything unless update_allowed, and grad_scale = clip_factor_of(scalars,
//          max_norm) — a double sqrt and quotient, correctly rounded on both, then one rounding
//          to float: the host's bits. No host wait between the gradient's norm and the update.
//          A block whose four segment pointers (p, g, m, v) are 16-byte aligned moves its elements
//          four at a time (one 16-byte load or store per array per four elements), then the n % 4
//          tail one by one; a block with any pointer unaligned (a ZeRO piece's state offset, say)
//          takes them one by one. Each element's arithmetic is the same either way: the same bits
//          (LLMPI_CUDA_OFF=adamw_vec4: one by one always).
#include <cmath>

#include "cuda_common.cuh"
#include "vector_access.cuh"

namespace llmpi::cuda {

namespace {

__device__ __forceinline__ bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

constexpr int kThreads = 256;
constexpr int kMaxSumBlocks = 1024;  // pass 2 is one block of kMaxSumBlocks threads

// One AdamW element (the update at the top of this file), from its gradient g.
__device__ __forceinline__ void adamw_element(float& p, float& m, float& v, float g, float lr, float beta1,
                                              float beta2, float eps, float wd, float c1, float c2) {
  const float mi = beta1 * m + (1.0f - beta1) * g;
  const float vi = beta2 * v + (1.0f - beta2) * g * g;
  m = mi;
  v = vi;
  p = p - lr * ((mi * c1) / (sqrtf(vi * c2) + eps) + wd * p);
}

__global__ void adamw_kernel(float* __restrict__ params, const float* __restrict__ grads,
                             float* __restrict__ m, float* __restrict__ v, size_t n, float lr,
                             float beta1, float beta2, float eps, float wd, float c1, float c2) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    adamw_element(params[i], m[i], v[i], grads[i], lr, beta1, beta2, eps, wd, c1, c2);
}

__global__ void sgd_kernel(float* __restrict__ params, const float* __restrict__ grads, size_t n,
                           float lr, float wd) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    params[i] -= lr * (grads[i] + wd * params[i]);
}

__global__ void scale_kernel(float* __restrict__ x, float s, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    x[i] *= s;
}

template <bool kSquare>
__global__ void sum_partial_kernel(double* __restrict__ part, const float* __restrict__ x,
                                   size_t n) {
  __shared__ double sh[32];
  double s = 0.0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const double xi = x[i];
    s += kSquare ? xi * xi : xi;
  }
  s = block_sum(s, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// *out = Σ parts (accumulate: *out += Σ parts)
__global__ void sum_parts_kernel(double* __restrict__ out, const double* __restrict__ part,
                                 int nparts, bool accumulate) {
  __shared__ double sh[32];
  double s = static_cast<int>(threadIdx.x) < nparts ? part[threadIdx.x] : 0.0;
  s = block_sum(s, sh);
  if (threadIdx.x == 0) *out = accumulate ? *out + s : s;
}

__global__ void adamw_segments_kernel(float* __restrict__ params, const float* __restrict__ grads,
                                      float* __restrict__ m, float* __restrict__ v,
                                      const UpdateSegment* __restrict__ segs, float grad_scale,
                                      const StepScalars* __restrict__ scalars, double max_norm,
                                      float lr, float beta1, float beta2, float eps, float wd,
                                      float c1, float c2, bool vec4) {
  if (scalars) {
    const StepScalars sc = *scalars;
    if (!update_allowed(sc)) return;  // the whole block: parameters and moments untouched
    grad_scale = clip_factor_of(sc, max_norm);
  }
  const UpdateSegment sg = segs[blockIdx.x];
  float* p = params + sg.offset;
  const float* gr = grads + sg.offset;
  float* mk = m + sg.state_offset;
  float* vk = v + sg.state_offset;
  const float wdk = sg.decay ? wd : 0.0f;
  unsigned done = 0;  // elements [0, done) updated four at a time
  if (vec4 && aligned16(p) && aligned16(gr) && aligned16(mk) && aligned16(vk)) {
    const unsigned nq = sg.n / 4;
    for (unsigned q = threadIdx.x; q < nq; q += blockDim.x) {
      Floats<4> pv = load_floats<4>(p + 4 * q), mv = load_floats<4>(mk + 4 * q), vv = load_floats<4>(vk + 4 * q);
      const Floats<4> gv = load_floats<4>(gr + 4 * q);
#pragma unroll
      for (int j = 0; j < 4; j++)
        adamw_element(pv.v[j], mv.v[j], vv.v[j], __fmul_rn(gv.v[j], grad_scale), lr, beta1, beta2, eps, wdk, c1, c2);
      store_floats<4>(p + 4 * q, pv);
      store_floats<4>(mk + 4 * q, mv);
      store_floats<4>(vk + 4 * q, vv);
    }
    done = nq * 4;
  }
  for (unsigned i = done + threadIdx.x; i < sg.n; i += blockDim.x)
    adamw_element(p[i], mk[i], vk[i], __fmul_rn(gr[i], grad_scale), lr, beta1, beta2, eps, wdk, c1, c2);
}

__global__ void sgd_segments_kernel(float* __restrict__ params, const float* __restrict__ grads,
                                    const UpdateSegment* __restrict__ segs, float grad_scale,
                                    const StepScalars* __restrict__ scalars, double max_norm,
                                    float lr, float wd) {
  if (scalars) {
    const StepScalars sc = *scalars;
    if (!update_allowed(sc)) return;
    grad_scale = clip_factor_of(sc, max_norm);
  }
  const UpdateSegment sg = segs[blockIdx.x];
  float* p = params + sg.offset;
  const float* gr = grads + sg.offset;
  const float wdk = sg.decay ? wd : 0.0f;
  for (unsigned i = threadIdx.x; i < sg.n; i += blockDim.x)
    p[i] -= lr * (__fmul_rn(gr[i], grad_scale) + wdk * p[i]);
}

// The two passes of sum_squares / sum_to_double into *out (accumulate: *out += the sum).
template <bool kSquare>
void sum_two_pass(double* out, const float* x, size_t n, bool accumulate) {
  cudaStream_t s = compute_stream();
  size_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > kMaxSumBlocks) blocks = kMaxSumBlocks;
  double* part = static_cast<double*>(workspace(kWsReduce, (kMaxSumBlocks + 1) * sizeof(double)));
  sum_partial_kernel<kSquare><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(part, x, n);
  LLMPI_LAUNCH_CHECK(kSquare ? "sum_squares_partial" : "sum_partial");
  sum_parts_kernel<<<1, kMaxSumBlocks, 0, s>>>(out, part, static_cast<int>(blocks), accumulate);
  LLMPI_LAUNCH_CHECK("sum_parts");
}

inline unsigned elementwise_grid(size_t n) {
  // Grid-stride loops: 8 waves of 2048 threads per SM on a 132-SM card is plenty; cap there.
  const unsigned g = grid_for(n, kThreads);
  return g < 132u * 64u ? g : 132u * 64u;
}

}  // namespace

void adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t) {
  if (n == 0) return;
  const float c1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta1), t)));
  const float c2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta2), t)));
  adamw_kernel<<<elementwise_grid(n), kThreads, 0, compute_stream()>>>(
      params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, c1, c2);
  LLMPI_LAUNCH_CHECK("adamw");
}

void sgd_update(float* params, const float* grads, size_t n, float lr, float weight_decay) {
  if (n == 0) return;
  sgd_kernel<<<elementwise_grid(n), kThreads, 0, compute_stream()>>>(params, grads, n, lr,
                                                                     weight_decay);
  LLMPI_LAUNCH_CHECK("sgd");
}

void scale(float* x, float s, size_t n) {
  if (n == 0) return;
  scale_kernel<<<elementwise_grid(n), kThreads, 0, compute_stream()>>>(x, s, n);
  LLMPI_LAUNCH_CHECK("scale");
}

double sum_squares(const float* x, size_t n) {
  count_readback();
  if (n == 0) return 0.0;
  double* out = static_cast<double*>(workspace(kWsReduce, (kMaxSumBlocks + 1) * sizeof(double))) +
                kMaxSumBlocks;
  sum_two_pass<true>(out, x, n, false);
  double r = 0.0;
  LLMPI_CUDA_CHECK(cudaMemcpyAsync(&r, out, sizeof(double), cudaMemcpyDeviceToHost, compute_stream()));
  wait_for_stream();
  return r;
}

void sum_squares_add(double* acc, const float* x, size_t n) {
  if (n > 0) sum_two_pass<true>(acc, x, n, true);  // n == 0 adds 0: acc unchanged
}

void sum_to_double(double* out, const float* x, size_t n) {
  if (n == 0) {
    LLMPI_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), compute_stream()));  // +0.0
    return;
  }
  sum_two_pass<false>(out, x, n, false);
}

void adamw_update_segments(float* params, const float* grads, float* m, float* v,
                           const UpdateSegment* segs, int nsegs, float grad_scale,
                           const StepScalars* scalars, double max_norm, float lr, float beta1,
                           float beta2, float eps, float weight_decay, int t) {
  if (nsegs <= 0) return;
  const float c1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta1), t)));
  const float c2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta2), t)));
  adamw_segments_kernel<<<static_cast<unsigned>(nsegs), kThreads, 0, compute_stream()>>>(
      params, grads, m, v, segs, grad_scale, scalars, max_norm, lr, beta1, beta2, eps,
      weight_decay, c1, c2, path_on(Path::adamw_vec4));
  LLMPI_LAUNCH_CHECK("adamw_segments");
}

void sgd_update_segments(float* params, const float* grads, const UpdateSegment* segs, int nsegs,
                         float grad_scale, const StepScalars* scalars, double max_norm, float lr,
                         float weight_decay) {
  if (nsegs <= 0) return;
  sgd_segments_kernel<<<static_cast<unsigned>(nsegs), kThreads, 0, compute_stream()>>>(
      params, grads, segs, grad_scale, scalars, max_norm, lr, weight_decay);
  LLMPI_LAUNCH_CHECK("sgd_segments");
}

}  // namespace llmpi::cuda
