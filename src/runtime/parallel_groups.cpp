#include "runtime/parallel_groups.h"

#include <cstdio>
#include <vector>

#include "runtime/error.h"

namespace llmpi {

ParallelGroups::ParallelGroups(MPI_Comm w, int pp_stages, bool tied_embedding) : world(w) {
  MPI_Comm_rank(world, &world_rank);
  MPI_Comm_size(world, &world_size);
  if (pp_stages < 1 || world_size % pp_stages != 0)
    fail("parallel.pp_stages ", pp_stages, " does not divide the ", world_size, " ranks (world = data-parallel × "
         "pipeline stages): run a multiple of ", pp_stages, " ranks, or choose pp_stages dividing ", world_size);
  pp = pp_stages;
  dp = world_size / pp;
  stage = world_rank % pp;
  dp_rank = world_rank / pp;
  MPI_Comm_split(world, dp_rank, stage, &pipeline);
  MPI_Comm_split(world, stage, dp_rank, &data);
  const bool in_embedding = tied_embedding && pp > 1 && (first_stage() || last_stage());
  MPI_Comm_split(world, in_embedding ? dp_rank : MPI_UNDEFINED, stage, &embedding);
}

ParallelGroups::~ParallelGroups() {
  for (MPI_Comm* c : {&pipeline, &data, &embedding})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

std::string ParallelGroups::describe() const {
  auto list = [](const std::vector<int>& v) {
    std::string s;
    for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
    return s;
  };
  std::vector<int> pipe_ranks, data_ranks;
  for (int s = 0; s < pp; s++) pipe_ranks.push_back(world_rank_of(dp_rank, s));
  for (int d = 0; d < dp; d++) data_ranks.push_back(world_rank_of(d, stage));
  std::string line = "rank " + std::to_string(world_rank) + ": pipeline " + std::to_string(dp_rank) + " stage " +
                     std::to_string(stage) + "/" + std::to_string(pp) + " (pipeline ranks " + list(pipe_ranks) +
                     "), data-parallel rank " + std::to_string(dp_rank) + "/" + std::to_string(dp) + " (ranks " +
                     list(data_ranks) + ")";
  if (embedding != MPI_COMM_NULL)
    line += ", tied-embedding group ranks " + list({world_rank_of(dp_rank, 0), world_rank_of(dp_rank, pp - 1)});
  return line;
}

void print_topology(const ParallelGroups& g, const std::string& extra) {
  const std::string mine = g.describe() + (extra.empty() ? "" : ", " + extra);
  int len = (int)mine.size();
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
