#include "comm/grad_sync.h"

#include <algorithm>
#include <chrono>
#include <climits>

#include "runtime/error.h"

namespace llmpi {

SyncMethod parse_sync_method(const std::string& name) {
  if (name == "allreduce") return SyncMethod::allreduce;
  fail("parallel.sync: unknown method '", name, "'; valid: \"allreduce\"");
}

const char* sync_method_name(SyncMethod m) {
  switch (m) {
    case SyncMethod::allreduce: return "allreduce";
  }
  return "?";
}

GradSync::GradSync(SyncMethod m, MPI_Comm c, float* g, size_t n_) : method(m), comm(c), grads(g), n(n_) {
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
}

void GradSync::on_ready(size_t) {
  // allreduce waits for the whole gradient (finish); overlapping methods start buckets here.
}

void allreduce_average(MPI_Comm comm, float* data, size_t n) {
  int world = 1;
  MPI_Comm_size(comm, &world);
  if (world == 1) return;
  for (size_t off = 0; off < n; off += (size_t)INT_MAX / 2) {
    int len = (int)std::min(n - off, (size_t)INT_MAX / 2);
    MPI_Allreduce(MPI_IN_PLACE, data + off, len, MPI_FLOAT, MPI_SUM, comm);
  }
  const float inv = 1.0f / (float)world;
  for (size_t i = 0; i < n; i++) data[i] *= inv;
}

void GradSync::finish() {
  if (world == 1) return;
  auto t0 = std::chrono::steady_clock::now();
  allreduce_average(comm, grads, n);
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  // A ring/recursive all-reduce moves 2(W-1)/W of the buffer out of, and into, every rank.
  double bytes = 2.0 * (world - 1) / world * (double)n * sizeof(float);
  step.comm_ms += ms;
  step.exposed_comm_ms += ms;  // nothing overlaps it
  step.bytes_sent += bytes;
  step.bytes_received += bytes;
  step.collectives += (int)((n + INT_MAX / 2 - 1) / (INT_MAX / 2));
}

}  // namespace llmpi
