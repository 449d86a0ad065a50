// Tensor parallelism under MPI (model/transformer.h "Tensor parallelism"):
//   - a shard Model of every family initialises as its part of the whole model, and its loss
//     (the vocabulary-parallel cross-entropy, row by row: chunked, fused, one chunk) and
//     gradients equal the whole model's part of them, on a vocabulary that does not split evenly;
//   - training with parallel.tp = T, alone and with data parallelism (ZeRO-1) and pipelines,
//     equals one rank over 10 steps (per-step loss and final parameters, to the drift of another
//     summation order: training_drift in mpi_test_data.h);
//   - sequence parallelism (norms, residuals, hidden dropout on each rank's rows) the same, with
//     less activation memory;
//   - checkpoints are whole and by name: T = 2 -> 1 and 1 -> 4 continue the same training;
//   - a model that does not split is refused on every rank, naming the key.
//   Mpi*        -n 2: T = 2
//   MpiN4*      -n 4: T = 4, T 2 × PP 2, T 2 × DP 2, the resumes
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "comm/tensor_group.h"
#include "model/transformer.h"
#include "model_test_util.h"
#include "mpi_test_data.h"
#include "train/trainer.h"

using namespace llmpi;
using namespace llmpi::testing_support;

namespace {

// |a - b| / |b| over a tensor (L2 norms, as rel_diff; the norm of a - b when b is 0).
double rel_l2(const float* a, const float* b, size_t n) {
  double d = 0, m = 0;
  for (size_t i = 0; i < n; i++) {
    d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    m += (double)b[i] * b[i];
  }
  return m > 0 ? std::sqrt(d / m) : std::sqrt(d);
}

// One step of shard `rank` of world_size() against the whole model on every rank.
void shard_equals_whole(const std::string& family, const std::vector<std::string>& extra, int chunk_rows,
                        bool fused_head, bool sequence_parallel = false) {
  const int W = world_size(), r = world_rank();
  const int B = 4, T = 16, V = 67;  // 67 rows: shards of 33 + 34 (T = 2), 16 + 17 + 17 + 17 (T = 4)
  std::vector<std::string> sets;
  bool fused_attention = false;
  for (const std::string& e : extra) {
    if (e == "runtime.attention=fused") fused_attention = true;
    else sets.push_back(e);
  }
  ModelDesc d = test::desc_of(family, 2, 4, 32, T, V, sets);
  d.lm_head_chunk_rows = chunk_rows;
  if (fused_attention) d.attention = AttentionImpl::fused;
  const Ops& ops = cpu_ops();
  Model whole(d, ops);
  ModelDesc sd = tensor_shard(d, W, r);
  sd.sequence_parallel = sequence_parallel;
  Model shard(sd, ops);
  shard.tensor = make_tensor_group(ops, MPI_COMM_WORLD, false);
  whole.init_params(5);
  shard.init_params(5);
  const std::vector<float> wp = whole.params_host(), sp = shard.params_host();
  for (const ParamSlice& s : shard.table.slices) {
    const ParamSlice& ws = whole.table.at(s.name);
    std::vector<float> expect(s.numel);
    if (s.sharded()) take_shard(s, wp.data() + ws.offset, expect.data());
    else std::copy(wp.begin() + ws.offset, wp.begin() + ws.offset + s.numel, expect.begin());
    // Exact: each tensor is drawn by name from the same seed, the shard keeping its part of it.
    EXPECT_TRUE(std::equal(expect.begin(), expect.end(), sp.begin() + s.offset)) << s.name << ": initial values";
  }
  const test::RandomBatch rb(d, B, T, 17);
  const std::vector<double> magnitude = test::gradient_magnitude(whole, rb.b, B, T);
  Activations aw(whole, B, T), as(shard, B, T);
  whole.zero_grads();
  shard.zero_grads();
  float lw, ls;
  if (fused_head) {
    lw = whole.forward(aw, rb.b, HeadMode::fused);
    ls = shard.forward(as, rb.b, HeadMode::fused);
  } else {
    lw = whole.forward(aw, rb.b, HeadMode::train);
    ls = shard.forward(as, rb.b, HeadMode::train);
  }
  whole.backward(aw);
  shard.backward(as);
  // Bound: each row's logits carry the rounding of the sums each side runs in its own order (the
  // row-parallel partial sums of up to K = 128 channels, the vocabulary's maxima and sums in
  // pieces), within gamma(128) = 7.6e-6 of their magnitude on either side, so 2·gamma(128) apart;
  // a row's loss log sum exp z - z_y moves by at most 2·max|dz| (its gradient in z, p - y, has L1
  // norm 2). Near-uniform predictions: the logits' magnitude is under the row's loss (log V,
  // log 2), which does not cancel: 4·gamma(128) of it, per row and in their mean.
  const double loss_bound = 4 * gamma_fp32(4.0 * d.d_model);
  EXPECT_LT(std::fabs(ls - lw) / std::fabs(lw), loss_bound)
      << family << ": loss " << ls << " vs the whole model's " << lw;
  ASSERT_EQ(as.losses_host.size(), aw.losses_host.size());
  EXPECT_LT(rel_l2(as.losses_host.data(), aw.losses_host.data(), aw.losses_host.size()), loss_bound)
      << family << ": the per-row losses (the cross-entropy across the vocabulary shards)";
  const std::vector<float> wg = whole.grads_host(), sg = shard.grads_host();
  // The shard computes the whole model's sums in other orders (the row-parallel GEMMs' partial
  // sums added across ranks, the vocabulary-parallel softmax's maxima and sums), so each gradient
  // differs from the whole model's by rounding: a sum of K terms by at most gamma(K) =
  // K·u/(1 - K·u) (u = 2^-24) times the sum of its terms' magnitudes, passed on through the
  // layers. The longest sums here are the MLP's K = 128 channels (gamma 7.6e-6), each side within
  // gamma(K) of exact, so each tensor's difference is held to 2·gamma(128) = 1.5e-5 of the
  // magnitude of what its gradient sums over the batch (gradient_magnitude: the per-example
  // gradients' magnitudes, standing for those of the products summed; a first-order bound, the
  // propagation through the layers not counted), not of the gradient itself: where the examples' parts cancel (bert's
  // classifier bias on near-uniform predictions) the gradient is much smaller than its terms, and
  // its difference relative to its own norm is large with no error in it. The key bias's
  // gradient is zero in exact arithmetic (softmax does not change when every score of a row moves
  // alike), in every example too, so its values and its magnitude are rounding noise. Its terms,
  // the scores' gradients times the queries, are of the size of the query bias's, the same
  // gradients times the keys (projections of the same activations by weights of one
  // distribution): it is held to the same bound of the query bias's magnitude (root mean square per
  // element).
  const double grad_bound = 2 * gamma_fp32(4.0 * d.d_model);
  int sharded = 0;
  double worst = 0;
  for (const ParamSlice& s : shard.table.slices) {
    const ParamSlice& ws = whole.table.at(s.name);
    std::vector<float> expect(s.numel);
    if (s.sharded()) take_shard(s, wg.data() + ws.offset, expect.data()), sharded++;
    else std::copy(wg.begin() + ws.offset, wg.begin() + ws.offset + s.numel, expect.begin());
    if (s.name.find("key.bias") != std::string::npos || s.name.find("k_proj.bias") != std::string::npos) {
      std::string query = s.name;
      const size_t at = query.find("key.bias");
      if (at != std::string::npos) query.replace(at, 3, "query");
      else query.replace(query.find("k_proj.bias"), 1, "q");
      const ParamSlice& wq = whole.table.at(query);
      double mq = 0;
      for (size_t i = 0; i < wq.numel; i++) mq += magnitude[wq.offset + i] * magnitude[wq.offset + i];
      const std::vector<double> stand_in(s.numel, std::sqrt(mq / wq.numel));
      const double e = test::rel_to_magnitude(sg.data() + s.offset, expect.data(), stand_in.data(), s.numel);
      EXPECT_LT(e, grad_bound) << family << ": gradient of " << s.name << " (against " << query << "'s magnitude)";
      worst = std::max(worst, e);
      continue;
    }
    std::vector<double> mag(s.numel);
    if (s.sharded()) {
      std::vector<float> wm(ws.numel), piece(s.numel);
      for (size_t i = 0; i < ws.numel; i++) wm[i] = (float)magnitude[ws.offset + i];
      take_shard(s, wm.data(), piece.data());
      std::copy(piece.begin(), piece.end(), mag.begin());
    } else {
      std::copy(magnitude.begin() + ws.offset, magnitude.begin() + ws.offset + s.numel, mag.begin());
    }
    const double e = test::rel_to_magnitude(sg.data() + s.offset, expect.data(), mag.data(), s.numel);
    EXPECT_LT(e, grad_bound) << family << ": gradient of " << s.name << " ("
                       << rel_l2(sg.data() + s.offset, expect.data(), s.numel) << " of its own norm)";
    worst = std::max(worst, e);
  }
  if (r == 0)
    std::printf("%s T=%d%s: loss %.7f (whole %.7f; %.1e apart, rows %.1e, bound %.1e), worst gradient difference "
                "%.1e of its magnitude\n", family.c_str(), W, sequence_parallel ? " sequence-parallel" : "", ls, lw,
                std::fabs(ls - lw) / std::fabs(lw),
                rel_l2(as.losses_host.data(), aw.losses_host.data(), aw.losses_host.size()), loss_bound, worst);
  EXPECT_GT(sharded, 0);
  EXPECT_LT(shard.table.numel, whole.table.numel);
  if (sequence_parallel) {  // the residual stream's tensors on this rank's rows: less than without
    ModelDesc plain = tensor_shard(d, W, r);
    Model no_sp(plain, ops);
    Activations ap(no_sp, B, T);
    EXPECT_LT(as.bytes(), ap.bytes()) << family << ": sequence parallelism keeps no less";
  }
}

void every_family_shard_equals_whole() {
  const std::string kv = world_size() == 2 ? "model.n_kv_head=2" : "model.n_kv_head=4";
  for (bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "fused head" : "chunked head");
    shard_equals_whole("gpt2", {}, 5, fused);  // 13 chunks of 5 rows
    shard_equals_whole("gpt2", {}, 0, fused);  // one chunk
    shard_equals_whole("llama", {kv}, 7, fused);
    shard_equals_whole("bert", {}, 0, fused);
  }
  shard_equals_whole("llama", {kv, "runtime.attention=fused"}, 0, false);
  for (bool fused : {false, true}) {  // sequence parallelism
    SCOPED_TRACE(fused ? "sequence parallel, fused head" : "sequence parallel, chunked head");
    shard_equals_whole("gpt2", {}, 5, fused, true);
    shard_equals_whole("llama", {kv}, 0, fused, true);
    shard_equals_whole("bert", {}, 0, fused, true);
  }
}

