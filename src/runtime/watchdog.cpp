#include "runtime/watchdog.h"

#include <chrono>
#include <string>

#include "runtime/clock.h"
#include "runtime/mpi_env.h"

#ifdef LLMPI_HAVE_CUDA
#include <nvtx3/nvToolsExt.h>  // header-only; the ranges cost nothing unless Nsight is attached
#endif

namespace llmpi {

Watchdog::Watchdog(double timeout_s) : timeout_ms_(timeout_s * 1000.0) {
  if (timeout_s > 0) thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void Watchdog::enter(const char* phase, int64_t step) {
  since_ms_ = now_ms();
  step_ = step;
#ifdef LLMPI_HAVE_CUDA
  // The same phases as NVTX ranges, so Nsight Systems shows them on the CPU timeline.
  if (phase_.load()) nvtxRangePop();
  if (phase) nvtxRangePushA(phase);
#endif
  phase_ = phase;
}

void Watchdog::run() {
  while (!stop_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const char* phase = phase_;
    if (!phase) continue;
    double waited = now_ms() - since_ms_;
    if (waited > timeout_ms_) {
      char secs[32];
      std::snprintf(secs, sizeof secs, "%.0f", waited / 1000.0);
      fatal("step " + std::to_string((long long)step_) + " has been in phase '" + phase + "' for " + secs +
            " s, longer than runtime.step_timeout_s (" + std::to_string((int)(timeout_ms_ / 1000)) +
            " s): a rank stopped answering or the step is slower than the limit; raise the limit if this is expected");
    }
  }
}

}  // namespace llmpi
