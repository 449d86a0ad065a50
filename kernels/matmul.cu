// Dense layer on cuBLAS, row-major as in backend/ops.h, plus the deterministic column-sum kernels
// used for dbias.
//
// Row strides: out's rows are gemm.out_ld apart and dout's gemm.dout_ld (0: OC), the padding never
// touched; the LM head pads its logits rows to a multiple of 64 (model_desc.h
// lm_logits_row_stride), so its GEMMs see 256-byte aligned rows.
//
//   forward   out[N,OC]     = inp[N,C] · W[OC,C]^T + bias[OC]
//             (cuBLASLt with the BIAS epilogue; with LLMPI_CUDA_EPILOGUES=0 bias rows written by a
//             kernel first, then the GEMM with beta = 1)
//   backward  dinp[N,C]    += dout[N,OC] · W[OC,C]          GEMM NN, beta = 1
//             dW[OC,C]     += dout[N,OC]^T · inp[N,C]       GEMM TN, beta = 1
//             dbias[OC]    += Σ_n dout[n, :]                fp32: the BGRADB epilogue of the dW
//                                                            GEMM; else the two-pass column sum
//                                                            (bf16: its first pass also writes
//                                                            dout's bf16 copy for the GEMMs)
//   fused with GELU (tanh), GPT-2's MLP (gemm_lt.cu, docs/GPU.md "cuBLASLt epilogues"):
//             matmul_gelu_forward    act = gelu(pre), pre = inp·W^T + bias   GELU_AUX_BIAS
//             matmul_dgelu_backward  dpre = gelu'(pre) ⊙ (dout·W), overwrite  DGELU, beta = 0
//             (fp32 and tf32; in bf16 both run as the GEMM and a GELU kernel, measured or
//             expected faster there: the functions' comments)
//   falling back to the unfused kernels where a documented rule excludes a shape (the GELU
//   row width not a multiple of 8), a bias is not 16-byte aligned (lt_bias_ok, a precaution) or
//   LLMPI_CUDA_EPILOGUES=0.
//
// The GEMMs' precision (backend/gemm_precision.h):
//   fp32  cublasSgemm, pure fp32 (the handle's math mode is CUBLAS_DEFAULT_MATH: no TF32)
//   tf32  cublasGemmEx, fp32 A/B/C, CUBLAS_COMPUTE_32F_FAST_TF32 (tensor cores, TF32 inputs)
//   bf16  the operands converted to bf16 (__float2bfloat16_rn, round to nearest even) into the
//         kWsGemm workspace by to_bf16_kernel, then cublasGemmEx with bf16 A/B, fp32 C and
//         CUBLAS_COMPUTE_32F (fp32 accumulation). Every operand is converted on every call,
//         except a weight whose bf16 copy the caller hands over (gemm.weight_bf16: a bf16 Model
//         rounds each weight once per forward, bf16_copy, and the forward and backward GEMMs
//         read that copy, once per forward however many chunks the LM head runs). For the
//         activations and output gradients the conversion is memory traffic on every GEMM (the
//         kernel profile in docs/PERF.md): the fast version has the producing ops write bf16 themselves — the
//         LM head's logits gradient does (gemm.dout_bf16, below). The scratch holds the
//         operands one call converts, side by side. An output gradient dout [N, OC] read as a GEMM operand
//         is converted with its rows padded to bf16_row_stride(OC) (a multiple of 8: every row 16-byte
//         aligned, as cuBLAS's tensor-core kernels want 16-bit operands; the LM head's
//         V = 50257 would leave them misaligned), the padding zero — unless the caller hands it
//         over in bf16 already (gemm.dout_bf16: a bf16 LM head's logits gradient, which
//         softmax_xent_bf16_grad writes in that layout).
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>

#include "backend/cuda_ops.h"
#include "cuda_common.cuh"
#include "runtime/error.h"

namespace llmpi::cuda {

namespace {

inline cublasOperation_t op(bool t) { return t ? CUBLAS_OP_T : CUBLAS_OP_N; }

// out[n, j] = bias[j] (0 without a bias), rows ld apart
__global__ void bias_rows_kernel(float* __restrict__ out, int ld, const float* __restrict__ bias, int N,
                                 int OC) {
  const size_t total = static_cast<size_t>(N) * OC;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i / OC * ld + i % OC] = bias != nullptr ? bias[i % OC] : 0.0f;
}

// Column sums in two passes, no atomics:
//   pass 1: part[k, j] = Σ_{n in chunk k} x[n, j]      (chunks of kColChunk rows, rows in order)
//   pass 2: colsum[j] += Σ_k part[k, j]                  (add_partial_sums: a fixed order)
// Threads of a block take consecutive columns, so every row read is coalesced.
constexpr int kColChunk = 32;
constexpr int kColThreads = 256;

__global__ void colsum_partial_kernel(float* __restrict__ part, const float* __restrict__ x, int N,
                                      int M, int ld) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= M) return;
  for (int k = blockIdx.y; k * kColChunk < N; k += gridDim.y) {  // chunk k (grid-stride in y)
    const int n0 = k * kColChunk;
    const int n1 = min(n0 + kColChunk, N);
    float s = 0.0f;
    for (int n = n0; n < n1; n++) s += x[static_cast<size_t>(n) * ld + j];
    part[static_cast<size_t>(k) * M + j] = s;
  }
}

