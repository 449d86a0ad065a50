// libFuzzer target: the Hugging Face tokenizers (hf:tokenizer.json) on arbitrary bytes, and the
// tokenizer.json reader on arbitrary files.
//
// The first input byte picks the mode:
//   even  the rest is text for the four committed fixture tokenizers
//         (tests/fixtures/hf_tokenizers/*/tokenizer.json, found from the working directory, which
//         `make fuzz` sets to the project root). Properties: every id < vocab_size, with and
//         without allow_special; decode never throws on those ids; decoding one id at a time
//         (DecodeStream) gives what decoding the whole list gives; the byte-level BPE round-trips any bytes,
//         decode(encode(text)) == text (unless the text holds its rstrip added token " World!").
//   odd   the rest is a tokenizer.json: loading either succeeds or throws llmpi::Error (never
//         another exception, a crash or a sanitizer report); when it loads, the text "a b" and
//         the file's own bytes encode to ids < vocab_size that decode without error.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <unistd.h>
#include <vector>

#include "runtime/error.h"
#include "tokenizer/tokenizer.h"

using namespace llmpi;

namespace {

std::vector<Tokenizer> g_tokenizers;  // bytelevel first

[[noreturn]] void bug(const std::string& tok, const std::string& what) {
  std::fprintf(stderr, "hf_tokenizer_fuzz (%s): %s\n", tok.c_str(), what.c_str());
  std::abort();
}

void check(const Tokenizer& t, std::string_view text, bool round_trip) {
  for (bool special : {false, true}) {
    std::vector<uint32_t> ids = encode(t, text, special);
    for (uint32_t id : ids)
      if (id >= uint32_t(t.vocab_size)) bug(t.description, "encode produced id " + std::to_string(id));
    std::string whole = decode(t, ids);
    std::string streamed;
    DecodeStream stream(t);
    for (uint32_t id : ids) stream.append(id, streamed);
    if (streamed != whole) bug(t.description, "streamed decode differs from whole decode");
    if (round_trip && whole != text) bug(t.description, "decode(encode(text)) != text");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string dir = "tests/fixtures/hf_tokenizers/";
  for (const char* kind : {"bytelevel_bpe", "llama_bpe", "metaspace_bpe", "wordpiece_small"}) {
    const std::string p = dir + kind + "/tokenizer.json";
    if (!std::filesystem::exists(p)) {
      std::fprintf(stderr, "hf_tokenizer_fuzz: %s not found; run from the project root\n", p.c_str());
      std::exit(1);
    }
    g_tokenizers.push_back(load_hf_tokenizer(p));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if ((data[0] & 1) == 0) {
    // (the byte-level fixture's added token " World!" has rstrip, so it swallows the white space
    // after it, as in the library: no round trip for such text)
    const bool round_trip = rest.find(" World!") == std::string_view::npos;
    for (size_t i = 0; i < g_tokenizers.size(); i++) check(g_tokenizers[i], rest, i == 0 && round_trip);
    return 0;
  }
  static const std::string path =
      (std::filesystem::temp_directory_path() / ("hf_tokenizer_fuzz_" + std::to_string(getpid()) + ".json")).string();
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(rest.data(), std::streamsize(rest.size()));
  }
  try {
    Tokenizer t = load_hf_tokenizer(path);
    check(t, "a b", false);
    check(t, rest.substr(0, 256), false);
  } catch (const Error&) {
    // a clear error is the expected outcome for most inputs
  } catch (const std::exception& e) {
    bug("tokenizer.json", std::string("an exception other than llmpi::Error: ") + e.what());
  }
  return 0;
}
