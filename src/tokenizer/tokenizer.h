// Tokenizers: text bytes <-> token ids.
//
//   byte  ids 0..255 are the byte values, 256 is end-of-text; vocab_size 257. Any byte string
//         round-trips. Needs no files.
//   gpt2  OpenAI GPT-2 byte-level BPE, loaded from the user's encoder.json and vocab.bpe
//         (50,257 tokens, <|endoftext|> = 50256 with the published files). Encodes exactly as
//         GPT-2's encoder.py does: pre-tokenize with its regex, map bytes to the printable
//         "byte unicode" alphabet, apply merges by rank. Any byte string round-trips, even
//         invalid UTF-8.
//   hf    a Hugging Face tokenizer.json ("hf:PATH"): byte-level BPE (GPT-2 style), BPE with byte
//         fallback and the ▁ metaspace (LLaMA / SentencePiece style), or WordPiece (BERT), with
//         its normalizer, pre-tokenizer, added tokens, decoder and post-processor template, as
//         the `tokenizers` library applies them (see hf_tokenizer.cpp for what is supported).
//         "wordpiece:PATH" builds the same from BERT's plain vocab.txt (BertNormalizer, with
//         lower-casing and accent stripping only when `lowercase` is set).
//
// Special tokens: encode(..., allow_special=true) turns each literal "<|endoftext|>" in the
// text into eot_id; with false (the default) it is ordinary text, as in GPT-2's encoder.py.
// decode() writes eot_id back as "<|endoftext|>" for byte and gpt2. For hf, allow_special=true
// splits out every added token the file marks special (what the tokenizers library does by
// default); with false they are ordinary text (its encode_special_tokens). Added tokens that are
// not special are always split out. The end-of-text id of an hf tokenizer is the first of
// <|endoftext|>, </s>, <|end_of_text|>, <eos>, [SEP] that it has.
//
// The `description` names the tokenizer and the files it came from; it is what llmpi-prep
// writes into the `tokenizer` attribute of token files:
//   "byte"                           the byte tokenizer
//   "gpt2:fnv1a64=<16 hex digits>"   FNV-1a 64 over encoder.json's bytes then vocab.bpe's
//   "hf:fnv1a64=<16 hex digits>"     FNV-1a 64 over tokenizer.json's bytes
//   "wordpiece:fnv1a64=<...>", "wordpiece:lowercase:fnv1a64=<...>"   over vocab.txt's bytes
//
// Not thread-safe: a gpt2 or hf Tokenizer caches the BPE result of each pre-token it has seen, so
// give each thread its own copy (load_tokenizer again).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace llmpi {

enum class TokenizerKind { byte, gpt2, hf };

struct Gpt2Bpe;      // merges, vocabulary and cache; defined in gpt2_bpe.cpp
struct HfTokenizer;  // the parsed tokenizer.json / vocab.txt; defined in hf_tokenizer.cpp

struct Tokenizer {
  TokenizerKind kind = TokenizerKind::byte;
  std::string name;         // "byte" | "gpt2" | "hf" | "wordpiece"
  // name + hash of its files (see above). This is the tokenizer's identity in data files
  // (data/dataset_identity.h): training refuses a train/val pair whose descriptions differ, so
  // every kind must set one that is equal exactly when two tokenizers map text to the same ids:
  // "<kind>:fnv1a64=<16 hex>" over all the files (and options, e.g. lowercase) it was loaded from.
  std::string description;
  int vocab_size = 0;
  int eot_id = 0;
  std::shared_ptr<Gpt2Bpe> bpe;  // gpt2 only
  std::shared_ptr<HfTokenizer> hf;  // hf only
};

// The literal text of the end-of-text special token.
inline constexpr std::string_view kEndOfText = "<|endoftext|>";

// kind is "byte", "gpt2", "hf:PATH/tokenizer.json" or "wordpiece:PATH/vocab.txt"; gpt2 needs
// both paths, the others take none (they must be empty). lowercase is for wordpiece only.
Tokenizer load_tokenizer(std::string_view kind, const std::string& encoder_path = "",
                         const std::string& merges_path = "", bool lowercase = false);