// colsum_partial_kernel that also writes x rounded to bf16, dst [N, ldd] (ldd >= M; columns
// [M, ldd) zero): a bf16 dense layer's backward converts its output gradient for the GEMMs and sums
// its columns for the bias gradient, and this reads it once for both. The sums are
// colsum_partial_kernel's, in its order (the same bits); every dst value is __float2bfloat16_rn
// of x, as to_bf16_rows writes it.
__global__ void colsum_partial_to_bf16_kernel(float* __restrict__ part, __nv_bfloat16* __restrict__ dst, int ldd,
                                              const float* __restrict__ x, int N, int M, int ld) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= ldd) return;
  for (int k = blockIdx.y; k * kColChunk < N; k += gridDim.y) {  // chunk k (grid-stride in y)
    const int n0 = k * kColChunk;
    const int n1 = min(n0 + kColChunk, N);
    if (j >= M) {  // a padding column
      for (int n = n0; n < n1; n++) dst[static_cast<size_t>(n) * ldd + j] = __float2bfloat16_rn(0.0f);
      continue;
    }
    float s = 0.0f;
    for (int n = n0; n < n1; n++) {
      const float v = x[static_cast<size_t>(n) * ld + j];
      dst[static_cast<size_t>(n) * ldd + j] = __float2bfloat16_rn(v);
      s += v;
    }
    part[static_cast<size_t>(k) * M + j] = s;
  }
}

// The second pass of every column sum (add_partial_sums): a block of kFinalCols columns x
// kFinalLanes lanes; lane y sums chunks y, y + kFinalLanes, ... in order, then lane 0 adds the
// lanes' sums in lane order. (One thread per column looping over all chunks runs only a few blocks
// at GPT-2 124M's 256 chunks: latency-bound; that version runs when Path::partial_sums_lanes is off.)
constexpr int kFinalCols = 32, kFinalLanes = 16;
__global__ void partial_sums_final_kernel(float* __restrict__ out0, float* __restrict__ out1, int split,
                                          const float* __restrict__ part, int nchunks, int M) {
  __shared__ float sh[kFinalLanes][kFinalCols];
  const int j = blockIdx.x * kFinalCols + threadIdx.x;
  float s = 0.0f;
  if (j < M)
    for (int k = threadIdx.y; k < nchunks; k += kFinalLanes) s += part[static_cast<size_t>(k) * M + j];
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || j >= M) return;
  float t = 0.0f;
  for (int y = 0; y < kFinalLanes; y++) t += sh[y][threadIdx.x];
  if (j < split)
    out0[j] += t;
  else
    out1[j - split] += t;
}

// The same sums with a thread per column adding the chunks in order (the kernels verified on an
// H100, 2026-11-24, for dbias and the norms' parameters; run when Path::partial_sums_lanes is off).
__global__ void partial_sums_serial_kernel(float* __restrict__ out0, float* __restrict__ out1, int split,
                                           const float* __restrict__ part, int nchunks, int M) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= M) return;
  float s = 0.0f;
  for (int k = 0; k < nchunks; k++) s += part[static_cast<size_t>(k) * M + j];
  if (j < split)
    out0[j] += s;
  else
    out1[j - split] += s;
}

// dst[i] = bf16(src[i]), round to nearest even (backend/bf16.h is the host twin). The first
// 4·n4 elements four at a time (16-byte loads; the host passes n4 = 0 unless src is 16-byte and
// dst 8-byte aligned), the rest one at a time.
__global__ void to_bf16_kernel(__nv_bfloat16* __restrict__ dst, const float* __restrict__ src, size_t n,
                               size_t n4) {
  for (size_t i = grid_first(); i < n4; i += grid_stride()) {
    const float4 v = reinterpret_cast<const float4*>(src)[i];
    __nv_bfloat162* d = reinterpret_cast<__nv_bfloat162*>(dst) + 2 * i;
    d[0] = __floats2bfloat162_rn(v.x, v.y);
    d[1] = __floats2bfloat162_rn(v.z, v.w);
  }
  for (size_t i = 4 * n4 + grid_first(); i < n; i += grid_stride()) dst[i] = __float2bfloat16_rn(src[i]);
}

