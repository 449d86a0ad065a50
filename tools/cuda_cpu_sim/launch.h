// The host side of a simulated launch (tools/cuda_cpu_sim/README.md): a kernel's grid run on the
// CPU, block after block, each block's threads real threads. The Makefile's rewrite of a .cu turns
//   kernel<<<grid, block, smem, stream>>>(args)  into  ::llmpi::sim::launcher(kernel, grid, block, smem, stream)(args)
// Checks what a launch on an H100 would refuse or fault on: an empty grid, more than 1024 threads
// a block, a grid's y or z over 65535, and dynamic shared memory above 48 KB without the kernel's
// cudaFuncSetAttribute opt-in (or above the 227 KB a block can have).
#pragma once
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <semaphore>
#include <thread>

#include "cuda_shim.h"

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace llmpi::sim {

// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes): per kernel
inline std::map<const void*, size_t>& smem_opt_in() {
  static std::map<const void*, size_t> m;
  return m;
}
struct LaunchStats {
  long long launches = 0, blocks = 0;
};
inline LaunchStats& launch_stats() {
  static LaunchStats s;
  return s;
}

// Threads that run one block's threads after another's (creating 1024 threads per block would
// cost more than the kernels): run(n, f) calls f(0..n-1), each on its own thread, and returns when
// all have returned. Each worker waits on its own semaphore, so a block of 128 threads wakes 128.
class ThreadPool {
 public:
  ~ThreadPool() {
    quit_ = true;
    for (auto& w : workers_) w->go.release();
    for (auto& w : workers_) w->thread.join();
  }
  void run(int n, const std::function<void(int)>& f) {
    while (static_cast<int>(workers_.size()) < n) {
      auto w = std::make_unique<Worker>();
      Worker* self = w.get();
      const int i = static_cast<int>(workers_.size());
      w->thread = std::thread([this, self, i] { work(*self, i); });
      workers_.push_back(std::move(w));
    }
    job_ = &f;
    remaining_.store(n);
    for (int i = 0; i < n; i++) workers_[i]->go.release();
    done_.acquire();
    job_ = nullptr;
  }

 private:
  struct Worker {
    std::binary_semaphore go{0};
    std::thread thread;
  };
  void work(Worker& w, int i) {
    for (;;) {
      w.go.acquire();
      if (quit_) return;
      (*job_)(i);
      if (remaining_.fetch_sub(1) == 1) done_.release();
    }
  }
  std::vector<std::unique_ptr<Worker>> workers_;
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<int> remaining_{0};
  std::binary_semaphore done_{0};
  std::atomic<bool> quit_{false};
};
inline ThreadPool& thread_pool() {
  static ThreadPool p;
  return p;
}

// what a simulation's main fills its inputs with
inline std::vector<float> uniform(size_t n, unsigned seed, float lo, float hi) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// body() as every thread of block (bx, by, bz) of `block` threads, on the pool, in context ctx
inline void run_block(BlockContext& ctx, dim3 block, unsigned bx, unsigned by, unsigned bz,
                      const std::function<void()>& body) {
  thread_pool().run(ctx.threads, [&](int t) {
    threadIdx = dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
    blockIdx = dim3(bx, by, bz);
    g_block = &ctx;
    body();
    // an exited thread no longer takes part in its block's or warp's barriers
    ctx.warp[warp_id()].arrive_and_drop();
    ctx.block.arrive_and_drop();
  });
}

// body() as every thread of the grid
inline void run_grid(const void* kernel, dim3 grid, dim3 block, size_t smem, const std::function<void()>& body) {
  const long long threads = static_cast<long long>(block.x) * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0) die("a launch with an empty grid or block");
  if (threads > 1024) die("a launch with more than 1024 threads per block");
  if (grid.y > 65535 || grid.z > 65535 || grid.x > 0x7fffffffu) die("a grid dimension over its limit");
  if (smem > 48 * 1024) {
    auto it = smem_opt_in().find(kernel);
    if (it == smem_opt_in().end() || it->second < smem)
      die("dynamic shared memory above 48 KB without cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  }
  if (smem > kSmemPerBlock) die("dynamic shared memory above the 227 KB an H100 block can have");
  blockDim = block;
  gridDim = grid;
  launch_stats().launches++;
  for (unsigned bz = 0; bz < grid.z; bz++)
    for (unsigned by = 0; by < grid.y; by++)
      for (unsigned bx = 0; bx < grid.x; bx++) {
        launch_stats().blocks++;
        BlockContext ctx(static_cast<int>(threads), smem);
        run_block(ctx, block, bx, by, bz, body);
      }
}

template <class... P>
struct Launcher {
  void (*kernel)(P...);
  dim3 grid, block;
  size_t smem;
  template <class... A>
  void operator()(A&&... args) const {
    run_grid(reinterpret_cast<const void*>(kernel), grid, block, smem, [&] { kernel(args...); });
  }
};
template <class... P>
Launcher<P...> launcher(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem = 0, cudaStream_t = nullptr) {
  return {kernel, grid, block, smem};
}

}  // namespace llmpi::sim
