// bench-checkpoint_io: time write_checkpoint and read_checkpoint_row (params, adam_m, adam_v of n
// floats each, one row) in DIR; medians of --reps runs. Used for the cost of the CRC-32C checksums
// (docs/PERF.md): build it from an older tree to compare.
//   bench-checkpoint_io --dir DIR [--floats 10000000] [--reps 5]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "checkpoint/checkpoint.h"
#include "runtime/config.h"

using namespace llmpi;

int main(int argc, char** argv) {
  CLI::App app{"Time checkpoint writes and reads (for docs/PERF.md)."};
  std::string dir;
  size_t n = 10000000;
  int reps = 5;
  app.add_option("--dir", dir, "directory to write the checkpoint in")->required();
  app.add_option("--floats", n, "values per dataset")->check(CLI::Range((size_t)1, (size_t)1 << 34));
  app.add_option("--reps", reps, "repetitions")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);

  CheckpointData d;
  ModelConfig m{};
  m.family = Family::gpt2;
  m.n_layer = 1;
  m.n_head = 1;
  m.d_model = 8;
  m.seq_len = 8;
  d.info.desc = model_desc_from_config(m, 10);
  d.info.optimizer = "adamw";
  d.info.sync = "allreduce";
  d.info.n = n;
  d.info.rows = 1;
  d.info.config_json = "{}";
  d.info.param_table_json = "[]";
  d.params.resize(n);
  for (size_t i = 0; i < n; i++) d.params[i] = float(i % 1000) * 1e-3f;
  d.m = d.params;
  d.v = d.params;
  std::vector<double> w, r;
  std::vector<float> a(n), b(n), c(n);
  const std::string path = dir + "/bench-checkpoint.h5";
  using Clock = std::chrono::steady_clock;
  for (int rep = 0; rep < reps; rep++) {
    auto t0 = Clock::now();
    write_checkpoint(path, d);
    auto t1 = Clock::now();
    CheckpointInfo info = read_checkpoint_info(path);
    read_checkpoint_row(info, 0, a.data(), b.data(), c.data());
    auto t2 = Clock::now();
    w.push_back(std::chrono::duration<double>(t1 - t0).count());
    r.push_back(std::chrono::duration<double>(t2 - t1).count());
  }
  std::remove(path.c_str());
  std::sort(w.begin(), w.end());
  std::sort(r.begin(), r.end());
  std::printf("checkpoint of 3 x %zu floats (%.0f MB): write median %.3f s, read median %.3f s (%d reps)\n", n,
              n * 12 / 1e6, w[w.size() / 2], r[r.size() / 2], reps);
  return 0;
}
