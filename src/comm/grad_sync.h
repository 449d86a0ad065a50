// Gradient synchronisation: after backward, every rank holds the average of all ranks' gradients.
//
// The method is chosen at run time (config parallel.sync). The trainer talks to it through two
// calls, so methods that overlap communication with backward plug in without touching the model:
//   on_ready(k)  called by backward whenever the flat gradient prefix [0, k) is final
//   finish()     called after backward; returns when grads hold the average on every rank
// Accounting per step (comm_ms, bytes, collectives) is kept in `step`.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <string>

namespace llmpi {

enum class SyncMethod {
  allreduce,  // MPI_Allreduce(SUM) of the whole flat gradient, then divide by the world size
};

SyncMethod parse_sync_method(const std::string& name);  // throws Error naming the valid ones
const char* sync_method_name(SyncMethod m);

struct SyncStats {
  double comm_ms = 0;          // wall time inside collectives
  double exposed_comm_ms = 0;  // part of it not hidden behind compute
  double bytes_sent = 0;       // per rank, as the algorithm moves them
  double bytes_received = 0;
  int collectives = 0;
};

struct GradSync {
  SyncMethod method;
  MPI_Comm comm;
  int rank = 0, world = 1;
  float* grads;  // host memory
  size_t n;
  SyncStats step;

  GradSync(SyncMethod method, MPI_Comm comm, float* grads, size_t n);
  void begin_step() { step = SyncStats{}; }
  void on_ready(size_t k);
  void finish();
};

// Average a float buffer in place across comm with MPI_Allreduce (chunked below INT_MAX elements).
void allreduce_average(MPI_Comm comm, float* data, size_t n);

}  // namespace llmpi
