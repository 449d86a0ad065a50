// The host side of a simulated launch (tools/cuda_cpu_sim/README.md): a kernel's grid run on the
// CPU, blocks side by side on the OS threads of a pool (one per core; LLMPI_SIM_THREADS sets the
// count), each block's threads fibers on one of them (fiber.h). The Makefile's rewrite of a .cu
// turns
//   kernel<<<grid, block, smem, stream>>>(args)  into  ::llmpi::sim::launcher(kernel, grid, block, smem, stream)(args)
// Checks what a launch on an H100 would refuse or fault on: an empty grid, more than 1024 threads
// a block, a grid's y or z over 65535, and dynamic shared memory above 48 KB without the kernel's
// cudaFuncSetAttribute opt-in (or above the 227 KB a block can have).
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <semaphore>
#include <thread>

#include "cuda_shim.h"
#include "stream.h"

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

// OS threads that run the blocks of a grid: run(n, f) calls f(0..n-1), each on its own thread, and
// returns when all have returned. Each worker waits on its own semaphore.
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
// how many blocks run side by side: LLMPI_SIM_THREADS, else one per core
inline int pool_threads() {
  static const int n = [] {
    const char* e = std::getenv("LLMPI_SIM_THREADS");
    const int v = e ? std::atoi(e) : static_cast<int>(std::thread::hardware_concurrency());
    return std::max(1, std::min(v, 64));
  }();
  return n;
}

// what a simulation's main fills its inputs with
inline std::vector<float> uniform(size_t n, unsigned seed, float lo, float hi) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// body() as every thread of block (bx, by, bz) of `block` threads, as fibers on the calling OS
// thread, in context ctx
struct BlockRun {
  BlockContext* ctx;
  dim3 block;
  unsigned bx, by, bz;
  const std::function<void()>* body;
};
inline void enter_block_thread(int t, void* arg) {
  const BlockRun& r = *static_cast<const BlockRun*>(arg);
  threadIdx = dim3(t % r.block.x, t / r.block.x % r.block.y, t / (r.block.x * r.block.y));
  blockIdx = dim3(r.bx, r.by, r.bz);
  g_block = r.ctx;
  (*r.body)();
}
inline void run_block(BlockContext& ctx, dim3 block, unsigned bx, unsigned by, unsigned bz,
                      const std::function<void()>& body) {
  BlockRun r{&ctx, block, bx, by, bz, &body};
  run_fibers(ctx.threads, &enter_block_thread, &r);
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
  const long long blocks = static_cast<long long>(grid.x) * grid.y * grid.z;
  launch_stats().launches++;
  launch_stats().blocks += blocks;
  // blocks are independent (no kernel here waits on another block), so any order will do
  std::atomic<long long> next{0};
  const int workers = static_cast<int>(std::min<long long>(pool_threads(), blocks));
  auto worker = [&](int) {
    for (long long b = next++; b < blocks; b = next++) {
      BlockContext ctx(static_cast<int>(threads), smem);
      run_block(ctx, block, static_cast<unsigned>(b % grid.x), static_cast<unsigned>(b / grid.x % grid.y),
                static_cast<unsigned>(b / (static_cast<long long>(grid.x) * grid.y)), body);
    }
  };
  if (workers == 1)
    worker(0);
  else
    thread_pool().run(workers, worker);
}

// The grid runs when the launch is made, after what its stream holds (stream.h)
template <class... P>
struct Launcher {
  void (*kernel)(P...);
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  template <class... A>
  void operator()(A&&... args) const {
    reach(stream);
    run_grid(reinterpret_cast<const void*>(kernel), grid, block, smem, [&] { kernel(args...); });
  }
};
template <class... P>
Launcher<P...> launcher(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem = 0, cudaStream_t stream = nullptr) {
  return {kernel, grid, block, smem, stream};
}

}  // namespace llmpi::sim
