// Checkpoint files: round trip, newest/pruning by step, and clear errors for damaged files.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "file_test_util.h"
#include "model_test_util.h"
#include "runtime/error.h"

using namespace llmpi;
namespace fs = std::filesystem;

namespace {
using test::TempDir;

CheckpointData sample(int rows, size_t n, bool adam) {
  CheckpointData d;
  d.info.step = 42;
  d.info.optimizer_t = 42;
  d.info.optimizer = adam ? "adamw" : "sgd";
  d.info.sync = rows > 1 ? "weights" : "allreduce";
  d.info.world_size = rows > 1 ? rows : 2;
  d.info.rows = rows;
  d.info.seed = 1234567890123ull;
  d.info.desc = test::desc_of("llama", 2, 2, 8, 16, 11, {"model.n_kv_head=1"});
  d.info.n = n;
  d.info.config_json = R"({"model":{"n_layer":2}})";
  d.info.param_table_json = "[]";
  for (size_t i = 0; i < rows * n; i++) {
    d.params.push_back(0.25f * i - 3.0f);
    if (adam) {
      d.m.push_back(1e-3f * i);
      d.v.push_back(1e-6f * i);
    }
  }
  return d;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Checkpoint, RoundTripEveryRow) {
  TempDir t;
  for (int rows : {1, 3}) {
    const size_t n = 100;
    CheckpointData d = sample(rows, n, true);
    std::string p = checkpoint_path(t.path, rows);
    write_checkpoint(p, d);
    EXPECT_FALSE(fs::exists(p + ".tmp"));
    CheckpointInfo i = read_checkpoint_info(p);
    EXPECT_EQ(i.step, 42);
    EXPECT_EQ(i.optimizer, "adamw");
    EXPECT_EQ(i.rows, rows);
    EXPECT_EQ(i.n, n);
    EXPECT_EQ(i.seed, 1234567890123ull);
    EXPECT_EQ(i.desc.d_model, 8);
    EXPECT_EQ(i.desc.max_seq_len, 16);
    EXPECT_EQ(i.desc.family, Family::llama);  // the family and its description round-trip
    EXPECT_EQ(model_desc_json(i.desc), model_desc_json(d.info.desc));
    EXPECT_EQ(i.config_json, d.info.config_json);
    for (int r = 0; r < rows; r++) {
      std::vector<float> p2(n), m2(n), v2(n);
      read_checkpoint_row(i, r, p2.data(), m2.data(), v2.data());
      // Exact: the floats written, read back
      EXPECT_EQ(p2, std::vector<float>(d.params.begin() + r * n, d.params.begin() + (r + 1) * n));
      EXPECT_EQ(m2, std::vector<float>(d.m.begin() + r * n, d.m.begin() + (r + 1) * n));
      EXPECT_EQ(v2, std::vector<float>(d.v.begin() + r * n, d.v.begin() + (r + 1) * n));
    }
  }
}

TEST(Checkpoint, NewestAndPruning) {
  TempDir t;
  EXPECT_EQ(latest_checkpoint(t.path), "");
  EXPECT_EQ(latest_checkpoint(t.path + "/missing"), "");
  CheckpointData d = sample(1, 10, false);
  d.info.lineage = "run-a";
  for (int64_t s : {5, 100, 20, 7}) write_checkpoint(checkpoint_path(t.path, s), d);
  // Another run's checkpoints (issue 14, finding 1: a new run in an old run's directory pruned
  // everything it wrote, because the old run's steps were higher), and one from before lineages.
  d.info.lineage = "run-b";
  for (int64_t s : {200, 300}) write_checkpoint(checkpoint_path(t.path, s), d);
  d.info.lineage = "";
  write_checkpoint(checkpoint_path(t.path, 1), d);
  std::FILE* f = std::fopen((t.path + "/step-00000999.h5.tmp").c_str(), "w");  // a crashed write
  std::fclose(f);
  EXPECT_EQ(latest_checkpoint(t.path), checkpoint_path(t.path, 300));
  EXPECT_EQ(read_checkpoint_info(checkpoint_path(t.path, 20)).lineage, "run-a");
  prune_checkpoints(t.path, 2, "run-a");
  EXPECT_FALSE(fs::exists(checkpoint_path(t.path, 5)));
  EXPECT_FALSE(fs::exists(checkpoint_path(t.path, 7)));
  EXPECT_TRUE(fs::exists(checkpoint_path(t.path, 20)));
  EXPECT_TRUE(fs::exists(checkpoint_path(t.path, 100)));
  for (int64_t s : {1, 200, 300}) EXPECT_TRUE(fs::exists(checkpoint_path(t.path, s))) << "not run-a's: kept";
  prune_checkpoints(t.path, 1, "run-b");
  EXPECT_FALSE(fs::exists(checkpoint_path(t.path, 200)));
  for (int64_t s : {1, 20, 100, 300}) EXPECT_TRUE(fs::exists(checkpoint_path(t.path, s)));
}

TEST(Checkpoint, ClearErrors) {
  TempDir t;
  EXPECT_NE(error_of([&] { read_checkpoint_info(t.path + "/none.h5"); }).find("does not exist"), std::string::npos);
  std::string junk = t.path + "/junk.h5";
  std::FILE* f = std::fopen(junk.c_str(), "w");
  std::fputs("not hdf5", f);
  std::fclose(f);
  EXPECT_NE(error_of([&] { read_checkpoint_info(junk); }).find("is not an HDF5 file"), std::string::npos);

  std::string good = checkpoint_path(t.path, 1);
  write_checkpoint(good, sample(1, 50000, true));
  std::string cut = t.path + "/cut.h5";
  fs::copy_file(good, cut);
  fs::resize_file(cut, fs::file_size(good) / 2);
  std::string e = error_of([&] {
    CheckpointInfo i = read_checkpoint_info(cut);
    std::vector<float> p(i.n), m(i.n), v(i.n);
    read_checkpoint_row(i, 0, p.data(), m.data(), v.data());
  });
  EXPECT_NE(e.find("cut.h5"), std::string::npos) << e;
  EXPECT_NE(e, "") << "a truncated checkpoint must not load";

  EXPECT_NE(error_of([&] { write_checkpoint(t.path + "/no/such/dir/x.h5", sample(1, 10, false)); }).find("cannot create"),
            std::string::npos);
}
