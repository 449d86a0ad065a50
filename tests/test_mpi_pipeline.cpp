// Pipeline parallelism under MPI (engine/engine.h): training with S stages, every
// schedule, equals non-pipelined training on one rank with the same global batch (per-step loss
// and final parameters over 10 steps, to the drift of another summation order: training_drift in
// mpi_test_data.h; micro-batches add their weight gradients in turn where one rank sums the batch's
// rows in one GEMM) for gpt2 (tied embedding: the copies on the first
// and last stage) and llama (untied), bert on S = 2 (gpipe, 1f1b, zb-h1); data parallelism × pipelines (2 × 2 on 4
// ranks, 2 × 3 on 6) equals one rank too; checkpoints are the whole model by name: a pipelined
// run resumes bit for bit, and a PP = 2 checkpoint resumes with PP = 1 and the reverse.
//   Mpi*        -n 2: S = 2
//   MpiN4*      -n 4: S = 4, and DP 2 × PP 2
//   MpiN6*      -n 6: DP 2 × PP 3
#include <gtest/gtest.h>
#include <mpi.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "hf/hf_import.h"
#include "model_test_util.h"
#include "mpi_test_data.h"
#include "engine/engine.h"
#include "runtime/parallel_groups.h"
#include "train/trainer.h"

using namespace llmpi;
using namespace llmpi::testing_support;

namespace {

// The training file of a family (made once, shared by the ranks) and its --set lines.
std::vector<std::string> family_sets(const std::string& family, const std::string& dir) {
  std::vector<std::string> sets = {"model.family=" + family, "train.steps=10", "train.grad_clip=1.0"};
  if (family == "bert") {
    sets.push_back("data.train=" + make_pattern_examples(MPI_COMM_WORLD, dir, "cls.h5", 512, 32, 64, 31));
    sets.insert(sets.end(), {"model.dropout=0", "model.attn_dropout=0", "model.num_labels=2"});
  } else {
    sets.push_back("data.train=" + make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 32));
    if (family == "llama") sets.insert(sets.end(), {"model.n_head=4", "model.n_kv_head=2"});
  }
  return sets;
}


// One rank, no pipeline (rank 0 only; the others get an empty result).
TrainResult one_rank(const Config& cfg, const TrainOptions& o = quiet_options(false)) {
  MPI_Comm solo;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() == 0 ? 0 : MPI_UNDEFINED, 0, &solo);
  TrainResult r;
  if (world_rank() == 0) {
    r = train(cfg, solo, o, true);
    MPI_Comm_free(&solo);
  }
  return r;
}

// bound: rank 0's (training_drift of the one-rank run, whose sums the pipeline runs in another order).
void expect_equal(const TrainResult& one, const TrainResult& pipe, const std::string& what, const Drift& bound) {
  std::vector<float> p0 = pipe.final_params;
  MPI_Bcast(p0.data(), (int)p0.size(), MPI_FLOAT, 0, MPI_COMM_WORLD);
  // Exact: every rank reports the whole model gathered by name from the stages.
  EXPECT_EQ(p0, pipe.final_params) << what << ": ranks report different parameters";
  if (world_rank() != 0) return;
  ASSERT_EQ(pipe.losses.size(), one.losses.size()) << what;
  double worst = 0;
  for (size_t s = 0; s < one.losses.size(); s++) {
    const double e = std::fabs(pipe.losses[s] - one.losses[s]) / one.losses[s];
    worst = std::max(worst, e);
    EXPECT_LT(e, bound.loss) << what << " step " << s;
  }
  const double d = rel_diff(pipe.final_params, one.final_params);
  EXPECT_LT(d, bound.params) << what;
  std::printf("%-40s loss %.6f -> %.6f (1 rank %.6f -> %.6f), losses within %.1e (bound %.1e), params rel diff "
              "%.1e (bound %.1e)\n", what.c_str(), pipe.losses.front(), pipe.losses.back(), one.losses.front(),
              one.losses.back(), worst, bound.loss, d, bound.params);
}

