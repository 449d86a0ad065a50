// A model family is a DESCRIPTION, not a copy of the code: norm, position encoding, MLP,
// attention kind, biases and head are fields of ModelDesc, and the parameter table, the forward
// and the backward all follow from it (model/param_layout.cpp, model/layers/, model/block.cpp). A family
// file (model/families/*.cpp) only says how its fields are set from the configuration and what
// Hugging Face calls each tensor.
//
//   family  norm       positions  MLP            attention               head
//   gpt2    LayerNorm  learned    GELU (tanh)    causal, fused c_attn    LM, tied to wte
//           pre-norm                                                     (model.tie_embeddings)
//   llama   RMSNorm    RoPE       SwiGLU         causal, grouped K/V     LM, untied lm_head
//           pre-norm   (HF rotate-half)          (n_kv_head), no bias
//   bert    LayerNorm  learned +  GELU (erf)     bidirectional with      pooler (dense + tanh on
//           post-norm  token type                padding mask            [CLS]) + classifier
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/options.h"

#include <nlohmann/json_fwd.hpp>

namespace llmpi {

struct ModelConfig;

enum class NormKind { layernorm, rmsnorm };
enum class MlpKind { gelu_tanh, gelu_erf, swiglu };
enum class HeadKind { lm, classifier };
// How attention is computed (runtime.attention), not what: `full` stores the probabilities P
// [B, NH, T, T] per layer for backward (attention_forward/backward); `fused` keeps one
// log-sum-exp per query row [B, NH, T] and recomputes P in backward
// (flash_attention_forward/backward), never holding a T x T matrix. Both give the same results
// to rounding.
enum class AttentionImpl { full, fused };

const char* family_name(Family f);
Family parse_family(const std::string& name);  // throws Error naming the known families
const std::vector<std::string>& family_names();

struct ModelDesc {
  Family family = Family::gpt2;
  int n_layer = 0, n_head = 0, n_kv_head = 0, d_model = 0, ffn_dim = 0;
  int max_seq_len = 0, vocab_size = 0;
  NormKind norm = NormKind::layernorm;
  double norm_eps = 1e-5;
  bool pre_norm = true;          // false: post-norm blocks (BERT)
  bool learned_positions = true; // wpe; false: RoPE (rope_theta)
  double rope_theta = 10000.0;
  int type_vocab_size = 0;       // > 0: token-type embedding (BERT)
  bool embedding_norm = false;   // LayerNorm after the embedding sum (BERT)
  MlpKind mlp = MlpKind::gelu_tanh;
  bool bias = true;              // biases on dense layers and LayerNorms
  bool causal = true;            // false: bidirectional attention with a padding mask
  HeadKind head = HeadKind::lm;
  bool tie_embeddings = true;    // LM head shares the token embedding
  bool final_norm = true;        // norm before the LM head (pre-norm families)
  int num_labels = 0;            // classifier head
  bool residual_scaled_init = false;  // GPT-2: residual projections N(0, std/sqrt(2 n_layer))
  double init_std = 0.02;
  float dropout = 0.0f;          // hidden dropout (training only)
  float attn_dropout = 0.0f;     // attention-probability dropout (training only)
  // A runtime choice, not part of the architecture: left out of model_desc_json (checkpoints)
  // and set by whoever runs the model (the trainer from runtime.attention: resolve_attention).
  AttentionImpl attention = AttentionImpl::full;
  // Rows per chunk of the chunked LM head (model/transformer.h "Chunked LM head"), also a runtime
  // choice left out of checkpoints: 0 = as many as keep one chunk's logits within
  // kLmHeadChunkBytes (tests set a small count to run many chunks).
  int lm_head_chunk_rows = 0;
  // Tensor parallelism (parallel.tp), a runtime choice too: this rank holds shard tp_rank of tp
  // (model/transformer.h "Tensor parallelism"): n_head / tp query heads, n_kv_head / tp key/value
  // heads, ffn_dim / tp MLP channels and the vocabulary rows [vocab_begin(), vocab_end()). The
  // per-rank widths below are those of the whole model when tp = 1.
  int tp = 1, tp_rank = 0;
  // Sequence parallelism (parallel.sequence_parallel, with tp > 1): the residual stream, norms and
  // hidden dropout on this rank's rows of each micro-batch only (model/transformer.h).
  bool sequence_parallel = false;
  bool seq_shards() const { return tp > 1 && sequence_parallel; }
  // The rows of the residual stream this rank holds of a micro-batch of N rows.
  int residual_rows(int N) const { return seq_shards() ? N / tp : N; }