// dst[i] = float(src[i]) (add: dst[i] += it): bf16 results of a library call widened (exact).
__global__ void from_bf16_kernel(float* __restrict__ dst, const __nv_bfloat16* __restrict__ src, size_t n, bool add) {
  for (size_t i = grid_first(); i < n; i += grid_stride()) {
    const float v = __bfloat162float(src[i]);
    dst[i] = add ? dst[i] + v : v;
  }
}

void to_bf16(__nv_bfloat16* dst, const float* src, size_t n, cudaStream_t stream = compute_stream()) {
  if (n == 0) return;
  const bool vec = reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 8 == 0;
  const size_t n4 = vec ? n / 4 : 0;
  to_bf16_kernel<<<grid_for(vec ? n4 + n % 4 : n, 256), 256, 0, stream>>>(dst, src, n, n4);
  LLMPI_LAUNCH_CHECK("to_bf16");
}

std::atomic<uint64_t> weight_roundings{0};

// An operand [n values] of a bf16 GEMM: the caller's bf16 copy when given (GemmMode), else src
// converted into dst.
const __nv_bfloat16* bf16_operand(__nv_bfloat16* dst, const float* src, const uint16_t* given, size_t n) {
  if (given != nullptr) return reinterpret_cast<const __nv_bfloat16*>(given);
  to_bf16(dst, src, n);
  return dst;
}

// The weight operand: the same, a conversion counted (bf16_weight_rounding_count).
const __nv_bfloat16* bf16_weight(__nv_bfloat16* dst, const float* w, const GemmMode& gemm, size_t n) {
  if (gemm.weight_bf16 == nullptr) weight_roundings.fetch_add(n, std::memory_order_relaxed);
  return bf16_operand(dst, w, gemm.weight_bf16, n);
}

// bf16 elements from one 256-byte boundary to the next at or after n.
size_t bf16_span(size_t n) { return (n + 127) / 128 * 128; }

// dst[r, c] = bf16(src[r, c]) for c < cols, 0 for cols <= c < ld (dst rows of ld values, src rows
// of src_ld).
__global__ void to_bf16_rows_kernel(__nv_bfloat16* __restrict__ dst, int ld, const float* __restrict__ src,
                                    int src_ld, int rows, int cols) {
  for (size_t r = blockIdx.y; r < static_cast<size_t>(rows); r += gridDim.y)
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < ld; c += gridDim.x * blockDim.x)
      dst[r * ld + c] = c < cols ? __float2bfloat16_rn(src[r * src_ld + c]) : __float2bfloat16_rn(0.0f);
}

// A [rows, cols] fp32 matrix (rows src_ld apart) to bf16 with row stride ld (to_bf16 when both
// are cols).
void to_bf16_rows(__nv_bfloat16* dst, int ld, const float* src, int src_ld, int rows, int cols) {
  if (ld == cols && src_ld == cols) return to_bf16(dst, src, static_cast<size_t>(rows) * cols);
  const unsigned gx = static_cast<unsigned>(std::min((ld + 255) / 256, 64));
  const unsigned gy = static_cast<unsigned>(std::min(rows, 65535));
  to_bf16_rows_kernel<<<dim3(gx, gy), 256, 0, compute_stream()>>>(dst, ld, src, src_ld, rows, cols);
  LLMPI_LAUNCH_CHECK("to_bf16_rows");
}

// A ragged dimension split off (tensor-core GEMMs only). cuBLAS picks its vectorised kernels only
// when every dimension that is contiguous in memory in some operand is a multiple of the vector
// width; one such dimension of odd length (the LM head's V = 50257: the output's columns in the
// forward, the reduction in dinp, the weight gradient's rows) sends the whole GEMM to a scalar
// "align1" kernel, measured at ~80 TFLOP/s on an H100 against ~750 for aligned bf16 shapes (ncu,
// bench/results/gpu-first-run-h100-2026-11-24.json). So such a GEMM runs as two: the largest multiple of 64 of
// that dimension, and the tail (< 64, a small GEMM), each writing its own part of C (M, N) or the
// tail accumulated onto the main part (K: beta = 1). No padding of the weights or the logits is
// needed. In row-major terms: N is contiguous in C (always) and in B unless transB, K in A unless
// transA and in B if transB, M in A if transA. The vector is 16 bytes: 8 bf16 operands, 4 fp32
// (tf32) ones. Only when every leading dimension is a whole number of vectors (the fp32 output
// too): a ragged dimension that is also a row stride (a hidden size C = 1029 with rows of C)
// leaves both parts misaligned, and the split would buy nothing (a desk review's point; the LM
// head's rows are padded: lm_logits_row_stride, bf16_row_stride). One dimension is split at most.
struct RaggedSplit {
  char dim = 0;  // 'M', 'N', 'K' or 0: none
  int main = 0;  // its aligned part
};
constexpr int kRaggedMin = 1024;  // smaller dimensions are left alone (a second launch for little gain)
RaggedSplit ragged_split(bool transA, bool transB, int M, int N, int K, int lda, int ldb, int ldc, int vec) {
  if (lda % vec != 0 || ldb % vec != 0 || ldc % 4 != 0) return {};
  auto ragged = [vec](int d) { return d >= kRaggedMin && d % vec != 0; };
  if (ragged(N)) return {'N', N / 64 * 64};
  if ((!transA || transB) && ragged(K)) return {'K', K / 64 * 64};
  if (transA && ragged(M)) return {'M', M / 64 * 64};
  return {};
}

