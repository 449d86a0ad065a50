// Private to the CUDA backend: the functions behind cuda_ops() (every op of backend/op_list.h,
// where the contract of each is written), the one compute stream and cuBLAS handle they share, a
// cached scratch workspace, error checks, and the warp/block reductions the kernels use.
//
// Execution model: every op is enqueued on ONE stream (compute_stream(), a blocking stream of the
// device bound by cuda_bind_device), so ops run in call order and scratch buffers can be reused
// from one op to the next without synchronisation. The host waits only where the contract needs a
// host value or a host buffer back: copy_to_device, copy_to_host, sum_squares (returns a double)
// and softmax_xent (target check). Argument errors found on the host (a dropout probability
// outside [0, 1), NH not a multiple of NKV) throw llmpi::Error before anything is enqueued.
//
// Determinism: no float atomics anywhere. Column sums (dbias, LayerNorm/RMSNorm dweight/dbias)
// are summed per fixed chunk of rows, then the chunks in a fixed order (add_partial_sums); the embedding backwards sort
// positions by token (stable) and sum each token's rows in position order; attention sums the
// dK/dV contributions of the query heads sharing a K/V head in head order (a reduction kernel);
// sum_squares uses a grid that depends only on n. Dropout masks are a hash of (key, element
// index), never a random state. Results are bitwise repeatable run to run on the same card.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/op_list.h"

