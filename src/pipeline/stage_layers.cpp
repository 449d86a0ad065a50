#include "pipeline/stage_layers.h"

#include <algorithm>
#include <limits>

#include "runtime/error.h"

namespace llmpi {

std::vector<int> split_layers(const ModelDesc& d, int T, int K, const std::vector<int>& explicit_counts) {
  if (!explicit_counts.empty()) {
    int sum = 0;
    for (int n : explicit_counts) sum += n;
    if ((int)explicit_counts.size() != K || sum != d.n_layer)
      fail("parallel.stage_layers lists ", explicit_counts.size(), " counts summing to ", sum, ", but the pipeline has ",
           K, " (virtual) stages and the model ", d.n_layer, " layers: give ", K, " counts summing to ", d.n_layer,
           ", or leave it empty to balance by cost");
    return explicit_counts;
  }
  if (d.n_layer < K)
    fail("the model has ", d.n_layer, " layers, fewer than the ", K, " (virtual) pipeline stages: use fewer "
         "parallel.pp_stages (or virtual_stages), or give parallel.stage_layers with zeros explicitly");
  // Forward FLOPs per token: a block 2·params + 4·T·C (scores and weighted values); the head its
  // matrix; the embedding a lookup (C).
  ModelPart block{0, 1, false, false};
  const double C = d.d_model;
  const double block_cost = 2.0 * build_param_table(d, block).numel + 4.0 * T * C;
  const double head_cost = d.head == HeadKind::lm ? 2.0 * d.vocab_size * C : 2.0 * C * C + 2.0 * C * d.num_labels;
  const double emb_cost = C;
  const int L = d.n_layer;
  // best[k][l]: the smallest possible maximum cost putting blocks [0, l) into virtual stages [0, k).
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(K + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int>> cut(K + 1, std::vector<int>(L + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= K; k++) {
    for (int l = k; l <= L - (K - k); l++) {
      for (int p = k - 1; p < l; p++) {  // stage k-1 holds blocks [p, l)
        double c = (l - p) * block_cost + (k == 1 ? emb_cost : 0) + (k == K ? head_cost : 0);
        double m = std::max(best[k - 1][p], c);
        if (m < best[k][l]) best[k][l] = m, cut[k][l] = p;
      }
    }
  }
  std::vector<int> counts(K);
  for (int k = K, l = L; k >= 1; k--) {
    counts[k - 1] = l - cut[k][l];
    l = cut[k][l];
  }
  return counts;
}

ModelPart virtual_stage_part(const std::vector<int>& counts, int k) {
  ModelPart p;
  p.l0 = 0;
  for (int i = 0; i < k; i++) p.l0 += counts[i];
  p.l1 = p.l0 + counts[k];
  p.embedding = k == 0;
  p.head = k == (int)counts.size() - 1;
  return p;
}

}  // namespace llmpi
