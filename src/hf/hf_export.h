// Hugging Face model directories out: config.json + model.safetensors that transformers'
// from_pretrained loads without warnings, for every family:
//   gpt2  → GPT2LMHeadModel ("transformer." names, Conv1D weights transposed back to [in, out],
//           no lm_head.weight when tied)
//   llama → LlamaForCausalLM (no lm_head.weight when tied)
//   bert  → BertForSequenceClassification (id2label from the label names when known)
// The inverse of hf/hf_import.h: importing an export gives the same parameters bit for bit.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/model_desc.h"
#include "params/param_table.h"

namespace llmpi {

struct HfExportOptions {
  std::vector<std::string> label_names;  // bert: id2label (default LABEL_0, LABEL_1, ...)
  int bos_token_id = -1, eos_token_id = -1, pad_token_id = -1;  // -1: not written (null)
};

// The config.json of a model with this description.
nlohmann::json hf_config_json(const ModelDesc& d, const HfExportOptions& o = {});

// The tensors of the whole model (t = build_param_table(d), params host, table layout) under
// their Hugging Face names, with GPT-2's Conv1D weights transposed, into out_dir/model.safetensors,
// and out_dir/config.json; out_dir is created. Both files are written atomically. Throws Error,
// writing nothing, when a value is not finite (naming the tensor). The destination checks of
// llmpi-export (no run directory, nothing overwritten unasked) are hf/export_dir.h's.
void export_hf_model(const std::string& out_dir, const ModelDesc& d, const ParamTable& t, const float* params,
                     const HfExportOptions& o = {});
// The same with each tensor read when it is written: source(s, out) writes slice s's s.numel
// values (our layout) into out. The export holds one tensor (two for a transposed one) at a time.
using TensorSource = std::function<void(const ParamSlice& s, float* out)>;
void export_hf_model(const std::string& out_dir, const ModelDesc& d, const ParamTable& t, const TensorSource& source,
                     const HfExportOptions& o = {});

}  // namespace llmpi