// Every schedule with S = world / dp stages equals one rank.
void every_schedule_equals_one_rank(const std::string& family, int n_layer, std::vector<std::string> schedules,
                                    const std::vector<std::string>& extra = {}) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const int S = world_size();
  std::vector<std::string> base = family_sets(family, dir);
  base.push_back("model.n_layer=" + std::to_string(n_layer));
  base.insert(base.end(), extra.begin(), extra.end());
  const Config ref = tiny_config_of(base, {});
  const TrainResult one = one_rank(ref);
  // Bound: another order of each step's sums from the first step on.
  const Drift bound = world_rank() == 0 ? training_drift(ref, 0, ref.train.steps, one.final_params) : Drift{};
  for (const std::string& sched : schedules) {
    std::vector<std::string> sets = {"parallel.pp_stages=" + std::to_string(S), "parallel.microbatches=4",
                                     "parallel.schedule=" + sched};
    if (sched == "interleaved") sets.push_back("parallel.virtual_stages=2");
    const TrainResult pipe = train(tiny_config_of(base, sets), MPI_COMM_WORLD, quiet_options(false), true);
    expect_equal(one, pipe, family + " S=" + std::to_string(S) + " " + sched, bound);
  }
  if (world_rank() == 0 && family != "bert") {
    EXPECT_LT(one.losses.back(), one.losses.front()) << "no progress";  // (progress, not rounding)
  }
}

const std::vector<std::string> kSchedules = {"gpipe", "1f1b", "interleaved", "zb-h1"};

}  // namespace

TEST(MpiPipeline, Gpt2TwoStagesEverySchedule) { every_schedule_equals_one_rank("gpt2", 4, kSchedules); }
TEST(MpiPipeline, LlamaTwoStagesEverySchedule) { every_schedule_equals_one_rank("llama", 4, kSchedules); }
// Messages far above MPI's eager limit (64 KB: 4 rows x 64 tokens x 64 floats), where a send
// completes only once its receiver is there: a runtime that waits for a send before reusing an
// activation slot deadlocked here with the interleaved schedule.
TEST(MpiPipeline, LargeMessagesEverySchedule) {
  every_schedule_equals_one_rank("gpt2", 4, kSchedules,
                                 {"train.global_batch=16", "model.seq_len=64", "model.d_model=64"});
}
TEST(MpiPipeline, BertTwoStages) { every_schedule_equals_one_rank("bert", 2, {"1f1b", "gpipe", "zb-h1"}); }
// Fused attention (runtime.attention=fused: lse per layer in each activation slot) in the stages,
// zero-bubble's split backward included.
TEST(MpiPipeline, FusedAttentionTwoStages) {
  every_schedule_equals_one_rank("llama", 4, {"1f1b", "zb-h1"}, {"runtime.attention=fused"});
  every_schedule_equals_one_rank("bert", 2, {"zb-h1"}, {"runtime.attention=fused"});
}

// runtime.recompute in the stages (several activation slots, each with its shared buffers) and
// in one rank: the losses and final parameters are the bits of recompute "none". Exact: the
// recomputed forward repeats the same operations on the same values (and dropout keys).
TEST(MpiPipeline, RecomputeGivesTheBitsOfNone) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  for (const std::string family : {"gpt2", "bert"}) {
    std::vector<std::string> base = family_sets(family, dir);
    base.insert(base.end(), {"model.n_layer=4", "train.steps=4", "parallel.pp_stages=2", "parallel.microbatches=4"});
    if (family == "bert") base.insert(base.end(), {"model.dropout=0.1", "model.attn_dropout=0.1"});
    for (const std::string sched : {"1f1b", "interleaved"}) {
      std::vector<std::string> sets = {"parallel.schedule=" + sched};
      if (sched == "interleaved") sets.push_back("parallel.virtual_stages=2");
      const TrainResult none = train(tiny_config_of(base, sets), MPI_COMM_WORLD, quiet_options(false), true);
      for (const std::string rc : {"selective", "full"}) {
        sets.push_back("runtime.recompute=" + rc);
        const TrainResult r = train(tiny_config_of(base, sets), MPI_COMM_WORLD, quiet_options(false), true);
        sets.pop_back();
        const std::string what = family + " " + sched + " " + rc;
        EXPECT_EQ(r.final_params, none.final_params) << what;
        if (world_rank() == 0) {
          EXPECT_EQ(r.losses, none.losses) << what;
        }
      }
    }
  }
}

