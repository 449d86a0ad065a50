// GPT-2: pre-LayerNorm blocks, learned positions, GELU (tanh) MLP, fused q/k/v (c_attn), biases
// everywhere, LM head tied to the token embedding unless model.tie_embeddings is false.
// Names are Hugging Face's GPT2Model ones (GPT2LMHeadModel adds "transformer." in front).
#include "model/families/families.h"

namespace llmpi {

ModelDesc gpt2_desc(const ModelConfig& m) {
  ModelDesc d;
  d.family = Family::gpt2;
  d.norm = NormKind::layernorm;
  d.pre_norm = true;
  d.learned_positions = true;
  d.mlp = MlpKind::gelu_tanh;
  d.ffn_dim = m.ffn_dim > 0 ? m.ffn_dim : family_ffn_dim(4 * int64_t(m.d_model), "4 x model.d_model", m.d_model);
  d.bias = true;
  d.causal = true;
  d.head = HeadKind::lm;
  d.tie_embeddings = m.tie_embeddings;
  d.final_norm = true;
  d.residual_scaled_init = true;
  d.dropout = static_cast<float>(m.dropout);
  d.attn_dropout = static_cast<float>(m.dropout);
  return d;
}

std::vector<std::string> gpt2_tensor_names(int role, int layer) {
  const std::string h = "h." + std::to_string(layer) + ".";
  switch (role) {
    case kTokEmb: return {"wte.weight"};
    case kPosEmb: return {"wpe.weight"};
    case kNorm1W: return {h + "ln_1.weight"};
    case kNorm1B: return {h + "ln_1.bias"};
    case kQkvW: return {h + "attn.c_attn.weight"};
    case kQkvB: return {h + "attn.c_attn.bias"};
    case kAttnOutW: return {h + "attn.c_proj.weight"};
    case kAttnOutB: return {h + "attn.c_proj.bias"};
    case kNorm2W: return {h + "ln_2.weight"};
    case kNorm2B: return {h + "ln_2.bias"};
    case kFcW: return {h + "mlp.c_fc.weight"};
    case kFcB: return {h + "mlp.c_fc.bias"};
    case kProjW: return {h + "mlp.c_proj.weight"};
    case kProjB: return {h + "mlp.c_proj.bias"};
    case kFinalNormW: return {"ln_f.weight"};
    case kFinalNormB: return {"ln_f.bias"};
    case kLmHead: return {"lm_head.weight"};
    default: return {};
  }
}

}  // namespace llmpi
