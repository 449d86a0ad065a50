// model.* values that come from elsewhere (llmpi-train --init-from: a Hugging Face config.json,
// hf/hf_import.h), handed to parse_config (runtime/config.h). `fixed` values must equal any value
// the user set for the key (else an error naming both); `defaults` apply to keys the user did not
// set.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace llmpi {

struct ModelSource {
  std::string name;  // e.g. "'dir/config.json'"
  nlohmann::json fixed = nlohmann::json::object(), defaults = nlohmann::json::object();
};

}  // namespace llmpi