// Explicit layer counts, and overlapped bucketed sync inside the stages, change nothing; the
// validation loss evaluated along the pipeline equals one rank's.
TEST(MpiPipeline, ExplicitStageLayersOverlapAndEvaluation) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  std::vector<std::string> base = family_sets("gpt2", dir);
  base.insert(base.end(), {"model.n_layer=3", "train.eval_every=5", "train.eval_batches=2",
                           "data.val=" + make_pattern_file(MPI_COMM_WORLD, dir, "val.h5", 4000, 64, 33)});
  const Config ref = tiny_config_of(base, {});
  const TrainResult one = one_rank(ref);
  const TrainResult pipe =
      train(tiny_config_of(base, {"parallel.pp_stages=2", "parallel.microbatches=8", "parallel.stage_layers=[1,2]",
                               "parallel.bucket_mb=0.01", "parallel.overlap=true"}),
            MPI_COMM_WORLD, quiet_options(false), true);
  // Bound: another order of each step's sums; an evaluation's loss, a forward of its step's
  // parameters, drifts as a training step's does.
  const Drift bound = world_rank() == 0 ? training_drift(ref, 0, 10, one.final_params) : Drift{};
  expect_equal(one, pipe, "gpt2 S=2 stage_layers [1,2] overlap", bound);
  if (world_rank() == 0) {
    ASSERT_EQ(pipe.val_losses.size(), 3u);  // steps 0, 5, 10
    ASSERT_EQ(one.val_losses.size(), 3u);
    for (size_t i = 0; i < 3; i++)
      EXPECT_LT(std::fabs(pipe.val_losses[i] - one.val_losses[i]) / one.val_losses[i], bound.loss) << "eval " << i;
  }
}

// Checkpoints hold the whole model by name: PP=2 resumes bit for bit; PP=2 -> PP=1 (on one rank)
// and PP=1 -> PP=2 continue the same training (to summation order).
TEST(MpiPipeline, CheckpointsResumeAcrossStageCounts) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  std::vector<std::string> base = family_sets("gpt2", dir);
  base.push_back("model.n_layer=4");
  auto cfg = [&](const std::string& run, std::vector<std::string> extra) {
    extra.insert(extra.end(), {"train.steps=8", "train.warmup_steps=2", "checkpoint.every=3", "run.dir=" + run});
    return tiny_config_of(base, extra);
  };
  const std::vector<std::string> pp2 = {"parallel.pp_stages=2", "parallel.microbatches=4", "parallel.schedule=1f1b"};
  TrainOptions o = quiet_options(true);
  const TrainResult whole = train(cfg(dir + "/whole", pp2), MPI_COMM_WORLD, o, true);
  TrainOptions cut = o;
  cut.preempt_after_step = 4;  // 5 steps done
  const TrainResult first = train(cfg(dir + "/cut", pp2), MPI_COMM_WORLD, cut, true);
  ASSERT_TRUE(first.preempted);
  TrainOptions again = o;
  again.resume = "auto";
  const TrainResult second = train(cfg(dir + "/cut", pp2), MPI_COMM_WORLD, again, true);
  ASSERT_EQ(second.start_step, 5);
  std::vector<float> joined = first.losses;
  joined.insert(joined.end(), second.losses.begin(), second.losses.end());
  // Exact: the checkpoint holds the parameters, moments and step bit for bit, and the resumed run
  // repeats the same steps with the same stages in the same order.
  EXPECT_EQ(joined, whole.losses) << "PP=2 resume: per-step losses must match bit for bit";
  EXPECT_EQ(second.final_params, whole.final_params) << "PP=2 resume: parameters must match bit for bit";

  // The PP=2 checkpoint of step 5 resumed without a pipeline on one rank.
  MPI_Comm solo;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() == 0 ? 0 : MPI_UNDEFINED, 0, &solo);
  const std::string ckpt = first.last_checkpoint;
  TrainResult flat;
  if (world_rank() == 0) {
    TrainOptions r = quiet_options(false);
    r.resume = ckpt;
    const Config flat_cfg = cfg(dir + "/flat", {});
    flat = train(flat_cfg, solo, r, true);
    MPI_Comm_free(&solo);
    EXPECT_EQ(flat.start_step, 5);
    // Bound: steps 5 to 7 sum in another order than the pipeline's (0 to 4 are the same run).
    const Drift bound = training_drift(flat_cfg, 5, 8, whole.final_params);
    EXPECT_LT(rel_diff(flat.final_params, whole.final_params), bound.params) << "PP=2 checkpoint resumed with PP=1";
    for (size_t s = 0; s < flat.losses.size(); s++)
      EXPECT_LT(std::fabs(flat.losses[s] - whole.losses[5 + s]) / whole.losses[5 + s], bound.loss) << "step " << 5 + s;
  }
  // And a PP=1 checkpoint (one rank) resumed with PP=2.
  std::string flat_ckpt;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() == 0 ? 0 : MPI_UNDEFINED, 0, &solo);
  if (world_rank() == 0) {
    TrainOptions c1 = o;
    c1.preempt_after_step = 4;
    flat_ckpt = train(cfg(dir + "/flat1", {}), solo, c1, true).last_checkpoint;
    MPI_Comm_free(&solo);
  }
  char buf[512] = {0};
  std::snprintf(buf, sizeof buf, "%s", flat_ckpt.c_str());
  MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
  TrainOptions r2 = quiet_options(false);
  r2.resume = buf;
  const Config piped_cfg = cfg(dir + "/piped", pp2);
  const TrainResult piped = train(piped_cfg, MPI_COMM_WORLD, r2, true);
  EXPECT_EQ(piped.start_step, 5);
  if (world_rank() == 0) {
    // Bound: every step's sums in another order (one rank's 0 to 4, the pipeline's 5 to 7).
    const Drift bound = training_drift(piped_cfg, 0, 8, whole.final_params);
    EXPECT_LT(rel_diff(piped.final_params, whole.final_params), bound.params) << "PP=1 -> PP=2";
  }
}

