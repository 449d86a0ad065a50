// Gradient accumulation (parallel.microbatches M with pp_stages 1; engine/engine.h): M
// micro-batches per step, their gradients added, one gradient sync per step during the last
// micro-batch's backward. Under MPI (-n 2), for every family and every sync method (ZeRO-1 and
// overlapped buckets included): 10 steps with 4 micro-batches of 1 sequence per rank equal one
// batch of 4 per rank (the same global batch), loss by loss and in the final parameters, to the
// drift of another summation order (training_drift, mpi_test_data.h; bf16 on the wire: its
// rounding, see Variant); a step is synchronised once (the same traffic). (The activations held,
// a micro-batch's: tests/test_memory_estimate.cpp.)
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>

#include "mpi_test_data.h"
#include "train/trainer.h"

using namespace llmpi;
using namespace llmpi::testing_support;

namespace {

struct Variant {
  const char* name;
  std::vector<std::string> sets;
  // bf16 on the wire rounds each gradient element to bfloat16 before the exchange: an element
  // whose fp32 value lies within the summation order's difference of a rounding boundary rounds
  // the other way, a whole bf16 spacing apart (bf16_flips).
  bool bf16_wire = false;
};

const std::vector<Variant>& sync_variants() {
  static const std::vector<Variant> v = {
      {"allreduce", {"parallel.sync=allreduce"}},
      {"gather_scatter", {"parallel.sync=gather_scatter"}},
      {"weights", {"parallel.sync=weights"}},
      {"allreduce overlap", {"parallel.sync=allreduce", "parallel.overlap=true", "parallel.bucket_mb=0.01",
                             "parallel.first_bucket_mb=0.002"}},
      {"allreduce ZeRO-1", {"parallel.sync=allreduce", "parallel.zero=1", "parallel.bucket_mb=0.01"}},
      {"gather_scatter ZeRO-1", {"parallel.sync=gather_scatter", "parallel.zero=1"}},
      {"allreduce bf16 on the wire", {"parallel.sync=allreduce", "parallel.grad_dtype=bf16"}, true},
  };
  return v;
}

double rel(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-30); }

void accumulation_equals_one_batch(const std::string& family) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  std::vector<std::string> base = {"model.family=" + family, "train.steps=10", "train.global_batch=8",
                                   "train.eval_every=0"};
  std::string data;
  if (family == "bert") {
    data = make_pattern_examples(MPI_COMM_WORLD, dir, "cls.h5", 512, 32, 64, 31);
    // dropout keys depend on the micro-batch: off, so both runs compute the same function
    base.insert(base.end(), {"model.dropout=0", "model.attn_dropout=0", "model.num_labels=2"});
  } else {
    data = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 32);
    if (family == "llama") base.insert(base.end(), {"model.n_head=4", "model.n_kv_head=2"});
  }
  for (const Variant& v : sync_variants()) {
    SCOPED_TRACE(family + " " + v.name);
    std::vector<std::string> sets = base;
    sets.insert(sets.end(), v.sets.begin(), v.sets.end());
    std::vector<std::string> acc = sets;
    acc.push_back("parallel.microbatches=4");
    const Config ref = tiny_config(data, sets);
    const TrainResult one = train(ref, MPI_COMM_WORLD, quiet_options(false), true);
    const TrainResult four = train(tiny_config(data, acc), MPI_COMM_WORLD, quiet_options(false), true);
    ASSERT_EQ(one.losses.size(), 10u);
    ASSERT_EQ(four.losses.size(), 10u);
    // Bound: one GEMM over a rank's 4 × 32 rows against four of 32 added in turn (the weights'
    // gradients; the bias's column sums run row by row alike) is another order of the same sums:
    // training_drift, with bf16 on the wire the flips of its rounding.
    const Drift bound = training_drift(ref, 0, 10, one.final_params, v.bf16_wire ? bf16_flips(order_delta(ref)) : 0);
    double worst = 0;
    for (size_t s = 0; s < 10; s++) {
      worst = std::max(worst, rel(four.losses[s], one.losses[s]));
      EXPECT_LE(rel(four.losses[s], one.losses[s]), bound.loss) << "step " << s << ": " << four.losses[s] << " vs "
                                                                  << one.losses[s];
    }
    const double params = rel_diff(four.final_params, one.final_params);
    EXPECT_LE(params, bound.params) << "final parameters";
    // One sync per step whatever M: the same traffic (bytes of the last step).
    EXPECT_EQ(four.bytes_sent_last_step, one.bytes_sent_last_step);
    if (world_rank() == 0)
      std::printf("%s %-28s losses within %.1e (bound %.1e), params within %.1e (bound %.1e) (4 micro-batches vs 1 "
                  "batch)\n", family.c_str(), v.name, worst, bound.loss, params, bound.params);
    // The loss fell: the runs train (not two copies of something stuck). (Progress, not rounding.)
    EXPECT_LT(four.losses.back(), four.losses.front());
  }
}

}  // namespace

TEST(MpiAccumulation, Gpt2EverySyncMethodEqualsOneBatch) { accumulation_equals_one_batch("gpt2"); }
TEST(MpiAccumulation, LlamaEverySyncMethodEqualsOneBatch) { accumulation_equals_one_batch("llama"); }
TEST(MpiAccumulation, BertEverySyncMethodEqualsOneBatch) { accumulation_equals_one_batch("bert"); }

// M that does not divide the rank's batch is refused on every rank, naming the fix.
TEST(MpiAccumulation, MicroBatchesNotDividingTheBatchAreRefused) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const std::string data = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 32);
  try {
    train(tiny_config(data, {"train.steps=2", "parallel.microbatches=3"}), MPI_COMM_WORLD, quiet_options(false));
    ADD_FAILURE() << "accepted microbatches 3 with 4 sequences per rank";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.microbatches 3 does not divide the 4 sequences each rank gets"),
              std::string::npos)
        << e.what();
  }
}
