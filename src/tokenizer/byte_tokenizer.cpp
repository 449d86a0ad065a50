// The byte tokenizer, and what all tokenizers share: load_tokenizer, special-token splitting,
// encode/decode dispatch, FNV-1a.
//
// byte tokenizer: id = byte value (0..255), end-of-text = 256, vocab_size = 257.
#include "tokenizer/tokenizer.h"

#include "runtime/error.h"

namespace llmpi {

uint64_t fnv1a64(std::string_view bytes, uint64_t h) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;  // FNV 64-bit prime
  }
  return h;
}

Tokenizer byte_tokenizer() {
  Tokenizer t;
  t.kind = TokenizerKind::byte;
  t.name = "byte";
  t.description = "byte";
  t.vocab_size = 257;
  t.eot_id = 256;
  return t;
}

Tokenizer load_tokenizer(std::string_view kind, const std::string& encoder_path,
                         const std::string& merges_path, bool lowercase) {
  const bool wordpiece = kind.substr(0, 10) == "wordpiece:";
  if (lowercase && !wordpiece)
    fail("--lowercase is for --tokenizer wordpiece:PATH/vocab.txt (a tokenizer.json says itself "
         "whether it lower-cases); drop it");
  if (kind.substr(0, 3) == "hf:" || wordpiece) {
    if (!encoder_path.empty() || !merges_path.empty())
      fail("tokenizer '", kind, "' takes no GPT-2 encoder/merges files; drop them");
    std::string path(kind.substr(wordpiece ? 10 : 3));
    if (path.empty())
      fail("tokenizer '", kind, "' names no file: give ", wordpiece ? "wordpiece:PATH/vocab.txt"
           : "hf:PATH/tokenizer.json");
    return wordpiece ? load_wordpiece_vocab(path, lowercase) : load_hf_tokenizer(path);
  }
  if (kind == "byte") {
    if (!encoder_path.empty() || !merges_path.empty())
      fail("tokenizer 'byte' takes no files, but GPT-2 encoder/merges paths were given; "
           "drop them or use --tokenizer gpt2");
    return byte_tokenizer();
  }
  if (kind == "gpt2") {
    if (encoder_path.empty() || merges_path.empty())
      fail("tokenizer 'gpt2' needs both its files: give --gpt2-encoder PATH/encoder.json and "
           "--gpt2-merges PATH/vocab.bpe (OpenAI's GPT-2 BPE files)");
    return load_gpt2_tokenizer(encoder_path, merges_path);
  }
  fail("unknown tokenizer '", kind, "'; use byte, gpt2, hf:PATH/tokenizer.json or "
       "wordpiece:PATH/vocab.txt");
}

// Encode a run of text that holds no special tokens.
static void encode_plain(const Tokenizer& tok, std::string_view text, std::vector<uint32_t>& out) {
  if (tok.kind == TokenizerKind::hf) {
    hf_encode(tok, text, out, false);
  } else if (tok.kind == TokenizerKind::byte) {
    out.reserve(out.size() + text.size());
    for (unsigned char c : text) out.push_back(c);
  } else {
    gpt2_encode_plain(tok, text, out);
  }
}

// With allow_special, the text is cut at each literal "<|endoftext|>"; the pieces between are
// encoded as plain text and each cut becomes eot_id.
void encode_append(const Tokenizer& tok, std::string_view text, std::vector<uint32_t>& out,
                   bool allow_special) {
  if (tok.kind == TokenizerKind::hf) {
    hf_encode(tok, text, out, allow_special);
    return;
  }
  if (!allow_special) {
    encode_plain(tok, text, out);
    return;
  }
  size_t pos = 0;
  while (true) {
    size_t hit = text.find(kEndOfText, pos);
    if (hit == std::string_view::npos) break;
    encode_plain(tok, text.substr(pos, hit - pos), out);
    out.push_back(static_cast<uint32_t>(tok.eot_id));
    pos = hit + kEndOfText.size();
  }
  encode_plain(tok, text.substr(pos), out);
}

std::vector<uint32_t> encode(const Tokenizer& tok, std::string_view text, bool allow_special) {
  std::vector<uint32_t> out;
  encode_append(tok, text, out, allow_special);
  return out;
}

void decode_append(const Tokenizer& tok, int64_t id, std::string& out) {
  if (id < 0 || id >= tok.vocab_size)
    fail("cannot decode token id ", id, ": tokenizer '", tok.name, "' has ids 0..",
         tok.vocab_size - 1, "; the ids come from a different tokenizer or vocabulary");
  if (tok.kind == TokenizerKind::hf) {
    hf_decode_append(tok, id, out, out.empty());
  } else if (tok.kind == TokenizerKind::byte) {
    if (id == tok.eot_id)
      out += kEndOfText;
    else
      out.push_back(static_cast<char>(static_cast<unsigned char>(id)));
  } else {
    gpt2_decode_append(tok, id, out);
  }
}

void DecodeStream::append(int64_t id, std::string& out) {
  if (tok->kind == TokenizerKind::hf && id >= 0 && id < tok->vocab_size) {
    hf_decode_append(*tok, id, out, at_start);
  } else {
    std::string piece;  // (byte and gpt2 tokens decode alone; decode_append checks the id)
    decode_append(*tok, id, piece);
    out += piece;
  }
  at_start = false;
}

std::string decode(const Tokenizer& tok, const std::vector<uint32_t>& ids) {
  if (tok.kind == TokenizerKind::hf) return hf_decode(tok, ids.data(), ids.size());
  std::string out;
  out.reserve(ids.size() * (tok.kind == TokenizerKind::byte ? 1 : 4));
  for (uint32_t id : ids) decode_append(tok, id, out);
  return out;
}

std::string decode(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  if (tok.kind == TokenizerKind::hf) {
    std::vector<uint32_t> u;
    u.reserve(ids.size());
    for (int32_t id : ids) {
      if (id < 0 || id >= tok.vocab_size)
        fail("cannot decode token id ", id, ": tokenizer '", tok.name, "' has ids 0..",
             tok.vocab_size - 1, "; the ids come from a different tokenizer or vocabulary");
      u.push_back(uint32_t(id));
    }
    return hf_decode(tok, u.data(), u.size());
  }
  std::string out;
  out.reserve(ids.size() * (tok.kind == TokenizerKind::byte ? 1 : 4));
  for (int32_t id : ids) decode_append(tok, id, out);
  return out;
}

}  // namespace llmpi
