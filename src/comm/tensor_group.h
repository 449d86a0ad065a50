// The collectives of a tensor-parallel group (model/transformer.h "Tensor parallelism"): sums and
// maxima in place over the group's ranks, and for sequence parallelism all-gathers and
// reduce-scatters of equal pieces, on a Model's backend memory.
//
//   CPU        MPI_Allreduce in place, MPI_Allgather, MPI_Reduce_scatter_block on the buffers (in
//              pieces of at most INT_MAX floats: runtime/large_count.h)
//   CUDA       with parallel.sync "nccl": ncclAllReduce (sum or max), ncclAllGather,
//              ncclReduceScatter on an NCCL communicator of the group, on its stream after the
//              compute stream's work, which then waits for it (no host wait: comm/nccl.h);
//              otherwise through host memory (the compute stream waited for, the MPI call, copied
//              back: any MPI, CUDA-aware or not)
//
// Every rank gets the same bits: MPI_Allreduce and ncclAllReduce give each member of the group the
// same result; the whole (replicated) parts of the model stay equal across the group because of
// that. Errors of the calls end the job, as every collective of a step does.
#pragma once
#include <mpi.h>

#include "backend/ops.h"
#include "runtime/group_collectives.h"

namespace llmpi {

// The group's collectives over `comm` (its size is the tensor-parallel degree) for a Model on
// `ops`; NCCL's with `nccl` on a GPU. Collective over comm (an NCCL communicator is made). The
// returned functions keep what they need alive.
TensorGroup make_tensor_group(const Ops& ops, MPI_Comm comm, bool nccl);

}  // namespace llmpi
