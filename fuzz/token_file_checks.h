// What the two token-file fuzz targets require of whatever TokenReader accepts: a file that opens
// must have consistent attributes, and every id read from it must lie below its vocab_size.
// A violation aborts with "<target>: <what>" (libFuzzer keeps the input).
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "data/token_file.h"
#include "runtime/error.h"

namespace fuzz_checks {

[[noreturn]] inline void bug(const char* target, const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", target, what.c_str());
  std::abort();
}

inline void check_info(const char* target, const llmpi::TokenFileInfo& i) {
  if (i.version != llmpi::kTokenFileVersion) bug(target, "opened a file of version " + std::to_string(i.version));
  if (i.vocab_size <= 0 || i.vocab_size > INT32_MAX) bug(target, "vocab_size " + std::to_string(i.vocab_size));
  if (i.eot_id < 0 || i.eot_id >= i.vocab_size) bug(target, "eot_id " + std::to_string(i.eot_id));
  if (!((i.dtype_bytes == 2 && i.dtype == "uint16") || (i.dtype_bytes == 4 && i.dtype == "uint32")))
    bug(target, "dtype " + i.dtype);
  if (i.n_tokens < 0) bug(target, "n_tokens " + std::to_string(i.n_tokens));
}

// Read [start, start + count); an llmpi::Error is an accepted refusal.
inline void read_some(const char* target, llmpi::TokenReader& r, int64_t start, int64_t count) {
  try {
    std::vector<int32_t> t = r.read(start, count);
    for (int32_t id : t)
      if (id < 0 || id >= r.info().vocab_size)
        bug(target, "read id " + std::to_string(id) + " with vocab_size " + std::to_string(r.info().vocab_size));
  } catch (const llmpi::Error&) {
  }
}

}  // namespace fuzz_checks
