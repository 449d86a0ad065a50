// Shared by the MPI tests: a temporary directory every rank agrees on, and a small token file
// with learnable structure (a noisy repeating pattern), written by rank 0.
#pragma once
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "data/classification_file.h"
#include "data/token_file.h"
#include "optim/optimizer.h"
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

// Whether every rank's vector equals rank 0's bit for bit (the same size everywhere).
inline bool same_on_every_rank(const std::vector<float>& p, MPI_Comm comm) {
  std::vector<float> p0 = p;
  MPI_Bcast(p0.data(), (int)p0.size(), MPI_FLOAT, 0, comm);
  int same = p0 == p, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, comm);
  return all == 1;
}

// A barrier whose waiting ranks sleep instead of polling: where some ranks of an oversubscribed
// test job (4 ranks on 2 cores) train while the others wait, the waiting ones leave them the cores.
inline void sleeping_barrier(MPI_Comm comm) {
  MPI_Request r;
  MPI_Ibarrier(comm, &r);
  for (int done = 0;;) {
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (done) return;
    usleep(2000);
  }
}

// A /proc/self/status value given in kB (VmRSS:, VmHWM:, ...), in bytes; -1 when absent.
inline double status_bytes(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) {
      std::istringstream s(line.substr(std::string(key).size()));
      double kb = -1;
      s >> kb;
      return kb * 1024;
    }
  return -1;
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

// Relative L2 difference |a - b| / |b| of two parameter vectors (1e30 when their sizes differ). The
// comparisons hold it to a bound of their own (training_drift below), or to 0 where they are exact.
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

// ---- How far apart two runs of the same training may be ------------------------------------------
// Two runs whose sums are the same in exact arithmetic but run in other orders (one rank against
// several, a pipeline, tensor-parallel shards, micro-batches, another attention kernel; or runs
// whose bits differ anywhere at all, after which every later sum rounds differently) are held to
// these error estimates, first order in the rounding. Their inputs: the run's configuration, the
// steps [first, last) whose sums may differ, and its parameters.
//  * A step's gradient element is a sum over the rows of the global batch, K = global batch ×
//    seq_len terms (the longest sum of a step: every other runs over channels, heads or the
//    vocabulary). Each run rounds it within gamma(K) = K·u/(1 - K·u) (u = 2^-24) of the exact
//    sum, in units of the magnitude sum|terms|, which for the products of random sign a weight
//    gradient adds is ~sqrt(K) times the gradient itself: the two runs' gradient elements differ
//    by delta = 2·gamma(K)·sqrt(K) of their own size. (Far less in most elements: rounding errors
//    of random sign stay ~sqrt(K) below gamma(K). But AdamW normalises each element by its own
//    size, and its small ones, whose terms cancel the most, move the most.)
//  * AdamW steps a parameter by lr·m/(sqrt(v) + eps), |m/sqrt(v)| <= ~1 (beta1^2 < beta2), a step
//    the gradients' scale does not change, so a relative difference delta of the gradients moves
//    a step by at most 2·delta·lr: after the steps, |dp_e| <= 2·delta·sum(lr) for each element, and
//    |dp| / |p| <= 2·delta·sum(lr)·sqrt(n) / |p| (L2 norms, n parameters).
//  * The loss: a forward of the same parameters sums over channels, no more than K terms, into
//    row losses that do not cancel: within 2·gamma(K). The parameters' difference moves it by
//    grad L · dp, a sum of terms of random sign (the differences are independent from element to
//    element): within 3 times its root mean square, 3·|grad L|·rms(dp_e), and |grad L| <= 1.2·L in
//    every model these tests train (the gradient's norm over the loss in their first 20 steps:
//    0.2 to 0.7 for gpt2 and llama, up to 1.13 for bert).
constexpr double kFp32Roundoff = 0x1p-24;
constexpr double kGradNormPerLoss = 1.2;

inline double gamma_fp32(double K) { return K * kFp32Roundoff / (1 - K * kFp32Roundoff); }

// The learning rates of steps [first, last) of cfg's schedule, summed (steps: the run's total
// where cfg gives train.epochs instead; 0 = cfg's train.steps).
inline double lr_sum(const Config& cfg, int64_t first, int64_t last, int64_t steps = 0) {
  TrainConfig tc = cfg.train;
  if (steps > 0) tc.steps = steps;
  double s = 0;
  for (int64_t t = first; t < last; t++) s += lr_at(tc, t);
  return s;
}

// The rows a step's gradient sums over (K above).
inline double batch_rows(const Config& cfg) { return (double)cfg.train.global_batch * cfg.model.seq_len; }

// delta above: how far two orders of a step's sums may set a gradient element apart, relative.
inline double order_delta(const Config& cfg) {
  return 2 * gamma_fp32(batch_rows(cfg)) * std::sqrt(batch_rows(cfg));
}

// The forward's: how far two orders of its sums may set the loss of the same parameters apart.
inline double forward_delta(const Config& cfg) { return 2 * gamma_fp32(batch_rows(cfg)); }

