#include "runtime/parallel_groups.h"

#include <cstdio>
#include <vector>

#include "runtime/large_count.h"
#include "runtime/error.h"

namespace llmpi {

ParallelGroups::ParallelGroups(MPI_Comm w, int pp_stages, bool tied_embedding, int tp_ranks) : world(w) {
  MPI_Comm_rank(world, &world_rank);
  MPI_Comm_size(world, &world_size);
  if (tp_ranks < 1 || world_size % tp_ranks != 0)
    fail("parallel.tp ", tp_ranks, " does not divide the ", world_size, " ranks (world = data-parallel × pipeline "
         "stages × tensor-parallel ranks): run a multiple of ", tp_ranks, " ranks, or choose parallel.tp dividing ",
         world_size);
  if (pp_stages < 1 || world_size % (pp_stages * tp_ranks) != 0)
    fail("parallel.pp_stages ", pp_stages, (tp_ranks > 1 ? " × parallel.tp " + std::to_string(tp_ranks) : ""),
         " does not divide the ", world_size, " ranks (world = data-parallel × pipeline stages × tensor-parallel "
         "ranks): run a multiple of ", pp_stages * tp_ranks, " ranks, or choose pp_stages",
         (tp_ranks > 1 ? " × tp" : ""), " dividing ", world_size);
  pp = pp_stages;
  tp = tp_ranks;
  dp = world_size / (pp * tp);
  const Place me = place_of(world_rank);
  dp_rank = me.dp_rank, stage = me.stage, tp_rank = me.tp_rank;
  MPI_Comm_split(world, dp_rank * tp + tp_rank, stage, &pipeline);
  MPI_Comm_split(world, stage * tp + tp_rank, dp_rank, &data);
  MPI_Comm_split(world, dp_rank * pp + stage, tp_rank, &tensor);
  MPI_Comm_split(world, dp_rank, stage * tp + tp_rank, &model);
  const bool in_embedding = tied_embedding && pp > 1 && (first_stage() || last_stage());
  MPI_Comm_split(world, in_embedding ? dp_rank * tp + tp_rank : MPI_UNDEFINED, stage, &embedding);
  MPI_Comm_dup(world, &checkpoint);
}

ParallelGroups::~ParallelGroups() {
  for (MPI_Comm* c : {&pipeline, &data, &embedding, &tensor, &model, &checkpoint})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

std::string ParallelGroups::describe() const {
  auto list = [](const std::vector<int>& v) {
    std::string s;
    for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
    return s;
  };
  std::vector<int> pipe_ranks, data_ranks, tensor_ranks;
  for (int s = 0; s < pp; s++) pipe_ranks.push_back(world_rank_of(dp_rank, s, tp_rank));
  for (int d = 0; d < dp; d++) data_ranks.push_back(world_rank_of(d, stage, tp_rank));
  for (int t = 0; t < tp; t++) tensor_ranks.push_back(world_rank_of(dp_rank, stage, t));
  std::string line = "rank " + std::to_string(world_rank) + ": pipeline " + std::to_string(dp_rank) + " stage " +
                     std::to_string(stage) + "/" + std::to_string(pp) + " (pipeline ranks " + list(pipe_ranks) +
                     "), data-parallel rank " + std::to_string(dp_rank) + "/" + std::to_string(dp) + " (ranks " +
                     list(data_ranks) + ")";
  if (tp > 1)
    line += ", tensor-parallel rank " + std::to_string(tp_rank) + "/" + std::to_string(tp) + " (ranks " +
            list(tensor_ranks) + ")";
  if (embedding != MPI_COMM_NULL)
    line += ", tied-embedding group ranks " +
            list({world_rank_of(dp_rank, 0, tp_rank), world_rank_of(dp_rank, pp - 1, tp_rank)});
  return line;
}

void print_topology(const ParallelGroups& g, const std::string& extra) {
  const std::string mine = g.describe() + (extra.empty() ? "" : ", " + extra);
  int len = mpi_count(mine.size(), "a topology line");  // one line per rank
  std::vector<int> lens(g.world_size), offs(g.world_size);
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, g.world);
  int total = 0;
  if (g.world_rank == 0)
    for (int i = 0; i < g.world_size; i++) offs[i] = total, total += lens[i];
  std::vector<char> all(total + 1);
  MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, 0, g.world);
  if (g.world_rank == 0) {
    for (int i = 0; i < g.world_size; i++) std::printf("topology: %.*s\n", lens[i], all.data() + offs[i]);
    std::fflush(stdout);
  }
}

}  // namespace llmpi
