// cuBLASLt GEMMs with epilogues: the dense layers' bias, GELU with its input kept (aux), the GELU
// gradient and the bias gradient computed inside the GEMM instead of by separate kernels
// (docs/GPU.md "cuBLASLt epilogues"; the calls: matmul.cu).
//
// Row-major to cuBLASLt's column-major as in sgemm_rm: C[M,N] = op(A) op(B) is, column-major,
// Cᵀ[N,M] = op(B)ᵀ op(A)ᵀ, so the cuBLASLt call has m = N, n = M, k = K, its first operand is B
// (op transB) and its second A (op transA). In those terms:
//   BIAS / GELU_AUX_BIAS: the bias has m = N entries (one per row of D = per column of our C);
//   GELU_AUX / DGELU: aux has D's shape, m × n column-major, i.e. our [M, N] row-major, ld ldaux;
//   BGRADB: the bias gradient has n = M entries, the sums over k of cuBLASLt's op(B) = our op(A)ᵀ.
//
// What the library documents and this file relies on (cublasLt.h of CUDA 13, cuBLAS guide):
//   - GELU is the tanh approximation 0.5 x (1 + tanh(√(2/π)(x + 0.044715 x³))) (GPT-2's); its
//     rounding is cuBLASLt's own, so it equals our gelu_forward to rounding, not bit for bit;
//   - the aux leading dimension must be divisible by 8 (lt_gelu_ld_ok; callers fall back);
//   - aux and bias default to D's type (fp32 here in every precision mode: the bias is added and
//     the aux stored in fp32; bf16 runs still keep fp32 activations);
//   - D = epilogue(alpha op(A) op(B) + beta C [+ bias]); C may be D (in place, same layout);
//   - split-K reductions are "in place with counters to guarantee the sequentiality" or a
//     separate reduction step, never float atomics; with one stream, a user-owned workspace and
//     the same algorithm, results are bitwise repeatable on the same card (cuBLAS "Results
//     reproducibility"). The algorithm is chosen once per case (shape, types, leading dimensions,
//     pointer alignments) by cublasLtMatmulAlgoGetHeuristic and cached, so a case always runs the
//     same algorithm.
// A case the heuristic finds no kernel for is an error (Error naming the case and the way around:
// LLMPI_CUDA_EPILOGUES=0), never a silent fallback: the fallbacks are decided by the callers from
// the documented rules above, before any call.
//
// Workspace: kLtWorkspaceBytes (32 MiB, as llm.c uses) in the kWsLt slot, followed by the BGRADB
// vector (kLtBgradMaxFloats floats); one fixed size, so the slot is allocated once (stream-ordered)
// by the first call and never grows. Handle and descriptors are RAII objects; the handle lives
// for the process (like the cuBLAS handle).
#include <cublasLt.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "backend/cuda_ops.h"
#include "cuda_common.cuh"
#include "runtime/error.h"

namespace llmpi {

bool cuda_gemm_epilogues_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("LLMPI_CUDA_EPILOGUES");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

namespace cuda {

namespace {

constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;
constexpr size_t kLtSlotBytes = kLtWorkspaceBytes + sizeof(float) * kLtBgradMaxFloats;

std::atomic<long long> g_counts[static_cast<int>(LtCount::kinds)];  // by LtCount

struct LtHandle {
  cublasLtHandle_t h = nullptr;
  LtHandle() { LLMPI_CUBLAS_CHECK(cublasLtCreate(&h)); }
  ~LtHandle() {
    if (h) (void)cublasLtDestroy(h);  // at exit: never throw
  }
  LtHandle(const LtHandle&) = delete;
  LtHandle& operator=(const LtHandle&) = delete;
};
cublasLtHandle_t lt_handle() {
  (void)compute_stream();  // the context and device first
  static LtHandle handle;
  return handle.h;
}

struct MatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  explicit MatmulDesc(cublasComputeType_t compute) {
    LLMPI_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d, compute, CUDA_R_32F));
  }
  ~MatmulDesc() {
    if (d) (void)cublasLtMatmulDescDestroy(d);
  }
  template <typename T>
  void set(cublasLtMatmulDescAttributes_t attr, const T& v) {
    LLMPI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof v));
  }
  MatmulDesc(const MatmulDesc&) = delete;
  MatmulDesc& operator=(const MatmulDesc&) = delete;
};

struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  Layout(cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld) {
    LLMPI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, rows, cols, ld));
  }
  ~Layout() {
    if (l) (void)cublasLtMatrixLayoutDestroy(l);
  }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};

struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  Preference() { LLMPI_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&p)); }
  ~Preference() {
    if (p) (void)cublasLtMatmulPreferenceDestroy(p);
  }
  template <typename T>
  void set(cublasLtMatmulPreferenceAttributes_t attr, const T& v) {
    LLMPI_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof v));
  }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
};

// The largest power of two up to 256 that divides the address (null: 256).
uint32_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al >>= 1;
  return al;
}

const char* epilogue_name(LtEpilogue ep) {
  switch (ep) {
    case LtEpilogue::none: return "DEFAULT";
    case LtEpilogue::bias: return "BIAS";
    case LtEpilogue::gelu_aux: return "GELU_AUX(_BIAS)";
    case LtEpilogue::dgelu: return "DGELU";
    case LtEpilogue::bgradb: return "BGRADB";
  }
  return "?";
}

const char* precision_name(GemmPrecision p) {
  return p == GemmPrecision::bf16 ? "bf16" : p == GemmPrecision::tf32 ? "tf32" : "fp32";
}

using AlgoKey = std::array<int64_t, 18>;
std::mutex g_algo_mutex;
std::map<AlgoKey, cublasLtMatmulAlgo_t> g_algos;

}  // namespace

