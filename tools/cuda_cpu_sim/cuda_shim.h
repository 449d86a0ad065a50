// A stand-in for the device side of CUDA that the backend's kernels use, so that their source runs
// unchanged on the CPU (tools/cuda_cpu_sim/README.md; launch.h is the host side). Not an emulator of
// a GPU:
//   - a block's threads are fibers (fiber.h), any block shape; __syncthreads and __syncwarp are
//     barriers between them, the shuffles and __any_sync go through per-warp exchange slots,
//     one warp barrier each; a thread that returns leaves both;
//   - blocks run side by side on the OS threads of launch.h's pool, each block's threads on one OS
//     thread; shared memory is per block and starts as NaN bytes: the
//     launch's dynamic bytes (dynamic_shared) and each static __shared__ array (static_shared, one
//     per declaration) in the rewritten files; sim-flash_mma's extracted kernels name one static
//     buffer instead (`__shared__` is empty there);
//   - mma_m16n8k16_bf16 and mma_m16n8k8_tf32 (kernels/mma_sync.cuh: the PTX mma.sync with bf16 or
//     tf32 operands and fp32 accumulators) are a warp-collective exchange: every lane deposits
//     its operand registers, each rebuilds A and B from the documented fragment layouts and
//     computes its own four outputs, summing a product's 16 terms in fp32 in index
//     order (with -DLLMPI_SIM_TRUNCATE_MMA: exactly, then rounded toward zero, as tensor cores
//     may). A kernel that put an element in the wrong lane or register half gets a wrong product;
//     the layouts themselves are the PTX ISA's ("Matrix Fragments for mma.m16n8k16");
//   - bf16 conversions are backend/bf16.h's round to nearest even, round_tf32 backend/tf32.h's;
//     atomics take one lock.
// What it cannot show: timing, occupancy, bank conflicts, the hardware's own rounding, memory
// ordering between blocks, and anything in code that does not compile against this header.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "backend/bf16.h"
#include "backend/tf32.h"
#include "fiber.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n)
#define __shared__

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace llmpi::sim {

using Dim3 = ::dim3;
constexpr int kBlockThreads = 128;  // the flash kernels' block: 4 warps (flash_mma_sim.cpp)
constexpr size_t kSmemPerBlock = 232448;  // an H100's opt-in shared memory per block (227 KB)

[[noreturn]] inline void die(const char* what) {
  std::fprintf(stderr, "cuda_cpu_sim: %s\n", what);
  std::abort();
}

// One block's exchange slots and shared memory. Warps are 32 consecutive
// linear thread ids (x fastest), the last one possibly partial.
struct BlockContext {
  explicit BlockContext(int threads_, size_t dynamic_bytes = 0)
      : threads(threads_), warp_slots((threads_ + 31) / 32), dynamic_smem(dynamic_bytes) {
    if (!dynamic_smem.empty()) std::memset(dynamic_smem.data(), 0xff, dynamic_smem.size());  // NaN bytes
  }
  // a `__shared__ T name[...]` declaration's memory in this block (key: the declaration), NaN
  // bytes at first; every thread of the block gets the same (they share one OS thread: no lock)
  void* static_memory(const void* key, size_t bytes) {
    auto& m = statics[key];
    if (!m.empty()) return m.data();
    m.assign(bytes, 0xff);
    static_bytes += bytes;
    if (static_bytes + dynamic_smem.size() > kSmemPerBlock) die("a block uses more shared memory than an H100 has");
    return m.data();
  }
  int threads;
  // what a warp's lanes hand each other (shuffles, __any_sync, mma.sync operands): two sets, used
  // in turn, so that one warp barrier per exchange is enough (WarpSlots::next)
  struct WarpSlots {
    std::array<uint64_t, 32> value[2];
    std::array<std::array<uint32_t, 4>, 32> mma_a[2];
    std::array<std::array<uint32_t, 2>, 32> mma_b[2];
    std::array<unsigned char, 32> turn{};  // each lane's next set
    // The set for this lane's next exchange. A lane writes set s, waits at the warp barrier, then
    // reads the others' values. Set s is written again only at the exchange after next, which a
    // lane reaches after the next exchange's barrier, that is, after every lane has arrived
    // there, done reading this one. (Every lane of a warp takes part in every exchange, as the
    // kernels' full-mask shuffles require.)
    int next(int lane) { return turn[lane] ^= 1; }
  };
  std::vector<WarpSlots> warp_slots;
  std::vector<unsigned char> dynamic_smem;
  std::map<const void*, std::vector<unsigned char>> statics;
  size_t static_bytes = 0;
};
inline thread_local BlockContext* g_block = nullptr;

}  // namespace llmpi::sim

inline thread_local dim3 threadIdx{0, 0, 0}, blockIdx{0, 0, 0};
inline dim3 blockDim{llmpi::sim::kBlockThreads, 1, 1}, gridDim{1, 1, 1};  // set by each launch