// Row-major C[M,N] = op(A) op(B) + beta C (alpha = 1) by cublasGemmEx on the tensor cores, the
// operands of element type T (`type`: CUDA_R_16BF or CUDA_R_32F), fp32 C, once or twice on the two
// parts of a ragged dimension (above).
template <typename T>
void gemm_ex_rm(bool transA, bool transB, int M, int N, int K, const T* A, int lda, const T* B, int ldb, float beta,
                float* C, int ldc, cudaDataType_t type, cublasComputeType_t compute) {
  auto gemm = [&](int m, int n, int k, const T* a, const T* b, float bt, float* c) {
    const float alpha = 1.0f;
    LLMPI_CUBLAS_CHECK(cublasGemmEx(cublas(), op(transB), op(transA), n, m, k, &alpha, b, type, ldb, a, type, lda,
                                    &bt, c, CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT));
  };
  const RaggedSplit r = ragged_split(transA, transB, M, N, K, lda, ldb, ldc, 16 / static_cast<int>(sizeof(T)));
  const size_t sa = lda, sb = ldb, sc = ldc;
  if (r.dim != 0) lt_count(LtCount::ragged_split);
  switch (r.dim) {
    case 'N':
      gemm(M, r.main, K, A, B, beta, C);
      return gemm(M, N - r.main, K, A, transB ? B + r.main * sb : B + r.main, beta, C + r.main);
    case 'K':
      gemm(M, N, r.main, A, B, beta, C);
      return gemm(M, N, K - r.main, transA ? A + r.main * sa : A + r.main, transB ? B + r.main : B + r.main * sb,
                  1.0f, C);
    case 'M':
      gemm(r.main, N, K, A, B, beta, C);
      return gemm(M - r.main, N, K, transA ? A + r.main : A + r.main * sa, B, beta, C + r.main * sc);
    default:
      return gemm(M, N, K, A, B, beta, C);
  }
}

// Row-major C[M,N] = op(A) op(B) + beta C as sgemm_rm (alpha = 1), with bf16 A and B; a ragged
// dimension split off (above).
void gemm_bf16_rm(bool transA, bool transB, int M, int N, int K, const __nv_bfloat16* A, int lda,
                  const __nv_bfloat16* B, int ldb, float beta, float* C, int ldc) {
  gemm_ex_rm(transA, transB, M, N, K, A, lda, B, ldb, beta, C, ldc, CUDA_R_16BF, CUBLAS_COMPUTE_32F);
}

// The same with fp32 operands: sgemm (fp32) or TF32 tensor-op math (tf32, a ragged dimension split
// off as for bf16). Not for bf16.
void gemm_f32_rm(GemmPrecision prec, bool transA, bool transB, int M, int N, int K, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc) {
  if (prec != GemmPrecision::tf32) return sgemm_rm(transA, transB, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
  gemm_ex_rm(transA, transB, M, N, K, A, lda, B, ldb, beta, C, ldc, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32);
}

}  // namespace

void sgemm_rm(bool transA, bool transB, int M, int N, int K, float alpha, const float* A, int lda,
              const float* B, int ldb, float beta, float* C, int ldc) {
  LLMPI_CUBLAS_CHECK(cublasSgemm(cublas(), op(transB), op(transA), N, M, K, &alpha, B, ldb, A, lda,
                                 &beta, C, ldc));
}

void gemm_tensor_rm(bool bf16, bool transA, bool transB, int M, int N, int K, const void* A, int lda,
                    const void* B, int ldb, float beta, float* C, int ldc) {
  if (bf16)
    return gemm_bf16_rm(transA, transB, M, N, K, static_cast<const __nv_bfloat16*>(A), lda,
                        static_cast<const __nv_bfloat16*>(B), ldb, beta, C, ldc);
  gemm_f32_rm(GemmPrecision::tf32, transA, transB, M, N, K, static_cast<const float*>(A), lda,
              static_cast<const float*>(B), ldb, beta, C, ldc);
}

