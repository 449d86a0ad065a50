// Shared by the CPU step benchmarks (bench-attention_cpu, bench-lm_head_cpu): a random language-
// model batch, and the timing loop that runs several model variants ALTERNATELY (variant 0, 1, ...,
// 0, 1, ...) so that a shared machine's load falls on all alike.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "model/transformer.h"
#include "runtime/rng.h"

namespace llmpi::bench {

inline double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// B x T uniformly random tokens and targets below `vocab` (Rng seed 7): owns the arrays the Batch
// points into.
struct RandomLmBatch {
  std::vector<int32_t> tokens, targets;
  Batch batch;
  RandomLmBatch(int B, int T, int vocab) : tokens(static_cast<size_t>(B) * T), targets(tokens.size()) {
    Rng rng(7);
    for (size_t k = 0; k < tokens.size(); k++) {
      tokens[k] = static_cast<int32_t>(rng.below(vocab));
      targets[k] = static_cast<int32_t>(rng.below(vocab));
    }
    batch.B = B;
    batch.T = T;
    batch.tokens = tokens.data();
    batch.targets = targets.data();
  }
};

// Per variant k: the ms of each timed training step (zero grads, forward, backward) and the loss
// of the last. One untimed warm-up round first, then `steps` timed rounds.
struct StepTimes {
  std::vector<std::vector<double>> ms;
  std::vector<float> last_loss;
};

// fused[k] (when given): variant k trains in HeadMode::fused (the trainer's fused LM head).
inline StepTimes time_steps_alternately(const std::vector<std::unique_ptr<Model>>& models,
                                        const std::vector<std::unique_ptr<Activations>>& acts,
                                        const Batch& batch, int steps, const std::vector<bool>& fused = {}) {
  StepTimes r;
  r.ms.resize(models.size());
  r.last_loss.assign(models.size(), 0.0f);
  for (int s = 0; s <= steps; s++)
    for (size_t k = 0; k < models.size(); k++) {
      const double t0 = now_ms();
      models[k]->zero_grads();
      r.last_loss[k] = k < fused.size() && fused[k] ? models[k]->forward(*acts[k], batch, HeadMode::fused)
                                                    : models[k]->forward(*acts[k], batch, HeadMode::train);
      models[k]->backward(*acts[k]);
      if (s > 0) r.ms[k].push_back(now_ms() - t0);  // round 0 warms up
    }
  return r;
}

}  // namespace llmpi::bench
