#include "plan/profile.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <random>
#include <vector>

#include "backend/ops.h"
#include "model/transformer.h"
#include "optim/optimizer.h"
#include "runtime/clock.h"
#include "runtime/config.h"
#include "runtime/error.h"

namespace llmpi {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Random values into backend memory (the hidden state entering a part, the gradient leaving it).
void fill(const Ops& o, float* dst, size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> h(n);
  for (float& x : h) x = nd(rng);
  o.copy_to_device(dst, h.data(), n * sizeof(float));
}

}  // namespace

LayerCosts measure_profile(const ModelDesc& d, int B, int T, int reps, int threads) {
  if (reps < 1) fail("--profile-reps must be >= 1");
  if (threads > 0) {
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
  }
  const Ops& o = cpu_ops();
  const size_t N = (size_t)B * T, NC = N * d.d_model;
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> tok(0, d.vocab_size - 1);
  std::vector<int32_t> tokens(N), targets(N), types(N, 0), mask(N, 1), labels(B, 0);
  for (size_t i = 0; i < N; i++) tokens[i] = tok(rng), targets[i] = tok(rng);
  Batch batch;
  batch.B = B, batch.T = T;
  batch.tokens = tokens.data();
  batch.targets = targets.data();
  if (d.head == HeadKind::classifier) {
    batch.token_types = types.data();
    batch.attn_mask = mask.data();
    batch.labels = labels.data();
  }
  const int L = d.n_layer;
  Model emb(d, o, ModelPart{0, 0, true, false});
  Model blk(d, o, ModelPart{0, 1, false, false});
  Model head(d, o, ModelPart{L, L, false, true});
  for (Model* m : {&emb, &blk, &head}) m->init_params(1337);
  Activations ae(emb, B, T), ab(blk, B, T), ah(head, B, T);
  emb.load_batch(ae, batch);
  blk.load_batch(ab, batch);
  head.load_batch(ah, batch);
  std::vector<double> ef, eb, bf, bb, bbi, bw, hf, hb, hbi, hw, opt;
  Optimizer adam(o, blk.table.numel, OptimizerKind::adamw);
  TrainConfig tc{};
  tc.beta1 = 0.9, tc.beta2 = 0.95, tc.eps = 1e-8, tc.weight_decay = 0.1, tc.lr = 1e-4;
  for (int rep = 0; rep <= reps; rep++) {  // rep 0 warms up
    double t0, t1, t2;
    // embedding
    t0 = now_s();
    emb.embed_forward(ae);
    t1 = now_s();
    fill(o, ae.dresidual, NC, rng, 0.01f);
    const double t1b = now_s();
    emb.begin_backward();
    emb.embed_backward(ae, {});
    t2 = now_s();
    if (rep) ef.push_back(t1 - t0), eb.push_back(t2 - t1b);
    // one block: forward, whole backward; then forward, input-only backward, weight gradients
    fill(o, ab.input, NC, rng, 1.0f);
    t0 = now_s();
    blk.blocks_forward(ab, 0, 1);
    t1 = now_s();
    fill(o, ab.dresidual, NC, rng, 0.01f);
    const double t1c = now_s();
    blk.begin_backward();
    blk.blocks_backward(ab, 0, 1, {});
    t2 = now_s();
    if (rep) bf.push_back(t1 - t0), bb.push_back(t2 - t1c);
    blk.blocks_forward(ab, 0, 1);
    fill(o, ab.dresidual, NC, rng, 0.01f);
    t0 = now_s();
    blk.begin_backward(ab, BackwardMode::input_only);
    blk.blocks_backward(ab, 0, 1, {});
    t1 = now_s();
    blk.weight_backward(ab, {});
    t2 = now_s();
    if (rep) bbi.push_back(t1 - t0), bw.push_back(t2 - t1);
    // head and loss
    fill(o, ah.input, NC, rng, 1.0f);
    t0 = now_s();
    head.head_forward(ah, HeadMode::train);
    t1 = now_s();
    head.begin_backward();
    head.head_backward(ah, {});
    t2 = now_s();
    if (rep) hf.push_back(t1 - t0), hb.push_back(t2 - t1);
    head.head_forward(ah, HeadMode::train);
    t0 = now_s();
    head.begin_backward(ah, BackwardMode::input_only);
    head.head_backward(ah, {});
    t1 = now_s();
    head.weight_backward(ah, {});
    t2 = now_s();
    if (rep) hbi.push_back(t1 - t0), hw.push_back(t2 - t1);
    // one AdamW update of the block's parameters
    t0 = now_s();
    adam.step(blk.params, blk.grads, blk.table, 1e-4, tc);
    t1 = now_s();
    if (rep) opt.push_back((t1 - t0) / (double)blk.table.numel);
  }
  LayerCosts c;
  c.micro_batch = B, c.seq_len = T;
  c.embed_f = median(ef), c.embed_b = median(eb);
  c.block_f = median(bf), c.block_b = median(bb);
  // BI and W were timed in their own pass; the whole backward's B is split in their proportion.
  const double split = median(bbi) / std::max(1e-12, median(bbi) + median(bw));
  c.block_bi = c.block_b * split;
  c.head_f = median(hf), c.head_b = median(hb);
  const double hsplit = median(hbi) / std::max(1e-12, median(hbi) + median(hw));
  c.head_bi = c.head_b * hsplit;
  // the chunks' recompute in the measured backward
  c.head_recompute = std::min(c.head_bi, lm_head_recompute_share(d, B, T) * c.head_f);
  c.opt_per_param = median(opt);
  c.source = "measured on this machine's CPU backend: " + std::to_string(threads > 0 ? threads : omp_get_max_threads()) +
             " thread(s), micro-batch " + std::to_string(B) + " x " + std::to_string(T) + ", median of " +
             std::to_string(reps) + " repetitions";
  return c;
}

}  // namespace llmpi