// A bad stage count or micro-batch count is refused on every rank with the fix.
TEST(MpiPipeline, BadSettingsAreRefused) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  std::vector<std::string> base = family_sets("gpt2", dir);
  auto refused = [&](std::vector<std::string> sets, const std::string& needle) {
    try {
      train(tiny_config_of(base, sets), MPI_COMM_WORLD, quiet_options(false));
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const CollectiveError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused({"parallel.pp_stages=2", "parallel.microbatches=3"}, "does not divide the 8 sequences");
  refused({"parallel.pp_stages=2", "model.n_layer=1"}, "fewer than the 2 (virtual) pipeline stages");
  refused({"parallel.pp_stages=2", "parallel.stage_layers=[2,1]"}, "parallel.stage_layers lists 2 counts summing to 3");
  refused({"parallel.pp_stages=2", "parallel.schedule=interleaved", "parallel.microbatches=1",
           "parallel.virtual_stages=2"}, "to be a multiple of parallel.pp_stages");
}

// zb-h1 defers the weight gradients for real. On every stage, watching the gradients after each
// compute action of one step: F and BI leave every dense layer's weight and bias gradient (and
// the embedding's, whose whole backward W runs) as it was, W(m) changes each of them and nothing else; W(m) runs only after the input-only backwards
// of the next s micro-batches (stage s); and the step's gradients equal 1F1B's bit for bit. Exact:
// the same GEMMs on the same values, accumulated in the same micro-batch order (W0 to W3, as
// 1F1B's backwards add them).
namespace {
void zero_bubble_defers_the_weight_gradient() {
  const int S = world_size(), M = 4, rows = 8, T = 16;
  for (const char* family : {"gpt2", "llama"}) {
    SCOPED_TRACE(family);
    const ModelDesc d = test::desc_of(family, 4, 2, 32, T, 64);
    ParallelGroups g(MPI_COMM_WORLD, S, d.head == HeadKind::lm && d.tie_embeddings);
    ParallelConfig pc{};
    pc.sync = SyncMethod::allreduce;
    pc.pp_stages = S;
    pc.microbatches = M;
    pc.virtual_stages = 1;
    const test::RandomBatch rb(d, rows, T, 7);
    const TrainConfig tc = parse_config("{}", "test", {"data.train=-"}).train;
    auto one_step = [&](const std::string& schedule, bool watch) {
      pc.schedule = parse_schedule_kind(schedule);
      EngineOptions eo;
      eo.local_batch = rows;
      eo.T = T;
      eo.seed = 11;
      Engine p(d, cpu_ops(), g, pc, SyncOptions{}, eo);
      p.connect();
      const Model& md = *p.chunks[0].model;
      auto deferred = [&](const ParamSlice& s) { return test::added_by_weight_pass(md, s); };
      std::vector<float> before = md.grads_host();
      std::vector<Action> order;
      if (watch)
        p.after_compute = [&](const Action& a) {
          const std::vector<float> now = md.grads_host();
          int dense = 0;
          for (const ParamSlice& s : md.table.slices) {
            const bool changed =
                std::memcmp(now.data() + s.offset, before.data() + s.offset, s.numel * sizeof(float)) != 0;
            if (!deferred(s)) {
              if (a.type == ActionType::W) {
                EXPECT_FALSE(changed) << action_string(a) << " changed " << s.name;
              }
              continue;
            }
            dense++;
            if (a.type == ActionType::W)
              EXPECT_TRUE(changed) << action_string(a) << " left " << s.name << " unchanged";
            else
              EXPECT_FALSE(changed) << action_string(a) << " changed the weight gradient " << s.name;
          }
          EXPECT_GT(dense, 0);
          order.push_back(a);
          before = now;
        };
      p.step(0, rb.b, 1e-3, tc);
      if (watch) {
        auto at = [&](ActionType t, int m) {
          for (size_t i = 0; i < order.size(); i++)
            if (order[i].type == t && order[i].mb == m) return (int)i;
          ADD_FAILURE() << action_type_name(t) << m << " did not run";
          return -1;
        };
        for (int m = 0; m < M; m++) {
          EXPECT_GT(at(ActionType::W, m), at(ActionType::BI, std::min(m + g.stage, M - 1)))
              << "stage " << g.stage << ": W" << m << " is not deferred by " << g.stage << " micro-batches";
        }
      }
      return md.grads_host();
    };
    const std::vector<float> zb = one_step("zb-h1", true), f1b = one_step("1f1b", false);
    EXPECT_EQ(zb, f1b) << "zb-h1's gradients differ from 1F1B's";
  }
}
}  // namespace
TEST(MpiPipeline, ZeroBubbleDefersTheWeightGradient) { zero_bubble_defers_the_weight_gradient(); }

// --init-from with stages: every stage reads its own tensors by name from the Hugging Face
// directory (gpt2's tied head copy reads the embedding). With lr 0 the gathered parameters after a
// step are bit for bit those of a PP = 1 run from the same directory (and not the seeded ones),
// and the first loss equals PP = 1's to rounding; with a learning rate, 5 steps stay within
// sgd_training_drift of PP = 1.
TEST(MpiPipeline, InitFromHuggingFaceEqualsOneRank) {
  std::string fixtures;
  for (std::string base : {"tests/fixtures/hf/", "../tests/fixtures/hf/"})
    if (std::ifstream(base + "gpt2/config.json")) fixtures = base;
  ASSERT_FALSE(fixtures.empty()) << "run the tests from the project root (tests/fixtures/hf/ not found)";
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const std::string data = make_pattern_file(MPI_COMM_WORLD, dir, "hf.h5", 20000, 320, 5);
  for (const std::string family : {"gpt2", "llama"}) {
    const HfConfig hf = read_hf_config(fixtures + family);
    auto cfg = [&](const std::string& lr, int steps, std::vector<std::string> extra) {
      std::vector<std::string> sets = {"data.train=" + data, "runtime.device=cpu", "model.seq_len=32",
                                       "train.global_batch=8", "train.lr=" + lr, "train.weight_decay=0",
                                       "train.steps=" + std::to_string(steps), "train.warmup_steps=0",
                                       "train.log_every=1", "train.eval_every=0"};
      sets.insert(sets.end(), extra.begin(), extra.end());
      return parse_config("{}", "test", sets, &hf.source);
    };
    TrainOptions o = quiet_options(false);
    o.init_from = fixtures + family;
    const std::vector<std::string> pp2 = {"parallel.pp_stages=2", "parallel.microbatches=4"};
    // lr 0: the imported parameters, gathered from the stages
    const TrainResult one = one_rank(cfg("0", 1, {}), o);
    const TrainResult pipe = train(cfg("0", 1, pp2), MPI_COMM_WORLD, o, true);
    const TrainResult seeded = train(cfg("0", 1, pp2), MPI_COMM_WORLD, quiet_options(false), true);
    if (world_rank() == 0) {
      // Exact: with lr 0 and no weight decay the step leaves every parameter as imported (p - 0).
      EXPECT_EQ(pipe.final_params, one.final_params) << family << ": PP=2 --init-from differs from PP=1";
      EXPECT_NE(pipe.final_params, seeded.final_params) << family << ": --init-from left the seeded values";
      ASSERT_EQ(pipe.losses.size(), 1u);
      // Bound: the loss is the same function of the same parameters, reduced in another order
      // (the mean of 4 micro-batch means against one mean of 8 rows, each rounded from a double
      // sum to float: 2·2^-24) from rows whose GEMMs may sum in another order for other row counts
      // (the forward's 2·gamma(K): training_drift over no steps).
      const double bound = 0x1p-23 + training_drift(cfg("0", 1, {}), 0, 0, one.final_params).loss;
      EXPECT_NEAR(pipe.losses[0], one.losses[0], bound * std::fabs(one.losses[0])) << family;
    }
    // and training from there, with SGD: gpt2's key bias has an analytically zero gradient (a
    // constant added to every key's score), so its gradient is rounding noise, which differs with
    // the summation order and which Adam's normalisation would turn into steps of ±lr.
    const Config sgd = cfg("0.1", 5, {"train.optimizer=sgd"});
    const TrainResult sgd_one = one_rank(sgd, o);
    Drift bound{};
    if (world_rank() == 0)  // Bound: another order of each step's sums, plain SGD's steps
      bound = sgd_training_drift(sgd, 0, 5, sgd_one.final_params,
                                 *std::max_element(sgd_one.losses.begin(), sgd_one.losses.end()));
    expect_equal(sgd_one, train(cfg("0.1", 5, {"train.optimizer=sgd", pp2[0], pp2[1]}), MPI_COMM_WORLD, o, true),
                 family + " --init-from PP=2, SGD", bound);
  }
}

// The start-up memory estimate of every rank of a pipeline (train/setup.cpp check_memory: the
// chunks rank_chunks gives, its tensor shard, its data-parallel rank) against what its Engine
// holds: the parameters of its chunks, AdamW's moments (ZeRO-1: its pieces), every activation slot
// of its schedule (zb-h1: with the kept input gradients) and what it writes to a checkpoint
// (Engine::state_ranges). Byte counts: exact.
TEST(MpiN4Pipeline, MemoryEstimateOfEachRankIsWhatItsEngineHolds) {
  struct Layout {
    const char* family;
    std::vector<std::string> sets;
  };
  const int T = 16, rows = 8;
  for (const Layout& l : {Layout{"gpt2", {"parallel.pp_stages=2", "parallel.tp=2", "parallel.schedule=1f1b"}},
                          Layout{"llama", {"parallel.pp_stages=2", "parallel.zero=1", "parallel.schedule=gpipe"}},
                          Layout{"gpt2", {"parallel.pp_stages=4", "parallel.schedule=zb-h1"}},
                          Layout{"gpt2", {"parallel.pp_stages=2", "parallel.schedule=interleaved",
                                          "parallel.virtual_stages=2", "parallel.zero=1"}}}) {
    std::vector<std::string> sets = l.sets;
    for (const char* k : {"data.train=-", "parallel.microbatches=4", "checkpoint.every=5"}) sets.push_back(k);
    const Config cfg = parse_config("{}", "test", sets);
    const std::string what = std::string(l.family) + " " + cfg.resolved["parallel"].dump();
    SCOPED_TRACE(what);
    const ModelDesc d = test::desc_of(l.family, 4, 2, 32, T, 64);
    const int tp = cfg.parallel.tp;
    ParallelGroups g(MPI_COMM_WORLD, cfg.parallel.pp_stages, d.head == HeadKind::lm && d.tie_embeddings, tp);
    EngineOptions eo;
    eo.local_batch = rows;
    eo.T = T;
    eo.seed = 3;
    Engine e(d, cpu_ops(), g, cfg.parallel, sync_options(cfg.parallel), eo);
    RankChunks rc = rank_chunks(d, cfg.parallel, T, g.stage);
    rc.tp = tp, rc.tp_rank = g.tp_rank;
    const ModelDesc shard = tp > 1 ? tensor_shard(d, tp, g.tp_rank) : d;
    const MemoryEstimate est = estimate_memory(shard, rows, T, cfg, g.dp, g.dp_rank, false, &rc);
    double params = 0, moments = 0, activations = 0, written = 0;
    for (const ModelChunk& ch : e.chunks) {
      params += (double)ch.model->table.numel;
      moments += 2.0 * (double)ch.opt->n;
      for (const auto& slot : ch.slots) activations += (double)(slot->bytes() + slot->losses_host.size() * sizeof(float));
    }
    for (int which = 0; which < 3; which++)
      for (const Engine::StateRange& sr : e.state_ranges(which, true, false)) written += (double)(sr.hi - sr.lo);
    EXPECT_EQ(est.n_params, (int64_t)params) << "stage " << g.stage;
    EXPECT_EQ(est.optimizer, 4 * moments) << "stage " << g.stage;
    EXPECT_EQ(est.activations, activations) << "stage " << g.stage;
    EXPECT_EQ(est.checkpoint_save, 4 * written) << "stage " << g.stage;
  }
}

TEST(MpiN4Pipeline, ZeroBubbleDefersTheWeightGradient) { zero_bubble_defers_the_weight_gradient(); }
TEST(MpiN4Pipeline, Gpt2FourStagesEverySchedule) { every_schedule_equals_one_rank("gpt2", 8, kSchedules); }
TEST(MpiN4Pipeline, LlamaFourStagesEverySchedule) { every_schedule_equals_one_rank("llama", 8, kSchedules); }

// 2 data-parallel replicas × 2 stages on 4 ranks equals one rank.
TEST(MpiN4Pipeline, TwoPipelinesOfTwoStagesEqualOneRank) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  for (const std::string family : {"gpt2", "llama"}) {
    std::vector<std::string> base = family_sets(family, dir);
    base.push_back("model.n_layer=4");
    const Config ref = tiny_config_of(base, {});
    const TrainResult one = one_rank(ref);
    const TrainResult pipe = train(tiny_config_of(base, {"parallel.pp_stages=2", "parallel.microbatches=2"}),
                                   MPI_COMM_WORLD, quiet_options(false), true);
    // Bound: another order of each step's sums (micro-batches, then the replicas' all-reduce).
    expect_equal(one, pipe, family + " DP2 x PP2",
                 world_rank() == 0 ? training_drift(ref, 0, 10, one.final_params) : Drift{});
  }
}

// 2 pipelines × 3 stages on 6 ranks (the course's picture) runs, and equals one rank.
TEST(MpiN6Pipeline, TwoPipelinesOfThreeStages) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  std::vector<std::string> base = family_sets("gpt2", dir);
  base.push_back("model.n_layer=3");
  const Config ref = tiny_config_of(base, {});
  const TrainResult one = one_rank(ref);
  const TrainResult pipe = train(tiny_config_of(base, {"parallel.pp_stages=3", "parallel.microbatches=4"}),
                                 MPI_COMM_WORLD, quiet_options(false), true);
  // Bound: another order of each step's sums (micro-batches, then the replicas' all-reduce).
  expect_equal(one, pipe, "gpt2 DP2 x PP3", world_rank() == 0 ? training_drift(ref, 0, 10, one.final_params) : Drift{});
}