void sgemm_rm_batched(bool transA, bool transB, int M, int N, int K, float alpha, const float* A,
                      int lda, long long strideA, const float* B, int ldb, long long strideB,
                      float beta, float* C, int ldc, long long strideC, int batch) {
  LLMPI_CUBLAS_CHECK(cublasSgemmStridedBatched(cublas(), op(transB), op(transA), N, M, K, &alpha, B,
                                               ldb, strideB, A, lda, strideA, &beta, C, ldc,
                                               strideC, batch));
}

void add_partial_sums(float* out0, float* out1, int split, const float* part, int nchunks, int M) {
  if (out1 == nullptr && split < M) fail("internal: add_partial_sums with columns past ", split, " and no out1");
  if (nchunks <= 0 || M <= 0) return;
  if (!path_on(Path::partial_sums_lanes)) {
    partial_sums_serial_kernel<<<(M + kColThreads - 1) / kColThreads, kColThreads, 0, compute_stream()>>>(
        out0, out1, split, part, nchunks, M);
    LLMPI_LAUNCH_CHECK("partial_sums_serial");
    return;
  }
  const dim3 block(kFinalCols, kFinalLanes);
  partial_sums_final_kernel<<<(M + kFinalCols - 1) / kFinalCols, block, 0, compute_stream()>>>(out0, out1, split,
                                                                                               part, nchunks, M);
  LLMPI_LAUNCH_CHECK("partial_sums_final");
}

// add_column_sums, and with dst also x rounded to bf16 into dst (rows of ldd >= M values, the
// padding zero) in the same pass over x
static void add_column_sums_to_bf16(float* colsum, __nv_bfloat16* dst, int ldd, const float* x, int N, int M,
                                    int ld) {
  if (N <= 0 || M <= 0) return;
  if (ld <= 0) ld = M;
  const int nchunks = (N + kColChunk - 1) / kColChunk;
  float* part = static_cast<float*>(
      workspace(kWsPartials, static_cast<size_t>(nchunks) * M * sizeof(float)));
  cudaStream_t s = compute_stream();
  if (dst != nullptr) {
    const dim3 g1((ldd + kColThreads - 1) / kColThreads, chunk_grid_y(nchunks));
    colsum_partial_to_bf16_kernel<<<g1, kColThreads, 0, s>>>(part, dst, ldd, x, N, M, ld);
    LLMPI_LAUNCH_CHECK("colsum_partial_to_bf16");
  } else {
    const dim3 g1((M + kColThreads - 1) / kColThreads, chunk_grid_y(nchunks));
    colsum_partial_kernel<<<g1, kColThreads, 0, s>>>(part, x, N, M, ld);
    LLMPI_LAUNCH_CHECK("colsum_partial");
  }
  add_partial_sums(colsum, nullptr, M, part, nchunks, M);
}

void add_column_sums(float* colsum, const float* x, int N, int M, int ld) {
  add_column_sums_to_bf16(colsum, nullptr, 0, x, N, M, ld);
}

void to_bf16_values(uint16_t* dst, const float* src, size_t n, cudaStream_t stream) {
  to_bf16(reinterpret_cast<__nv_bfloat16*>(dst), src, n, stream);
}

void from_bf16_values(float* dst, const uint16_t* src, size_t n, bool add, cudaStream_t stream) {
  if (n == 0) return;
  from_bf16_kernel<<<grid_for(n, 256), 256, 0, stream>>>(dst, reinterpret_cast<const __nv_bfloat16*>(src), n, add);
  LLMPI_LAUNCH_CHECK(add ? "from_bf16 (add)" : "from_bf16");
}

void bf16_copy(uint16_t* dst, const float* src, size_t n) {
  weight_roundings.fetch_add(n, std::memory_order_relaxed);
  to_bf16(reinterpret_cast<__nv_bfloat16*>(dst), src, n);
}

uint64_t bf16_weight_rounding_count() { return weight_roundings.load(std::memory_order_relaxed); }