// ---- training -----------------------------------------------------------------------------------



// Training on the first `ranks` ranks of the world (the others get an empty result).
TrainResult on_ranks(int ranks, const Config& cfg, const TrainOptions& o = quiet_options(false)) {
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() < ranks ? 0 : MPI_UNDEFINED, 0, &sub);
  TrainResult r;
  if (sub != MPI_COMM_NULL) {
    r = train(cfg, sub, o, true);
    MPI_Comm_free(&sub);
  }
  return r;
}

// Rank 0 compares; final_params are the whole model's on every rank (gathered by name). bound:
// training_drift of the reference over the steps whose sums the two runs order otherwise.
void expect_close(const TrainResult& ref, const TrainResult& got, const std::string& what, const Drift& bound,
                  size_t first_step = 0) {
  if (world_rank() != 0) return;
  ASSERT_EQ(got.losses.size() + first_step, ref.losses.size()) << what;
  double worst = 0;
  for (size_t s = 0; s < got.losses.size(); s++) {
    const double e = std::fabs(got.losses[s] - ref.losses[first_step + s]) / ref.losses[first_step + s];
    worst = std::max(worst, e);
    EXPECT_LT(e, bound.loss) << what << " step " << first_step + s;
  }
  const double d = rel_diff(got.final_params, ref.final_params);
  EXPECT_LT(d, bound.params) << what;
  std::printf("%-44s loss %.6f -> %.6f (1 rank %.6f -> %.6f), losses within %.1e (bound %.1e), params rel diff %.1e "
              "(bound %.1e)\n", what.c_str(), got.losses.front(), got.losses.back(), ref.losses[first_step],
              ref.losses.back(), worst, bound.loss, d, bound.params);
}

