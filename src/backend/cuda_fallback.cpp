// The CUDA API of backend/cuda_ops.h in a build without CUDA (make CUDA=0, or no nvcc found):
// cuda_available() says why not, everything else throws Error. With CUDA, kernels/cuda_ops.cu
// defines these functions and this file compiles to nothing.
#ifndef LLMPI_HAVE_CUDA
#include "backend/cuda_ops.h"
#include "runtime/error.h"

namespace llmpi {

namespace {
constexpr const char* kNoCuda = "built without CUDA (make CUDA=0 or no nvcc)";
[[noreturn]] void no_cuda(const char* what) {
  fail(what, ": this llmpi was ", kNoCuda, "; rebuild with nvcc on PATH (or NVCC=/path/to/nvcc)");
}
}  // namespace

bool cuda_available(std::string* why) {
  if (why) *why = kNoCuda;
  return false;
}
void cuda_bind_device(int) { no_cuda("runtime.device = cuda"); }
const Ops& cuda_ops() { no_cuda("the CUDA backend"); }
void cuda_synchronize() { no_cuda("cuda_synchronize"); }
uint64_t cuda_host_waits() { no_cuda("cuda_host_waits"); }
void cuda_mark(int) { no_cuda("cuda_mark"); }
double cuda_marks_ms(int, int) { no_cuda("cuda_marks_ms"); }
int cuda_device() { no_cuda("cuda_device"); }
std::string cuda_device_name() { no_cuda("cuda_device_name"); }
void cuda_mem_info(size_t*, size_t*) { no_cuda("cuda_mem_info"); }
size_t cuda_workspace_bytes() { no_cuda("cuda_workspace_bytes"); }
void* cuda_compute_stream() { no_cuda("cuda_compute_stream"); }
void* cuda_host_alloc(size_t) { no_cuda("cuda_host_alloc"); }
void cuda_host_free(void*) {}
void* cuda_pages_reserve(size_t) { no_cuda("cuda_pages_reserve"); }
void cuda_pages_free(void*) {}
void cuda_pages_back(void*, size_t, size_t) { no_cuda("cuda_pages_back"); }
void cuda_pages_release(void*, size_t, size_t, void*) { no_cuda("cuda_pages_release"); }
void cuda_pages_limit(void*, size_t) { no_cuda("cuda_pages_limit"); }
size_t cuda_pages_backed(const void*) { no_cuda("cuda_pages_backed"); }
size_t cuda_pages_peak(const void*) { no_cuda("cuda_pages_peak"); }
size_t cuda_pages_chunk(const void*) { no_cuda("cuda_pages_chunk"); }
void* cuda_event_new() { no_cuda("cuda_event_new"); }
void cuda_event_free(void*) {}
void cuda_event_record(void*, void*) { no_cuda("cuda_event_record"); }
void cuda_compute_waits(void*) { no_cuda("cuda_compute_waits"); }
bool cuda_sync_check_enabled() { return false; }
bool cuda_gemm_epilogues_enabled() { return false; }
CudaEpilogueCounts cuda_epilogue_counts() { return {}; }
double cuda_gemm_tflops(int, int, int, int, const std::string&, int) { no_cuda("cuda_gemm_tflops"); }
const char* cuda_flash_attention_kernel(GemmPrecision, int) { no_cuda("cuda_flash_attention_kernel"); }
std::vector<CudaPath> cuda_paths() { return {}; }
std::string cuda_paths_description() { return kNoCuda; }
bool cuda_path_enabled(const std::string&) { return false; }
std::string cuda_set_paths_off(const std::string&) { return {}; }
void cuda_mma_probe(GemmPrecision, const float*, const float*, float*) { no_cuda("cuda_mma_probe"); }
void cuda_round_tf32(const float*, float*, size_t) { no_cuda("cuda_round_tf32"); }

}  // namespace llmpi
#endif  // LLMPI_HAVE_CUDA
