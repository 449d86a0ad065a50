// What the simulated CUDA backend (tools/cuda_cpu_sim/README.md) takes from the two .cu files it
// does not compile: gemm_lt.cu's cuBLASLt GEMMs with epilogues, here computed on the CPU to their
// contract (cuda_common.cuh), with its counters and switch; cudnn_attention.cpp's entry points,
// off; and the column-major GEMM behind include/cublas_v2.h. (NCCL, which nccl_sync.cu calls, is
// sim_nccl.cpp's.)
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cuda_ops.h"
#include "backend/ops.h"
#include "cublas_v2.h"
#include "cuda_common.cuh"
#include "cudnn_attention.cuh"
#include "runtime/error.h"
#include "sim_runtime.h"

namespace llmpi::sim {

bool g_epilogues = true;
long long g_lt_counts[static_cast<int>(cuda::LtCount::kinds)] = {};

cublasStatus_t gemm_col_major(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                              const void* A, cudaDataType_t at, int lda, const void* B, cudaDataType_t bt, int ldb,
                              float beta, float* C, int ldc, bool tf32) {
  // cuBLAS's argument rules (cublasGemmEx: "invalid value" otherwise)
  const int a_rows = ta == CUBLAS_OP_N ? m : k, b_rows = tb == CUBLAS_OP_N ? k : n;
  if (m < 0 || n < 0 || k < 0 || lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (at != bt || (at != CUDA_R_32F && at != CUDA_R_16BF)) return CUBLAS_STATUS_INVALID_VALUE;
  auto value = [&](const void* p, cudaDataType_t t, size_t i) {
    if (t == CUDA_R_16BF) return bf16_bits_to_float(static_cast<const uint16_t*>(p)[i]);
    const float x = static_cast<const float*>(p)[i];
    return tf32 ? round_to_tf32(x) : x;
  };
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  // The operands' values packed in panels of 8 rows of op(A) and 8 columns of op(B), each panel
  // k x 8 with its 8 values of one l side by side (zeros past m and n):
  //   a_p[p][l][r] = op(A)[8p + r][l],  b_p[q][l][c] = op(B)[l][8q + c]
  const int pa = (m + 7) / 8, pb = (n + 7) / 8;
  std::vector<float> a_p(static_cast<size_t>(pa) * k * 8, 0.0f), b_p(static_cast<size_t>(pb) * k * 8, 0.0f);
#pragma omp parallel for schedule(static)
  for (int i = 0; i < m; i++)
    for (int l = 0; l < k; l++)
      a_p[(static_cast<size_t>(i / 8) * k + l) * 8 + i % 8] =
          value(A, at, ta == CUBLAS_OP_N ? i + static_cast<size_t>(l) * lda : l + static_cast<size_t>(i) * lda);
#pragma omp parallel for schedule(static)
  for (int j = 0; j < n; j++)
    for (int l = 0; l < k; l++)
      b_p[(static_cast<size_t>(j / 8) * k + l) * 8 + j % 8] =
          value(B, bt, tb == CUBLAS_OP_N ? l + static_cast<size_t>(j) * ldb : j + static_cast<size_t>(l) * ldb);
  // s[i][j] = Σ_l a(i, l) b(l, j), each sum in fp32 in l order from +0: the bits of one loop per
  // element (the order of each sum is kept; only independent sums run side by side, 8 rows in a
  // vector, 8 columns in 8 of them)
  typedef float v8 __attribute__((vector_size(32)));
  constexpr int kPanelsPerTask = 4;  // column panels per task: an A panel is read from cache 4 times
  const int tasks = (pb + kPanelsPerTask - 1) / kPanelsPerTask;
#pragma omp parallel for schedule(dynamic)
  for (int task = 0; task < tasks; task++)
    for (int p = 0; p < pa; p++)
      for (int q = task * kPanelsPerTask; q < std::min(pb, (task + 1) * kPanelsPerTask); q++) {
        const float* a = a_p.data() + static_cast<size_t>(p) * k * 8;  // (k = 0: empty panels)
        const float* b = b_p.data() + static_cast<size_t>(q) * k * 8;
        v8 s[8] = {};
        for (int l = 0; l < k; l++) {
          v8 av;
          std::memcpy(&av, a + static_cast<size_t>(l) * 8, sizeof av);
          for (int c = 0; c < 8; c++) s[c] += av * b[static_cast<size_t>(l) * 8 + c];
        }
        for (int c = 0; c < 8 && 8 * q + c < n; c++)
          for (int r = 0; r < 8 && 8 * p + r < m; r++) {
            float& out = C[(8 * p + r) + static_cast<size_t>(8 * q + c) * ldc];
            out = alpha * s[c][r] + (beta == 0.0f ? 0.0f : beta * out);  // beta = 0: C is not read (may be NaN)
          }
      }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace llmpi::sim

namespace llmpi::cuda {

void lt_count(LtCount what) { sim::g_lt_counts[static_cast<int>(what)]++; }
float* lt_bgrad_scratch() {
  static std::vector<float> v(kLtBgradMaxFloats);
  return v.data();
}

// gemm_lt.cu's contract (cuda_common.cuh): D = epilogue(op(A) op(B) + beta C [+ bias]), row-major,
// computed as the swapped column-major product as the real one is; the GELU (tanh) and its
// derivative by the CPU backend's ops.
void lt_gemm_rm(const LtGemm& g) {
  sim::reach(compute_stream());  // gemm_lt.cu's GEMMs run on the compute stream
  const cudaDataType_t t = g.prec == GemmPrecision::bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasOperation_t opA = g.transA ? CUBLAS_OP_T : CUBLAS_OP_N, opB = g.transB ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (g.ep == LtEpilogue::bgradb) {  // bgrad[m] = Σ_k op(A)[m, k], from the operand as given
    for (int m = 0; m < g.M; m++) {
      float s = 0.0f;
      for (int k = 0; k < g.K; k++) {
        const size_t i = g.transA ? static_cast<size_t>(k) * g.lda + m : static_cast<size_t>(m) * g.lda + k;
        s += t == CUDA_R_16BF ? bf16_bits_to_float(static_cast<const uint16_t*>(g.A)[i])
                              : static_cast<const float*>(g.A)[i];
      }
      g.bgrad[m] = s;
    }
  }
  std::vector<float> prod(static_cast<size_t>(g.M) * g.N);  // op(A) op(B), row-major, ld N
  const cublasStatus_t s = sim::gemm_col_major(opB, opA, g.N, g.M, g.K, 1.0f, g.B, t, g.ldb, g.A, t, g.lda, 0.0f,
                                               prod.data(), g.N, g.prec == GemmPrecision::tf32);
  if (s != CUBLAS_STATUS_SUCCESS) throw_cublas(s, "lt_gemm_rm", __FILE__, __LINE__);
  const Ops& cpu = cpu_ops();
  for (int m = 0; m < g.M; m++)
    for (int n = 0; n < g.N; n++) {
      float& c = g.C[static_cast<size_t>(m) * g.ldc + n];
      float v = prod[static_cast<size_t>(m) * g.N + n] + (g.beta == 0.0f ? 0.0f : g.beta * c);
      switch (g.ep) {
        case LtEpilogue::bias:
          v += g.bias[n];
          break;
        case LtEpilogue::gelu_aux: {
          if (g.bias) v += g.bias[n];
          g.aux[static_cast<size_t>(m) * g.ldaux + n] = v;
          float out;
          cpu.gelu_forward(&out, &v, 1);
          v = out;
          break;
        }
        case LtEpilogue::dgelu: {
          float d = 0.0f;
          cpu.gelu_backward(&d, &g.aux[static_cast<size_t>(m) * g.ldaux + n], &v, 1);
          v = d;
          break;
        }
        default:
          break;
      }
      c = v;
    }
}

// cudnn_attention.cpp is not simulated either (cuDNN is a library of GPU kernels): the path reports
// itself off, and flash_attention_forward/backward run our kernels.
bool cudnn_attention_loadable(std::string* why) {
  if (why) *why = "the CPU simulator has no cuDNN";
  return false;
}
bool cudnn_attention_applies(GemmPrecision, int, int, int, float) { return false; }
bool cudnn_attention_forward(float*, float*, const float*, int, int, int, int, int, bool) { return false; }
bool cudnn_attention_backward(float*, const float*, const float*, const float*, const float*, int, int, int, int, int,
                              bool) {
  return false;
}

}  // namespace llmpi::cuda

namespace llmpi {
bool cuda_gemm_epilogues_enabled() { return sim::g_epilogues; }
CudaEpilogueCounts cuda_epilogue_counts() {
  const long long* n = sim::g_lt_counts;
  using K = cuda::LtCount;
  CudaEpilogueCounts c;
  c.bias = n[static_cast<int>(K::bias)];
  c.gelu_aux = n[static_cast<int>(K::gelu_aux)];
  c.dgelu = n[static_cast<int>(K::dgelu)];
  c.bgradb = n[static_cast<int>(K::bgradb)];
  c.unfused = n[static_cast<int>(K::unfused)];
  c.ragged_split = n[static_cast<int>(K::ragged_split)];
  c.colsum_in_conversion = n[static_cast<int>(K::colsum_in_conversion)];
  return c;
}
}  // namespace llmpi

