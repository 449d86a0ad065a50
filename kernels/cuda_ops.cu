// The CUDA backend's op table (the ops and their contracts: backend/op_list.h; API:
// backend/cuda_ops.h), device selection, and the device queries used by the trainer and the
// benchmarks.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda_ops.h"
#include "cuda_common.cuh"
#include "runtime/error.h"

namespace llmpi {

namespace {

// Fills x with a deterministic pattern in [-1, 1) (for the sgemm benchmark: zeros would let the
// card run at a lower power, and a higher clock, than real data).
__device__ __forceinline__ void store_pattern(float* x, float v) { *x = v; }
__device__ __forceinline__ void store_pattern(__nv_bfloat16* x, float v) { *x = __float2bfloat16_rn(v); }
// (float for the fp32 and TF32 GEMM rates, bf16 rounded to nearest even for the bf16 one)
template <typename T>
__global__ void fill_pattern_kernel(T* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    store_pattern(x + i, static_cast<float>(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}

}  // namespace

bool cuda_available(std::string* why) {
  auto no = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return no(std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(e) + " (" +
              cudaGetErrorString(e) + ")");
  }
  if (count <= 0) return no("no CUDA device (cudaGetDeviceCount returned 0)");
  for (int d = 0; d < count; d++) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d) != cudaSuccess) {
      (void)cudaGetLastError();
      return no("cannot query the compute capability of device " + std::to_string(d));
    }
    if (major < 8)
      return no("device " + std::to_string(d) + " has compute capability " +
                std::to_string(major) + "." + std::to_string(minor) +
                "; this build needs 8.0 or newer (sm_80, sm_90, compute_90 PTX)");
  }
  if (why) why->clear();
  return true;
}

void cuda_bind_device(int local_rank) {
  std::string why;
  if (!cuda_available(&why)) fail("runtime.device = cuda, but no usable GPU: ", why);
  int count = 0;
  LLMPI_CUDA_CHECK(cudaGetDeviceCount(&count));
  const int dev = (local_rank < 0 ? 0 : local_rank) % count;
  LLMPI_CUDA_CHECK(cudaSetDevice(dev));
}

const Ops& cuda_ops() {
  static const Ops ops = [] {
    Ops o{};
    o.device = Device::cuda;
#define X(ret, name, params) o.name = cuda::name;
    LLMPI_OPS(X)
#undef X
    return o;
  }();
  return ops;
}

void cuda_synchronize() { cuda::wait_for_stream(); }

uint64_t cuda_host_waits() { return cuda::host_waits(); }

namespace {
cudaEvent_t mark_event(int k) {
  static cudaEvent_t marks[kCudaMarks] = {};
  if (k < 0 || k >= kCudaMarks) fail("internal: cuda_mark ", k, " outside [0, ", kCudaMarks, ")");
  if (marks[k] == nullptr) LLMPI_CUDA_CHECK(cudaEventCreate(&marks[k]));
  return marks[k];
}
}  // namespace

void cuda_mark(int k) { LLMPI_CUDA_CHECK(cudaEventRecord(mark_event(k), cuda::compute_stream())); }

double cuda_marks_ms(int a, int b) {
  float ms = 0;
  LLMPI_CUDA_CHECK(cudaEventElapsedTime(&ms, mark_event(a), mark_event(b)));
  return ms;
}

int cuda_device() {
  int d = 0;
  LLMPI_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

std::string cuda_device_name() {
  cudaDeviceProp p{};
  LLMPI_CUDA_CHECK(cudaGetDeviceProperties(&p, cuda_device()));
  return std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) + ")";
}

void cuda_mem_info(size_t* free_bytes, size_t* total_bytes) {
  (void)cuda::compute_stream();  // make sure the context exists
  LLMPI_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

size_t cuda_workspace_bytes() { return cuda::workspace_bytes(); }

void* cuda_compute_stream() { return static_cast<void*>(cuda::compute_stream()); }

void* cuda_host_alloc(size_t bytes) {
  void* p = nullptr;
  if (bytes == 0) return nullptr;
  LLMPI_CUDA_CHECK(cudaMallocHost(&p, bytes));
  return p;
}

void cuda_host_free(void* p) {
  if (p) (void)cudaFreeHost(p);  // in a destructor: never throw
}

bool cuda_sync_check_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("LLMPI_CUDA_SYNC_CHECK");
    return v && *v && std::string(v) != "0";
  }();
  return on;
}

