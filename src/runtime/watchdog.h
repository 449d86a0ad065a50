// The step watchdog (runtime.step_timeout_s): the training loop names the phase it enters
// (data, forward, backward, gradient sync, ...); a thread checks twice a second and, when one
// phase has lasted longer than the limit, ends the job with MPI_Abort and a message naming the
// step and the phase — typically a collective waiting for a rank that stopped answering.
// In CUDA builds every phase is also an NVTX range, so Nsight shows the same phases.
#pragma once
#include <atomic>
#include <cstdint>
#include <thread>

namespace llmpi {

struct Watchdog {
  explicit Watchdog(double timeout_s);  // 0 = disabled (no thread)
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Enter a phase (a string literal) of step `step`; nullptr = idle (not timed).
  void enter(const char* phase, int64_t step);

 private:
  double timeout_ms_;
  std::atomic<const char*> phase_{nullptr};
  std::atomic<int64_t> step_{0};
  std::atomic<double> since_ms_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
  void run();
};

}  // namespace llmpi
