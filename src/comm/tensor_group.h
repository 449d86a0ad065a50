// The collectives of a tensor-parallel group (model/transformer.h "Tensor parallelism"): sums and
// maxima in place over the group's ranks, on a Model's backend memory.
//
//   CPU        MPI_Allreduce in place on the buffer
//   CUDA       through a host copy: the compute stream's work is waited for, the
//              values copied to the host, MPI_Allreduce, copied back (any MPI, CUDA-aware or not)
//
// Every rank gets the same bits: MPI_Allreduce over a group gives each member the same result
// (MPICH and Open MPI reduce in one order for all, for commutative built-in operations); the
// replicated parts of the model stay equal across the group only because of that.
// Errors of the MPI calls end the job (MPI's default handler), as every collective of a step does.
#pragma once
#include <mpi.h>

#include <memory>

#include "backend/ops.h"
#include "model/transformer.h"

namespace llmpi {

// The group's collectives over `comm` (its size is the tensor-parallel degree) for a Model on
// `ops`. The returned functions keep what they need alive (a host staging buffer on a GPU).
TensorGroup make_tensor_group(const Ops& ops, MPI_Comm comm);

}  // namespace llmpi
