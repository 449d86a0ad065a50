// The parallel topology: world = DP × PP × TP, built once with MPI_Comm_split and passed to
// whatever needs a communicator (as Megatron's parallel_state). The ranks of a tensor-parallel
// group are adjacent (one node: they exchange the most), then the stages of one pipeline:
//
//   world rank  r = (dp_rank · S + stage) · TP + tp_rank
//               (S = parallel.pp_stages, TP = parallel.tp, DP = world / (S · TP))
//   tensor      the TP ranks with this (dp_rank, stage) (rank in it = tp_rank): the shards of one
//               stage's layers (model/transformer.h "Tensor parallelism")
//   pipeline    the S ranks with this (dp_rank, tp_rank) (rank in it = stage): activations,
//               gradients, checkpoint gathering
//   model       the S · TP ranks with this dp_rank: one replica of the whole model, over which
//               the global gradient norm is summed
//   data        the DP ranks with this (stage, tp_rank) (rank in it = dp_rank): the sampler's
//               share, gradient synchronisation of this shard of this stage's parameters
//   embedding   stage 0 and stage S-1 of this pipeline, when the LM head is tied to the token
//               embedding and S > 1 (MPI_COMM_NULL elsewhere): the two copies of the tied matrix
//               have their gradients summed here so they stay in step
//   world       the communicator the run was given: loss and metric reductions (every stage
//               takes part, the last one holds the loss; of a tensor-parallel group, tp_rank 0
//               counts it), errors and pre-emption agreement
//   checkpoint  a duplicate of world for a checkpoint's file (train/checkpointing.cpp): its
//               creation, MPI-IO open, sync and close run on the writer thread while the steps
//               use the others, and collectives of two threads must not share a communicator
//
// With S = 1 the pipeline communicator holds one rank, with TP = 1 the tensor one; with both,
// `data` is the whole world.
#pragma once
#include <mpi.h>

#include <string>

namespace llmpi {

struct ParallelGroups {
  MPI_Comm world = MPI_COMM_NULL;  // not owned
  int world_rank = 0, world_size = 1;
  int pp = 1, dp = 1, tp = 1;      // pipeline stages, data-parallel replicas, tensor-parallel ranks
  int stage = 0, dp_rank = 0, tp_rank = 0;
  MPI_Comm pipeline = MPI_COMM_NULL, data = MPI_COMM_NULL, embedding = MPI_COMM_NULL;  // owned
  MPI_Comm tensor = MPI_COMM_NULL, model = MPI_COMM_NULL;                              // owned
  MPI_Comm checkpoint = MPI_COMM_NULL;                                                  // owned

  // Collective over world. Throws Error (on every rank) when pp_stages × tp does not divide the world.
  ParallelGroups(MPI_Comm world, int pp_stages, bool tied_embedding, int tp = 1);
  ~ParallelGroups();
  ParallelGroups(const ParallelGroups&) = delete;
  ParallelGroups& operator=(const ParallelGroups&) = delete;

  bool first_stage() const { return stage == 0; }
  bool last_stage() const { return stage == pp - 1; }
  // World rank of (dp_rank, stage, tp_rank), and the reverse: the place of any world rank.
  int world_rank_of(int replica, int st, int shard = 0) const { return (replica * pp + st) * tp + shard; }
  struct Place {
    int dp_rank, stage, tp_rank;
  };
  Place place_of(int rank) const { return {rank / (tp * pp), rank / tp % pp, rank % tp}; }
  // "rank 3: pipeline 1 stage 1/2, data-parallel rank 1/2 (stage 1 ranks 1,3), pipeline ranks 2,3, ..."
  std::string describe() const;
};

// Rank 0 prints every rank's describe() line, in rank order (collective over g.world), each
// followed by `extra` of that rank (e.g. the layers it holds).
void print_topology(const ParallelGroups& g, const std::string& extra);

}  // namespace llmpi