namespace cuda {
int device_smem_optin() {
  static int cached_dev = -1, optin = 0;
  const int dev = cuda_device();
  if (dev != cached_dev) {
    LLMPI_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    cached_dev = dev;
  }
  return optin;
}

void launch_check(const char* name, const char* file, int line) {
  cudaError_t e = cudaPeekAtLastError();
  if (e == cudaSuccess && cuda_sync_check_enabled()) e = cudaStreamSynchronize(compute_stream());
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw_cuda(e, name, file, line);
  }
}
}  // namespace cuda

double cuda_gemm_tflops(int M, int N, int K, int iters, const std::string& math, int ldc) {
  if (ldc == 0) ldc = N;
  if (M <= 0 || N <= 0 || K <= 0 || iters <= 0 || ldc < N) fail("cuda_gemm_tflops: bad sizes");
  if (math != "fp32" && math != "tf32" && math != "bf16")
    fail("cuda_gemm_tflops: math '", math, "' is not fp32, tf32 or bf16");
  const bool bf16 = math == "bf16";
  cudaStream_t s = cuda::compute_stream();
  const size_t na = static_cast<size_t>(M) * K, nb = static_cast<size_t>(N) * K,
               nc = static_cast<size_t>(M) * ldc;
  const size_t elem = bf16 ? sizeof(__nv_bfloat16) : sizeof(float);
  void* a = cuda::alloc(na * elem);
  void* b = cuda::alloc(nb * elem);
  float* c = static_cast<float*>(cuda::alloc(nc * sizeof(float)));
  if (bf16) {
    fill_pattern_kernel<__nv_bfloat16><<<cuda::grid_for(na, 256), 256, 0, s>>>(static_cast<__nv_bfloat16*>(a), na, 1u);
    fill_pattern_kernel<__nv_bfloat16><<<cuda::grid_for(nb, 256), 256, 0, s>>>(static_cast<__nv_bfloat16*>(b), nb, 2u);
  } else {
    fill_pattern_kernel<float><<<cuda::grid_for(na, 256), 256, 0, s>>>(static_cast<float*>(a), na, 1u);
    fill_pattern_kernel<float><<<cuda::grid_for(nb, 256), 256, 0, s>>>(static_cast<float*>(b), nb, 2u);
  }
  LLMPI_LAUNCH_CHECK("fill_pattern");
  // Row-major C[M,N] = A[M,K] . B[N,K]^T is column-major C^T[N,M] = (B^T)^T[N,K] . A^T[K,M].
  cudaEvent_t e0, e1;
  LLMPI_CUDA_CHECK(cudaEventCreate(&e0));
  LLMPI_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int it = 0; it < iters + 3; it++) {
    LLMPI_CUDA_CHECK(cudaEventRecord(e0, s));
    if (math == "fp32")
      cuda::sgemm_rm(false, true, M, N, K, 1.0f, static_cast<const float*>(a), K,
                     static_cast<const float*>(b), K, 0.0f, c, ldc);
    else  // as the dense layers run it (a ragged dimension split off: the LM head's V)
      cuda::gemm_tensor_rm(bf16, false, true, M, N, K, a, K, b, K, 0.0f, c, ldc);
    LLMPI_CUDA_CHECK(cudaEventRecord(e1, s));
    LLMPI_CUDA_CHECK(cudaEventSynchronize(e1));
    float t = 0.0f;
    LLMPI_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    if (it >= 3) ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cuda::free(a);
  cuda::free(b);
  cuda::free(c);
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2] * 1e-3;
  return 2.0 * M * N * static_cast<double>(K) / med / 1e12;
}

}  // namespace llmpi