Tokenizer byte_tokenizer();
Tokenizer load_gpt2_tokenizer(const std::string& encoder_path, const std::string& merges_path);
Tokenizer load_hf_tokenizer(const std::string& tokenizer_json_path);
Tokenizer load_wordpiece_vocab(const std::string& vocab_txt_path, bool lowercase);

// Encode text and append the ids to out (the fast path for many documents).
void encode_append(const Tokenizer& tok, std::string_view text, std::vector<uint32_t>& out,
                   bool allow_special = false);
std::vector<uint32_t> encode(const Tokenizer& tok, std::string_view text, bool allow_special = false);

// Decode ids back to bytes. An id outside [0, vocab_size) is an Error.
// decode_append decodes one id as the continuation of `out`: for hf tokenizers whose decoder
// treats the text's first token specially (strips the space a leading ▁ becomes; WordPiece's
// first piece gets no space) that happens when out is empty. To stream ids one at a time exactly
// as decode() of them all, use DecodeStream, which knows which id came first.
void decode_append(const Tokenizer& tok, int64_t id, std::string& out);
std::string decode(const Tokenizer& tok, const std::vector<uint32_t>& ids);
std::string decode(const Tokenizer& tok, const std::vector<int32_t>& ids);

// Streaming decode (llmpi-sample): append(id, out) adds what id adds to the decoded text; after
// any ids, everything appended equals decode() of those ids. Raw bytes: a character split over
// several byte tokens comes out whole once its last byte is appended.
struct DecodeStream {
  const Tokenizer* tok;
  bool at_start = true;  // no id decoded yet
  explicit DecodeStream(const Tokenizer& t) : tok(&t) {}
  void append(int64_t id, std::string& out);
};

// One text, or a pair, encoded and wrapped by the tokenizer's post-processor template (BERT:
// [CLS] A [SEP] B [SEP]; LLaMA: <s> A ...). type_ids: the segment of each id (0 for A, 1 for B
// in BERT's template). hf only; a tokenizer without a template gives A (then B) unchanged.
struct TemplateEncoding {
  std::vector<uint32_t> ids, type_ids;
};
TemplateEncoding encode_with_template(const Tokenizer& tok, std::string_view a,
                                      const std::string_view* b = nullptr,
                                      bool allow_special = true);
// The template alone, around ids already encoded (b null: a single text). The number of ids it
// adds to a pair is apply_template(tok, {}, &empty).ids.size(): what truncation must leave room for.
TemplateEncoding apply_template(const Tokenizer& tok, const std::vector<uint32_t>& a,
                                const std::vector<uint32_t>* b = nullptr);

// 64-bit FNV-1a, continued from `h` (start with kFnv1a64Offset).
inline constexpr uint64_t kFnv1a64Offset = 14695981039346656037ull;
uint64_t fnv1a64(std::string_view bytes, uint64_t h = kFnv1a64Offset);

// Internals of the gpt2 kind, called by encode_append/decode_append: encode text that holds no
// special tokens, and decode one id.
void gpt2_encode_plain(const Tokenizer& tok, std::string_view text, std::vector<uint32_t>& out);
void gpt2_decode_append(const Tokenizer& tok, int64_t id, std::string& out);
// The hf kind: encode (any text), decode a whole sequence through the tokenizer.json decoder,
// and decode one id (at_start: it is the text's first id, so the decoder's first-token rules,
// such as stripping the space a leading ▁ becomes, apply).
void hf_encode(const Tokenizer& tok, std::string_view text, std::vector<uint32_t>& out,
               bool allow_special);
std::string hf_decode(const Tokenizer& tok, const uint32_t* ids, size_t n);
void hf_decode_append(const Tokenizer& tok, int64_t id, std::string& out, bool at_start);

// GPT-2 pre-tokenization alone (exposed for tests): the pieces of `text`, in order, that the
// regex 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ finds.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

}  // namespace llmpi