// Each layout (its --set lines, on every rank of the world) trains as one rank does.
void layouts_equal_one_rank(const std::string& family, const std::vector<std::vector<std::string>>& layouts,
                            const std::vector<std::string>& reference = {}) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const std::vector<std::string> base = family_run_sets(family, dir);
  const Config ref = tiny_config_of(base, reference);
  const TrainResult one = on_ranks(1, ref);
  // Bound: the shards' partial sums, the replicas' and micro-batches' gradients added, are another
  // order of each step's sums from the first step on.
  const Drift bound = world_rank() == 0 ? training_drift(ref, 0, ref.train.steps, one.final_params) : Drift{};
  for (const std::vector<std::string>& layout : layouts) {
    const TrainResult r = train(tiny_config_of(base, layout), MPI_COMM_WORLD, quiet_options(false), true);
    std::string what = family;
    for (const std::string& s : layout)
      if (s.rfind("parallel.", 0) == 0 || s.rfind("runtime.", 0) == 0) what += " " + s.substr(s.find('.') + 1);
    expect_close(one, r, what, bound);
  }
  if (world_rank() == 0 && family != "bert") {
    EXPECT_LT(one.losses.back(), one.losses.front()) << "no progress";  // (progress, not rounding)
  }
}

}  // namespace

TEST(MpiTensorParallel, ShardsEqualTheWholeModel) { every_family_shard_equals_whole(); }
TEST(MpiN4TensorParallel, ShardsEqualTheWholeModel) { every_family_shard_equals_whole(); }

