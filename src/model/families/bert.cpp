// BERT: token + learned position + token-type embeddings followed by LayerNorm; post-LayerNorm
// blocks (x = LN(x + attn(x)); x = LN(x + mlp(x))); exact erf GELU; bidirectional attention with
// a padding mask; hidden and attention-probability dropout while training; a pooler (dense + tanh
// over the first token, [CLS]) and a classifier with model.num_labels outputs.
// Names are Hugging Face's BertForSequenceClassification ones.
#include "model/families/families.h"

namespace llmpi {

ModelDesc bert_desc(const ModelConfig& m) {
  ModelDesc d;
  d.family = Family::bert;
  d.norm = NormKind::layernorm;
  d.pre_norm = false;
  d.learned_positions = true;
  d.type_vocab_size = m.type_vocab_size;
  d.embedding_norm = true;
  d.mlp = MlpKind::gelu_erf;
  d.ffn_dim = m.ffn_dim > 0 ? m.ffn_dim : family_ffn_dim(4 * int64_t(m.d_model), "4 x model.d_model", m.d_model);
  d.bias = true;
  d.causal = false;
  d.head = HeadKind::classifier;
  d.tie_embeddings = false;
  d.final_norm = false;
  d.num_labels = m.num_labels;
  d.residual_scaled_init = false;
  d.dropout = static_cast<float>(m.dropout);
  d.attn_dropout = static_cast<float>(m.attn_dropout);
  return d;
}

std::vector<std::string> bert_tensor_names(int role, int layer) {
  const std::string e = "bert.embeddings.", h = "bert.encoder.layer." + std::to_string(layer) + ".";
  switch (role) {
    case kTokEmb: return {e + "word_embeddings.weight"};
    case kPosEmb: return {e + "position_embeddings.weight"};
    case kTypeEmb: return {e + "token_type_embeddings.weight"};
    case kEmbNormW: return {e + "LayerNorm.weight"};
    case kEmbNormB: return {e + "LayerNorm.bias"};
    case kQkvW:
      return {h + "attention.self.query.weight", h + "attention.self.key.weight", h + "attention.self.value.weight"};
    case kQkvB: return {h + "attention.self.query.bias", h + "attention.self.key.bias", h + "attention.self.value.bias"};
    case kAttnOutW: return {h + "attention.output.dense.weight"};
    case kAttnOutB: return {h + "attention.output.dense.bias"};
    case kNorm1W: return {h + "attention.output.LayerNorm.weight"};
    case kNorm1B: return {h + "attention.output.LayerNorm.bias"};
    case kFcW: return {h + "intermediate.dense.weight"};
    case kFcB: return {h + "intermediate.dense.bias"};
    case kProjW: return {h + "output.dense.weight"};
    case kProjB: return {h + "output.dense.bias"};
    case kNorm2W: return {h + "output.LayerNorm.weight"};
    case kNorm2B: return {h + "output.LayerNorm.bias"};
    case kPoolerW: return {"bert.pooler.dense.weight"};
    case kPoolerB: return {"bert.pooler.dense.bias"};
    case kClsW: return {"classifier.weight"};
    case kClsB: return {"classifier.bias"};
    default: return {};
  }
}

}  // namespace llmpi