namespace {
// The operands of out = inp·Wᵀ in the GEMM's type: fp32 / tf32 the buffers themselves, bf16
// copies converted into the kWsGemm slot.
struct GemmOperands {
  const void* a;
  const void* b;
};
GemmOperands forward_operands(const float* inp, const float* weight, int N, int C, int OC, const GemmMode& gemm) {
  if (gemm.prec != GemmPrecision::bf16) return {inp, weight};
  // the input: the caller's bf16 copy (gemm.inp_bf16), or converted here
  const size_t ni = gemm.inp_bf16 ? 0 : static_cast<size_t>(N) * C, nw = gemm.weight_bf16 ? 0 : static_cast<size_t>(OC) * C;
  auto* ws = static_cast<__nv_bfloat16*>(workspace(kWsGemm, (bf16_span(ni) + nw) * sizeof(__nv_bfloat16)));
  return {bf16_operand(ws, inp, gemm.inp_bf16, ni),
          bf16_weight(ws + bf16_span(ni), weight, gemm, static_cast<size_t>(OC) * C)};
}

// out[n, j] = x[n, :]·W[j, :] (+ bias[j]) through cuBLASLt with the given epilogue.
LtGemm forward_lt(LtEpilogue ep, float* out, int ldo, GemmOperands x, const float* bias, int N, int C, int OC,
                  GemmPrecision prec) {
  LtGemm g;
  g.ep = ep;
  g.prec = prec;
  g.transA = false;
  g.transB = true;
  g.M = N, g.N = OC, g.K = C;
  g.A = x.a, g.lda = C;
  g.B = x.b, g.ldb = C;
  g.beta = 0.0f;
  g.C = out, g.ldc = ldo;
  g.bias = bias;
  return g;
}

__global__ void add_inplace_kernel(float* __restrict__ dst, const float* __restrict__ src, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] += src[i];
}
}  // namespace

// With a bias and the epilogues on: one cuBLASLt GEMM with the BIAS epilogue (beta = 0), so out
// is written once instead of bias rows first and the GEMM reading them back.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC, GemmMode gemm) {
  const GemmPrecision prec = gemm.prec;
  if (N <= 0 || OC <= 0) return;
  const int ldo = gemm.out_stride(OC);
  if (ldo < OC) fail("internal: matmul_forward with out_ld ", ldo, " < OC ", OC);
  cudaStream_t s = compute_stream();
  if (bias != nullptr && C > 0 && cuda_gemm_epilogues_enabled() && lt_bias_ok(bias)) {
    lt_gemm_rm(forward_lt(LtEpilogue::bias, out, ldo, forward_operands(inp, weight, N, C, OC, gemm), bias, N, C, OC,
                          prec));
    lt_count(LtCount::bias);
    return;
  }
  float beta = 0.0f;
  if (bias != nullptr || C <= 0) {  // (no input: out = bias, or 0)
    bias_rows_kernel<<<grid_for(static_cast<size_t>(N) * OC, 256), 256, 0, s>>>(out, ldo, bias, N, OC);
    LLMPI_LAUNCH_CHECK("bias_rows");
    beta = 1.0f;
  }
  if (C <= 0) return;
  if (prec != GemmPrecision::bf16)
    return gemm_f32_rm(prec, false, true, N, OC, C, inp, C, weight, C, beta, out, ldo);
  const GemmOperands x = forward_operands(inp, weight, N, C, OC, gemm);
  gemm_bf16_rm(false, true, N, OC, C, static_cast<const __nv_bfloat16*>(x.a), C,
               static_cast<const __nv_bfloat16*>(x.b), C, beta, out, ldo);
}

// act = gelu(pre), pre = inp·Wᵀ + bias: one cuBLASLt GEMM with the GELU_AUX(_BIAS) epilogue (D =
// act, aux = pre) when the epilogues are on, the row width OC suits the aux rule (a multiple of 8),
// the precision is not bf16 and no bf16 act is asked for; otherwise matmul_forward (its BIAS
// epilogue) then our GELU kernel, which writes act and / or act_bf16. Not in bf16: with bf16
// operands and an fp32 output cuBLASLt ran GELU_AUX as a pass of its own after the GEMM
// (`epilogue::globalKernel`, 0.23 ms per GPT-2 124M layer at B = 8 on an H100: reading D and
// writing D and aux, 12 bytes a value), and it writes act in the GEMM's output type, so a bf16 act
// would have rounded pre and the bias too (cublasLt.h: the aux and bias types follow the output's).
// Our kernel reads pre and writes act_bf16 (6 bytes a value) and the projection's GEMMs then read
// act_bf16 in place instead of converting act in the forward and again in the backward.
void matmul_gelu_forward(float* pre, float* act, const float* inp, const float* weight, const float* bias, int N,
                         int C, int OC, GemmMode gemm, uint16_t* act_bf16) {
  const GemmPrecision prec = gemm.prec;
  if (gemm.out_stride(OC) != OC) fail("internal: matmul_gelu_forward writes contiguous rows (out_ld ", gemm.out_ld, ")");
  if (N <= 0 || OC <= 0) return;
  const size_t n = static_cast<size_t>(N) * OC;
  if (prec == GemmPrecision::bf16 && !path_on(Path::bf16_gelu_kernel)) {
    // The way an H100 verified (2026-11-24): act in fp32 by cuBLASLt's GELU_AUX_BIAS epilogue (or,
    // without the epilogues, the GEMM and the fp32 GELU), then converted to bf16 if asked.
    float* act32 = act != nullptr ? act : static_cast<float*>(workspace(kWsAct, n * sizeof(float)));
    if (C > 0 && cuda_gemm_epilogues_enabled() && lt_gelu_ld_ok(OC) && lt_bias_ok(bias)) {
      LtGemm g = forward_lt(LtEpilogue::gelu_aux, act32, OC, forward_operands(inp, weight, N, C, OC, gemm), bias,
                            N, C, OC, prec);
      g.aux = pre;
      g.ldaux = OC;
      lt_gemm_rm(g);
      lt_count(LtCount::gelu_aux);
    } else {
      matmul_forward(pre, inp, weight, bias, N, C, OC, gemm);
      gelu_forward_to(act32, nullptr, pre, n);
    }
    if (act_bf16 != nullptr) to_bf16(reinterpret_cast<__nv_bfloat16*>(act_bf16), act32, n);
    return;
  }
  const bool lt = cuda_gemm_epilogues_enabled() && prec != GemmPrecision::bf16;
  if (C > 0 && lt && act_bf16 == nullptr && lt_gelu_ld_ok(OC) && lt_bias_ok(bias)) {
    LtGemm g = forward_lt(LtEpilogue::gelu_aux, act, OC, forward_operands(inp, weight, N, C, OC, gemm), bias, N, C,
                          OC, prec);
    g.aux = pre;
    g.ldaux = OC;
    lt_gemm_rm(g);
    lt_count(LtCount::gelu_aux);
    return;
  }
  if (lt) lt_count(LtCount::unfused);  // bf16: by choice, not counted
  matmul_forward(pre, inp, weight, bias, N, C, OC, gemm);
  gelu_forward_to(act, act_bf16, pre, n);
}

