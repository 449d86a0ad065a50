// TensorBoard event files (metrics/tensorboard.h, metrics.tensorboard):
//  - the encoding is TensorBoard's own: the events of tests/fixtures/tensorboard/reference.tfevents,
//    which PyPI tensorboard's protocol buffers and record writer wrote (tools/tensorboard_fixture.py),
//    encode to the same bytes here, and read back as the same events;
//  - the writer's file reads back as what was written (floats as float), begins with the version
//    (and a SessionLog START at a resumed run's first step), never replaces an existing file;
//  - a damaged record (a flipped byte, a cut file) is refused, naming the record;
//  - under MPI (-n 2) a run's event file holds rank 0's metrics.jsonl steps and values, and a resumed
//    run adds a second file starting at its first step (and the evaluation it keeps); --overwrite
//    moves the files aside; metrics.tensorboard false writes none.
#include <gtest/gtest.h>
#include <mpi.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>

#include "file_test_util.h"
#include "metrics/tensorboard.h"
#include "mpi_test_data.h"
#include "train/trainer.h"

using namespace llmpi;
using llmpi::test::error_of;
using llmpi::test::TempDirTest;
namespace fs = std::filesystem;

namespace {

std::string slurp_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string fixture_path() {
  for (std::string p : {"tests/fixtures/tensorboard/reference.tfevents", "../tests/fixtures/tensorboard/reference.tfevents"})
    if (fs::exists(p)) return p;
  return "";
}

// The events tools/tensorboard_fixture.py writes (its docstring lists them).
std::vector<TensorboardEvent> reference_events() {
  std::vector<TensorboardEvent> e(5);
  e[0].wall_time = 1765000000.25, e[0].file_version = "brain.Event:2";
  e[1].wall_time = 1765000001.5, e[1].step = 0, e[1].values = {{"train/loss", 4.1875f}, {"train/learning_rate", 3e-4f}};
  e[2].wall_time = 1765000002.75, e[2].step = 300, e[2].values = {{"eval/val_loss", 2.0f}, {"eval/accuracy", 0.0f}};
  e[3].wall_time = 1765000003.0, e[3].step = 12, e[3].session_start = true;
  e[4].wall_time = 1765000004.125, e[4].step = 4294967301LL, e[4].values = {{"perf/tokens_per_s", 123456.789f}};
  return e;
}

void expect_same(const TensorboardEvent& a, const TensorboardEvent& b, const std::string& what) {
  EXPECT_EQ(a.wall_time, b.wall_time) << what;
  EXPECT_EQ(a.step, b.step) << what;
  EXPECT_EQ(a.file_version, b.file_version) << what;
  EXPECT_EQ(a.session_start, b.session_start) << what;
  ASSERT_EQ(a.values.size(), b.values.size()) << what;
  for (size_t i = 0; i < a.values.size(); i++) {
    EXPECT_EQ(a.values[i].first, b.values[i].first) << what;
    EXPECT_EQ(a.values[i].second, b.values[i].second) << what << " " << a.values[i].first;
  }
}

double fixed_clock() { return 1765000100.5; }

// What TensorBoard shows of these event files (in order): per step and tag the last value written,
// each SessionLog START first dropping every event at its step and later. *start: the last START's
// step (-1: none).
std::map<int64_t, std::map<std::string, float>> shown(const std::vector<std::string>& files, int64_t* start) {
  std::map<int64_t, std::map<std::string, float>> by_step;
  *start = -1;
  for (const std::string& f : files)
    for (const TensorboardEvent& e : read_tensorboard_events(f)) {
      if (e.session_start) {
        *start = e.step;
        by_step.erase(by_step.lower_bound(e.step), by_step.end());
      }
      for (const auto& [tag, value] : e.values) by_step[e.step][tag] = value;
    }
  return by_step;
}

}  // namespace

TEST(Tensorboard, EncodesAsTensorBoardsOwnWriter) {
  const std::string path = fixture_path();
  ASSERT_FALSE(path.empty()) << "run the tests from the project root (tests/fixtures/tensorboard not found)";
  std::string ours;
  for (const TensorboardEvent& e : reference_events()) ours += tensorboard_record(encode_tensorboard_event(e));
  EXPECT_EQ(ours, slurp_bytes(path)) << "the bytes of TensorBoard's writer (tools/tensorboard_fixture.py)";
  const std::vector<TensorboardEvent> read = read_tensorboard_events(path);
  const std::vector<TensorboardEvent> want = reference_events();
  ASSERT_EQ(read.size(), want.size());
  for (size_t i = 0; i < want.size(); i++) expect_same(read[i], want[i], "event " + std::to_string(i));
}

