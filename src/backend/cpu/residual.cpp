// Residual connection: out = a + b, elementwise (out may alias a or b).
#include "backend/cpu/cpu_ops.h"

namespace llmpi::cpu {

// out[i] = a[i] + b[i]
void residual_forward(float* out, const float* a, const float* b, size_t n) {
  const long long nn = static_cast<long long>(n);
#pragma omp parallel for simd schedule(static) if (nn > (1 << 16))
  for (long long i = 0; i < nn; i++) out[i] = a[i] + b[i];
}

}  // namespace llmpi::cpu
