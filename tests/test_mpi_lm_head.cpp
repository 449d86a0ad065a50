// The chunked LM head under MPI (-n 2): training with runtime.lm_head_chunk_rows = 5 (a local
// batch of 4 x 32 = 128 rows in 26 chunks, the last of 3 rows; a pipeline's micro-batch of 32 rows
// in 7) equals the unchunked one-rank run, 10 steps, losses and final parameters to the drift of
// another summation order (training_drift in mpi_test_data.h, the bound of every data-parallel
// and pipeline test): the chunked head adds the head's weight gradient chunk by chunk, the ranks'
// halves after. Variants: data parallel (allreduce), the bf16 GEMMs, and a 2-stage zb-h1
// pipeline, whose deferred head weight gradient recomputes the logits. With bf16 GEMMs an fp32
// difference now and then flips an operand's bf16 rounding, and AdamW carries that on:
// bf16_operand_drift.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "mpi_test_data.h"
#include "train/trainer.h"

using namespace llmpi;
using namespace llmpi::testing_support;

namespace {

void chunked_equals_unchunked(const std::string& family, const std::vector<std::string>& extra, bool bf16) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const std::string file = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 32);
  std::vector<std::string> base = {"model.family=" + family, "train.steps=10"};
  if (family == "llama") base.insert(base.end(), {"model.n_head=4", "model.n_kv_head=2"});
  base.insert(base.end(), extra.begin(), extra.end());
  MPI_Comm solo;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() == 0 ? 0 : MPI_UNDEFINED, 0, &solo);
  const Config ref = tiny_config(file, base);
  TrainResult one;
  Drift bound{};
  if (world_rank() == 0) {
    one = train(ref, solo, quiet_options(false), true);
    MPI_Comm_free(&solo);
    // Bound: another order of each step's sums from the first step on (see the top).
    bound = bf16 ? bf16_operand_drift(ref, 0, 10, one.final_params) : training_drift(ref, 0, 10, one.final_params);
  }
  struct Variant {
    const char* name;
    std::vector<std::string> sets;
  };
  const std::vector<Variant> variants = {
      {"allreduce", {"parallel.sync=allreduce"}},
      {"zb-h1 2 stages", {"parallel.pp_stages=2", "parallel.microbatches=4", "parallel.schedule=zb-h1"}},
  };
  for (const Variant& v : variants) {
    std::vector<std::string> sets = base;
    sets.push_back("runtime.lm_head_chunk_rows=5");
    sets.insert(sets.end(), v.sets.begin(), v.sets.end());
    const TrainResult two = train(tiny_config(file, sets), MPI_COMM_WORLD, quiet_options(false), true);
    std::vector<float> p0 = two.final_params;
    MPI_Bcast(p0.data(), (int)p0.size(), MPI_FLOAT, 0, MPI_COMM_WORLD);
    // Exact: the ranks end with the same parameters, gathered (pipeline) or updated alike from the
    // same averaged gradient (data parallel).
    EXPECT_EQ(p0, two.final_params) << v.name << ": ranks diverged";
    if (world_rank() != 0) continue;
    ASSERT_EQ(two.losses.size(), one.losses.size()) << v.name;
    double worst = 0;
    for (size_t s = 0; s < one.losses.size(); s++) {
      const double e = std::fabs(two.losses[s] - one.losses[s]) / one.losses[s];
      worst = std::max(worst, e);
      EXPECT_LT(e, bound.loss) << family << " " << v.name << " step " << s;
    }
    const double d = rel_diff(two.final_params, one.final_params);
    EXPECT_LT(d, bound.params) << family << " " << v.name;
    std::printf("%s chunked head, %-16s loss %.6f -> %.6f (1 rank unchunked %.6f -> %.6f), losses within %.1e "
                "(bound %.1e), params rel diff %.1e (bound %.1e)\n",
                family.c_str(), v.name, two.losses.front(), two.losses.back(), one.losses.front(), one.losses.back(),
                worst, bound.loss, d, bound.params);
  }
  if (world_rank() == 0) {
    EXPECT_LT(one.losses.back(), one.losses.front()) << "no progress";  // (progress, not rounding)
  }
}

}  // namespace

TEST(MpiLmHead, ChunkedGpt2EqualsUnchunkedOneRank) { chunked_equals_unchunked("gpt2", {}, false); }
TEST(MpiLmHead, ChunkedLlamaBf16EqualsUnchunkedOneRank) {
  chunked_equals_unchunked("llama", {"runtime.precision=bf16"}, true);
}
