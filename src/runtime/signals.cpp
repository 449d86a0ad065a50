#include "runtime/signals.h"

#include <pthread.h>

#include <csignal>
#include <mutex>
#include <thread>

namespace llmpi {

static volatile std::sig_atomic_t g_signal = 0;

// Repeats are normal — the scheduler signals every process of the job, and srun / mpiexec
// forward the signal they got to the ranks as well — so only the first one counts. The
// scheduler's SIGKILL after its grace time is the deadline.
static void note_signal(int sig) {
  if (g_signal == 0) g_signal = sig;
}

void install_preemption_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    // A thread that started before this call (MPI's progress threads) may still take the
    // signal: there the handler only sets the flag.
    struct sigaction sa = {};
    sa.sa_handler = note_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGUSR1, &sa, nullptr);
    // The compute threads never take it: this thread, and every thread it starts from now on
    // (OpenMP's workers, the checkpoint writer), block both signals, and one thread of its own
    // waits for them. A handler run on a compute thread would push its frame wherever the stack
    // pointer points, and oneDNN's JIT GEMM kernels (2.x, 3.x before 3.11) point it into the
    // heap while they run: the signal frame then overwrites heap memory.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    std::thread([set] {
      for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) == 0) note_signal(sig);
      }
    }).detach();
  });
}

bool preemption_requested() { return g_signal != 0; }
int preemption_signal() { return g_signal; }
void request_preemption_for_test(int sig) { g_signal = sig; }

}  // namespace llmpi
