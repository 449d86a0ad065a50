// Sharded checkpoints (checkpoint/sharded.h) in one process: the rectangles of a shard's values, a
// version-3 file written rectangle by rectangle and read back by other rectangles, its checksums,
// and the owners' coverage check.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/sharded.h"
#include "file_test_util.h"
#include "model_test_util.h"
#include "runtime/error.h"

using namespace llmpi;
namespace fs = std::filesystem;

namespace {

using test::TempDir;

// A slice holding a shard of a whole tensor of `whole` shape.
ParamSlice shard_of(std::vector<int> whole, int split, std::vector<std::pair<int, int>> ranges) {
  ParamSlice s;
  s.name = "t";
  s.whole_shape = whole;
  s.split = split;
  s.ranges = ranges;
  const int64_t cols = whole.size() > 1 ? whole[1] : 1;
  int64_t n = 0;
  if (split == 0)
    for (auto [b, e] : ranges) n += (e - b) * cols;
  else
    n = (int64_t)whole[0] * (ranges[0].second - ranges[0].first);
  s.numel = (size_t)n;
  s.shape = split == 0 ? std::vector<int>{(int)(n / cols)} : std::vector<int>{whole[0], ranges[0].second - ranges[0].first};
  if (split == 0 && whole.size() > 1) s.shape.push_back(whole[1]);
  return s;
}

// The values of rectangles of a whole tensor (row-major [R, C] holding 0, 1, 2, ...), in order.
std::vector<float> values_of(const std::vector<TensorRect>& rects, int64_t C) {
  std::vector<float> out;
  for (const TensorRect& r : rects)
    for (int64_t i = 0; i < r.rows; i++)
      for (int64_t j = 0; j < r.cols; j++) out.push_back(float((r.row0 + i) * C + r.col0 + j));
  return out;
}

CheckpointInfo info_for(const ParamTable& t, int64_t replicas) {
  CheckpointInfo i;
  i.step = 7;
  i.optimizer_t = 7;
  i.optimizer = "sgd";
  i.sync = replicas > 1 ? "weights" : "allreduce";
  i.world_size = replicas > 1 ? replicas : 2;
  i.rows = replicas;
  i.seed = 99;
  i.desc = test::desc_of("gpt2", 1, 2, 8, 16, 11);
  i.n = t.numel;
  i.version = 3;
  i.checksummed = true;
  i.config_json = R"({"model":{"n_layer":1}})";
  i.param_table_json = param_table_json(t);
  return i;
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

// Every range [lo, hi) of a shard's values maps to rectangles of the whole tensor holding exactly
// those values in order, for row shards of several ranges (a fused QKV weight's), column shards,
// vectors and a whole tensor: the contract sharded saves and loads rest on.
TEST(ShardedCheckpoint, SliceRectsHoldExactlyTheShardsValues) {
  std::vector<ParamSlice> cases = {
      shard_of({9, 3}, 0, {{0, 2}, {4, 6}, {7, 9}}),  // rows of three parts
      shard_of({4, 7}, 1, {{2, 5}}),                   // columns
      shard_of({10}, 0, {{1, 3}, {6, 9}}),             // a vector's parts
  };
  ParamSlice whole;
  whole.name = "w";
  whole.shape = {5, 4};
  whole.numel = 20;
  cases.push_back(whole);
  for (const ParamSlice& s : cases) {
    const std::vector<int>& shape = s.sharded() ? s.whole_shape : s.shape;
    const auto [R, C] = rows_cols(shape);
    std::vector<float> all((size_t)(R * C));
    for (size_t k = 0; k < all.size(); k++) all[k] = float(k);
    std::vector<float> mine(s.numel);
    if (s.sharded()) take_shard(s, all.data(), mine.data());
    else mine = all;
    for (size_t lo = 0; lo < s.numel; lo++)
      for (size_t hi = lo + 1; hi <= s.numel; hi++) {
        const std::vector<TensorRect> rects = slice_rects(s, lo, hi);
        for (const TensorRect& r : rects) {
          ASSERT_TRUE(r.rows > 0 && r.cols > 0 && r.row0 >= 0 && r.col0 >= 0 && r.row0 + r.rows <= R &&
                      r.col0 + r.cols <= C);
        }
        // Exact: integer-valued floats (indices, far below 2^24), copied.
        const std::vector<float> want(mine.begin() + (long)lo, mine.begin() + (long)hi);
        ASSERT_EQ(values_of(rects, C), want) << s.name << " [" << lo << ", " << hi << ")";
      }
  }
}

// A file written in rectangles (as two "ranks" would: halves of one tensor, a vector whole) reads
// back whole and by other rectangles, in the tensors' own shapes; every checksum verifies; a
// changed byte is found and named; rectangles that do not cover a tensor are refused before
// anything is written.
TEST(ShardedCheckpoint, WrittenByRectanglesReadByOthers) {
  TempDir t;
  ParamTable table;
  ParamSlice a;
  a.name = "h.0.mlp.c_fc.weight";
  a.shape = {6, 5};
  table.add(a);
  ParamSlice b;
  b.name = "h.0.ln_1.bias";
  b.shape = {7};
  table.add(b);
  std::vector<float> values(table.numel);
  for (size_t k = 0; k < values.size(); k++) values[k] = 0.5f * float(k) - 3.0f;
  const float* av = values.data();
  const float* bv = values.data() + table.slices[1].offset;
  // Tensor 0 in two column halves (row-major within each), tensor 1 whole.
  std::vector<float> left, right;
  for (int i = 0; i < 6; i++)
    for (int j = 0; j < 5; j++) (j < 2 ? left : right).push_back(av[i * 5 + j]);
  std::vector<RectWrite> w = {{kParams, 0, 0, {0, 6, 0, 2}, left.data(), 0},
                              {kParams, 0, 0, {0, 6, 2, 3}, right.data(), 0},
                              {kParams, 1, 0, {0, 7, 0, 1}, bv, 0}};
  rect_crcs(w);
  const CheckpointInfo info = info_for(table, 1);
  const std::string path = t.path + "/step-00000007.h5", tmp = path + ".tmp";
  const std::vector<uint64_t> offsets = create_sharded_file(MPI_COMM_SELF, tmp, info, table, 1, w);
  MPI_File fh;
  ASSERT_EQ(MPI_File_open(MPI_COMM_SELF, tmp.c_str(), MPI_MODE_WRONLY, MPI_INFO_NULL, &fh), MPI_SUCCESS);
  EXPECT_EQ(write_rects(fh, table, 1, offsets, w, tmp), "");
  MPI_File_close(&fh);
  fs::rename(tmp, path);

  const CheckpointInfo got = read_checkpoint_info(path);
  EXPECT_EQ(got.version, 3);
  EXPECT_EQ(got.rows, 1);
  EXPECT_EQ(got.n, table.numel);
  EXPECT_TRUE(got.checksummed);
  // Exact: the bytes written are read back.
  std::vector<float> row(table.numel);
  read_checkpoint_row(got, 0, row.data(), nullptr, nullptr);
  EXPECT_EQ(row, values);
  const CheckpointReader reader(got);
  std::vector<float> part(6);
  reader.read(kParams, 0, 0, {1, 3, 1, 2}, part.data());  // rows 1-3, columns 1-2: across both halves
  EXPECT_EQ(part, (std::vector<float>{av[6], av[7], av[11], av[12], av[16], av[17]}));
  EXPECT_NO_THROW(reader.verify_share(1, 0, 1));

  // The tensors in their own shapes, for h5py and h5dump.
  const std::string dump = t.path + "/dump.txt";
  ASSERT_EQ(std::system(("h5dump -H '" + path + "' > '" + dump + "'").c_str()), 0);
  std::ifstream in(dump);
  const std::string header((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(header.find("DATASET \"h.0.mlp.c_fc.weight\""), std::string::npos) << header;
  EXPECT_NE(header.find("( 6, 5 )"), std::string::npos) << header;
  EXPECT_NE(header.find("( 7 )"), std::string::npos) << header;

  // One changed value of tensor 0's right half: the share that reads it fails, naming it.
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    const uint64_t at = offsets[0] + (3 * 5 + 4) * sizeof(float);
    f.seekp((std::streamoff)at);
    const float bad = 1e9f;
    f.write(reinterpret_cast<const char*>(&bad), sizeof bad);
  }
  const CheckpointReader damaged(read_checkpoint_info(path));
  const std::string err = error_of([&] { damaged.verify_share(1, 0, 1); });
  EXPECT_NE(err.find("dataset 'params/h.0.mlp.c_fc.weight' fails its checksum in rows [0, 6), columns [2, 5)"),
            std::string::npos) << err;
  // Three units (two rectangles and the vector): shares 0 and 2 of 3 do not read the damaged one.
  EXPECT_NO_THROW(damaged.verify_share(1, 0, 3));
  EXPECT_THROW(damaged.verify_share(1, 1, 3), CheckpointDamaged);
  EXPECT_NO_THROW(damaged.verify_share(1, 2, 3));

  // Rectangles that leave part of a tensor unwritten: refused, and no file is left.
  std::vector<RectWrite> gap = {w[0], w[2]};
  const std::string tmp2 = t.path + "/step-00000008.h5.tmp";
  const std::string gap_err = error_of([&] { create_sharded_file(MPI_COMM_SELF, tmp2, info, table, 1, gap); });
  EXPECT_NE(gap_err.find("do not cover it once"), std::string::npos) << gap_err;
  EXPECT_FALSE(fs::exists(tmp2));
}