TEST(MpiTensorParallel, TrainingEqualsOneRank) {
  layouts_equal_one_rank("gpt2", {{"parallel.tp=2"}});
  layouts_equal_one_rank("llama", {{"parallel.tp=2", "runtime.attention=fused"}});
  // (hidden dropout on: its masks are the same on both ranks of the group)
  layouts_equal_one_rank("bert", {{"parallel.tp=2"}});
  // sequence parallelism (bert without dropout: each rank draws masks for its own rows)
  layouts_equal_one_rank("gpt2", {{"parallel.tp=2", "parallel.sequence_parallel=true"}});
  layouts_equal_one_rank("bert", {{"parallel.tp=2", "parallel.sequence_parallel=true", "model.dropout=0"}},
                         {"model.dropout=0"});
}

TEST(MpiN4TensorParallel, WithPipelinesAndDataParallelism) {
  const std::vector<std::string> pp = {"parallel.tp=2", "parallel.pp_stages=2", "parallel.microbatches=4"};
  std::vector<std::string> zb = pp;
  zb.push_back("parallel.schedule=zb-h1");
  std::vector<std::string> pp_sp = pp;
  pp_sp.push_back("parallel.sequence_parallel=true");
  layouts_equal_one_rank("gpt2", {{"parallel.tp=4"}, pp, {"parallel.tp=4", "parallel.sequence_parallel=true"}});
  layouts_equal_one_rank("llama", {zb, pp_sp, {"parallel.tp=2", "parallel.zero=1"}});
  // (without dropout: replicas and micro-batches draw other masks than one rank's batch)
  layouts_equal_one_rank("bert", {{"parallel.tp=2", "model.dropout=0"}}, {"model.dropout=0"});
}

// Checkpoints are whole and by name: a T = 2 checkpoint resumed on one rank, a one-rank checkpoint
// resumed with T = 4, each continuing the uninterrupted run.
TEST(MpiN4TensorParallel, CheckpointsResumeAcrossTensorParallelDegrees) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const std::vector<std::string> base = family_run_sets("llama", dir);
  auto cfg = [&](const std::string& run, std::vector<std::string> extra) {
    extra.insert(extra.end(), {"train.steps=8", "train.warmup_steps=2", "checkpoint.every=3", "run.dir=" + dir + run,
                               "model.n_kv_head=4"});
    return tiny_config_of(base, extra);
  };
  const TrainResult whole = on_ranks(1, cfg("/whole", {}), quiet_options(true));
  const Config ref = cfg("/whole", {});
  // 2 -> 1
  const TrainResult first = on_ranks(2, cfg("/tp2", {"parallel.tp=2"}), train_options(true, "", 4));
  if (world_rank() == 0) {
    ASSERT_TRUE(first.preempted);
  }
  const TrainResult flat = on_ranks(1, cfg("/tp2", {}), train_options(true, "auto"));
  if (world_rank() == 0) {
    EXPECT_EQ(flat.start_step, 5);
  }
  // Bound: steps 0 to 4 ran with T = 2, 5 to 7 after them: every step's sums in another order.
  expect_close(whole, flat, "llama T=2 checkpoint resumed with T=1",
               world_rank() == 0 ? training_drift(ref, 0, 8, whole.final_params) : Drift{}, 5);
  // 1 -> 4
  on_ranks(1, cfg("/tp4", {}), train_options(true, "", 4));
  const TrainResult wide = train(cfg("/tp4", {"parallel.tp=4"}), MPI_COMM_WORLD, train_options(true, "auto"), true);
  if (world_rank() == 0) {
    EXPECT_EQ(wide.start_step, 5);
  }
  // Bound: steps 0 to 4 are the uninterrupted run's (one rank, the same bits), 5 to 7 with T = 4.
  expect_close(whole, wide, "llama T=1 checkpoint resumed with T=4",
               world_rank() == 0 ? training_drift(ref, 5, 8, whole.final_params) : Drift{}, 5);
}

