// Tokenizers: text bytes <-> token ids.
//
//   byte  ids 0..255 are the byte values, 256 is end-of-text; vocab_size 257. Any byte string
//         round-trips. Needs no files.
//   gpt2  OpenAI GPT-2 byte-level BPE, loaded from the user's encoder.json and vocab.bpe
//         (50,257 tokens, <|endoftext|> = 50256 with the published files). Encodes exactly as
//         GPT-2's encoder.py does: pre-tokenize with its regex, map bytes to the printable
//         "byte unicode" alphabet, apply merges by rank. Any byte string round-trips, even
//         invalid UTF-8.
//
// Special tokens: encode(..., allow_special=true) turns each literal "<|endoftext|>" in the
// text into eot_id; with false (the default) it is ordinary text, as in GPT-2's encoder.py.
// decode() writes eot_id back as "<|endoftext|>" for both tokenizers.
//
// The `description` names the tokenizer and the files it came from; it is what llmpi-prep
// writes into the `tokenizer` attribute of token files:
//   "byte"                           the byte tokenizer
//   "gpt2:fnv1a64=<16 hex digits>"   FNV-1a 64 over encoder.json's bytes then vocab.bpe's
//
// Not thread-safe: a gpt2 Tokenizer caches the BPE result of each pre-token it has seen, so
// give each thread its own copy (load_tokenizer again).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace llmpi {

enum class TokenizerKind { byte, gpt2 };

struct Gpt2Bpe;  // merges, vocabulary and cache; defined in gpt2_bpe.cpp

struct Tokenizer {
  TokenizerKind kind = TokenizerKind::byte;
  std::string name;         // "byte" | "gpt2"
  std::string description;  // name + hash of its files (see above)
  int vocab_size = 0;
  int eot_id = 0;
  std::shared_ptr<Gpt2Bpe> bpe;  // gpt2 only
};

// The literal text of the end-of-text special token.
inline constexpr std::string_view kEndOfText = "<|endoftext|>";

// kind is "byte" or "gpt2"; gpt2 needs both paths, byte ignores them (they must be empty).
Tokenizer load_tokenizer(std::string_view kind, const std::string& encoder_path = "",
                         const std::string& merges_path = "");
Tokenizer byte_tokenizer();
Tokenizer load_gpt2_tokenizer(const std::string& encoder_path, const std::string& merges_path);

// Encode text and append the ids to out (the fast path for many documents).
void encode_append(const Tokenizer& tok, std::string_view text, std::vector<uint32_t>& out,
                   bool allow_special = false);
std::vector<uint32_t> encode(const Tokenizer& tok, std::string_view text, bool allow_special = false);

// Decode ids back to bytes. An id outside [0, vocab_size) is an Error.
void decode_append(const Tokenizer& tok, int64_t id, std::string& out);
std::string decode(const Tokenizer& tok, const std::vector<uint32_t>& ids);
std::string decode(const Tokenizer& tok, const std::vector<int32_t>& ids);

// 64-bit FNV-1a, continued from `h` (start with kFnv1a64Offset).
inline constexpr uint64_t kFnv1a64Offset = 14695981039346656037ull;
uint64_t fnv1a64(std::string_view bytes, uint64_t h = kFnv1a64Offset);

// Internals of the gpt2 kind, called by encode_append/decode_append: encode text that holds no
// special tokens, and decode one id.
void gpt2_encode_plain(const Tokenizer& tok, std::string_view text, std::vector<uint32_t>& out);
void gpt2_decode_append(const Tokenizer& tok, int64_t id, std::string& out);

// GPT-2 pre-tokenization alone (exposed for tests): the pieces of `text`, in order, that the
// regex 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ finds.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

}  // namespace llmpi
