// The dense layers a Model runs (the contract: model/dense_layers.h); the shapes follow
// the sublayers (model/layers/attention.cpp, mlp.cpp, lm_head.cpp, classifier.cpp).
#include "model/dense_layers.h"

namespace llmpi {

std::vector<DenseShape> dense_layers(const ModelDesc& d, const ModelPart& part, int B, int T) {
  const int N = B * T, C = d.d_model, l1 = part.l1 < 0 ? d.n_layer : part.l1, blocks = l1 - part.l0;
  std::vector<DenseShape> layers;
  if (blocks > 0)  // QKV, attention output, MLP in, MLP out (sequence parallelism: on the gathered rows)
    layers.insert(layers.end(), {{N, C, d.qkv_dim(), blocks},
                                 {N, d.heads() * d.head_dim(), C, blocks},
                                 {N, C, d.fc_dim(), blocks},
                                 {N, d.ffn(), C, blocks}});
  if (!part.head) return layers;
  if (d.head == HeadKind::lm) {  // chunks of R rows, the last one perhaps shorter
    const int R = lm_head_chunk_rows(d, N), V = d.vocab_rows();
    if (N / R > 0) layers.push_back({R, C, V, N / R});
    if (N % R > 0) layers.push_back({N % R, C, V, 1});
  } else {  // pooler, classifier
    layers.insert(layers.end(), {{B, C, C, 1}, {B, C, d.num_labels, 1}});
  }
  return layers;
}

}  // namespace llmpi
