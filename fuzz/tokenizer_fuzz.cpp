// libFuzzer target: the byte and GPT-2 BPE tokenizers on arbitrary bytes.
//
// Properties (any violation, crash or sanitizer report is a bug):
//   byte:  decode(encode(text)) == text, with and without allow_special; encode(decode(ids)) == ids
//          for ids 0..255 (no end-of-text); every id < vocab_size.
//   gpt2:  (when ../shared/data/gpt2 or $LLMPI_SHARED_DATA/gpt2 holds encoder.json and vocab.bpe)
//          the pre-token pieces concatenate to the text; decode(encode(text)) == text, with and
//          without allow_special; every id < vocab_size; for ids taken from the input,
//          decode(encode(decode(ids))) == decode(ids).
// Only llmpi::Error may be thrown, and only by decode of an out-of-range id (which is not done).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/error.h"
#include "tokenizer/tokenizer.h"

using namespace llmpi;

namespace {

std::unique_ptr<Tokenizer> g_gpt2;

[[noreturn]] void bug(const char* tok, const std::string& what) {
  std::fprintf(stderr, "tokenizer_fuzz (%s): %s\n", tok, what.c_str());
  std::abort();
}

void check_ids(const Tokenizer& t, const std::vector<uint32_t>& ids) {
  for (uint32_t id : ids)
    if (id >= uint32_t(t.vocab_size)) bug(t.name.c_str(), "encode produced id " + std::to_string(id));
}

void round_trip(const Tokenizer& t, std::string_view text) {
  for (bool special : {false, true}) {
    std::vector<uint32_t> ids = encode(t, text, special);
    check_ids(t, ids);
    if (decode(t, ids) != text)
      bug(t.name.c_str(), std::string("decode(encode(text)) != text (allow_special=") +
                              (special ? "true" : "false") + ", " + std::to_string(text.size()) + " bytes)");
  }
}

bool exists(const std::string& p) { return bool(std::ifstream(p)); }

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* env = std::getenv("LLMPI_SHARED_DATA");
  std::string d = (env && *env ? std::string(env) : std::string("../shared/data")) + "/gpt2/";
  if (exists(d + "encoder.json") && exists(d + "vocab.bpe")) {
    g_gpt2 = std::make_unique<Tokenizer>(load_tokenizer("gpt2", d + "encoder.json", d + "vocab.bpe"));
    std::fprintf(stderr, "tokenizer_fuzz: byte and gpt2 (%s)\n", d.c_str());
  } else {
    std::fprintf(stderr, "tokenizer_fuzz: byte only (no GPT-2 files in %s)\n", d.c_str());
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  // byte
  static const Tokenizer byte = byte_tokenizer();
  round_trip(byte, text);
  std::vector<uint32_t> byte_ids(data, data + size);
  if (encode(byte, decode(byte, byte_ids)) != byte_ids) bug("byte", "encode(decode(ids)) != ids");

  if (!g_gpt2) return 0;
  const Tokenizer& g = *g_gpt2;
  std::string joined;
  for (std::string_view p : gpt2_pretokenize(text)) {
    if (p.empty()) bug("gpt2", "empty pre-token piece");
    joined += p;
  }
  if (joined != text) bug("gpt2", "pre-token pieces do not concatenate to the text");
  round_trip(g, text);
  // The input as little-endian 16-bit ids (mod vocab_size): any id sequence decodes to bytes
  // that encode back to the same bytes.
  std::vector<uint32_t> ids;
  for (size_t i = 0; i + 1 < size; i += 2) ids.push_back(uint32_t(data[i] | data[i + 1] << 8) % uint32_t(g.vocab_size));
  std::string s = decode(g, ids);
  round_trip(g, s);
  return 0;
}