// dpre = gelu'(pre) ⊙ (dout·W), overwritten: one cuBLASLt GEMM with the DGELU epilogue (beta = 0,
// aux = pre) when the epilogues are on, C is a multiple of 8 and the precision is not bf16;
// otherwise the GEMM with beta = 0 and gelu_grad_multiply. bf16: dout and W converted into
// kWsGemm first, as in matmul_backward.
void matmul_dgelu_backward(float* dpre, const float* dout, const float* weight, const float* pre, int N, int C,
                           int OC, GemmMode gemm) {
  const GemmPrecision prec = gemm.prec;
  if (N <= 0 || C <= 0) return;
  const size_t n = static_cast<size_t>(N) * C;
  if (OC <= 0) return zero(dpre, n * sizeof(float));  // dout·W = 0, and so is its product with gelu'
  const void *d = dout, *w = weight;
  const int ld_in = gemm.dout_stride(OC);  // dout's row stride
  int ldd = ld_in;                         // the GEMM's (padded in dout's bf16 copy)
  if (prec == GemmPrecision::bf16) {
    ldd = bf16_row_stride(OC);
    const size_t nd = static_cast<size_t>(N) * ldd, nw = gemm.weight_bf16 ? 0 : static_cast<size_t>(OC) * C;
    auto* ws = static_cast<__nv_bfloat16*>(workspace(kWsGemm, (bf16_span(nd) + nw) * sizeof(__nv_bfloat16)));
    __nv_bfloat16* dout16 = ws;
    to_bf16_rows(dout16, ldd, dout, ld_in, N, OC);
    d = dout16;
    w = bf16_weight(ws + bf16_span(nd), weight, gemm, static_cast<size_t>(OC) * C);
  }
  // Not in bf16: there cuBLASLt ran DGELU as a pass of its own after the GEMM, and the whole
  // backward was slower than with our GEMM + gelu_grad_multiply (H100, GPT-2 124M bf16, B = 64:
  // backward 215.1 ms with the epilogues, 208.4 ms without; bench/results/gpu-first-run-h100-2026-11-24.json).
  const bool shape_ok = lt_gelu_ld_ok(C);
  if (cuda_gemm_epilogues_enabled() && shape_ok && prec != GemmPrecision::bf16) {
    LtGemm g;
    g.ep = LtEpilogue::dgelu;
    g.prec = prec;
    g.M = N, g.N = C, g.K = OC;
    g.A = d, g.lda = ldd;
    g.B = w, g.ldb = C;
    g.beta = 0.0f;
    g.C = dpre, g.ldc = C;
    g.aux = const_cast<float*>(pre);  // an input of DGELU
    g.ldaux = C;
    lt_gemm_rm(g);
    lt_count(LtCount::dgelu);
    return;
  }
  if (cuda_gemm_epilogues_enabled() && !shape_ok) lt_count(LtCount::unfused);  // bf16: by choice, not counted
  if (prec == GemmPrecision::bf16)
    gemm_bf16_rm(false, false, N, C, OC, static_cast<const __nv_bfloat16*>(d), ldd,
                 static_cast<const __nv_bfloat16*>(w), C, 0.0f, dpre, C);
  else
    gemm_f32_rm(prec, false, false, N, C, OC, dout, ld_in, weight, C, 0.0f, dpre, C);
  gelu_grad_multiply(dpre, pre, n);
}

