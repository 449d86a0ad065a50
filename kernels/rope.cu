// Rotary position embedding (Hugging Face rotate-half convention), in place.
//
// x holds N = B*T rows of `stride` floats; the first nh*hs floats of a row are nh heads of hs
// (hs even, half = hs/2). Row n is position t = n % T. For i < half:
//   f_i = theta^(-2i/hs),  a = t f_i
//   forward   x'[i]      = x[i] cos a - x[i+half] sin a
//             x'[i+half] = x[i+half] cos a + x[i] sin a
//   backward  the inverse rotation (angle -a) of the gradient, in place (the rotation is
//             orthogonal, so its transpose is its inverse):
//             dx'[i]      = dx[i] cos a + dx[i+half] sin a
//             dx'[i+half] = dx[i+half] cos a - dx[i] sin a
// One thread per (row n, frequency i), looping over the nh heads (they share the angle). The
// angle and its sine/cosine are computed in double and rounded once to float: at t in the
// thousands a float angle would already be off by ~1e-4 rad.
#include "cuda_common.cuh"

namespace llmpi::cuda {

namespace {

constexpr int kThreads = 256;

// direction = +1: forward rotation; -1: inverse rotation (backward).
__global__ void rope_kernel(float* x, int N, int T, int nh, int hs, int stride, float theta,
                            float direction) {
  const int half = hs / 2;
  const size_t total = static_cast<size_t>(N) * half;
  const double log2_theta = log2(static_cast<double>(theta));
  for (size_t k = grid_first(); k < total; k += grid_stride()) {
    const size_t n = k / half;
    const int i = static_cast<int>(k - n * half);
    const int t = static_cast<int>(n % T);
    const double inv_freq = exp2(-(2.0 * i / hs) * log2_theta);  // theta^(-2i/hs)
    double sd, cd;
    sincos(static_cast<double>(t) * inv_freq, &sd, &cd);
    const float s = static_cast<float>(sd) * direction, c = static_cast<float>(cd);
    float* row = x + n * static_cast<size_t>(stride);
    for (int h = 0; h < nh; h++) {
      float* head = row + static_cast<size_t>(h) * hs;
      const float x0 = head[i], x1 = head[i + half];
      head[i] = x0 * c - x1 * s;
      head[i + half] = x1 * c + x0 * s;
    }
  }
}

void rope(float* x, int B, int T, int nh, int hs, int stride, float theta, float direction) {
  const int N = B * T;
  if (N <= 0 || nh <= 0 || hs < 2) return;
  const size_t total = static_cast<size_t>(N) * (hs / 2);
  rope_kernel<<<grid_for(total, kThreads), kThreads, 0, compute_stream()>>>(x, N, T, nh, hs,
                                                                             stride, theta,
                                                                             direction);
  LLMPI_LAUNCH_CHECK("rope");
}

}  // namespace

void rope_forward(float* x, int B, int T, int nh, int hs, int stride, float theta) {
  rope(x, B, T, nh, hs, stride, theta, 1.0f);
}

void rope_backward(float* dx, int B, int T, int nh, int hs, int stride, float theta) {
  rope(dx, B, T, nh, hs, stride, theta, -1.0f);
}

}  // namespace llmpi::cuda
