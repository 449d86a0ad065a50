// Classification metrics from a confusion matrix, as GLUE reports them: accuracy for every task,
// F1 of the positive class (label 1) for MRPC and QQP, Matthews correlation for CoLA. The matrix
// is summed over ranks before any metric is taken, so every example counts once.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace llmpi {

struct ConfusionMatrix {
  int K = 0;                     // classes
  std::vector<double> counts;    // counts[truth * K + predicted]; doubles so one MPI_SUM adds them

  explicit ConfusionMatrix(int k = 0) : K(k), counts(static_cast<size_t>(k) * k, 0.0) {}
  void add(int truth, int predicted) { counts[static_cast<size_t>(truth) * K + predicted] += 1; }
  double total() const;
  // correct / total (0 for an empty matrix).
  double accuracy() const;
  // Binary tasks: F1 = 2·TP / (2·TP + FP + FN) of class `positive` (0 when it never occurs nor is
  // predicted).
  double f1(int positive = 1) const;
  // Matthews correlation, the K-class form (Gorodkin's R_K), which for K = 2 is
  //   (TP·TN − FP·FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)):
  //   (c·s − Σ_k p_k·t_k) / sqrt((s² − Σ_k p_k²)(s² − Σ_k t_k²))
  // with c correct, s total, p_k predicted as k, t_k truly k; 0 when a denominator is 0 (as
  // scikit-learn does).
  double matthews() const;
};

}  // namespace llmpi
