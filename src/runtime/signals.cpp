#include "runtime/signals.h"

#include <csignal>

namespace llmpi {

static volatile std::sig_atomic_t g_signal = 0;

// Repeats are normal — the scheduler signals every process of the job, and srun / mpiexec
// forward the signal they got to the ranks as well — so only the first one counts. The
// scheduler's SIGKILL after its grace time is the deadline.
static void on_signal(int sig) {
  if (g_signal == 0) g_signal = sig;
}

void install_preemption_handlers() {
  struct sigaction sa = {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

bool preemption_requested() { return g_signal != 0; }
int preemption_signal() { return g_signal; }
void request_preemption_for_test(int sig) { g_signal = sig; }

}  // namespace llmpi