namespace llmpi::cuda {

// ---- errors: throw llmpi::Error naming the call, the file:line and CUDA's message ----------------
[[noreturn]] void throw_cuda(cudaError_t e, const char* what, const char* file, int line);
[[noreturn]] void throw_cublas(cublasStatus_t s, const char* what, const char* file, int line);

#define LLMPI_CUDA_CHECK(call)                                                        \
  do {                                                                                \
    cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess) ::llmpi::cuda::throw_cuda(e_, #call, __FILE__, __LINE__); \
  } while (0)
#define LLMPI_CUBLAS_CHECK(call)                                                                  \
  do {                                                                                            \
    cublasStatus_t s_ = (call);                                                                   \
    if (s_ != CUBLAS_STATUS_SUCCESS) ::llmpi::cuda::throw_cublas(s_, #call, __FILE__, __LINE__); \
  } while (0)
// After a kernel launch: launch-configuration errors (bad grid, no kernel image) surface here,
// named by the op. With LLMPI_CUDA_SYNC_CHECK=1 (debug; cuda_sync_check_enabled()) it also waits
// for the stream, so an asynchronous fault inside the kernel is reported at this op.
void launch_check(const char* name, const char* file, int line);
#define LLMPI_LAUNCH_CHECK(name) ::llmpi::cuda::launch_check(name, __FILE__, __LINE__)

// ---- switched paths (cuda_paths.cu; backend/cuda_ops.h "Paths") ---------------------------------
// Each kernel change not yet timed on a card on its own, switched off by LLMPI_CUDA_OFF=name,...
// (or all): the code that asks path_on(p) runs the earlier version instead. In the order of cuda_paths.cu.
enum class Path {
  mma_attention, tf32_attention, attention_tile_order, rowdot_warp, softmax_row_smem, colsum_in_conversion,
  gelu_grad_vec4, bf16_gelu_kernel, partial_sums_lanes, cudnn_attention, adamw_vec4, count
};
bool path_on(Path p);
std::string set_paths_off(const std::string& list);  // replaces LLMPI_CUDA_OFF's list (tests); returns it
// Whether libcudnn could be loaded (cudnn_attention.cpp; dlopen once), else false and *why.
bool cudnn_attention_loadable(std::string* why);

// ---- shared state (memory.cu) ------------------------------------------------------------------
cudaStream_t compute_stream();
cublasHandle_t cublas();
// Scratch buffers that persist between calls and grow on demand (never shrink). A slot's content
// is valid only within one op (ops on the one stream never overlap, so slots are reused freely).
// kWsAttn: attention's dropped probabilities (forward, one batch element) and per-query-head
// dK/dV before their group sums (backward); fused attention's D [B, NH, T] (backward). kWsGemm:
// a bf16 dense layer's operands converted to bf16 (matmul.cu), all of one call side by side.
// kWsLt: cuBLASLt's workspace and the bias-gradient vector of a BGRADB epilogue (gemm_lt.cu), one
// fixed size (kLtSlotBytes), so it is allocated once, at the first dense layer of the first
// forward, and never grows afterwards (in particular never inside a backward).
// kWsAct: GPT-2's GELU output in fp32 before its bf16 conversion, when the bf16 GELU kernel's path
// is off (matmul_gelu_forward). kWsCudnn: cuDNN attention's bf16 operands and its workspace
// (cudnn_attention.cpp).
enum WorkspaceSlot {
  kWsPartials = 0, kWsSortKeys, kWsSortVals, kWsSortTemp, kWsReduce, kWsFlag, kWsAttn, kWsGemm, kWsLt, kWsAct,
  kWsCudnn, kWsSlots
};
void* workspace(WorkspaceSlot slot, size_t bytes);
size_t workspace_bytes();  // all slots together
// The host waits for the compute stream: every wait of the backend goes through here, so that
// cuda_host_waits() counts them (tests pin a training step's waits; the LLMPI_CUDA_SYNC_CHECK
// debug waits are not counted).
void wait_for_stream();
uint64_t host_waits();
// One result handed to the host (readback_count): copy_to_host, sum_squares, softmax_xent.
void count_readback();

// The bound device's shared memory per block with opt-in (cudaDevAttrMaxSharedMemoryPerBlockOptin:
// an H100 227 KB, an A100 163 KB), read once per bound device (a process binds one).
int device_smem_optin();
// Opts kernel k in to `bytes` of dynamic shared memory above the 48 KB default; *allowed (the
// caller's static, 0 at first) remembers the most it has asked for, so a call asks only to grow.
template <typename Kernel>
void allow_smem(Kernel k, size_t bytes, size_t* allowed) {
  if (bytes <= 48 * 1024 || bytes <= *allowed) return;
  LLMPI_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  *allowed = bytes;
}

// Blocks for a grid-stride loop over n items: one item per thread, at most 2^20 blocks.
inline unsigned grid_for(size_t n, int threads) {
  size_t b = (n + threads - 1) / threads;
  const size_t cap = size_t(1) << 20;
  if (b > cap) b = cap;
  return b == 0 ? 1u : static_cast<unsigned>(b);
}

// gridDim.y for kernels that loop over row chunks k = blockIdx.y, blockIdx.y + gridDim.y, ...
// (the y dimension of a grid is limited to 65535 blocks).
inline unsigned chunk_grid_y(int nchunks) {
  return nchunks < 1 ? 1u : nchunks > 65535 ? 65535u : static_cast<unsigned>(nchunks);
}

// ---- row-major sgemm (matmul.cu), the cblas_sgemm(CblasRowMajor, ...) of the CPU backend -------
// C[M,N] = alpha op(A) op(B) + beta C, all row-major with leading dimensions lda/ldb/ldc.
// A row-major matrix is its column-major transpose, so this is the column-major
//   C^T = alpha op(B)^T op(A)^T + beta C^T
// i.e. cublasSgemm with the operands (and M/N) swapped and the same transpose flags.
void sgemm_rm(bool transA, bool transB, int M, int N, int K, float alpha, const float* A, int lda,
              const float* B, int ldb, float beta, float* C, int ldc);
// The same for `batch` products whose operands start strideA/strideB/strideC floats apart.
void sgemm_rm_batched(bool transA, bool transB, int M, int N, int K, float alpha, const float* A,
                      int lda, long long strideA, const float* B, int ldb, long long strideB,
                      float beta, float* C, int ldc, long long strideC, int batch);

// The same (alpha = 1) on the tensor cores as the dense layers run it: bf16 operands (bf16 true;
// A and B are __nv_bfloat16) or fp32 operands with TF32 math, fp32 C and accumulation, a ragged
// dimension split off (matmul.cu). For benchmarks that measure what the model's GEMMs get.
void gemm_tensor_rm(bool bf16, bool transA, bool transB, int M, int N, int K, const void* A, int lda,
                    const void* B, int ldb, float beta, float* C, int ldc);

// ---- cuBLASLt GEMMs with epilogues (gemm_lt.cu) ---------------------------------------------------
// Row-major C[M,N] = op(A) op(B) + beta C (alpha = 1) as sgemm_rm, through cuBLASLt, with:
//   bias           C[m, n] += bias[n] before the activation (bias [N])
//   gelu_aux       C = gelu(op(A) op(B) + bias), aux [M, N] (ld ldaux) receives the GELU's input
//   dgelu          C = gelu'(aux) ⊙ (op(A) op(B) + beta C), aux the GELU's input (ld ldaux)
//   bgradb         also bgrad[m] = Σ_k op(A)[m, k] (cuBLASLt's BGRADB of the swapped call): with
//                  op(A) = doutᵀ that is the bias gradient, WRITTEN (not added)
// Operands: fp32 (GemmPrecision fp32: CUBLAS_COMPUTE_32F; tf32: CUBLAS_COMPUTE_32F_FAST_TF32) or
// bf16 (already converted; CUBLAS_COMPUTE_32F); C, bias, aux and bgrad are fp32 in every mode.
// The rules for when a call may use an epilogue are the callers' (lt_gelu_ld_ok, ...): a call
// here that cuBLASLt has no kernel for throws Error (naming the case and LLMPI_CUDA_EPILOGUES=0).
enum class LtEpilogue { none, bias, gelu_aux, dgelu, bgradb };
struct LtGemm {
  LtEpilogue ep = LtEpilogue::none;
  GemmPrecision prec = GemmPrecision::fp32;  // bf16: A and B point to bf16 values
  bool transA = false, transB = false;
  int M = 0, N = 0, K = 0;
  const void* A = nullptr;
  int lda = 0;
  const void* B = nullptr;
  int ldb = 0;
  float beta = 0.0f;
  float* C = nullptr;
  int ldc = 0;
  const float* bias = nullptr;  // bias (bias, gelu_aux; may be null for gelu_aux)
  float* aux = nullptr;         // gelu_aux: output; dgelu: input
  int ldaux = 0;
  float* bgrad = nullptr;       // bgradb: output [M]
};
void lt_gemm_rm(const LtGemm& g);
// Documented rule (cublasLt.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD): the GELU input matrix's
// leading dimension must be divisible by 8.
inline bool lt_gelu_ld_ok(int ld) { return ld > 0 && ld % 8 == 0; }
// A precaution, not a documented rule: the bias vector of an epilogue 16-byte aligned (or none).
// The parameters are packed, so after BERT's classifier ([labels, C], [labels]) with an odd label
// count every later bias starts at an odd float; such a call takes the unfused path instead of
// asking the heuristic for a kernel that reads a 4-byte-aligned bias.
inline bool lt_bias_ok(const float* bias) { return reinterpret_cast<uintptr_t>(bias) % 16 == 0; }
// The bias-gradient vector of a bgradb call: kLtBgradMaxFloats floats inside the kWsLt slot
// (a layer with more output columns keeps the column-sum kernel).
constexpr int kLtBgradMaxFloats = 1 << 16;
float* lt_bgrad_scratch();
enum class LtCount { bias, gelu_aux, dgelu, bgradb, unfused, ragged_split, colsum_in_conversion, kinds };
void lt_count(LtCount what);

// d[i] = gelu'(pre[i]) · d[i], GELU tanh (gelu.cu; matmul_dgelu_backward's unfused path)
void gelu_grad_multiply(float* d, const float* pre, size_t n);
// gelu_forward into out and / or, rounded to bf16, out_bf16 (either may be null; gelu.cu; the
// path of matmul_gelu_forward that runs no GELU epilogue)
void gelu_forward_to(float* out, uint16_t* out_bf16, const float* inp, size_t n);

// dst[i] = bf16 bits of src[i], round to nearest even (matmul.cu; bf16_copy without counting a
// weight rounding): an activation handed to a bf16 library call (cudnn_attention.cpp), a gradient
// put on the wire in bf16 (nccl_sync.cu, on NCCL's stream)
void to_bf16_values(uint16_t* dst, const float* src, size_t n, cudaStream_t stream = compute_stream());
// dst = the bf16 values src holds, widened (add: dst += them), n elements.
void from_bf16_values(float* dst, const uint16_t* src, size_t n, bool add, cudaStream_t stream = compute_stream());

// Column sums, deterministic: colsum[j] += Σ_n x[n, j] for x [N, M], rows ld apart (0 = M)
// (matmul.cu).
void add_column_sums(float* colsum, const float* x, int N, int M, int ld = 0);
// The second pass of the column sums (these and the norms' parameter gradients): for each column
// j < M of part [nchunks, M] (per-chunk sums), out0[j] += Σ_k part[k, j] for j < split, else
// out1[j - split] += it; summed in a fixed order (matmul.cu partial_sums_final_kernel).
void add_partial_sums(float* out0, float* out1, int split, const float* part, int nchunks, int M);

// Deterministic scatter-add of rows by index (embedding.cu), no atomics:
//   dst[ids[n], :] += src[n, :]  for n = 0..N-1, each dst row receiving its terms in increasing n
// (positions stably sorted by index, then one block per run of equal indices). Used by the
// embedding backwards (dwte, the token-type table). With Vn >= 0, dst holds the rows [v0, v0 + Vn)
// of the whole table (a vocabulary shard): ids in that range go to row id - v0, the others nowhere.
void scatter_add_rows(float* dst, const float* src, const int32_t* ids, int N, int C, int v0 = 0, int Vn = -1);

// Throws Error unless 0 <= p < 1 (activations.cu; the CPU backend's check and message).
void check_dropout_p(const char* op, float p);

// ---- ops: every op of backend/op_list.h (the contract of each is there) ------------------------
// memory.cu: alloc free zero copy_to_device copy_to_device_async copy_to_host copy
// embedding.cu: embedding_forward/backward, embedding_add_forward/backward
// layernorm.cu: layernorm_forward/backward, rmsnorm_forward/backward
// matmul.cu: matmul_forward/backward, matmul_gelu_forward, matmul_dgelu_backward, bf16_copy,
//   bf16_weight_rounding_count
// rope.cu: rope_forward/backward
// attention.cu: attention_forward/backward  gelu.cu: gelu_forward/backward (tanh approximation)
// activations.cu: gelu_erf, swiglu, tanh, dropout (forward/backward)
// flash_attention.cu: flash_attention_forward/backward
// residual.cu: residual_forward, first_token_forward/backward
// softmax_xent.cu: softmax_xent(_record), softmax_xent_bf16_grad   adamw.cu: adamw_update sgd_update sum_squares scale
//   sum_squares_add sum_to_double adamw_update_segments sgd_update_segments
// memory.cu also: readback_count
LLMPI_OPS(LLMPI_DECLARE_OP)

// ---- device helpers (not for host-only files: cudnn_attention.cpp defines LLMPI_CUDA_HOST_ONLY) --
#ifndef LLMPI_CUDA_HOST_ONLY
template <typename F>
__device__ __forceinline__ F warp_sum(F v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `sh` is 32 elements of shared memory; the function may be called repeatedly with the same `sh`.
template <typename F>
__device__ F block_sum(F v, F* sh) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // protects sh from a previous call's readers
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  F r = lane < nw ? sh[lane] : F(0);
  return warp_sum(r);
}
__device__ __forceinline__ float block_max(float v, float* sh) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  float r = lane < nw ? sh[lane] : -INFINITY;
  return warp_max(r);
}

// Grid-stride loops: for (size_t i = grid_first(); i < n; i += grid_stride()) (64-bit indices).
__device__ __forceinline__ size_t grid_first() {
  return blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
}
__device__ __forceinline__ size_t grid_stride() {
  return static_cast<size_t>(gridDim.x) * blockDim.x;
}
#endif  // LLMPI_CUDA_HOST_ONLY

}  // namespace llmpi::cuda