// What does not split is refused on every rank, naming the key and the fix.
TEST(MpiN4TensorParallel, ModelsThatDoNotSplitAreRefused) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  auto refused = [&](const std::string& family, std::vector<std::string> sets, const std::string& needle) {
    try {
      train(tiny_config_of(family_run_sets(family, dir), sets), MPI_COMM_WORLD, quiet_options(false));
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const CollectiveError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused("llama", {"parallel.tp=4"}, "parallel.tp 4 does not divide the 2 key/value heads (model.n_kv_head)");
  refused("gpt2", {"parallel.tp=4", "model.n_head=2"}, "parallel.tp 4 does not divide model.n_head 2");
  refused("gpt2", {"parallel.tp=4", "model.ffn_dim=66"}, "does not divide the MLP width 66 (model.ffn_dim)");
  refused("gpt2", {"parallel.tp=3"}, "parallel.tp 3 does not divide the 4 ranks");
  refused("gpt2", {"parallel.tp=2", "parallel.pp_stages=4"}, "parallel.pp_stages 4 × parallel.tp 2 does not divide");
  auto bad_config = [&](std::vector<std::string> sets, const std::string& needle) {
    try {
      tiny_config_of(family_run_sets("gpt2", dir), sets);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  bad_config({"parallel.tp=4", "parallel.sequence_parallel=true", "model.seq_len=30"},
             "model.seq_len (30) must be a multiple of parallel.tp (4)");
  bad_config({"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.pp_stages=2", "parallel.schedule=zb-h1"},
             "does not combine with parallel.schedule \"zb-h1\"");
}

// Sharded checkpoints (checkpoint/sharded.h): DP 2 x TP 2 with ZeRO-1 and PP 2 x TP 2 each save
// only what they own into one file, which resumes on one rank and on four data-parallel replicas
// with ZeRO-1, each continuing the uninterrupted run (AdamW's moments included: a wrong piece
// would change the steps after the resume).
TEST(MpiN4TensorParallel, ShardedCheckpointsResumeInOtherLayouts) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const std::vector<std::string> base = family_run_sets("gpt2", dir);
  auto cfg = [&](const std::string& run, std::vector<std::string> extra) {
    extra.insert(extra.end(), {"train.steps=8", "train.warmup_steps=2", "checkpoint.every=3", "run.dir=" + dir + run,
                               "model.n_layer=2", "train.global_batch=8"});
    return tiny_config_of(base, extra);
  };
  const TrainResult whole = on_ranks(1, cfg("/whole", {}), quiet_options(true));
  const Config ref = cfg("/whole", {});
  for (const auto& [name, layout] :
       std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"dp2xtp2", {"parallel.tp=2", "parallel.zero=1"}},
           {"pp2xtp2", {"parallel.tp=2", "parallel.pp_stages=2", "parallel.microbatches=2"}}}) {
    for (const auto& [to, ranks, sets] : std::vector<std::tuple<std::string, int, std::vector<std::string>>>{
             {"one rank", 1, {}}, {"dp4 with ZeRO-1", 4, {"parallel.zero=1"}}}) {
      const std::string run = "/" + name + "-" + std::to_string(ranks);
      const TrainResult first = train(cfg(run, layout), MPI_COMM_WORLD, train_options(true, "", 4));
      if (world_rank() == 0) {
        ASSERT_TRUE(first.preempted);
      }
      const TrainResult resumed = on_ranks(ranks, cfg(run, sets), train_options(true, "auto"));
      if (world_rank() == 0) {
        EXPECT_EQ(resumed.start_step, 5) << name << " -> " << to;
      }
      // Bound: every step, before the save and after the resume, sums in another order than one rank's.
      expect_close(whole, resumed, "gpt2 " + name + " checkpoint resumed on " + to,
                   world_rank() == 0 ? training_drift(ref, 0, 8, whole.final_params) : Drift{}, 5);
    }
  }
}
