// What GLUE fine-tuning relies on besides the model: the learning-rate schedules, the AdamW
// weight-decay exclusions BERT fine-tuning uses, and the metrics GLUE reports.
#include <gtest/gtest.h>

#include <cmath>

#include "metrics/classification_metrics.h"
#include "model/transformer.h"
#include "optim/optimizer.h"
#include "runtime/config.h"

using namespace llmpi;

namespace {
TrainConfig schedule(const std::string& kind, int64_t steps, int64_t warmup, double min_ratio) {
  Config c = parse_config(R"({"data": {"train": "t.h5"}})", "test",
                          {"train.lr_schedule=" + kind, "train.steps=" + std::to_string(steps),
                           "train.warmup_steps=" + std::to_string(warmup), "train.lr=2e-5",
                           "train.min_lr_ratio=" + std::to_string(min_ratio)});
  return c.train;
}
}  // namespace

// linear: transformers' get_linear_schedule_with_warmup with the rate of step s taken after s
// scheduler steps — lr·(T − s)/(T − W) after the warm-up, down to min_lr at s = T.
TEST(FineTuning, LinearScheduleDecaysToMinimum) {
  // Bound: the schedule and the hand formula each round ≤ 5 times (the decimal constants,
  // quotient, subtraction, product, sum; cos(fl(π)/2) = 6e-17 adds less) on values ≤ lr:
  // they differ by ≤ 2·5u·lr, u = 2^-53.
  const double tol = 2 * 5 * 0x1p-53 * 2e-5;
  TrainConfig tc = schedule("linear", 117, 0, 0.0);
  for (int64_t s : {0, 1, 50, 116})
    EXPECT_NEAR(lr_at(tc, s), 2e-5 * (117.0 - s) / 117.0, tol) << "step " << s;
  EXPECT_EQ(lr_at(tc, 117), 0.0);  // Exact: 0 + (1 − 1)·lr
  tc = schedule("linear", 100, 10, 0.1);
  EXPECT_NEAR(lr_at(tc, 0), 2e-6, tol);   // warm-up: lr·(s+1)/W
  EXPECT_NEAR(lr_at(tc, 9), 2e-5, tol);
  EXPECT_NEAR(lr_at(tc, 10), 2e-5, tol);  // then linear from lr to lr·min_lr_ratio
  EXPECT_NEAR(lr_at(tc, 55), 2e-6 + 0.5 * (2e-5 - 2e-6), tol);
  EXPECT_NEAR(lr_at(tc, 100), 2e-6, tol);
  tc = schedule("constant", 100, 4, 0.0);
  EXPECT_NEAR(lr_at(tc, 1), 1e-5, tol);
  EXPECT_NEAR(lr_at(tc, 99), 2e-5, tol);
  tc = schedule("cosine", 100, 0, 0.0);
  EXPECT_NEAR(lr_at(tc, 50), 1e-5, tol);  // half-way down a cosine
}

// AdamW decays the 2-D weights and not the biases or LayerNorm weights — for bert exactly
// transformers' `no_decay = ["bias", "LayerNorm.weight"]` rule on the Hugging Face names.
TEST(FineTuning, WeightDecaySkipsBiasesAndLayerNorms) {
  Config c = parse_config(R"({"data": {"train": "t.h5"}, "model": {"family": "bert"}})", "test",
                          {"model.n_layer=2", "model.d_model=32", "model.n_head=2"});
  const ParamTable t = build_param_table(model_desc_from_config(c.model, 100));
  int decayed = 0, excluded = 0;
  for (const ParamSlice& s : t.slices) {
    const bool no_decay = s.name.find("bias") != std::string::npos || s.name.find("LayerNorm.weight") != std::string::npos;
    EXPECT_EQ(s.decay, !no_decay) << s.name;
    (s.decay ? decayed : excluded)++;
  }
  EXPECT_GT(decayed, 0);
  EXPECT_GT(excluded, 0);
}

// Metrics from a confusion matrix, checked against values worked out by hand (and equal to
// scikit-learn's accuracy_score, f1_score and matthews_corrcoef for these labels).
TEST(FineTuning, ClassificationMetrics) {
  ConfusionMatrix cm(2);
  // truth 1 predicted 1: 5 (TP); truth 0 predicted 0: 3 (TN); truth 0 predicted 1: 2 (FP); truth 1 predicted 0: 1 (FN)
  for (int i = 0; i < 5; i++) cm.add(1, 1);
  for (int i = 0; i < 3; i++) cm.add(0, 0);
  for (int i = 0; i < 2; i++) cm.add(0, 1);
  cm.add(1, 0);
  // Exact: integer counts; each metric is one correctly rounded quotient (the MCC's 26/sqrt(3360)
  // and 13/sqrt(840) too: sqrt(4x) is 2·sqrt(x) rounded alike), and so is the hand value.
  EXPECT_EQ(cm.total(), 11);
  EXPECT_EQ(cm.accuracy(), 8.0 / 11.0);
  EXPECT_EQ(cm.f1(1), 10.0 / 13.0);                        // 2TP / (2TP + FP + FN)
  EXPECT_EQ(cm.matthews(), 13.0 / std::sqrt(7.0 * 6 * 5 * 4));  // (TP·TN − FP·FN)/sqrt(...)
  ConfusionMatrix constant(2);  // a classifier that always says 0: MCC 0 (not NaN), F1 0
  for (int i = 0; i < 4; i++) constant.add(i % 2, 0);
  // Exact: nothing predicted 1 makes the MCC's denominator 0, whose defined value is 0; F1 is 0 / 2.
  EXPECT_EQ(constant.matthews(), 0.0);
  EXPECT_EQ(constant.f1(1), 0.0);
  EXPECT_EQ(constant.accuracy(), 0.5);  // Exact: 2 / 4
  ConfusionMatrix perfect(3);  // three classes, all right: MCC 1
  for (int k = 0; k < 3; k++) perfect.add(k, k), perfect.add(k, k);
  EXPECT_EQ(perfect.matthews(), 1.0);  // Exact: 24 / sqrt(576)
  EXPECT_EQ(ConfusionMatrix(2).accuracy(), 0.0);  // Exact: no rows, the defined 0
}