using TensorboardFile = TempDirTest;

TEST_F(TensorboardFile, WriterReadsBackAndNeverReplacesAFile) {
  std::string first, second;
  {
    TensorboardWriter w(dir, 0, fixed_clock);
    first = w.path();
    w.scalars(0, {{"train/loss", 4.25}, {"train/learning_rate", 1e-3}});
    w.scalars(7, {{"eval/val_loss", 3.0000001}});
  }
  {
    TensorboardWriter w(dir, 5, fixed_clock);  // the same second, the same process: a new name
    second = w.path();
    w.scalars(5, {{"train/loss", 2.5}});
  }
  EXPECT_NE(first, second);
  EXPECT_NE(first.find("/events.out.tfevents.1765000100."), std::string::npos) << first;
  EXPECT_EQ(tensorboard_files(dir), (std::vector<std::string>{first, second}));
  const std::vector<TensorboardEvent> a = read_tensorboard_events(first);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a[0].file_version, "brain.Event:2");
  EXPECT_EQ(a[0].wall_time, 1765000100.5);
  EXPECT_EQ(a[1].step, 0);
  ASSERT_EQ(a[1].values.size(), 2u);
  EXPECT_EQ(a[1].values[0], (std::pair<std::string, float>{"train/loss", 4.25f}));
  EXPECT_EQ(a[1].values[1], (std::pair<std::string, float>{"train/learning_rate", 1e-3f}));  // as float
  EXPECT_EQ(a[2].step, 7);
  EXPECT_EQ(a[2].values[0].second, 3.0000001f);
  const std::vector<TensorboardEvent> b = read_tensorboard_events(second);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_TRUE(b[1].session_start);  // a resumed run's first step
  EXPECT_EQ(b[1].step, 5);
  EXPECT_TRUE(b[1].values.empty());
  EXPECT_EQ(b[2].values[0].second, 2.5f);
}

TEST_F(TensorboardFile, DamagedRecordsAreRefusedNamingTheRecord) {
  std::string path;
  {
    TensorboardWriter w(dir, 0, fixed_clock);
    path = w.path();
    w.scalars(1, {{"train/loss", 1.0}});
  }
  const std::string good = slurp_bytes(path);
  auto rewrite = [&](const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; };
  std::string flipped = good;
  flipped[good.size() - 7] ^= 0x10;  // inside the second record's data
  rewrite(flipped);
  EXPECT_NE(error_of([&] { read_tensorboard_events(path); }).find("record 1: the data's CRC does not match"),
            std::string::npos);
  flipped = good;
  flipped[2] ^= 0x01;  // the first record's length
  rewrite(flipped);
  EXPECT_NE(error_of([&] { read_tensorboard_events(path); }).find("record 0: the length's CRC does not match"),
            std::string::npos);
  rewrite(good.substr(0, good.size() - 3));
  EXPECT_NE(error_of([&] { read_tensorboard_events(path); }).find("record 1: truncated"), std::string::npos);
  rewrite(good);
  EXPECT_EQ(read_tensorboard_events(path).size(), 2u);
}

