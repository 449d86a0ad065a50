// libFuzzer target: the token file reader's checks (llmpi::TokenReader, open_token_file_info) on
// arbitrary file contents.
//
// The input bytes are written to a temporary file (one per process, under $TMPDIR or /tmp), which
// is opened with open_token_file_info and TokenReader; when it opens, the first and last tokens are
// read. The only exception that may escape is llmpi::Error: anything else, a crash or a sanitizer
// report is a bug. A file that opens must describe itself consistently (version 1, vocab_size in
// 1..INT32_MAX, eot_id below it, dtype uint16 or uint32), and every token read must be
// < vocab_size. Seed corpus: valid files from write_token_file and truncations of them
// (fuzz/make_token_seeds.cpp).
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "data/token_file.h"
#include "token_file_checks.h"
#include "runtime/error.h"

namespace {

std::string g_path;

[[noreturn]] void bug(const std::string& what) {
  std::fprintf(stderr, "token_file_fuzz: %s\n", what.c_str());
  std::abort();
}

// Known third-party defect, not llmpi's: libhdf5 1.10.x (Debian 12 ships 1.10.8) walks the objects
// of a global heap collection ("GCOL", where variable-length strings such as our 'format' and
// 'tokenizer' attributes live) with `p = begin + need` and no check that `need` advances p, so an
// object header with index 0 and size 0 (or a size that wraps the pointer) makes H5Aread loop
// forever inside H5HG__cache_heap_deserialize. Input beyond the end of the file reads as zeros,
// as libhdf5's sec2 driver returns it. We cannot fix that in llmpi (the loop is inside H5Aread);
// such inputs are skipped here so that a 25 s timeout is not spent on each (fuzz/known/
// hdf5-1.10-gheap-loop.h5 is one: `h5dump -A` loops on it too). libhdf5's other defects on
// malformed files (e.g. fuzz/known/hdf5-1.10-attr-heap-overflow.h5) are triaged by
// tools/fuzz_run.sh: listed as third-party, not failures.
bool hdf5_110_gheap_loops(const uint8_t* data, size_t size) {
  auto byte = [&](uint64_t i) -> uint64_t { return i < size ? data[i] : 0; };
  auto le = [&](uint64_t at, int n) {
    uint64_t v = 0;
    for (int k = n - 1; k >= 0; k--) v = v << 8 | byte(at + k);
    return v;
  };
  for (size_t at = 0; at + 16 <= size; at++) {
    if (std::memcmp(data + at, "GCOL", 4) != 0 || data[at + 4] != 1) continue;
    const uint64_t heap_size = le(at + 8, 8);  // size of lengths: 8 in every file we open
    if (heap_size > (uint64_t(1) << 30)) continue;  // libhdf5 fails to read it first
    for (uint64_t p = 16; p < heap_size;) {
      if (p + 16 > heap_size) break;  // tail too small for an object header: free space
      const uint64_t idx = le(at + p, 2), obj_size = le(at + p + 8, 8);
      const uint64_t need = idx > 0 ? 16 + ((obj_size + 7) & ~uint64_t(7)) : obj_size;
      if (need == 0 || need > ~uint64_t(0) - (uint64_t(1) << 48)) return true;  // stuck, or wraps
      p += need;
    }
  }
  return false;
}

void remove_tmp() {
  if (!g_path.empty()) std::remove(g_path.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* t = std::getenv("TMPDIR");
  g_path = std::string(t && *t ? t : "/tmp") + "/llmpi-token-file-fuzz-" + std::to_string(getpid()) + ".h5";
  std::atexit(remove_tmp);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (hdf5_110_gheap_loops(data, size)) return -1;  // see above; -1: do not add it to the corpus
  FILE* f = std::fopen(g_path.c_str(), "wb");
  if (!f) bug("cannot write " + g_path);
  if (size && std::fwrite(data, 1, size, f) != size) bug("cannot write " + g_path);
  std::fclose(f);

  try {
    fuzz_checks::check_info("token_file_fuzz", llmpi::open_token_file_info(g_path));
  } catch (const llmpi::Error&) {
  }
  try {
    llmpi::TokenReader r(g_path);
    fuzz_checks::check_info("token_file_fuzz", r.info());
    const int64_t n = r.n_tokens();
    fuzz_checks::read_some("token_file_fuzz", r, 0, std::min<int64_t>(n, 4096));
    fuzz_checks::read_some("token_file_fuzz", r, std::max<int64_t>(0, n - 16), std::min<int64_t>(n, 16));
    fuzz_checks::read_some("token_file_fuzz", r, n, 1);  // out of range: an Error
    r.close();
  } catch (const llmpi::Error&) {
  }
  return 0;
}
