// Every configuration key, declared once (config_keys.cpp): its name, default (whose JSON type is
// the key's type), range, description, where it acts, which families take it (model keys), how it
// is read into the typed Config, and when a value set for it has no effect. Everything else is
// derived from the table:
//   the defaults document and the families' model keys   config_defaults, family_model_defaults
//   parsing and range errors                              parse_config (config.cpp)
//   "has no effect here" warnings                         keys_without_effect
//   `llmpi-train --help` and docs/CONFIG.md's key table   config_keys_help, config_keys_markdown
//     (regenerated with tools/gen_config_doc.sh; tests/cli/docs.sh fails when the committed table
//     differs)
// Checks between keys (d_model a multiple of n_head, say) stay in parse_config.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/config.h"

namespace llmpi {

// A number's allowed range: lo <= v (lo < v when lo_open) and v <= hi (v < hi when hi_open), NaN
// for no bound; `note` follows the range in the error ("(0 = no clipping)").
struct KeyRange {
  double lo, hi;
  bool lo_open = false, hi_open = false;
  const char* note = "";
  bool any() const { return lo == lo || hi == hi; }  // (NaN != NaN)
};

struct ConfigKey {
  const char* key;          // "section.key"
  nlohmann::json def;       // the default; its type is the key's (integers, numbers, strings, booleans, a list)
  KeyRange range;           // numbers: checked when read (an error names the key, the range and the value)
  const char* acts;         // where the key has an effect ("" = every run; model keys: their families)
  const char* description;  // one line: what it sets, the meaning of 0 or each word value
  // model keys: the families that take it (bits 1 << Family), and their defaults where they differ
  unsigned families;
  nlohmann::json family_defaults;  // {"bert": 1e-12}
  // The value (of the key's type, its range checked) into the typed Config; throws Error naming the key.
  std::function<void(Config&, const nlohmann::json&)> read;
  // Why a value set for the key does nothing in configuration c ("" when it acts).
  std::function<std::string(const Config&)> no_effect;

  std::string section() const { const std::string k = key; return k.substr(0, k.find('.')); }  // "train"
  std::string name() const { const std::string k = key; return k.substr(k.find('.') + 1); }    // "lr"
};

const std::vector<ConfigKey>& config_keys();
const ConfigKey* find_config_key(const std::string& key);  // null for an unknown key
// The value v set for k within k's range (numbers only), else an Error naming the key, the range
// and the value.
void check_key_range(const ConfigKey& k, const nlohmann::json& v);

// What is wrong with the table, one line each: keys declared twice, keys without a description.
// Empty when the table is whole.
std::vector<std::string> config_key_docs_missing();
// The key list of `llmpi-train --help`: key, default and description, model keys per family.
std::string config_keys_help();
// The Markdown table of docs/CONFIG.md: key, default, where it acts, description.
std::string config_keys_markdown();

}  // namespace llmpi
