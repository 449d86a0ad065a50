// The configuration reference: one line per key of the defaults document (config.cpp) saying what
// it does and where it acts. `llmpi-train --help` prints it with each key's default, and
// `llmpi-train --help-keys-markdown` prints it as the table of docs/CONFIG.md (regenerated with
// tools/gen_config_doc.sh; tests/cli/docs.sh fails when the committed table differs). A key added
// to the defaults document needs its line here: config_key_docs_missing() names keys without one.
#pragma once
#include <string>
#include <vector>

namespace llmpi {

struct ConfigKeyDoc {
  const char* key;          // "section.key", as in the defaults document
  const char* acts;         // where the key has an effect ("" = every run; model keys: derived from the families)
  const char* description;  // one line: what it sets, the meaning of 0 or each word value
};

const std::vector<ConfigKeyDoc>& config_key_docs();
// What is wrong with the table, one line each: keys of the defaults document without a description,
// descriptions of keys it does not have, keys described twice. Empty when the table is whole.
std::vector<std::string> config_key_docs_missing();
// The key list of `llmpi-train --help`: key, default and description, model keys per family.
std::string config_keys_help();
// The Markdown table of docs/CONFIG.md: key, default, where it acts, description.
std::string config_keys_markdown();

}  // namespace llmpi
