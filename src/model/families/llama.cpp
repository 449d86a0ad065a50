// LLaMA: pre-RMSNorm blocks, rotary positions (Hugging Face's rotate-half convention, applied to
// the q/k projections' outputs as stored in HF checkpoints), SwiGLU MLP (down(silu(gate x) * up x)),
// grouped-query attention (model.n_kv_head), no biases, untied lm_head unless
// model.tie_embeddings is true. Names are Hugging Face's LlamaForCausalLM ones.
#include "model/families/families.h"

namespace llmpi {

ModelDesc llama_desc(const ModelConfig& m) {
  ModelDesc d;
  d.family = Family::llama;
  d.norm = NormKind::rmsnorm;
  d.pre_norm = true;
  d.learned_positions = false;
  d.rope_theta = m.rope_theta;
  d.mlp = MlpKind::swiglu;
  // Default hidden size: 2/3 of 4·d_model (SwiGLU has three matrices where GELU has two, so
  // this keeps the MLP's parameter count), rounded up to a multiple of 64.
  d.ffn_dim = m.ffn_dim > 0 ? m.ffn_dim
                            : family_ffn_dim((8 * int64_t(m.d_model) / 3 + 63) / 64 * 64,
                                             "8/3 x model.d_model rounded up to 64", m.d_model);
  d.bias = false;
  d.causal = true;
  d.head = HeadKind::lm;
  d.tie_embeddings = m.tie_embeddings;
  d.final_norm = true;
  d.residual_scaled_init = false;
  d.dropout = static_cast<float>(m.dropout);
  d.attn_dropout = static_cast<float>(m.dropout);
  return d;
}

std::vector<std::string> llama_tensor_names(int role, int layer) {
  const std::string h = "model.layers." + std::to_string(layer) + ".";
  switch (role) {
    case kTokEmb: return {"model.embed_tokens.weight"};
    case kNorm1W: return {h + "input_layernorm.weight"};
    case kQkvW: return {h + "self_attn.q_proj.weight", h + "self_attn.k_proj.weight", h + "self_attn.v_proj.weight"};
    case kAttnOutW: return {h + "self_attn.o_proj.weight"};
    case kNorm2W: return {h + "post_attention_layernorm.weight"};
    case kFcW: return {h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"};
    case kProjW: return {h + "mlp.down_proj.weight"};
    case kFinalNormW: return {"model.norm.weight"};
    case kLmHead: return {"lm_head.weight"};
    default: return {};
  }
}

}  // namespace llmpi
