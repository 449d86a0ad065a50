// The CUDA backend: the op table (contract: backend/ops.h) over kernels/*.cu, plus device
// selection and the few device queries the trainer and benchmarks need.
//
// Availability: cuda_available() is false, with the reason in *why, when the program was built
// without CUDA (make CUDA=0, or no nvcc), when there is no driver (cudaGetDeviceCount returns
// cudaErrorInsufficientDriver / cudaErrorNoDevice; no driver is ever required on a CPU-only run),
// when there is no device, or when a device is older than this build supports (compute
// capability < 8.0; the build carries sm_80 and sm_90 code plus compute_90 PTX).
//
// Use: cuda_bind_device(local_rank) once, before the first op (device = local_rank % count);
// then pass cuda_ops() wherever an Ops is taken. Every op is enqueued on one compute stream of
// that device, in call order; the host waits only in alloc, copy_to_device, copy_to_host,
// sum_squares and softmax_xent (a training step uses the non-waiting forms: op_list.h, e.g.
// copy_to_device_async for the batch).
// Pointers given to the ops are device pointers from cuda_ops().alloc.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/ops.h"

namespace llmpi {

// True when a usable GPU exists; otherwise false and, if why is not null, *why = the reason.
// Creates no CUDA context.
bool cuda_available(std::string* why = nullptr);

// Binds this process to device local_rank % (number of devices). Throws Error when no GPU is
// usable. Call before the first op.
void cuda_bind_device(int local_rank);

// The CUDA op table. Throws Error in a build without CUDA.
const Ops& cuda_ops();

// ---- extras for timing and benchmarks (throw Error in a build without CUDA) ----
void cuda_synchronize();                               // wait for every op enqueued so far
// How many times the host has waited for the compute stream so far (alloc, copy_to_device,
// copy_to_host, sum_squares, softmax_xent, cuda_synchronize, and copy_to_device_async when the
// staging slot it takes is still being copied from; not the LLMPI_CUDA_SYNC_CHECK debug waits):
// tests pin a training step's waits with it.
uint64_t cuda_host_waits();
// Timing a step without waiting: cuda_mark(k) records timestamp k (0 <= k < kCudaMarks) on the
// compute stream; once the stream has passed both marks (after cuda_synchronize, say),
// cuda_marks_ms(a, b) is the GPU time from mark a to mark b in ms (no wait).
constexpr int kCudaMarks = 64;
void cuda_mark(int k);
double cuda_marks_ms(int a, int b);
int cuda_device();                                     // the bound device's ordinal
std::string cuda_device_name();                        // e.g. "NVIDIA H100 80GB HBM3 (sm_90)"
void cuda_mem_info(size_t* free_bytes, size_t* total_bytes);  // cudaMemGetInfo
size_t cuda_workspace_bytes();                         // the backend's cached scratch buffers
void* cuda_compute_stream();                           // the cudaStream_t of every op (opaque)
// Page-locked host memory (cudaMallocHost): copies from and to it run at full PCIe/NVLink speed
// and need no bounce buffer inside the driver. For the MPI staging buffer of the gradient sync.
void* cuda_host_alloc(size_t bytes);
void cuda_host_free(void* p);                          // null is fine
// ---- Device pages (kernels/device_pages.cu): device memory backed only where it is used -------
// ZeRO-2 on a GPU (comm/grad_sync.h) keeps the gradient's flat layout but only this rank's pieces
// and the buckets in flight in device memory, as host_pages does on the CPU; a GPU does not fault
// memory in, so the user backs a range before any kernel touches it.
// cuda_pages_reserve(bytes): address space of bytes (CUDA virtual memory management), nothing
// backed: a kernel touching it faults. Chunks of the allocation granularity (2 MiB on current
// cards) are the unit. Throws Error naming why (a driver without the API).
void* cuda_pages_reserve(size_t bytes);
void cuda_pages_free(void* p);  // waits for the device; null is fine
// The chunks overlapping [p + offset, p + offset + bytes) are backed; those newly backed (or taken
// back from a release still in flight) are zeroed on the compute stream first. Blocks the host
// while backing would pass the limit and earlier releases are still in flight.
void cuda_pages_back(void* p, size_t offset, size_t bytes);
// [p + offset, p + offset + bytes) reads as zero from now on, in the order of `stream` (a
// cudaStream_t; null: the compute stream), the stream whose enqueued work reads it last: the
// bytes of chunks partly inside are zeroed there, and the chunks wholly inside are given back once
// that stream has passed this point.
void cuda_pages_release(void* p, size_t offset, size_t bytes, void* stream);
// The backed bytes the host may hold at once (default: no limit): cuda_pages_back waits for the
// oldest releases in flight rather than pass it.
void cuda_pages_limit(void* p, size_t bytes);
size_t cuda_pages_backed(const void* p);  // bytes backed now (releases in flight included)
size_t cuda_pages_peak(const void* p);    // the most bytes backed at once so far
size_t cuda_pages_chunk(const void* p);   // the chunk: the unit backed and given back
// Events, to order the compute stream after work on another stream (ZeRO-3's gathers on NCCL's):
// cuda_event_record marks what `stream` (null: the compute stream) has enqueued so far, and
// cuda_compute_waits makes the compute stream's later work wait for that mark (the host does not).
void* cuda_event_new();
void cuda_event_free(void* event);  // null is fine
void cuda_event_record(void* event, void* stream);
void cuda_compute_waits(void* event);

// Debug mode: with LLMPI_CUDA_SYNC_CHECK=1 in the environment every kernel launch is followed by a
// synchronisation of the compute stream and a check, so an asynchronous fault (an illegal address,
// a device-side assert) is reported at the op that caused it instead of at a later call.
bool cuda_sync_check_enabled();
// cuBLASLt epilogues (kernels/gemm_lt.cu, docs/GPU.md "cuBLASLt epilogues"): on unless
// LLMPI_CUDA_EPILOGUES=0 is in the environment (read once), which runs every dense layer the
// unfused way (bias rows + cuBLAS GEMM, separate GELU kernels, column-sum dbias): for A/B
// comparisons (bench-gpu_gpt2) and as the way around a cuBLASLt that has no kernel for a case.
bool cuda_gemm_epilogues_enabled();
// How many GEMMs of each kind ran through a cuBLASLt epilogue, and how many fused calls took the
// unfused path because a documented rule excluded the shape (e.g. a GELU row width not a multiple
// of 8), since the process started: the tests check which path a call took. ragged_split: the
// tensor-core GEMMs (bf16, tf32) run as two because a dimension contiguous in memory was >= 1024
// and not a multiple of 8 (kernels/matmul.cu, the LM head's V = 50257). colsum_in_conversion: bf16
// backwards whose bias-gradient column sums ran in the pass converting dout to bf16.
struct CudaEpilogueCounts {
  long long bias = 0, gelu_aux = 0, dgelu = 0, bgradb = 0, unfused = 0, ragged_split = 0, colsum_in_conversion = 0;
};
CudaEpilogueCounts cuda_epilogue_counts();
// Measured rate of a row-major GEMM C[M,N] = A[M,K] B[N,K]^T (fp32 C) on the compute stream, in
// TFLOP/s: median of `iters` timed calls after 3 warm-up calls. math: "fp32" (cublasSgemm, no
// TF32), "tf32" (fp32 operands, CUBLAS_COMPUTE_32F_FAST_TF32) or "bf16" (bf16 operands, fp32
// accumulation): the ceiling each precision mode's dense layers can reach on this card. ldc: C's
// row stride (>= N; 0 = N), to compare the LM head's logits GEMM on rows of V = 50257 floats with
// rows padded to 50304 (model_desc.h lm_logits_row_stride).
double cuda_gemm_tflops(int M, int N, int K, int iters, const std::string& math = "fp32", int ldc = 0);
// The kernel flash_attention_forward/backward run on the bound device for this precision and
// head size, for an unmasked call without dropout (for benchmark reports): "cudnn-sdpa-bf16"
// (cuDNN's attention, kernels/cudnn_attention.cpp, where it is loaded and on; a shape cuDNN has no
// plan for still runs ours), "flash-bf16-mma" / "flash-tf32-mma" (tensor cores,
// kernels/flash_attention_mma.cu), "flash-bf16-wmma" (the verified WMMA kernels, with
// mma_attention off) or "flash-fp32" (kernels/flash_attention.cu).
const char* cuda_flash_attention_kernel(GemmPrecision prec, int head_size);
// ---- Paths: the kernel changes not yet timed on a card on their own, each one switch away from
// the earlier version (kernels/cuda_paths.cu; the table in docs/GPU.md). LLMPI_CUDA_OFF=name,name,... in
// the environment (read once; "all": the verified set) switches paths off; an unknown name is an
// Error listing the known ones. The trainer prints cuda_paths_description() in its start-up banner
// and records cuda_paths() in summary.json; bench-gpu_gpt2 does both.
struct CudaPath {
  std::string name;      // e.g. "mma_attention"
  std::string change;    // what the path does (and the commit that wrote it)
  std::string fallback;  // what runs instead when it is off
  bool on = false;
  std::string why_off;   // when off: the LLMPI_CUDA_OFF list, or why it cannot run (no libcudnn)
};
std::vector<CudaPath> cuda_paths();
// One line: the paths on, the paths off and why. Without CUDA: "built without CUDA".
std::string cuda_paths_description();
// Whether the named path is on (an unknown name is an Error). For tests that check which path ran.
bool cuda_path_enabled(const std::string& name);
// Replaces LLMPI_CUDA_OFF's list for the rest of the process (tests compare a path with its
// fallback in one process); the same syntax. Returns the list it replaced.
std::string cuda_set_paths_off(const std::string& list);

// Self-tests of the tensor-core instructions the fused attention is built on (kernels/mma_sync.cuh,
// kernels/mma_sync_probe.cu): one warp computes D [16 x 8] = A [16 x K] B [K x 8] (host buffers,
// row-major; bf16: K = 16, the operands rounded to bf16; tf32: K = 8, rounded by cvt.rna) through
// the fragment layouts the header states; and round_tf32 (cvt.rna.tf32.f32) of n host values.
void cuda_mma_probe(GemmPrecision prec, const float* A, const float* B, float* D);
void cuda_round_tf32(const float* in, float* out, size_t n);

}  // namespace llmpi
