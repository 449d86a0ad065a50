#include "metrics/classification_metrics.h"

#include <cmath>

namespace llmpi {

double ConfusionMatrix::total() const {
  double s = 0;
  for (double c : counts) s += c;
  return s;
}

double ConfusionMatrix::accuracy() const {
  double correct = 0;
  for (int k = 0; k < K; k++) correct += counts[static_cast<size_t>(k) * K + k];
  const double s = total();
  return s > 0 ? correct / s : 0.0;
}

double ConfusionMatrix::f1(int positive) const {
  if (positive < 0 || positive >= K) return 0.0;
  const double tp = counts[static_cast<size_t>(positive) * K + positive];
  double fp = 0, fn = 0;
  for (int k = 0; k < K; k++) {
    if (k == positive) continue;
    fp += counts[static_cast<size_t>(k) * K + positive];  // truly k, predicted positive
    fn += counts[static_cast<size_t>(positive) * K + k];  // truly positive, predicted k
  }
  const double d = 2 * tp + fp + fn;
  return d > 0 ? 2 * tp / d : 0.0;
}

double ConfusionMatrix::matthews() const {
  std::vector<double> pred(K, 0.0), truth(K, 0.0);
  double correct = 0;
  for (int t = 0; t < K; t++)
    for (int p = 0; p < K; p++) {
      const double c = counts[static_cast<size_t>(t) * K + p];
      truth[t] += c, pred[p] += c;
      if (t == p) correct += c;
    }
  const double s = total();
  double pt = 0, pp = 0, tt = 0;
  for (int k = 0; k < K; k++) pt += pred[k] * truth[k], pp += pred[k] * pred[k], tt += truth[k] * truth[k];
  const double d = (s * s - pp) * (s * s - tt);
  return d > 0 ? (correct * s - pt) / std::sqrt(d) : 0.0;
}

}  // namespace llmpi
