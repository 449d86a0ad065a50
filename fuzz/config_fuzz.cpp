// libFuzzer target: llmpi::parse_config on arbitrary JSON text and `--set` overrides.
//
// Input: the JSON text, then optionally '\0' followed by one override per '\0'-separated part
// (at most 8), exactly as `llmpi-train --config run.json --set A --set B` would pass them.
// Contract checked:
//   - the only exception that may leave parse_config is llmpi::Error (anything else, a crash or a
//     sanitizer report is a bug);
//   - an accepted configuration can be written out: cfg.resolved.dump() (what the trainer writes
//     to run_dir/config.json) does not throw;
//   - no silent clamping: every integer field of the Config equals the value in cfg.resolved.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "config_input.h"
#include "runtime/config.h"
#include "runtime/error.h"

namespace {

[[noreturn]] void bug(const std::string& what) {
  std::fprintf(stderr, "config_fuzz: %s\n", what.c_str());
  std::abort();
}

template <typename T>
void same_number(const nlohmann::json& resolved, const char* sec, const char* key, T field) {
  const nlohmann::json& v = resolved[sec][key];
  bool ok = v.is_number_float() ? double(field) == v.get<double>()
            : v.is_number_unsigned() ? field >= 0 && uint64_t(field) == v.get<uint64_t>()
                                     : int64_t(field) == v.get<int64_t>() &&
                                           (field >= 0 || v.get<int64_t>() < 0);
  if (!ok)
    bug(std::string("'") + sec + "." + key + "' is " + v.dump() + " in cfg.resolved but " +
        std::to_string(field) + " in the Config struct (silently changed)");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string in(reinterpret_cast<const char*>(data), size);
  auto [text, overrides] = split_config_input(in);

  llmpi::Config c;
  try {
    c = llmpi::parse_config(text, "fuzz.json", overrides);
  } catch (const llmpi::Error&) {
    return 0;  // a rejected configuration: fine
  }
  // Accepted: the resolved document must serialise (the trainer writes it as config.json).
  std::string dumped;
  try {
    dumped = c.resolved.dump(2);
  } catch (const std::exception& e) {
    bug(std::string("accepted config cannot be written as config.json: ") + e.what());
  }
  const nlohmann::json& r = c.resolved;
  same_number(r, "model", "n_layer", c.model.n_layer);
  same_number(r, "model", "n_head", c.model.n_head);
  same_number(r, "model", "d_model", c.model.d_model);
  same_number(r, "model", "seq_len", c.model.seq_len);
  same_number(r, "model", "vocab_size", c.model.vocab_size);
  same_number(r, "train", "steps", c.train.steps);
  same_number(r, "train", "global_batch", c.train.global_batch);
  same_number(r, "train", "warmup_steps", c.train.warmup_steps);
  same_number(r, "train", "log_every", c.train.log_every);
  same_number(r, "train", "eval_every", c.train.eval_every);
  same_number(r, "train", "eval_batches", c.train.eval_batches);
  same_number(r, "parallel", "poll_us", c.parallel.poll_us);
  same_number(r, "parallel", "average_every", c.parallel.average_every);
  same_number(r, "runtime", "threads", c.runtime.threads);
  same_number(r, "runtime", "trace_steps", c.runtime.trace_steps);
  same_number(r, "checkpoint", "every", c.checkpoint.every);
  same_number(r, "checkpoint", "keep", c.checkpoint.keep);
  {  // the seed is unsigned: a negative value may not wrap around to a huge one
    const nlohmann::json& v = r["train"]["seed"];
    bool ok = v.is_number_float() ? double(c.train.seed) == v.get<double>()
              : v.is_number_unsigned() ? c.train.seed == v.get<uint64_t>()
                                       : v.get<int64_t>() >= 0 && c.train.seed == v.get<uint64_t>();
    if (!ok) bug("'train.seed' is " + v.dump() + " but became " + std::to_string(c.train.seed));
  }
  return 0;
}
