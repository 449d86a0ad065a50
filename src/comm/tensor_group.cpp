#include "comm/tensor_group.h"

#include <memory>
#include <vector>

#include "runtime/large_count.h"
#include "comm/nccl.h"

namespace llmpi {

namespace {

TensorGroup::Fn mpi_fn(const Ops& ops, MPI_Comm comm, MPI_Op op, std::shared_ptr<std::vector<float>> staging) {
  if (!ops.on_gpu())
    return [comm, op](float* x, size_t n) { large::allreduce(MPI_IN_PLACE, x, n, MPI_FLOAT, op, comm); };
  const Ops* o = &ops;
  return [o, comm, op, staging](float* x, size_t n) {  // one host buffer, grown to the largest call
    std::vector<float>& h = *staging;
    if (h.size() < n) h.resize(n);
    o->copy_to_host(h.data(), x, n * sizeof(float));  // waits for the compute stream
    large::allreduce(MPI_IN_PLACE, h.data(), n, MPI_FLOAT, op, comm);
    o->copy_to_device(x, h.data(), n * sizeof(float));
  };
}

}  // namespace

TensorGroup make_tensor_group(const Ops& ops, MPI_Comm comm, bool nccl) {
  TensorGroup g;
  if (nccl && ops.on_gpu()) {
    std::shared_ptr<NcclComm> c = nccl_comm_create(comm);
    g.sum = [c](float* x, size_t n) {
      c->allreduce(x, n, false);
      c->compute_waits();
    };
    g.max = [c](float* x, size_t n) {
      c->allreduce(x, n, true);
      c->compute_waits();
    };
    g.all_gather = [c](const float* piece, float* whole, size_t n) {
      c->all_gather_pieces(piece, whole, n);
      c->compute_waits();
    };
    g.reduce_scatter = [c](const float* whole, float* piece, size_t n) {
      c->reduce_scatter_pieces(whole, piece, n);
      c->compute_waits();
    };
    return g;
  }
  auto staging = std::make_shared<std::vector<float>>();
  g.sum = mpi_fn(ops, comm, MPI_SUM, staging);
  g.max = mpi_fn(ops, comm, MPI_MAX, staging);
  int W = 1;
  MPI_Comm_size(comm, &W);
  if (!ops.on_gpu()) {
    g.all_gather = [comm](const float* piece, float* whole, size_t n) {
      large::allgather(piece, n, MPI_FLOAT, whole, comm);
    };
    g.reduce_scatter = [comm](const float* whole, float* piece, size_t n) {
      large::reduce_scatter_block(whole, piece, n, MPI_FLOAT, MPI_SUM, comm);
    };
    return g;
  }
  const Ops* o = &ops;
  auto in = std::make_shared<std::vector<float>>(), out = std::make_shared<std::vector<float>>();
  g.all_gather = [o, comm, W, in, out](const float* piece, float* whole, size_t n) {
    in->resize(n), out->resize(n * W);
    o->copy_to_host(in->data(), piece, n * sizeof(float));
    large::allgather(in->data(), n, MPI_FLOAT, out->data(), comm);
    o->copy_to_device(whole, out->data(), n * W * sizeof(float));
  };
  g.reduce_scatter = [o, comm, W, in, out](const float* whole, float* piece, size_t n) {
    in->resize(n * W), out->resize(n);
    o->copy_to_host(in->data(), whole, n * W * sizeof(float));
    large::reduce_scatter_block(in->data(), out->data(), n, MPI_FLOAT, MPI_SUM, comm);
    o->copy_to_device(piece, out->data(), n * sizeof(float));
  };
  return g;
}

}  // namespace llmpi