namespace llmpi::sim {
inline int linear_thread() { return static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)); }
inline int warp_id() { return linear_thread() / 32; }
inline int lane_id() { return linear_thread() % 32; }

// Waits at this warp's or block's barrier (fiber.h); the fibers that ran meanwhile set the
// thread-local ids to theirs, so this thread's are put back
inline void wait_at(Wait w) {
  const dim3 t = threadIdx, b = blockIdx;
  BlockContext* const blk = g_block;
  suspend(w);
  threadIdx = t;
  blockIdx = b;
  g_block = blk;
}

// What the rewritten kernels' shared arrays name (the Makefile's rewrite of a .cu):
//   extern __shared__ T name[];   ->  T* const name = dynamic_shared<T>();
//   __shared__ T name[N]...;      ->  auto& name = static_shared<T[N]...>([] {});  (the lambda's
//                                     type makes each declaration, in each instantiation, its own)
template <class T>
T* dynamic_shared() {
  return reinterpret_cast<T*>(g_block->dynamic_smem.data());
}
template <class T, class Tag>
T& static_shared(Tag) {
  static const char key = 0;
  return *reinterpret_cast<T*>(g_block->static_memory(&key, sizeof(T)));
}

// Hands `bits` to the other lanes of this warp (every lane calls it: one warp barrier) and returns
// what each lane handed over
inline const std::array<uint64_t, 32>& share(uint64_t bits) {
  auto& ws = g_block->warp_slots[warp_id()];
  auto& slots = ws.value[ws.next(lane_id())];
  slots[lane_id()] = bits;
  wait_at(Wait::warp);
  return slots;
}
// A value of lane src of this warp (every lane calls it)
template <class T>
T exchange(T v, int src) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = share(bits)[src & 31];
  T r;
  std::memcpy(&r, &bits, sizeof(T));
  return r;
}

inline std::mutex& atomic_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace llmpi::sim

inline void __syncthreads() { llmpi::sim::wait_at(llmpi::sim::Wait::block); }
inline void __syncwarp(unsigned = 0xffffffffu) { llmpi::sim::wait_at(llmpi::sim::Wait::warp); }
template <class T>
T __shfl_xor_sync(unsigned, T v, int lane_mask, int = 32) {
  return llmpi::sim::exchange(v, llmpi::sim::lane_id() ^ lane_mask);
}
template <class T>
T __shfl_down_sync(unsigned, T v, unsigned delta, int = 32) {
  const int l = llmpi::sim::lane_id();
  return llmpi::sim::exchange(v, l + static_cast<int>(delta) < 32 ? l + static_cast<int>(delta) : l);
}
template <class T>
T __shfl_up_sync(unsigned, T v, unsigned delta, int = 32) {
  const int l = llmpi::sim::lane_id();
  return llmpi::sim::exchange(v, l >= static_cast<int>(delta) ? l - static_cast<int>(delta) : l);
}
template <class T>
T __shfl_sync(unsigned, T v, int src, int = 32) {
  return llmpi::sim::exchange(v, src);
}
inline int __any_sync(unsigned, int pred) {
  const int lanes = std::min(32, llmpi::sim::g_block->threads - 32 * llmpi::sim::warp_id());
  const auto& slots = llmpi::sim::share(pred != 0);
  int any = 0;
  for (int l = 0; l < lanes; l++) any |= static_cast<int>(slots[l]);
  return any;
}
template <class T>
T atomicMax(T* p, T v) {
  std::lock_guard<std::mutex> lock(llmpi::sim::atomic_mutex());
  const T old = *p;
  if (v > old) *p = v;
  return old;
}
template <class T>
T atomicAdd(T* p, T v) {
  std::lock_guard<std::mutex> lock(llmpi::sim::atomic_mutex());
  const T old = *p;
  *p = old + v;
  return old;
}
inline void __trap() { llmpi::sim::die("__trap"); }
using std::min;

struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
struct alignas(8) float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
struct alignas(8) uint2 {
  uint32_t x, y;
};
inline uint2 make_uint2(uint32_t x, uint32_t y) { return {x, y}; }

