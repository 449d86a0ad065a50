#include "comm/tensor_group.h"

#include <vector>

namespace llmpi {

namespace {

// Host staging for a GPU backend: one buffer grown to the largest call (pageable: the copies are
// synchronous either way).
struct Staging {
  std::vector<float> host;
};

TensorGroup::Fn reduce_fn(const Ops& ops, MPI_Comm comm, MPI_Op op, std::shared_ptr<Staging> staging) {
  if (!ops.on_gpu())
    return [comm, op](float* x, size_t n) { MPI_Allreduce(MPI_IN_PLACE, x, static_cast<int>(n), MPI_FLOAT, op, comm); };
  const Ops* o = &ops;
  return [o, comm, op, staging](float* x, size_t n) {
    std::vector<float>& h = staging->host;
    if (h.size() < n) h.resize(n);
    o->copy_to_host(h.data(), x, n * sizeof(float));  // waits for the compute stream
    MPI_Allreduce(MPI_IN_PLACE, h.data(), static_cast<int>(n), MPI_FLOAT, op, comm);
    o->copy_to_device(x, h.data(), n * sizeof(float));
  };
}

}  // namespace

TensorGroup make_tensor_group(const Ops& ops, MPI_Comm comm) {
  auto staging = std::make_shared<Staging>();
  TensorGroup g;
  g.sum = reduce_fn(ops, comm, MPI_SUM, staging);
  g.max = reduce_fn(ops, comm, MPI_MAX, staging);
  return g;
}

}  // namespace llmpi
