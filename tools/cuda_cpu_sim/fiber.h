// A block's threads as fibers (tools/cuda_cpu_sim/README.md): run_fibers(n, enter, arg) runs
// enter(0, arg) .. enter(n - 1, arg), each on a stack of its own, all on the calling OS thread,
// switching only where one waits at a barrier. A barrier is a switch of a few nanoseconds instead
// of an OS thread's sleep and wake-up (every shuffle and mma.sync of the simulated kernels is a
// warp barrier), and the schedule is the same in every run.
//
// The scheduler always runs the lowest-numbered thread that can run (LLMPI_SIM_SCHEDULE=highest:
// the highest), until it waits or returns:
//   - suspend(Wait::warp): until every thread of its warp (threads 32w .. 32w + 31) that has not
//     returned waits there too (__syncwarp, the shuffles, mma.sync);
//   - suspend(Wait::block): until every thread of the block that has not returned waits there too
//     (__syncthreads);
// a thread that returns leaves both, as an exited GPU thread does. So warp 0 runs as far ahead of
// the others as the block's barriers let it (with `highest`, the last warp): where a barrier is
// missing, it reads shared memory that the others have not written yet, or overwrites what they
// have still to read — races a GPU may lose only now and then show up at every run. If every
// thread left waits and no barrier can complete (a warp's lanes split between __syncwarp and
// __syncthreads, say), the run stops with each warp's states: a GPU would hang there, or worse.
#pragma once

namespace llmpi::sim {

enum class Wait : unsigned char { none, warp, block, returned };
enum class Schedule : unsigned char { lowest_first, highest_first };

// LLMPI_SIM_SCHEDULE's order (read once)
Schedule schedule();

// Runs enter(t, arg) for t = 0 .. n - 1 (n ≤ 1024) as fibers and returns when all have returned.
// Not reentrant on one OS thread; different OS threads may each run their own.
void run_fibers(int n, void (*enter)(int t, void* arg), void* arg);

// From inside run_fibers' enter: suspends this thread until the barrier completes. The caller's
// thread-local state (threadIdx, ...) is its own to restore: other fibers ran meanwhile.
void suspend(Wait w);

}  // namespace llmpi::sim