struct Drift {
  double params;  // |dp| / |p| of the parameters after the steps (rel_diff)
  double loss;    // |dL| / L of a step's loss, at any of the steps
};

// Two runs of cfg's AdamW training whose steps [first, last) sum in other orders (first > 0: they
// agree bit for bit before, e.g. from a shared checkpoint); params: one run's final parameters
// (none: no bound on them). grad_delta: the gradients' relative difference (root mean square over
// the elements) where it is not delta (bf16, below).
inline Drift training_drift(const Config& cfg, int64_t first, int64_t last, const std::vector<float>& params,
                            double grad_delta = 0, int64_t steps = 0) {
  const double g = grad_delta > 0 ? grad_delta : order_delta(cfg);
  double p2 = 0;
  for (float x : params) p2 += (double)x * x;
  const double n = (double)params.size(), sum_lr = lr_sum(cfg, first, last, steps);
  const double dp = 2 * g * sum_lr;  // each element's drift (its rms where g is one)
  return {p2 > 0 ? dp * std::sqrt(n / p2) : 0.0, forward_delta(cfg) + 3 * kGradNormPerLoss * dp};
}

// The same for plain SGD, which steps by lr·g, linear in the gradient: what counts is the L2 norm of
// the gradients' difference, an aggregate over many elements whose rounding errors, of random
// sign, stay ~sqrt(K) below gamma(K) of their magnitudes: within 2·gamma(K)·|grad L|. So |dp| <=
// 2·gamma(K)·sum(lr)·|grad L|, |grad L| at most 1.2·L for a loss L (max_loss: the largest of the
// run's), and the loss within |grad L|·|dp| of it (and the forward's own 2·gamma(K)).
inline Drift sgd_training_drift(const Config& cfg, int64_t first, int64_t last, const std::vector<float>& params,
                                double max_loss) {
  const double delta = forward_delta(cfg);
  double p2 = 0;
  for (float x : params) p2 += (double)x * x;
  const double dp = delta * lr_sum(cfg, first, last) * kGradNormPerLoss * max_loss;  // |dp|, L2
  return {dp / std::sqrt(p2), delta + kGradNormPerLoss * dp};
}

// bf16: a value whose fp32 bits differ by a relative d between the runs rounds to bf16 the other
// way with probability d / 2^-7 (bf16's spacing, relative, is at most 2^-7), and is then a whole
// spacing apart: the rounded values differ by d and these flips, sqrt(d·2^-7) root mean square
// over the elements. Gradients rounded for the wire differ so (training_drift's grad_delta).
inline double bf16_flips(double d) { return d + std::sqrt(d * 0x1p-7); }

// bf16 GEMM operands: the weights' fp32 difference flips their rounding, which moves the
// gradients, whose steps move the weights further. With the weights a relative r apart (against
// w = init_std / sqrt(2·n_layer), the smallest weights' size: the scaled residual projections')
// the gradients differ by sqrt(r·2^-7), so AdamW's steps by 2·lr·sqrt(r·2^-7), which grows r by
// that over w: sqrt(r) grows by 2^-3.5·lr / w a step, whatever fp32 difference starts it, to
// r = 2^-7·(sum(lr) / w)^2, and the gradients' difference to g = 2^-7·sum(lr) / w (half of it on
// average over the steps), on top of the fp32 sums' own delta. The loss also sees the flipped
// weights themselves: 3·|grad L|·w·g (a flip moves a weight by 2^-7·w with probability r / 2^-7;
// terms of random sign).
inline Drift bf16_operand_drift(const Config& cfg, int64_t first, int64_t last, const std::vector<float>& params) {
  const double w = cfg.model.init_std / std::sqrt(2.0 * cfg.model.n_layer);
  const double g = 0x1p-7 * lr_sum(cfg, first, last) / w;
  Drift d = training_drift(cfg, first, last, params, order_delta(cfg) + g / 2);
  d.loss += 3 * kGradNormPerLoss * w * g;
  return d;
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

// The --set lines of a 10-step run of `family` (gpt2, llama with grouped-query attention, or
// bert classifying with dropout) on data written into dir (collective over the world), for
// tiny_config_of.
inline std::vector<std::string> family_run_sets(const std::string& family, const std::string& dir) {
  std::vector<std::string> sets = {"model.family=" + family, "train.steps=10", "train.grad_clip=1.0",
                                   "model.n_head=4"};
  if (family == "bert") {
    sets.push_back("data.train=" + make_pattern_examples(MPI_COMM_WORLD, dir, "cls.h5", 512, 32, 64, 31));
    sets.insert(sets.end(), {"model.dropout=0.1", "model.attn_dropout=0", "model.num_labels=2"});
  } else {
    sets.push_back("data.train=" + make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 32));
    if (family == "llama") sets.push_back("model.n_kv_head=2");
  }
  return sets;
}

}  // namespace llmpi::testing_support