// A run writes rank 0's logged steps into its event file, with metrics.jsonl's values (as float);
// the evaluations too. Pre-empted after step 5 (checkpoints at steps 4 and 6) and resumed from its
// step-4 checkpoint, it adds a second file that starts at step 4, so that TensorBoard drops the
// first file's steps 4 and 5 as llmpi-train trims metrics.jsonl. metrics.tensorboard false writes
// none.
TEST(MpiTensorboard, RunWritesWhatMetricsJsonlHolds) {
  using namespace llmpi::testing_support;
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 31);
  const std::string val = make_pattern_file(MPI_COMM_WORLD, dir, "val.h5", 4000, 64, 33);
  const std::string run = dir + "/run";
  const Config cfg = tiny_config(tr, {"train.steps=8", "checkpoint.every=4", "run.dir=" + run, "data.val=" + val,
                                      "train.eval_every=4", "train.eval_batches=1", "train.log_every=1"});
  TrainOptions first = quiet_options(true);
  first.preempt_after_step = 5;
  ASSERT_TRUE(train(cfg, MPI_COMM_WORLD, first).preempted);
  TrainOptions again = quiet_options(true);
  again.resume = run + "/checkpoints/step-00000004.h5";
  train(cfg, MPI_COMM_WORLD, again);
  if (world_rank() == 0) {
    const std::vector<std::string> files = tensorboard_files(run);
    ASSERT_EQ(files.size(), 2u);
    int64_t start = -1;
    std::map<int64_t, std::map<std::string, float>> by_step = shown(files, &start);
    EXPECT_EQ(start, 4) << "the resumed run starts at its checkpoint's step";
    std::ifstream in(run + "/metrics.jsonl");
    std::string line;
    int64_t lines = 0;
    while (std::getline(in, line)) {
      const nlohmann::json j = nlohmann::json::parse(line);
      const int64_t step = j["step"];
      ASSERT_TRUE(by_step.count(step) && by_step[step].count("train/loss"))
          << "step " << step << " missing from the event files";
      std::map<std::string, float>& v = by_step[step];
      EXPECT_EQ(v["train/loss"], (float)j["loss"].get<double>()) << step;
      EXPECT_EQ(v["train/learning_rate"], (float)j["lr"].get<double>()) << step;
      EXPECT_EQ(v["train/grad_norm"], (float)j["grad_norm"].get<double>()) << step;
      EXPECT_EQ(v["perf/tokens_per_s"], (float)j["tokens_per_s"].get<double>()) << step;
      EXPECT_EQ(v["perf/step_ms"], (float)j["step_ms"].get<double>()) << step;
      EXPECT_GT(v["perf/model_tflops_per_rank"], 0.0f) << step;
      EXPECT_GT(v["memory/peak_rss_mb"], 1.0f) << step;
      lines++;
    }
    int64_t trained = 0;
    std::map<int64_t, float> val;
    for (const auto& [step, tags] : by_step) {
      trained += tags.count("train/loss");
      if (tags.count("eval/val_loss")) val[step] = tags.at("eval/val_loss");
    }
    EXPECT_EQ(lines, trained);
    EXPECT_EQ(lines, 8);
    // The evaluations: eval.jsonl's steps and values (its step-4 line, which the resumed run keeps
    // and does not repeat, written again into the second file).
    std::map<int64_t, float> want;
    std::ifstream ev(run + "/eval.jsonl");
    while (std::getline(ev, line)) {
      const nlohmann::json j = nlohmann::json::parse(line);
      want[j["step"].get<int64_t>()] = (float)j["val_loss"].get<double>();
    }
    EXPECT_EQ(val, want);
    EXPECT_TRUE(want.count(4) && want.count(8)) << "evaluations at steps 4 and 8";
  }
  // --overwrite: the earlier run's event files move aside with its logs; the new run has its own.
  std::vector<std::string> earlier;
  if (world_rank() == 0) earlier = tensorboard_files(run);
  TrainOptions over = quiet_options(true);
  over.overwrite = true;
  train(tiny_config(tr, {"train.steps=2", "run.dir=" + run}), MPI_COMM_WORLD, over);
  if (world_rank() == 0) {
    std::vector<std::string> aside;
    for (auto& p : fs::directory_iterator(run))
      if (p.path().filename().string().rfind("previous-", 0) == 0) aside = tensorboard_files(p.path().string());
    ASSERT_EQ(aside.size(), earlier.size());
    for (size_t i = 0; i < aside.size(); i++)
      EXPECT_EQ(fs::path(aside[i]).filename(), fs::path(earlier[i]).filename());
    const std::vector<std::string> now = tensorboard_files(run);
    ASSERT_EQ(now.size(), 1u);
    EXPECT_EQ(read_tensorboard_events(now[0]).size(), 1u + 2u) << "the version and two steps";
  }
  const std::string off = dir + "/off";
  train(tiny_config(tr, {"train.steps=2", "run.dir=" + off, "metrics.tensorboard=false"}), MPI_COMM_WORLD,
        quiet_options(true));
  if (world_rank() == 0) {
    EXPECT_TRUE(fs::exists(off + "/metrics.jsonl"));
    EXPECT_TRUE(tensorboard_files(off).empty());
  }
  MPI_Barrier(MPI_COMM_WORLD);
}