float* lt_bgrad_scratch() {
  auto* base = static_cast<char*>(workspace(kWsLt, kLtSlotBytes));
  return reinterpret_cast<float*>(base + kLtWorkspaceBytes);
}

void lt_count(LtCount what) { g_counts[static_cast<int>(what)]++; }

void lt_gemm_rm(const LtGemm& g) {
  const bool bf16 = g.prec == GemmPrecision::bf16;
  const cudaDataType_t ab = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t compute =
      g.prec == GemmPrecision::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  // cuBLASLt's terms: D (m × n) = op(first) op(second), first = our B, second = our A.
  const int m = g.N, n = g.M, k = g.K;
  const cublasOperation_t op_first = g.transB ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = g.transA ? CUBLAS_OP_T : CUBLAS_OP_N;

  MatmulDesc desc(compute);
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA, op_first);
  desc.set(CUBLASLT_MATMUL_DESC_TRANSB, op_second);
  cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_DEFAULT;
  switch (g.ep) {
    case LtEpilogue::none: break;
    case LtEpilogue::bias: ep = CUBLASLT_EPILOGUE_BIAS; break;
    case LtEpilogue::gelu_aux: ep = g.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX; break;
    case LtEpilogue::dgelu: ep = CUBLASLT_EPILOGUE_DGELU; break;
    case LtEpilogue::bgradb: ep = CUBLASLT_EPILOGUE_BGRADB; break;
  }
  desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, ep);
  const void* bias_ptr = g.ep == LtEpilogue::bgradb ? static_cast<const void*>(g.bgrad) : g.bias;
  if (g.ep == LtEpilogue::bias || g.ep == LtEpilogue::bgradb || (g.ep == LtEpilogue::gelu_aux && g.bias)) {
    if (bias_ptr == nullptr) fail("internal: cuBLASLt ", epilogue_name(g.ep), " without its vector");
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_ptr);
  }
  if (g.ep == LtEpilogue::gelu_aux || g.ep == LtEpilogue::dgelu) {
    if (g.aux == nullptr || !lt_gelu_ld_ok(g.ldaux) || g.ldaux < m)
      fail("internal: cuBLASLt ", epilogue_name(g.ep), " needs an aux matrix with a leading dimension >= ", m,
           " divisible by 8 (got ", g.ldaux, ")");
    void* aux = g.aux;
    const int64_t ldaux = g.ldaux;
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, ldaux);
  }

  // Stored shapes (column-major views of the row-major buffers).
  Layout first(ab, g.transB ? k : m, g.transB ? m : k, g.ldb);
  Layout second(ab, g.transA ? n : k, g.transA ? k : n, g.lda);
  Layout out(CUDA_R_32F, m, n, g.ldc);

  void* ws = workspace(kWsLt, kLtSlotBytes);
  const AlgoKey key = {static_cast<int64_t>(g.ep), g.bias != nullptr, static_cast<int64_t>(g.prec), g.transA,
                       g.transB, m, n, k, g.lda, g.ldb, g.ldc, g.ldaux, alignment(g.A), alignment(g.B),
                       alignment(g.C), alignment(bias_ptr), alignment(g.aux), g.beta != 0.0f};
  cublasLtMatmulAlgo_t algo;
  {
    std::lock_guard<std::mutex> lock(g_algo_mutex);
    auto it = g_algos.find(key);
    if (it == g_algos.end()) {
      Preference pref;
      const uint64_t ws_bytes = kLtWorkspaceBytes;
      pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ws_bytes);
      // The operands' real alignments, so the heuristic only offers kernels that can read them.
      pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment(g.B));
      pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment(g.A));
      pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment(g.C));
      pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment(g.C));
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt_handle(), desc.d, first.l, second.l, out.l, out.l,
                                                              pref.p, 1, &result, &found);
      if (s != CUBLAS_STATUS_SUCCESS || found == 0)
        fail("cuBLASLt has no kernel for the ", epilogue_name(g.ep), " epilogue with ", precision_name(g.prec),
             " operands (row-major ", g.M, " x ", g.N, " x ", g.K, ", transA ", g.transA, ", transB ", g.transB,
             ", lda ", g.lda, ", ldb ", g.ldb, ", ldc ", g.ldc, "; cublasLtMatmulAlgoGetHeuristic: ",
             cublasGetStatusName(s), ", ", found,
             " algorithms). Run with LLMPI_CUDA_EPILOGUES=0 to use the unfused dense layers, and report the case");
      it = g_algos.emplace(key, result.algo).first;
    }
    algo = it->second;
  }
  const float alpha = 1.0f, beta = g.beta;
  LLMPI_CUBLAS_CHECK(cublasLtMatmul(lt_handle(), desc.d, &alpha, g.B, first.l, g.A, second.l, &beta, g.C, out.l,
                                    g.C, out.l, &algo, ws, kLtWorkspaceBytes, compute_stream()));
}

}  // namespace cuda

CudaEpilogueCounts cuda_epilogue_counts() {
  CudaEpilogueCounts c;
  c.bias = cuda::g_counts[static_cast<int>(cuda::LtCount::bias)];
  c.gelu_aux = cuda::g_counts[static_cast<int>(cuda::LtCount::gelu_aux)];
  c.dgelu = cuda::g_counts[static_cast<int>(cuda::LtCount::dgelu)];
  c.bgradb = cuda::g_counts[static_cast<int>(cuda::LtCount::bgradb)];
  c.unfused = cuda::g_counts[static_cast<int>(cuda::LtCount::unfused)];
  c.ragged_split = cuda::g_counts[static_cast<int>(cuda::LtCount::ragged_split)];
  c.colsum_in_conversion = cuda::g_counts[static_cast<int>(cuda::LtCount::colsum_in_conversion)];
  return c;
}

}  // namespace llmpi