struct __nv_bfloat16 {
  uint16_t bits;
};
inline __nv_bfloat16 __float2bfloat16_rn(float x) { return {llmpi::float_to_bf16_bits(x)}; }
inline float __bfloat162float(__nv_bfloat16 b) { return llmpi::bf16_bits_to_float(b.bits); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.bits; }
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)}; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return {u}; }
inline float __low2float(__nv_bfloat162 v) { return __bfloat162float(v.x); }
inline float __high2float(__nv_bfloat162 v) { return __bfloat162float(v.y); }
inline float2 __bfloat1622float2(__nv_bfloat162 v) { return {__bfloat162float(v.x), __bfloat162float(v.y)}; }
inline unsigned __float_as_uint(float x) {
  unsigned u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
inline int __float_as_int(float x) { return static_cast<int>(__float_as_uint(x)); }
inline float __int_as_float(int i) { return __uint_as_float(static_cast<unsigned>(i)); }
// The correctly rounded operations the kernels name to keep nvcc from contracting them into an
// FMA (the sim's builds pass -ffp-contract=off, so g++ contracts nothing: where nvcc would fuse
// an a * b + c elsewhere the sim rounds twice, a difference within the comparisons' tolerances).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __expf(float x) { return std::exp(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }  // the device's is within 2 ulp
template <class T>
T __ldg(const T* p) {
  return *p;
}

namespace llmpi::cuda {

namespace sim_mma {
inline float as_float(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
// d[e] += Σ_k A[m][k] B[k][n] for this lane's four outputs (m = g or g + 8, n = 2t or 2t + 1), the
// K terms in index order in fp32 (-DLLMPI_SIM_TRUNCATE_MMA: exactly, then rounded toward zero)
template <int K>
void accumulate(float (&d)[4], const float (&A)[16][K], const float (&B)[K][8]) {
  const int lane = llmpi::sim::lane_id(), g = lane / 4, t = lane % 4;
  for (int e = 0; e < 4; e++) {
    const int m = g + (e >> 1) * 8, n = 2 * t + (e & 1);
#ifdef LLMPI_SIM_TRUNCATE_MMA
    double s = d[e];
    for (int k = 0; k < K; k++) s += static_cast<double>(A[m][k]) * B[k][n];
    float f = static_cast<float>(s);
    if (std::fabs(static_cast<double>(f)) > std::fabs(s)) f = std::nextafter(f, 0.0f);
    d[e] = f;
#else
    float s = d[e];
    for (int k = 0; k < K; k++) s += A[m][k] * B[k][n];
    d[e] = s;
#endif
  }
}
// every lane's operand registers, after the warp barrier: the set of slots they are in
inline int exchange(const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  auto& ws = llmpi::sim::g_block->warp_slots[llmpi::sim::warp_id()];
  const int lane = llmpi::sim::lane_id(), set = ws.next(lane);
  for (int r = 0; r < 4; r++) ws.mma_a[set][lane][r] = a[r];
  for (int r = 0; r < 2; r++) ws.mma_b[set][lane][r] = b[r];
  __syncwarp();
  return set;
}
}  // namespace sim_mma

// D (16 x 8) += A (16 x 16) B (16 x 8), bf16, the whole warp together; g = lane / 4, t = lane % 4:
// a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1], a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9];
// b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g]; d[0], d[1] = D[g][2t, 2t+1], d[2], d[3] = D[g+8][..];
// the lower index in a register's low 16 bits.
inline void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  const int set = sim_mma::exchange(a, b);
  const auto& ws = llmpi::sim::g_block->warp_slots[llmpi::sim::warp_id()];
  auto lo = [](uint32_t v) { return llmpi::bf16_bits_to_float(static_cast<uint16_t>(v & 0xffffu)); };
  auto hi = [](uint32_t v) { return llmpi::bf16_bits_to_float(static_cast<uint16_t>(v >> 16)); };
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; l++) {
    const int g = l / 4, t = l % 4;
    for (int r = 0; r < 4; r++) {
      const int row = g + (r & 1) * 8, col = 2 * t + (r >> 1) * 8;
      A[row][col] = lo(ws.mma_a[set][l][r]);
      A[row][col + 1] = hi(ws.mma_a[set][l][r]);
    }
    for (int r = 0; r < 2; r++) {
      const int k = 2 * t + r * 8;
      B[k][g] = lo(ws.mma_b[set][l][r]);
      B[k + 1][g] = hi(ws.mma_b[set][l][r]);
    }
  }
  sim_mma::accumulate<16>(d, A, B);
}

// D (16 x 8) += A (16 x 8) B (8 x 8), tf32: a[0] = A[g][t], a[1] = A[g+8][t], a[2] = A[g][t+4],
// a[3] = A[g+8][t+4]; b[0] = B[t][g], b[1] = B[t+4][g]. The tensor cores read a tf32 operand's top
// 19 bits; the kernels round every operand first (round_tf32), and a value with low bits left
// stops the run here, so an unrounded operand cannot pass unnoticed.
inline void mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  const int set = sim_mma::exchange(a, b);
  const auto& ws = llmpi::sim::g_block->warp_slots[llmpi::sim::warp_id()];
  auto tf = [](uint32_t v) {
    if ((v & 0x1fffu) != 0 && (v & 0x7f800000u) != 0x7f800000u) llmpi::sim::die("a tf32 mma operand that is not rounded");
    return sim_mma::as_float(v);
  };
  float A[16][8], B[8][8];
  for (int l = 0; l < 32; l++) {
    const int g = l / 4, t = l % 4;
    for (int r = 0; r < 4; r++) A[g + (r & 1) * 8][t + (r >> 1) * 4] = tf(ws.mma_a[set][l][r]);
    for (int r = 0; r < 2; r++) B[t + r * 4][g] = tf(ws.mma_b[set][l][r]);
  }
  sim_mma::accumulate<8>(d, A, B);
}

inline float round_tf32(float x) { return llmpi::round_to_tf32(x); }

}  // namespace llmpi::cuda