  int head_dim() const { return d_model / n_head; }
  int heads() const { return n_head / tp; }          // query heads on this rank
  int kv_heads() const { return n_kv_head / tp; }    // key/value heads on this rank
  int ffn() const { return ffn_dim / tp; }           // MLP channels on this rank
  // This rank's width of the QKV projection's output, [q | k | v] of its heads.
  int qkv_dim() const { return (heads() + 2 * kv_heads()) * head_dim(); }
  // This rank's width of the first MLP projection's output: [gate | up] for SwiGLU.
  int fc_dim() const { return mlp == MlpKind::swiglu ? 2 * ffn() : ffn(); }
  // The vocabulary rows of this rank's token embedding and LM head: as even a split as it goes.
  int vocab_begin() const { return static_cast<int>(static_cast<int64_t>(vocab_size) * tp_rank / tp); }
  int vocab_end() const { return static_cast<int>(static_cast<int64_t>(vocab_size) * (tp_rank + 1) / tp); }
  int vocab_rows() const { return vocab_end() - vocab_begin(); }
};

// The description of shard `rank` of `tp` (tensor parallelism; d.tp must be 1). Throws Error
// naming the key to change when the model does not split so: tp must divide model.n_head,
// model.n_kv_head and the MLP width, and be at most the vocabulary size.
ModelDesc tensor_shard(const ModelDesc& d, int tp, int rank);

// The row stride of the LM head's logits in its chunk buffer (Activations::logits_ld): V rounded
// up to a multiple of 64 values (GPT-2: 50257 -> 50304, llm.c's padded vocabulary; 256-byte
// aligned rows for the head's GEMMs, GemmMode::out_ld). Only the stride is padded: the weight
// keeps V rows and the padding columns are never computed nor read.
inline int lm_logits_row_stride(int V) { return (V + 63) / 64 * 64; }

// The LM head's logits are computed in chunks of rows whose fp32 logits take at most this many
// bytes (256 MiB: 1334 rows of 50304 floats at GPT-2's V = 50257, against 13.2 GB for B = 64,
// T = 1024 whole).
constexpr size_t kLmHeadChunkBytes = size_t(256) << 20;
// Rows per chunk of the LM head over N rows (1 <= result <= N; N when N < 1 rows fit).
inline int lm_head_chunk_rows(const ModelDesc& d, int N) {
  size_t r = d.lm_head_chunk_rows > 0
                 ? static_cast<size_t>(d.lm_head_chunk_rows)
                 : kLmHeadChunkBytes / (sizeof(float) * static_cast<size_t>(lm_logits_row_stride(d.vocab_size > 0 ? d.vocab_size : 1)));
  if (r < 1) r = 1;
  return N < 1 ? 1 : static_cast<int>(r < static_cast<size_t>(N) ? r : static_cast<size_t>(N));
}

// The description the configuration asks for (model.* keys; vocab_size resolved by the caller).
// Throws Error naming the key when the sizes are beyond check_model_sizes' limits.
ModelDesc model_desc_from_config(const ModelConfig& m, int vocab_size);

// The most parameters a model may have: 2^56 (7.2e16), so that every byte count of them —
// parameters, gradients, optimizer state and their staging copies, under 64 bytes a parameter in
// all — stays within int64.
inline constexpr int64_t kMaxParams = int64_t(1) << 56;
// The limits of a description, all computed in 64 bits (and wider where a product may leave them):
//   model.n_layer      at most kMaxLayers (runtime/config.h)
//   widths             the kernels take every width as an int: the QKV projection's
//                      (n_head + 2 n_kv_head) x head size, the MLP's ffn_dim (its default a multiple
//                      of d_model: family_ffn_dim) and its first projection's output (2 x ffn_dim with
//                      SwiGLU), and the LM head's padded logits row (lm_logits_row_stride(vocab_size))
//                      at most INT_MAX
//   parameters         the whole model's count at most kMaxParams
// Throws Error naming the key to change and the limit; build_param_table, model_desc_from_config
// and model_desc_from_json call it.
void check_model_sizes(const ModelDesc& d);
// A family's default MLP width, `width` = the family's multiple of model.d_model (`rule` says which,
// e.g. "4 x model.d_model"), computed in 64 bits; throws Error naming model.d_model and model.ffn_dim
// when it exceeds INT_MAX.
int family_ffn_dim(int64_t width, const char* rule, int d_model);

// runtime.attention ("auto" | "full" | "fused") for a run on a GPU or not, with head size
// head_dim: "auto" is fused on a GPU (memory O(B NH T) instead of O(B NH T^2)) when the CUDA
// kernels take the head size (kFusedAttentionMaxHeadDimCuda), full otherwise and on the CPU (its
// GEMM-based full attention is the faster one there). Throws Error for another value, and for
// "fused" on a GPU with a head size the kernels do not take.
constexpr int kFusedAttentionMaxHeadDimCuda = 128;  // kernels/flash_attention.cu
AttentionImpl resolve_attention(AttentionChoice setting, bool on_gpu, int head_dim);
// The same from the word ("auto", "full", "fused"; an Error for any other): command-line options.
AttentionImpl resolve_attention(const std::string& setting, bool on_gpu, int head_dim);
const char* attention_impl_name(AttentionImpl a);

// Stored in checkpoints; a checkpoint of one description is never loaded into another.
nlohmann::json model_desc_json(const ModelDesc& d);
ModelDesc model_desc_from_json(const nlohmann::json& j);  // throws Error on a malformed description

// Training FLOPs per token: 6 × parameters + 12 × layers × seq_len × d_model (attention).
double flops_per_token(const ModelDesc& d, size_t n_params, int seq_len);

// ---- the tensors of a block, by role ------------------------------------------------------------
// Roles are what the generic code binds to; a family gives each role its Hugging Face name(s). A
// role with several names (LLaMA's q/k/v projections, its gate/up projections, BERT's
// query/key/value) is one fused tensor in the flat buffer: its parts are adjacent, in order, so a
// single GEMM computes all of them.
enum Role : int {
  kTokEmb, kPosEmb, kTypeEmb, kEmbNormW, kEmbNormB,
  kNorm1W, kNorm1B, kQkvW, kQkvB, kAttnOutW, kAttnOutB, kNorm2W, kNorm2B, kFcW, kFcB, kProjW, kProjB,
  kFinalNormW, kFinalNormB, kLmHead, kPoolerW, kPoolerB, kClsW, kClsB,
  kRoleCount
};
const char* role_name(int role);

// The Hugging Face names of a role's tensor(s) in layer `layer` (-1 outside the blocks); empty
// when the family has no such tensor.
std::vector<std::string> family_tensor_names(Family f, int role, int layer);

}  // namespace llmpi