// bf16: dout is converted once for both GEMMs, weight only with dinp, inp only with dweight
// (so a split call converts what it reads, and the two halves equal the whole call bit for bit).
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, GemmMode gemm) {
  const GemmPrecision prec = gemm.prec;
  if (N <= 0 || OC <= 0 || C <= 0) return;
  const int ld_in = gemm.dout_stride(OC);  // dout's (and a given dout_bf16's) row stride
  if (ld_in < OC) fail("internal: matmul_backward with dout_ld ", ld_in, " < OC ", OC);
  if (prec != GemmPrecision::bf16) {
    if (dinp != nullptr) gemm_f32_rm(prec, false, false, N, C, OC, dout, ld_in, weight, C, 1.0f, dinp, C);
    if (dweight != nullptr && dbias != nullptr && prec == GemmPrecision::fp32 && cuda_gemm_epilogues_enabled() &&
        OC <= kLtBgradMaxFloats) {
      // dW += doutᵀ·inp with the BGRADB epilogue: the bias gradient Σ_n dout[n, :] comes out of
      // the same GEMM (no separate pass over dout). BGRADB writes its vector, so it goes to a
      // scratch and is added to dbias (the "+=" contract). fp32 only: with bf16 (and TF32)
      // operands cuBLASLt would sum the rounded dout, and the bias gradient is the sum of the
      // unrounded one (docs/PRECISION.md).
      float* bgrad = lt_bgrad_scratch();
      LtGemm g;
      g.ep = LtEpilogue::bgradb;
      g.transA = true;
      g.M = OC, g.N = C, g.K = N;
      g.A = dout, g.lda = ld_in;
      g.B = inp, g.ldb = C;
      g.beta = 1.0f;
      g.C = dweight, g.ldc = C;
      g.bgrad = bgrad;
      lt_gemm_rm(g);
      add_inplace_kernel<<<(OC + 255) / 256, 256, 0, compute_stream()>>>(dbias, bgrad, OC);
      LLMPI_LAUNCH_CHECK("bias_gradient_add");
      lt_count(LtCount::bgradb);
      return;
    }
    if (dweight != nullptr) gemm_f32_rm(prec, true, false, OC, C, N, dout, ld_in, inp, C, 1.0f, dweight, C);
  } else if (dinp != nullptr || dweight != nullptr) {
    // dout's bf16 rows: the caller's (gemm.dout_bf16), or converted here with rows padded
    const bool given = gemm.dout_bf16 != nullptr;
    const int ldd = given ? ld_in : bf16_row_stride(OC);
    const size_t nd = given ? 0 : static_cast<size_t>(N) * ldd,
                 nw = dinp && !gemm.weight_bf16 ? static_cast<size_t>(OC) * C : 0,
                 ni = dweight && !gemm.inp_bf16 ? static_cast<size_t>(N) * C : 0;
    auto* ws = static_cast<__nv_bfloat16*>(
        workspace(kWsGemm, (bf16_span(nd) + bf16_span(nw) + ni) * sizeof(__nv_bfloat16)));
    __nv_bfloat16 *dout16 = ws, *w16 = ws + bf16_span(nd), *inp16 = w16 + bf16_span(nw);
    if (!given) {
      if (dbias != nullptr && path_on(Path::colsum_in_conversion)) {  // the bias gradient's column sums in the conversion's pass over dout
        add_column_sums_to_bf16(dbias, dout16, ldd, dout, N, OC, ld_in);
        lt_count(LtCount::colsum_in_conversion);
        dbias = nullptr;
      } else {
        to_bf16_rows(dout16, ldd, dout, ld_in, N, OC);
      }
    }
    const __nv_bfloat16* d16 = given ? reinterpret_cast<const __nv_bfloat16*>(gemm.dout_bf16) : dout16;
    if (dinp != nullptr)
      gemm_bf16_rm(false, false, N, C, OC, d16, ldd, bf16_weight(w16, weight, gemm, static_cast<size_t>(OC) * C), C,
                   1.0f, dinp, C);
    if (dweight != nullptr)  // the input: the caller's bf16 copy, or converted here
      gemm_bf16_rm(true, false, OC, C, N, d16, ldd, bf16_operand(inp16, inp, gemm.inp_bf16, ni), C, 1.0f, dweight, C);
  }
  if (dbias != nullptr) add_column_sums(dbias, dout, N, OC, ld_in);
}

}  // namespace llmpi::cuda
