// Pre-emption signals. install_preemption_handlers() makes SIGTERM and SIGUSR1 (Slurm's
// `--signal=USR1@120`, PBS's SIGTERM before the kill) set a flag instead of killing the process;
// the trainer looks at it at every step boundary, agrees across ranks, writes one checkpoint and
// exits 0. Repeated signals (the scheduler and mpiexec/srun both forward SIGTERM) are ignored.
// Call it on the main thread before the compute starts: from then on the signals are blocked
// there and in every thread it starts, and a thread of their own receives them
// (signals.cpp says why).
#pragma once

namespace llmpi {

void install_preemption_handlers();
bool preemption_requested();   // async-signal-safe flag, set by the handlers
int preemption_signal();       // which signal set it (0 = none)
void request_preemption_for_test(int sig);  // set the flag as the handler would

}  // namespace llmpi
