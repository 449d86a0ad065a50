// The per-family pieces (one file each): how model.* configures the description, and the
// Hugging Face tensor names of each role. Everything else is shared (model/layers/, model/block.cpp).
#pragma once
#include <string>
#include <vector>

#include "model/model_desc.h"
#include "runtime/config.h"

namespace llmpi {

ModelDesc gpt2_desc(const ModelConfig& m);
ModelDesc llama_desc(const ModelConfig& m);
ModelDesc bert_desc(const ModelConfig& m);
std::vector<std::string> gpt2_tensor_names(int role, int layer);
std::vector<std::string> llama_tensor_names(int role, int layer);
std::vector<std::string> bert_tensor_names(int role, int layer);

}  // namespace llmpi
