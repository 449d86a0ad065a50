// Shared by the MPI tests: a temporary directory every rank agrees on, and a small token file
// with learnable structure (a noisy repeating pattern), written by rank 0.
#pragma once
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "data/classification_file.h"
#include "data/token_file.h"
#include "runtime/rng.h"
#include "train/trainer.h"

namespace llmpi::testing_support {

// mkdtemp on rank 0, broadcast to all ranks.
inline std::string shared_temp_dir(MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  char buf[256] = "/tmp/llmpi-test-XXXXXX";
  if (rank == 0 && !mkdtemp(buf)) buf[0] = 0;
  MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, comm);
  return buf;
}

// n tokens over vocab V: mostly (prev * 7 + 3) % V, 10% random — a model can learn it.
inline void write_pattern_tokens(const std::string& path, int64_t n, int V, uint64_t seed) {
  std::vector<uint32_t> toks(n);
  Rng rng(seed);
  uint32_t prev = 0;
  for (auto& t : toks) {
    t = rng.below(10) == 0 ? (uint32_t)rng.below(V) : (prev * 7 + 3) % V;
    prev = t;
  }
  write_token_file(path, toks, TokenFileAttrs{V, V - 1, "test-pattern", "llmpi-tests"});
}

// n classification examples of seq_len T over vocab V (token 0 is [CLS], padding is 0): each
// sequence has a random length in [T/4, T], two segments (token types 0 then 1), a random label,
// and its tokens drawn from the label's half of the vocabulary (plus 10% from anywhere) —
// something a small model learns in a few dozen steps.
inline void write_pattern_examples(const std::string& path, int64_t n, int T, int V, uint64_t seed) {
  ClassificationExamples ex;
  ex.seq_len = T;
  Rng rng(seed);
  for (int64_t i = 0; i < n; i++) {
    const int len = T / 4 + (int)rng.below(T - T / 4 + 1);
    const int label = (int)rng.below(2), half = (V - 2) / 2;
    for (int t = 0; t < T; t++) {
      const int32_t tok = rng.below(10) == 0 ? 2 + (int32_t)rng.below(V - 2) : 2 + label * half + (int32_t)rng.below(half);
      ex.input_ids.push_back(t == 0 ? 1 : t < len ? tok : 0);
      ex.token_type_ids.push_back(t >= len / 2 && t < len ? 1 : 0);
      ex.attention_mask.push_back(t < len ? 1 : 0);
    }
    ex.labels.push_back(label);
  }
  ClassificationAttrs a;
  a.vocab_size = V;
  a.num_labels = 2;
  a.label_names = {"low", "high"};
  a.pad_id = 0;
  a.tokenizer = "test-pattern";
  a.created_by = "llmpi-tests";
  write_classification_file(path, ex, a);
}

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// The small model every MPI test trains (2 layers, width 32, seq_len 32, global batch 8), with
// the test's own `--set` overrides applied after these. The global batch is the file's, so that a
// test's train.batch_per_rank replaces it as it would a run.json's.
inline Config tiny_config(const std::string& train, const std::vector<std::string>& extra) {
  std::vector<std::string> sets = {"data.train=" + train, "runtime.device=cpu", "model.n_layer=2", "model.n_head=2", "model.d_model=32",
                                   "model.seq_len=32", "train.lr=1e-3",
                                   "train.log_every=1", "train.eval_every=0"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return parse_config(R"({"train": {"global_batch": 8}})", "test", sets);
}

// tiny_config of a test's --set lines, `base` then `extra`, its data.train the one they name.
inline Config tiny_config_of(const std::vector<std::string>& base, const std::vector<std::string>& extra) {
  std::vector<std::string> sets = base;
  sets.insert(sets.end(), extra.begin(), extra.end());
  std::string train;
  for (auto& s : sets)
    if (s.rfind("data.train=", 0) == 0) train = s.substr(11);
  return tiny_config(train, sets);
}

// Options for in-process training in tests: no progress lines; run directory only when asked.
inline TrainOptions quiet_options(bool write_run_dir) {
  TrainOptions o;
  o.print = false;
  o.write_run_dir = write_run_dir;
  return o;
}

// Options for a test's train() call: quiet, with or without a run directory, resuming from
// `resume` ("" = no, "auto", or a checkpoint path), pre-empted after step `preempt` (-1 = never).
inline TrainOptions train_options(bool write_run_dir, const std::string& resume = "", int64_t preempt = -1) {
  TrainOptions o = quiet_options(write_run_dir);
  o.resume = resume;
  o.preempt_after_step = preempt;
  return o;
}

// Relative L2 difference |a - b| / |b| of two parameter vectors (1e30 when their sizes differ).
inline double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 1e30;
  double d2 = 0, r2 = 0;
  for (size_t i = 0; i < a.size(); i++) {
    const double d = (double)a[i] - b[i];
    d2 += d * d;
    r2 += (double)b[i] * b[i];
  }
  return std::sqrt(d2 / r2);
}

inline std::string make_pattern_file(MPI_Comm comm, const std::string& dir, const std::string& name,
                                     int64_t n, int V, uint64_t seed) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::string path = dir + "/" + name;
  if (rank == 0) write_pattern_tokens(path, n, V, seed);
  MPI_Barrier(comm);
  return path;
}

inline std::string make_pattern_examples(MPI_Comm comm, const std::string& dir, const std::string& name,
                                         int64_t n, int T, int V, uint64_t seed) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::string path = dir + "/" + name;
  if (rank == 0) write_pattern_examples(path, n, T, V, seed);
  MPI_Barrier(comm);
  return path;
}

}  // namespace llmpi::testing_support
