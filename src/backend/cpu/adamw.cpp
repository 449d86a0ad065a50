// AdamW and the gradient utilities (global-norm clipping: sum_squares + scale, or within a step
// without host waits sum_squares_add + the clip factor folded into adamw/sgd_update_segments).
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace llmpi::cpu {

namespace {
constexpr long long kParMin = 1 << 15;
// sum_squares partial sums are taken over fixed chunks of this many elements and added in chunk
// order, so the result is the same bits for any thread count.
constexpr size_t kSumChunk = 1 << 16;
}  // namespace

double sum_squares_value(const float* x, size_t n);  // Σ x², without counting a readback

// For each i (t >= 1):
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g²
//   p -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * p )
// The bias corrections are computed once in double.
void adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t) {
  const float c1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta1), t)));
  const float c2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta2), t)));
  const float a1 = 1.0f - beta1, a2 = 1.0f - beta2;
  const long long nn = static_cast<long long>(n);
#pragma omp parallel for simd schedule(static) if (nn > kParMin)
  for (long long i = 0; i < nn; i++) {
    const float g = grads[i];
    const float mi = beta1 * m[i] + a1 * g;
    const float vi = beta2 * v[i] + a2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float p = params[i];
    params[i] = p - lr * ((mi * c1) / (std::sqrt(vi * c2) + eps) + weight_decay * p);
  }
}

// For each i: p -= lr * (g + wd * p)   (plain SGD, decoupled weight decay; no momentum)
void sgd_update(float* params, const float* grads, size_t n, float lr, float weight_decay) {
  const long long nn = static_cast<long long>(n);
#pragma omp parallel for simd schedule(static) if (nn > kParMin)
  for (long long i = 0; i < nn; i++) params[i] -= lr * (grads[i] + weight_decay * params[i]);
}

// Σ x², each term widened to double.
double sum_squares(const float* x, size_t n) {
  count_readback();  // a result the host gets (a host wait on a GPU)
  return sum_squares_value(x, n);
}

// *acc += Σ x², the same double as sum_squares (acc is host memory here).
void sum_squares_add(double* acc, const float* x, size_t n) { *acc += sum_squares_value(x, n); }

// *out = Σ x in double, in index order: the same bits as the loop the loss was summed with on the
// host (a sequential double sum; without -ffast-math the compiler keeps the order).
void sum_to_double(double* out, const float* x, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++) s += x[i];
  *out = s;
}

double sum_squares_value(const float* x, size_t n) {
  const size_t nchunks = (n + kSumChunk - 1) / kSumChunk;
  if (nchunks <= 1) {
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (size_t i = 0; i < n; i++) s += static_cast<double>(x[i]) * x[i];
    return s;
  }
  std::vector<double> part(nchunks, 0.0);
  const long long nc = static_cast<long long>(nchunks);
#pragma omp parallel for schedule(static)
  for (long long k = 0; k < nc; k++) {
    const size_t i0 = static_cast<size_t>(k) * kSumChunk;
    const size_t i1 = i0 + kSumChunk < n ? i0 + kSumChunk : n;
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (size_t i = i0; i < i1; i++) s += static_cast<double>(x[i]) * x[i];
    part[k] = s;
  }
  double s = 0.0;
  for (double p : part) s += p;
  return s;
}

// x *= s
void scale(float* x, float s, size_t n) {
  const long long nn = static_cast<long long>(n);
#pragma omp parallel for simd schedule(static) if (nn > kParMin)
  for (long long i = 0; i < nn; i++) x[i] *= s;
}

// The multi-tensor forms: each segment's elements as adamw_update / sgd_update would update them,
// with g = grads[i] * grad_scale (rounded to float on its own, as scale() stored it: see
// scaled_grad). Segments are independent, so any schedule gives the same bits. With scalars the
// decision the host made from a readback is made here from them (step_scalars.h): no update at
// all unless update_allowed, and grad_scale = clip_factor_of(*scalars, max_norm).
namespace {
// g * s rounded to float by itself. With -ffp-contract=fast (GCC's default for C++) a product
// that feeds only an addition may be fused into an FMA with it; SGD's g + wd·p would then differ
// from scale() followed by sgd_update. The empty asm hides the product from that fusion.
inline float scaled_grad(float g, float s) {
  float r = g * s;
#if defined(__x86_64__) || defined(__i386__)
  asm("" : "+x"(r));
#else
  asm("" : "+r"(r));
#endif
  return r;
}
}  // namespace

void adamw_update_segments(float* params, const float* grads, float* m, float* v, const UpdateSegment* segs,
                           int nsegs, float grad_scale, const StepScalars* scalars, double max_norm, float lr,
                           float beta1, float beta2, float eps, float weight_decay, int t) {
  if (scalars) {
    if (!update_allowed(*scalars)) return;  // a non-finite step: parameters and moments untouched
    grad_scale = clip_factor_of(*scalars, max_norm);
  }
  const float c1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta1), t)));
  const float c2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta2), t)));
  const float a1 = 1.0f - beta1, a2 = 1.0f - beta2;
#pragma omp parallel for schedule(static) if (nsegs > 1)
  for (int k = 0; k < nsegs; k++) {
    const UpdateSegment sg = segs[k];
    float* p = params + sg.offset;
    const float* gr = grads + sg.offset;
    float* mk = m + sg.state_offset;
    float* vk = v + sg.state_offset;
    const float wd = sg.decay ? weight_decay : 0.0f;
    const long long nn = sg.n;
    // g feeds only multiplications here (a1·g, a2·g·g), so no FMA can swallow its rounding.
#pragma omp simd
    for (long long i = 0; i < nn; i++) {
      const float g = gr[i] * grad_scale;
      const float mi = beta1 * mk[i] + a1 * g;
      const float vi = beta2 * vk[i] + a2 * g * g;
      mk[i] = mi;
      vk[i] = vi;
      const float pi = p[i];
      p[i] = pi - lr * ((mi * c1) / (std::sqrt(vi * c2) + eps) + wd * pi);
    }
  }
}

void sgd_update_segments(float* params, const float* grads, const UpdateSegment* segs, int nsegs, float grad_scale,
                         const StepScalars* scalars, double max_norm, float lr, float weight_decay) {
  if (scalars) {
    if (!update_allowed(*scalars)) return;  // a non-finite step: parameters untouched
    grad_scale = clip_factor_of(*scalars, max_norm);
  }
#pragma omp parallel for schedule(static) if (nsegs > 1)
  for (int k = 0; k < nsegs; k++) {
    const UpdateSegment sg = segs[k];
    float* p = params + sg.offset;
    const float* gr = grads + sg.offset;
    const float wd = sg.decay ? weight_decay : 0.0f;
    const long long nn = sg.n;
    if (grad_scale == 1.0f) {  // g * 1 == g: sgd_update's loop as it is
#pragma omp simd
      for (long long i = 0; i < nn; i++) p[i] -= lr * (gr[i] + wd * p[i]);
    } else {
      for (long long i = 0; i < nn; i++) p[i] -= lr * (scaled_grad(gr[i], grad_scale) + wd * p[i]);
    }
  }
}

}  // namespace llmpi::cpu
