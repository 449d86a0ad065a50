// Hugging Face tokenizers: a tokenizer.json ("hf:PATH"), or BERT's vocab.txt ("wordpiece:PATH"),
// encoded and decoded as the `tokenizers` library (Rust) does.
//
// Encoding a text runs the library's pipeline:
//   1. added tokens that are not `normalized` are cut out of the raw text (leftmost-longest
//      match; `lstrip`/`rstrip` swallow the white space beside them, `single_word` needs a
//      non-word character or the text's edge on both sides); special ones only when
//      allow_special (otherwise they are ordinary text, like encode_special_tokens);
//   2. each piece between them is normalized, then the `normalized` added tokens (whose own
//      text was normalized the same way) are cut out of it;
//   3. each remaining piece is pre-tokenized into words, and each word goes through the model
//      (BPE or WordPiece) to ids.
// Decoding maps ids to their token strings and runs the decoder chain over the whole list.
//
// Supported (anything else is an error that names it):
//   normalizer     BertNormalizer, Lowercase, NFD, Prepend, Replace (string pattern), Sequence
//   pre_tokenizer  ByteLevel, Metaspace, BertPreTokenizer, WhitespaceSplit, Sequence
//   model          BPE (byte_fallback, fuse_unk, unk_token, continuing_subword_prefix,
//                  end_of_word_suffix, ignore_merges; no dropout), WordPiece
//   decoder        ByteLevel, WordPiece, Metaspace, Replace (string), ByteFallback, Fuse, Strip,
//                  Sequence
//   post_processor TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel (none)
// truncation and padding in tokenizer.json are ignored (llmpi-prep joins whole documents).
//
// Differences from the library, on purpose:
//   - Byte-fallback tokens decode to their raw bytes even when they do not form valid UTF-8
//     (the library writes U+FFFD for each), so a streamed character split over several tokens
//     still comes out whole; ByteLevel likewise gives raw bytes. Valid text decodes the same.
//   - Input that is not valid UTF-8 (which the library, taking Python str, never sees) has each
//     bad byte replaced by U+FFFD, except under a ByteLevel pre-tokenizer with no normalizer,
//     where bytes pass through untouched and round-trip.
//   - NFD does not reorder combining marks by their combining class (text in NFC or with
//     marks in canonical order, i.e. nearly all text, is unaffected).
//   - An added token's single_word test takes a word character to be \p{L}, \p{N} or '_'
//     (GPT-2's classes), where the library asks Rust's char::is_alphanumeric (which also counts
//     a few marks and letter-like numbers).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <queue>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace llmpi {

using nlohmann::json;
namespace uc = unicode;

namespace {

struct AddedToken {
  std::string content;  // as in the file
  std::string pattern;  // what is matched: content, normalized when `normalized`
  uint32_t id = 0;
  bool special = false, normalized = false, lstrip = false, rstrip = false, single_word = false;
};

enum class Norm { bert, lowercase, nfd, prepend, replace };
struct NormStep {
  Norm kind;
  bool clean_text = false, chinese = false, strip_accents = false, lowercase = false;  // bert
  std::string from, to;  // prepend (to), replace (from -> to)
};

enum class Prepend { always, first, never };
enum class Pre { byte_level, metaspace, bert, whitespace_split };
struct PreStep {
  Pre kind;
  bool add_prefix_space = false, use_regex = true;  // byte_level
  std::string replacement;                          // metaspace
  Prepend prepend = Prepend::always;
  bool split = true;
};

enum class Dec { byte_level, wordpiece, metaspace, replace, byte_fallback, fuse, strip };
struct DecStep {
  Dec kind;
  std::string from, to;      // replace; wordpiece prefix (from); metaspace replacement (from)
  bool cleanup = false;      // wordpiece
  Prepend prepend = Prepend::always;  // metaspace
  uint32_t strip_char = ' ';
  size_t start = 0, stop = 0;  // strip
};

struct TemplateItem {
  bool special = false;      // a special token's ids, or sequence A / B
  int sequence = 0;          // 0 = A, 1 = B
  std::vector<uint32_t> ids;
  uint32_t type_id = 0;
};

struct Piece {
  std::string text;
  bool at_start;  // begins at offset 0 of the original text (Metaspace's prepend_scheme first)
};

// The word cache starts over beyond 512K words (tens of MB), so a corpus of many distinct words
// keeps the memory of a tokenizing process bounded.
constexpr size_t kCacheMaxWordBytes = 256;
constexpr size_t kCacheMaxEntries = 1 << 19;

}  // namespace

struct HfTokenizer {
  std::string path;
  bool wordpiece = false;  // model: WordPiece, else BPE
  std::unordered_map<std::string, uint32_t> vocab;  // the model's vocabulary
  std::vector<std::string> id_token;                // id -> token string (model or added)
  std::vector<char> id_known;
  // BPE
  std::unordered_map<uint64_t, std::pair<uint32_t, uint32_t>> merges;  // (a<<32|b) -> rank, id
  int64_t unk_id = -1;
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;
  std::string subword_prefix, word_suffix;  // BPE: continuing_subword_prefix / end_of_word_suffix
  int64_t byte_token[256];                  // <0xXX> ids for byte fallback, -1 when absent
  // WordPiece
  size_t max_input_chars = 100, max_token_bytes = 0;
  // pipeline
  std::vector<NormStep> normalizer;
  std::vector<PreStep> pre;
  bool has_decoder = false;
  std::vector<DecStep> decoder;
  std::vector<AddedToken> added;
  std::vector<int> raw_first[256], norm_first[256];  // added tokens by first byte of pattern
  bool has_template = false;
  std::vector<TemplateItem> single, pair;
  bool byte_exact = false;  // ByteLevel pre-tokenizer, no normalizer: bytes pass through
  uint32_t byte_to_cp[256];
  int cp_to_byte[512];
  std::unordered_map<std::string, std::vector<uint32_t>> cache;
};

namespace {

// ---- file reading and JSON helpers ----------------------------------------------------------

std::string read_file(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open ", what, " '", path, "'; check the path");
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail("cannot read ", what, " '", path, "'; check that it is readable");
  return ss.str();
}

std::string hex16(uint64_t h) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)h);
  return buf;
}

struct Ctx {
  const std::string& path;
  [[noreturn]] void bad(const std::string& where, const std::string& what) const {
    fail("tokenizer.json '", path, "': ", where, ": ", what);
  }
};

std::string str_field(const Ctx& c, const json& j, const char* key, const std::string& where,
                      const std::string& dflt = std::string(), bool required = false) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) c.bad(where, std::string("has no \"") + key + "\"");
    return dflt;
  }
  if (!it->is_string()) c.bad(where, std::string("\"") + key + "\" is not a string");
  return it->get<std::string>();
}

bool bool_field(const Ctx& c, const json& j, const char* key, const std::string& where, bool dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) c.bad(where, std::string("\"") + key + "\" is not true/false");
  return it->get<bool>();
}

int64_t int_field(const Ctx& c, const json& j, const char* key, const std::string& where,
                  int64_t dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_number_integer()) c.bad(where, std::string("\"") + key + "\" is not an integer");
  return it->get<int64_t>();
}

std::string type_of(const Ctx& c, const json& j, const std::string& where) {
  if (!j.is_object()) c.bad(where, "is not an object");
  return str_field(c, j, "type", where, "", true);
}

// Replace patterns: {"String": "x"} is supported, {"Regex": ...} is not.
std::string replace_pattern(const Ctx& c, const json& j, const std::string& where) {
  auto it = j.find("pattern");
  if (it == j.end() || !it->is_object()) c.bad(where, "Replace has no \"pattern\" object");
  if (it->contains("String") && (*it)["String"].is_string()) return (*it)["String"].get<std::string>();
  c.bad(where, "Replace with a regular-expression pattern is not supported (only {\"String\": "
               "...}); llmpi reads the BPE, byte-level BPE and WordPiece tokenizers of GPT-2, "
               "LLaMA and BERT");
}

Prepend prepend_scheme(const Ctx& c, const json& j, const std::string& where) {
  auto it = j.find("prepend_scheme");
  if (it != j.end() && it->is_string()) {
    std::string s = it->get<std::string>();
    if (s == "always") return Prepend::always;
    if (s == "first") return Prepend::first;
    if (s == "never") return Prepend::never;
    c.bad(where, "prepend_scheme '" + s + "' is not always, first or never");
  }
  // Older files: add_prefix_space true/false.
  return bool_field(c, j, "add_prefix_space", where, true) ? Prepend::always : Prepend::never;
}

std::string single_char(const Ctx& c, const json& j, const char* key, const std::string& where,
                        const char* dflt) {
  std::string s = str_field(c, j, key, where, dflt);
  uint32_t cp;
  if (s.empty() || uc::utf8_decode(s, 0, cp) != s.size() || cp == uc::kInvalid)
    c.bad(where, std::string("\"") + key + "\" must be one character");
  return s;
}

// ---- pipeline parsing -----------------------------------------------------------------------

void parse_normalizer(const Ctx& c, const json& j, std::vector<NormStep>& out, const std::string& where) {
  std::string t = type_of(c, j, where);
  NormStep s;
  if (t == "Sequence") {
    auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) c.bad(where, "Sequence has no \"normalizers\" list");
    for (size_t i = 0; i < it->size(); i++)
      parse_normalizer(c, (*it)[i], out, where + "[" + std::to_string(i) + "]");
    return;
  } else if (t == "BertNormalizer") {
    s.kind = Norm::bert;
    s.clean_text = bool_field(c, j, "clean_text", where, true);
    s.chinese = bool_field(c, j, "handle_chinese_chars", where, true);
    s.lowercase = bool_field(c, j, "lowercase", where, true);
    s.strip_accents = bool_field(c, j, "strip_accents", where, s.lowercase);  // null: as lowercase
  } else if (t == "Lowercase") {
    s.kind = Norm::lowercase;
  } else if (t == "NFD") {
    s.kind = Norm::nfd;
  } else if (t == "Prepend") {
    s.kind = Norm::prepend;
    s.to = str_field(c, j, "prepend", where, "", true);
  } else if (t == "Replace") {
    s.kind = Norm::replace;
    s.from = replace_pattern(c, j, where);
    s.to = str_field(c, j, "content", where, "", true);
    if (s.from.empty()) c.bad(where, "Replace with an empty pattern");
  } else {
    c.bad(where, "normalizer type '" + t + "' is not supported (llmpi reads BertNormalizer, "
                 "Lowercase, NFD, Prepend, Replace and Sequence of them)");
  }
  out.push_back(s);
}

void parse_pre_tokenizer(const Ctx& c, const json& j, std::vector<PreStep>& out, const std::string& where) {
  std::string t = type_of(c, j, where);
  PreStep s;
  if (t == "Sequence") {
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) c.bad(where, "Sequence has no \"pretokenizers\" list");
    for (size_t i = 0; i < it->size(); i++)
      parse_pre_tokenizer(c, (*it)[i], out, where + "[" + std::to_string(i) + "]");
    return;
  } else if (t == "ByteLevel") {
    s.kind = Pre::byte_level;
    s.add_prefix_space = bool_field(c, j, "add_prefix_space", where, true);
    s.use_regex = bool_field(c, j, "use_regex", where, true);
  } else if (t == "Metaspace") {
    s.kind = Pre::metaspace;
    s.replacement = single_char(c, j, "replacement", where, "\xE2\x96\x81");
    s.prepend = prepend_scheme(c, j, where);
    s.split = bool_field(c, j, "split", where, true);
  } else if (t == "BertPreTokenizer") {
    s.kind = Pre::bert;
  } else if (t == "WhitespaceSplit") {
    s.kind = Pre::whitespace_split;
  } else {
    c.bad(where, "pre_tokenizer type '" + t + "' is not supported (llmpi reads ByteLevel, "
                 "Metaspace, BertPreTokenizer, WhitespaceSplit and Sequence of them)");
  }
  out.push_back(s);
}

void parse_decoder(const Ctx& c, const json& j, std::vector<DecStep>& out, const std::string& where) {
  std::string t = type_of(c, j, where);
  DecStep s;
  if (t == "Sequence") {
    auto it = j.find("decoders");
    if (it == j.end() || !it->is_array()) c.bad(where, "Sequence has no \"decoders\" list");
    for (size_t i = 0; i < it->size(); i++)
      parse_decoder(c, (*it)[i], out, where + "[" + std::to_string(i) + "]");
    return;
  } else if (t == "ByteLevel") {
    s.kind = Dec::byte_level;
  } else if (t == "WordPiece") {
    s.kind = Dec::wordpiece;
    s.from = str_field(c, j, "prefix", where, "##");
    s.cleanup = bool_field(c, j, "cleanup", where, true);
  } else if (t == "Metaspace") {
    s.kind = Dec::metaspace;
    s.from = single_char(c, j, "replacement", where, "\xE2\x96\x81");
    s.prepend = prepend_scheme(c, j, where);
  } else if (t == "Replace") {
    s.kind = Dec::replace;
    s.from = replace_pattern(c, j, where);
    s.to = str_field(c, j, "content", where, "", true);
    if (s.from.empty()) c.bad(where, "Replace with an empty pattern");
  } else if (t == "ByteFallback") {
    s.kind = Dec::byte_fallback;
  } else if (t == "Fuse") {
    s.kind = Dec::fuse;
  } else if (t == "Strip") {
    s.kind = Dec::strip;
    std::string ch = single_char(c, j, "content", where, " ");
    uc::utf8_decode(ch, 0, s.strip_char);
    int64_t a = int_field(c, j, "start", where, 0), b = int_field(c, j, "stop", where, 0);
    if (a < 0 || b < 0) c.bad(where, "Strip start/stop must be >= 0");
    s.start = size_t(a), s.stop = size_t(b);
  } else {
    c.bad(where, "decoder type '" + t + "' is not supported (llmpi reads ByteLevel, WordPiece, "
                 "Metaspace, Replace, ByteFallback, Fuse, Strip and Sequence of them)");
  }
  out.push_back(s);
}

// The id of a special-token name in a template: from the template's own table when it has one,
// else the tokenizer's vocabulary.
uint32_t token_id(const Ctx& c, const HfTokenizer& t, const std::string& token, const std::string& where) {
  auto v = t.vocab.find(token);
  if (v != t.vocab.end()) return v->second;
  for (const AddedToken& a : t.added)
    if (a.content == token) return a.id;
  c.bad(where, "token '" + token + "' is not in the vocabulary");
}

void parse_template(const Ctx& c, HfTokenizer& t, const json& j, const std::string& where) {
  std::string type = type_of(c, j, where);
  auto special = [&](const std::string& name, uint32_t type_id) {
    TemplateItem it;
    it.special = true;
    it.ids = {token_id(c, t, name, where)};
    it.type_id = type_id;
    return it;
  };
  auto seq = [](int which, uint32_t type_id) {
    TemplateItem it;
    it.sequence = which;
    it.type_id = type_id;
    return it;
  };
  auto pair_name = [&](const char* key) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_array() || it->size() != 2 || !(*it)[0].is_string())
      c.bad(where, std::string(type) + " has no [\"token\", id] \"" + key + "\"");
    return (*it)[0].get<std::string>();
  };
  if (type == "ByteLevel") return;  // offsets only; ids unchanged
  t.has_template = true;
  if (type == "BertProcessing") {
    std::string cls = pair_name("cls"), sep = pair_name("sep");
    t.single = {special(cls, 0), seq(0, 0), special(sep, 0)};
    t.pair = {special(cls, 0), seq(0, 0), special(sep, 0), seq(1, 1), special(sep, 1)};
  } else if (type == "RobertaProcessing") {
    std::string cls = pair_name("cls"), sep = pair_name("sep");
    t.single = {special(cls, 0), seq(0, 0), special(sep, 0)};
    t.pair = {special(cls, 0), seq(0, 0), special(sep, 0), special(sep, 0), seq(1, 0), special(sep, 0)};
  } else if (type == "TemplateProcessing") {
    std::unordered_map<std::string, std::vector<uint32_t>> table;
    auto st = j.find("special_tokens");
    if (st != j.end() && st->is_object())
      for (auto it = st->begin(); it != st->end(); ++it) {
        std::vector<uint32_t> ids;
        if (it->contains("ids") && (*it)["ids"].is_array())
          for (const json& v : (*it)["ids"]) {
            if (!v.is_number_unsigned()) c.bad(where, "special token '" + it.key() + "' has a bad id");
            ids.push_back(v.get<uint32_t>());
          }
        table[it.key()] = ids;
      }
    auto parse_list = [&](const char* key, std::vector<TemplateItem>& items) {
      auto it = j.find(key);
      if (it == j.end() || !it->is_array()) c.bad(where, std::string("TemplateProcessing has no \"") + key + "\" list");
      for (const json& e : *it) {
        if (e.contains("SpecialToken")) {
          const json& s = e["SpecialToken"];
          std::string id = str_field(c, s, "id", where, "", true);
          TemplateItem ti;
          ti.special = true;
          ti.type_id = uint32_t(int_field(c, s, "type_id", where, 0));
          auto f = table.find(id);
          ti.ids = f != table.end() ? f->second : std::vector<uint32_t>{token_id(c, t, id, where)};
          items.push_back(ti);
        } else if (e.contains("Sequence")) {
          const json& s = e["Sequence"];
          std::string id = str_field(c, s, "id", where, "A");
          if (id != "A" && id != "B") c.bad(where, "template sequence '" + id + "' is not A or B");
          items.push_back(seq(id == "A" ? 0 : 1, uint32_t(int_field(c, s, "type_id", where, 0))));
        } else {
          c.bad(where, "template item is neither SpecialToken nor Sequence");
        }
      }
    };
    parse_list("single", t.single);
    parse_list("pair", t.pair);
  } else {
    c.bad(where, "post_processor type '" + type + "' is not supported (llmpi reads "
                 "TemplateProcessing, BertProcessing, RobertaProcessing and ByteLevel)");
  }
}

// ---- normalizers ----------------------------------------------------------------------------

std::u32string to_u32(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    i += uc::utf8_decode(s, i, cp);
    out.push_back(cp == uc::kInvalid ? 0xFFFD : cp);
  }
  return out;
}

std::string to_utf8(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) uc::utf8_append(uint32_t(c), out);
  return out;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (s.find(from) == std::string::npos) return;
  std::string out;
  size_t pos = 0;
  while (true) {
    size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += to;
    pos = hit + from.size();
  }
  out.append(s, pos, std::string::npos);
  s.swap(out);
}

// BertNormalizer, in the library's order:
//   clean_text      drop NUL, U+FFFD and control characters; white space becomes ' '
//   chinese chars   put ' ' on both sides of each CJK ideograph
//   strip_accents   NFD, then drop nonspacing marks (Mn)
//   lowercase       full lower-case mapping, character by character
void bert_normalize(const NormStep& s, std::u32string& text) {
  std::u32string out, tmp;
  out.reserve(text.size());
  for (char32_t c : text) {
    uint32_t cp = uint32_t(c);
    if (s.clean_text) {
      if (cp == 0 || cp == 0xFFFD || (uc::is_bert_control(cp) && cp != '\t' && cp != '\n' && cp != '\r'))
        continue;
      if (uc::is_white_space(cp)) cp = ' ';
    }
    if (s.chinese && uc::is_cjk(cp)) {
      out.push_back(' ');
      out.push_back(cp);
      out.push_back(' ');
    } else {
      out.push_back(cp);
    }
  }
  if (s.strip_accents) {
    tmp.clear();
    for (char32_t c : out) {
      size_t at = tmp.size();
      uc::append_nfd(uint32_t(c), tmp);
      tmp.erase(std::remove_if(tmp.begin() + at, tmp.end(),
                               [](char32_t d) { return uc::is_nonspacing_mark(uint32_t(d)); }),
                tmp.end());
    }
    out.swap(tmp);
  }
  if (s.lowercase) {
    tmp.clear();
    for (char32_t c : out) uc::append_lower(uint32_t(c), tmp);
    out.swap(tmp);
  }
  text.swap(out);
}

std::string normalize(const HfTokenizer& t, std::string_view text) {
  std::string s(text);
  for (const NormStep& n : t.normalizer) {
    switch (n.kind) {
      case Norm::prepend:
        if (!s.empty()) s.insert(0, n.to);
        break;
      case Norm::replace:
        replace_all(s, n.from, n.to);
        break;
      case Norm::bert: {
        std::u32string u = to_u32(s);
        bert_normalize(n, u);
        s = to_utf8(u);
        break;
      }
      case Norm::lowercase: {
        std::u32string u = to_u32(s), out;
        for (char32_t c : u) uc::append_lower(uint32_t(c), out);
        s = to_utf8(out);
        break;
      }
      case Norm::nfd: {
        std::u32string u = to_u32(s), out;
        for (char32_t c : u) uc::append_nfd(uint32_t(c), out);
        s = to_utf8(out);
        break;
      }
    }
  }
  return s;
}

// ---- added tokens ---------------------------------------------------------------------------

struct Segment {
  size_t start, stop;
  int64_t id;  // -1: text to tokenize
};

bool is_word_char(uint32_t cp) { return cp == '_' || uc::is_letter_or_number(cp); }

uint32_t last_char(std::string_view s) {
  size_t i = s.size();
  while (i > 0 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) i--;
  if (i > 0) i--;
  uint32_t cp;
  uc::utf8_decode(s, i, cp);
  return cp;
}

// The library's AddedVocabulary::find_matches: leftmost-longest matches of the token patterns,
// the search going on after each match's end (also after a match that is then not used).
std::vector<Segment> find_added(const HfTokenizer& t, std::string_view s, bool normalized,
                                bool allow_special) {
  std::vector<Segment> out;
  const std::vector<int>* first = normalized ? t.norm_first : t.raw_first;
  size_t start_offset = 0, pos = 0;
  const size_t n = s.size();
  while (pos < n) {
    const std::vector<int>& cands = first[static_cast<unsigned char>(s[pos])];
    const AddedToken* best = nullptr;
    for (int k : cands) {  // longest first
      const AddedToken& a = t.added[size_t(k)];
      if (s.compare(pos, a.pattern.size(), a.pattern) == 0) {
        best = &a;
        break;
      }
    }
    if (!best) {
      pos++;
      continue;
    }
    size_t start = pos, stop = pos + best->pattern.size();
    pos = stop;
    if (best->special && !allow_special) continue;
    if (best->single_word) {
      bool start_ok = start == 0 || !is_word_char(last_char(s.substr(0, start)));
      uint32_t next_cp = 0;
      if (stop < n) uc::utf8_decode(s, stop, next_cp);
      bool stop_ok = stop == n || !is_word_char(next_cp);
      if (!start_ok || !stop_ok) continue;
    }
    if (best->lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        size_t i = new_start;
        while (i > 0 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) i--;
        if (i > 0) i--;
        uint32_t cp;
        uc::utf8_decode(s, i, cp);
        if (!uc::is_white_space(cp)) break;
        new_start = i;
      }
      start = std::max(new_start, start_offset);
    }
    if (best->rstrip) {
      while (stop < n) {
        uint32_t cp;
        size_t len = uc::utf8_decode(s, stop, cp);
        if (!uc::is_white_space(cp)) break;
        stop += len;
      }
    }
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, int64_t(best->id)});
    start_offset = stop;
  }
  if (start_offset < n) out.push_back({start_offset, n, -1});
  return out;
}

// ---- pre-tokenizers -------------------------------------------------------------------------

// Split each piece at every character `is_delim` says; Removed drops the delimiters, Isolated
// makes each one its own piece.
template <typename F>
void split_pieces(std::vector<Piece>& pieces, F is_delim, bool isolated) {
  std::vector<Piece> out;
  for (const Piece& p : pieces) {
    const std::string& s = p.text;
    size_t word_start = 0;
    for (size_t i = 0; i < s.size();) {
      uint32_t cp;
      size_t len = uc::utf8_decode(s, i, cp);
      if (cp != uc::kInvalid && is_delim(cp)) {
        if (i > word_start) out.push_back({s.substr(word_start, i - word_start), p.at_start && word_start == 0});
        if (isolated) out.push_back({s.substr(i, len), p.at_start && i == 0});
        word_start = i + len;
      }
      i += len;
    }
    if (word_start < s.size()) out.push_back({s.substr(word_start), p.at_start && word_start == 0});
  }
  pieces.swap(out);
}

void pre_tokenize(const HfTokenizer& t, std::vector<Piece>& pieces) {
  for (const PreStep& p : t.pre) {
    switch (p.kind) {
      case Pre::bert:
        split_pieces(pieces, [](uint32_t cp) { return uc::is_white_space(cp); }, false);
        split_pieces(pieces, [](uint32_t cp) { return uc::is_bert_punctuation(cp); }, true);
        break;
      case Pre::whitespace_split:
        split_pieces(pieces, [](uint32_t cp) { return uc::is_white_space(cp); }, false);
        break;
      case Pre::metaspace: {
        std::vector<Piece> out;
        for (Piece& piece : pieces) {
          replace_all(piece.text, " ", p.replacement);
          bool starts = piece.text.compare(0, p.replacement.size(), p.replacement) == 0;
          if (!starts && !piece.text.empty() && (p.prepend == Prepend::always || (p.prepend == Prepend::first && piece.at_start)))
            piece.text.insert(0, p.replacement);
          if (!p.split) {
            out.push_back(std::move(piece));
            continue;
          }
          // MergedWithNext: each replacement character starts a new piece.
          const std::string& s = piece.text;
          size_t word_start = 0;
          for (size_t i = s.find(p.replacement); i != std::string::npos; i = s.find(p.replacement, i + 1)) {
            if (i > word_start) out.push_back({s.substr(word_start, i - word_start), piece.at_start && word_start == 0});
            word_start = i;
          }
          if (word_start < s.size()) out.push_back({s.substr(word_start), piece.at_start && word_start == 0});
        }
        pieces.swap(out);
        break;
      }
      case Pre::byte_level: {
        std::vector<Piece> out;
        for (Piece& piece : pieces) {
          if (p.add_prefix_space && piece.text.compare(0, 1, " ") != 0) piece.text.insert(0, " ");
          auto to_alphabet = [&](std::string_view w) {
            std::string a;
            a.reserve(w.size() * 2);
            for (unsigned char b : w) uc::utf8_append(t.byte_to_cp[b], a);
            return a;
          };
          if (p.use_regex) {
            for (std::string_view w : gpt2_pretokenize(piece.text)) out.push_back({to_alphabet(w), false});
          } else {
            out.push_back({to_alphabet(piece.text), false});
          }
        }
        pieces.swap(out);
        break;
      }
    }
  }
}

// ---- models ---------------------------------------------------------------------------------

inline uint64_t pair_key(uint32_t a, uint32_t b) { return (uint64_t(a) << 32) | b; }

struct Symbol {
  uint32_t id;
  int prev, next;
  size_t len;  // bytes of the word it covers; 0 once merged into its left neighbour
};

struct MergeCandidate {
  uint32_t rank;
  int pos;
  uint32_t new_id;
  // priority_queue pops the largest: make that the lowest rank, then the leftmost position.
  bool operator<(const MergeCandidate& o) const {
    return rank != o.rank ? rank > o.rank : pos > o.pos;
  }
};

// BPE of one word, as the library's BPE::merge_word + Word::merge_all:
//   symbols: each character (with continuing_subword_prefix after the first and
//   end_of_word_suffix on the last) is its vocabulary id; a character that is not in the
//   vocabulary becomes its <0xXX> byte tokens (byte_fallback) or the unknown token (runs of
//   unknowns fused into one when fuse_unk), or is dropped when there is no unknown token;
//   merges: repeatedly apply the lowest-ranked adjacent pair (leftmost on ties).
void bpe_word(HfTokenizer& t, const std::string& w, std::vector<uint32_t>& out) {
  if (t.ignore_merges) {
    auto v = t.vocab.find(w);
    if (v != t.vocab.end()) {
      out.push_back(v->second);
      return;
    }
  }
  const bool cacheable = w.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    auto hit = t.cache.find(w);
    if (hit != t.cache.end()) {
      out.insert(out.end(), hit->second.begin(), hit->second.end());
      return;
    }
  }
  std::vector<Symbol> sym;
  sym.reserve(w.size());
  auto add = [&](uint32_t id, size_t len) {
    int i = int(sym.size());
    sym.push_back({id, i - 1, -1, len});
    if (i > 0) sym[size_t(i - 1)].next = i;
  };
  int64_t unk = -1;
  size_t unk_len = 0;
  std::string s;
  for (size_t i = 0; i < w.size();) {
    size_t len = uc::utf8_length(w, i);
    s.assign(w, i, len);
    if (i > 0 && !t.subword_prefix.empty()) s.insert(0, t.subword_prefix);
    if (i + len == w.size() && !t.word_suffix.empty()) s += t.word_suffix;
    i += len;
    auto v = t.vocab.find(s);
    if (v != t.vocab.end()) {
      if (unk >= 0) {
        add(uint32_t(unk), unk_len);
        unk = -1;
      }
      add(v->second, len);
      continue;
    }
    if (t.byte_fallback) {
      bool all = true;
      for (unsigned char b : s) all = all && t.byte_token[b] >= 0;
      if (all) {
        // (a pending unknown stays pending, as in the library)
        for (unsigned char b : s) add(uint32_t(t.byte_token[b]), 1);
        continue;
      }
    }
    if (t.unk_id >= 0) {
      if (unk >= 0 && t.fuse_unk) {
        unk_len += len;
      } else {
        if (unk >= 0) add(uint32_t(unk), unk_len);
        unk = t.unk_id;
        unk_len = len;
      }
    }
  }
  if (unk >= 0) add(uint32_t(unk), unk_len);

  std::priority_queue<MergeCandidate> queue;
  auto push_pair = [&](int pos) {
    int next = sym[size_t(pos)].next;
    if (next < 0) return;
    auto m = t.merges.find(pair_key(sym[size_t(pos)].id, sym[size_t(next)].id));
    if (m != t.merges.end()) queue.push({m->second.first, pos, m->second.second});
  };
  for (int i = 0; i + 1 < int(sym.size()); i++) push_pair(i);
  while (!queue.empty()) {
    MergeCandidate top = queue.top();
    queue.pop();
    Symbol& left = sym[size_t(top.pos)];
    if (left.len == 0 || left.next < 0) continue;
    const int right_pos = left.next;
    Symbol& right = sym[size_t(right_pos)];
    auto m = t.merges.find(pair_key(left.id, right.id));
    if (m == t.merges.end() || m->second.second != top.new_id) continue;  // stale entry
    left.id = top.new_id;
    left.len += right.len;
    left.next = right.next;
    right.len = 0;
    if (left.next >= 0) sym[size_t(left.next)].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  const size_t before = out.size();
  for (const Symbol& x : sym)
    if (x.len) out.push_back(x.id);
  if (cacheable) {
    if (t.cache.size() >= kCacheMaxEntries) t.cache.clear();
    t.cache.emplace(w, std::vector<uint32_t>(out.begin() + long(before), out.end()));
  }
}

// WordPiece of one word: greedy longest match from the left, continuation pieces looked up with
// the ## prefix; the whole word is [UNK] when some position has no match or the word is longer
// than max_input_chars_per_word characters.
void wordpiece_word(const HfTokenizer& t, const std::string& w, std::vector<uint32_t>& out) {
  std::vector<size_t> bounds;  // character starts, then w.size()
  for (size_t i = 0; i < w.size(); i += uc::utf8_length(w, i)) bounds.push_back(i);
  const size_t n_chars = bounds.size();
  bounds.push_back(w.size());
  if (n_chars > t.max_input_chars) {
    out.push_back(uint32_t(t.unk_id));
    return;
  }
  const size_t before = out.size();
  std::string sub;
  size_t start = 0;  // index into bounds
  while (start < n_chars) {
    size_t end = n_chars;
    const size_t prefix = start > 0 ? t.subword_prefix.size() : 0;
    while (end > start && bounds[end] - bounds[start] + prefix > t.max_token_bytes) end--;
    int64_t found = -1;
    for (; end > start; end--) {
      sub.clear();
      if (start > 0) sub = t.subword_prefix;
      sub.append(w, bounds[start], bounds[end] - bounds[start]);
      auto v = t.vocab.find(sub);
      if (v != t.vocab.end()) {
        found = v->second;
        break;
      }
    }
    if (found < 0) {
      out.resize(before);
      out.push_back(uint32_t(t.unk_id));
      return;
    }
    out.push_back(uint32_t(found));
    start = end;
  }
}

// ---- decoders -------------------------------------------------------------------------------

bool byte_token_value(const std::string& tok, unsigned char& b) {
  if (tok.size() != 6 || tok.compare(0, 3, "<0x") != 0 || tok[5] != '>') return false;
  auto hexval = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  int hi = hexval(tok[3]), lo = hexval(tok[4]);
  if (hi < 0 || lo < 0) return false;
  b = static_cast<unsigned char>(hi * 16 + lo);
  return true;
}

// The decoder chain over token strings. at_start: the first string begins the text (false when
// decoding one token as the continuation of earlier output; then the first-token rules and a
// Strip after a Fuse do not apply).
std::string run_decoders(const HfTokenizer& t, std::vector<std::string> toks, bool at_start) {
  if (!t.has_decoder) {
    std::string out;
    for (size_t i = 0; i < toks.size(); i++) {
      if (i > 0 || !at_start) out += ' ';
      out += toks[i];
    }
    return out;
  }
  bool fused = false;
  for (const DecStep& d : t.decoder) {
    switch (d.kind) {
      case Dec::byte_level:
        for (std::string& tok : toks) {
          std::string bytes;
          bool ok = true;
          for (size_t i = 0; i < tok.size() && ok;) {
            uint32_t cp;
            i += uc::utf8_decode(tok, i, cp);
            if (cp < 512 && t.cp_to_byte[cp] >= 0)
              bytes.push_back(char(t.cp_to_byte[cp]));
            else
              ok = false;
          }
          if (ok) tok.swap(bytes);  // a token with any other character is kept as it is
        }
        break;
      case Dec::wordpiece:
        for (size_t i = 0; i < toks.size(); i++) {
          std::string& tok = toks[i];
          if (i > 0 || !at_start) {
            if (tok.compare(0, d.from.size(), d.from) == 0)
              tok.erase(0, d.from.size());
            else
              tok.insert(0, " ");
          }
          if (d.cleanup) {
            static const char* const kCleanup[][2] = {
                {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
                {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
            for (const auto& r : kCleanup) replace_all(tok, r[0], r[1]);
          }
        }
        break;
      case Dec::metaspace:
        for (size_t i = 0; i < toks.size(); i++) {
          const bool drop = i == 0 && at_start && d.prepend != Prepend::never;
          replace_all(toks[i], d.from, drop ? "" : " ");
        }
        break;
      case Dec::replace:
        for (std::string& tok : toks) replace_all(tok, d.from, d.to);
        break;
      case Dec::byte_fallback: {
        std::vector<std::string> out;
        std::string bytes;
        bool in_bytes = false;
        for (std::string& tok : toks) {
          unsigned char b;
          if (byte_token_value(tok, b)) {
            bytes.push_back(char(b));
            in_bytes = true;
            continue;
          }
          if (in_bytes) out.push_back(std::move(bytes));
          bytes.clear();
          in_bytes = false;
          out.push_back(std::move(tok));
        }
        if (in_bytes) out.push_back(std::move(bytes));
        toks.swap(out);
        break;
      }
      case Dec::fuse: {
        std::string all;
        for (const std::string& tok : toks) all += tok;
        toks.assign(1, std::move(all));
        fused = true;
        break;
      }
      case Dec::strip:
        if (fused && !at_start) break;  // the start of a fused text is not the start here
        for (std::string& tok : toks) {
          std::u32string u = to_u32(tok);
          size_t a = 0, b = u.size();
          while (a < d.start && a < b && uint32_t(u[a]) == d.strip_char) a++;
          for (size_t k = 0; k < d.stop && b > a && uint32_t(u[b - 1]) == d.strip_char; k++) b--;
          if (a != 0 || b != u.size()) tok = to_utf8(u.substr(a, b - a));
        }
        break;
    }
  }
  std::string out;
  for (const std::string& tok : toks) out += tok;
  return out;
}

// ---- loading --------------------------------------------------------------------------------

void index_added(HfTokenizer& t) {
  for (auto& v : t.raw_first) v.clear();
  for (auto& v : t.norm_first) v.clear();
  std::vector<int> order(t.added.size());
  for (size_t i = 0; i < order.size(); i++) order[i] = int(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return t.added[size_t(a)].pattern.size() > t.added[size_t(b)].pattern.size();
  });
  for (int k : order) {
    const AddedToken& a = t.added[size_t(k)];
    if (a.pattern.empty()) continue;
    (a.normalized ? t.norm_first : t.raw_first)[static_cast<unsigned char>(a.pattern[0])].push_back(k);
  }
}

// Fill id_token from the vocabulary and added tokens; check ids are dense; choose eot_id.
Tokenizer finish(std::shared_ptr<HfTokenizer> hp, const char* name, const std::string& description) {
  HfTokenizer& t = *hp;
  uint32_t max_id = 0;
  for (const auto& kv : t.vocab) max_id = std::max(max_id, kv.second);
  for (const AddedToken& a : t.added) max_id = std::max(max_id, a.id);
  const size_t n = size_t(max_id) + 1;
  if (n > t.vocab.size() + t.added.size())  // (checked before allocating n strings)
    fail("tokenizer '", t.path, "' has ids up to ", max_id, " but only ",
         t.vocab.size() + t.added.size(), " tokens; the vocabulary's ids must be 0..n-1 (the file "
         "is damaged)");
  t.id_token.assign(n, std::string());
  t.id_known.assign(n, 0);
  for (const auto& kv : t.vocab) {
    t.id_token[kv.second] = kv.first;
    t.id_known[kv.second] = 1;
  }
  for (const AddedToken& a : t.added) {
    t.id_token[a.id] = a.content;
    t.id_known[a.id] = 1;
  }
  for (size_t i = 0; i < n; i++)
    if (!t.id_known[i])
      fail("tokenizer '", t.path, "' has no token with id ", i, " although ids go up to ", max_id,
           "; the vocabulary's ids must be 0..n-1 (the file is damaged)");
  for (int b = 0; b < 256; b++) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    auto v = t.vocab.find(buf);
    t.byte_token[b] = v != t.vocab.end() ? int64_t(v->second) : -1;
  }
  uc::byte_level_alphabet(t.byte_to_cp);
  std::fill(std::begin(t.cp_to_byte), std::end(t.cp_to_byte), -1);
  for (int b = 0; b < 256; b++) t.cp_to_byte[t.byte_to_cp[b]] = b;
  t.byte_exact = t.normalizer.empty() && !t.pre.empty() && t.pre[0].kind == Pre::byte_level;
  index_added(t);

  Tokenizer tok;
  tok.kind = TokenizerKind::hf;
  tok.name = name;
  tok.description = description;
  tok.vocab_size = int(n);
  tok.eot_id = -1;
  static const char* const kEnd[] = {"<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "[SEP]"};
  for (const char* e : kEnd) {
    for (const AddedToken& a : t.added)
      if (a.content == e) tok.eot_id = int(a.id);
    if (tok.eot_id < 0) {
      auto v = t.vocab.find(e);
      if (v != t.vocab.end()) tok.eot_id = int(v->second);
    }
    if (tok.eot_id >= 0) break;
  }
  if (tok.eot_id < 0)
    fail("tokenizer '", t.path, "' has none of the end-of-text tokens <|endoftext|>, </s>, "
         "<|end_of_text|>, <eos>, [SEP]; llmpi-prep puts one between documents, so the vocabulary "
         "needs one of them (add it as a special added token)");
  tok.hf = std::move(hp);
  return tok;
}

}  // namespace

Tokenizer load_hf_tokenizer(const std::string& path) {
  const std::string text = read_file(path, "tokenizer.json");
  auto hp = std::make_shared<HfTokenizer>();
  HfTokenizer& t = *hp;
  t.path = path;
  Ctx c{path};
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("tokenizer.json '", path, "' is not valid JSON (", e.what(),
         "); give a Hugging Face tokenizer.json (hf:PATH/tokenizer.json)");
  }
  if (!j.is_object() || !j.contains("model"))
    fail("'", path, "' is not a Hugging Face tokenizer.json (no \"model\" object); give the "
         "tokenizer.json that comes with the model");

  // model
  const json& m = j["model"];
  std::string mtype = m.is_object() && m.contains("type") && m["type"].is_string()
                          ? m["type"].get<std::string>()
                          : (m.is_object() && m.contains("merges") ? "BPE" : "");
  if (mtype != "BPE" && mtype != "WordPiece")
    c.bad("model", "model type '" + mtype + "' is not supported (llmpi reads BPE and WordPiece: "
                   "the GPT-2, LLaMA and BERT tokenizers)");
  t.wordpiece = mtype == "WordPiece";
  if (!m.contains("vocab") || !m["vocab"].is_object()) c.bad("model", "has no \"vocab\" object");
  t.vocab.reserve(m["vocab"].size() * 2);
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    if (!it->is_number_unsigned() || it->get<uint64_t>() > uint64_t(INT32_MAX))
      c.bad("model.vocab", "token '" + it.key() + "' has no id in 0..2^31-1");
    t.vocab[it.key()] = it->get<uint32_t>();
  }
  if (t.vocab.empty()) c.bad("model.vocab", "is empty");
  std::string unk = str_field(c, m, "unk_token", "model");
  if (!unk.empty()) {
    auto v = t.vocab.find(unk);
    if (v == t.vocab.end()) c.bad("model", "unk_token '" + unk + "' is not in the vocabulary");
    t.unk_id = v->second;
  }
  if (t.wordpiece) {
    if (t.unk_id < 0) c.bad("model", "WordPiece needs an unk_token");
    t.subword_prefix = str_field(c, m, "continuing_subword_prefix", "model", "##");
    int64_t mx = int_field(c, m, "max_input_chars_per_word", "model", 100);
    if (mx < 0) c.bad("model", "max_input_chars_per_word is negative");
    t.max_input_chars = size_t(mx);
    for (const auto& kv : t.vocab) t.max_token_bytes = std::max(t.max_token_bytes, kv.first.size());
  } else {
    auto d = m.find("dropout");
    if (d != m.end() && !d->is_null() && !(d->is_number() && d->get<double>() == 0.0))
      c.bad("model", "BPE dropout is set; llmpi tokenizes deterministically, so remove it "
                     "(set \"dropout\": null)");
    t.byte_fallback = bool_field(c, m, "byte_fallback", "model", false);
    t.fuse_unk = bool_field(c, m, "fuse_unk", "model", false);
    t.ignore_merges = bool_field(c, m, "ignore_merges", "model", false);
    t.subword_prefix = str_field(c, m, "continuing_subword_prefix", "model");
    t.word_suffix = str_field(c, m, "end_of_word_suffix", "model");
    if (!m.contains("merges") || !m["merges"].is_array()) c.bad("model", "BPE has no \"merges\" list");
    const json& merges = m["merges"];
    t.merges.reserve(merges.size() * 2);
    std::string a, b;
    for (size_t r = 0; r < merges.size(); r++) {
      const json& e = merges[r];
      if (e.is_string()) {  // "a b"
        const std::string& s = e.get_ref<const std::string&>();
        size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          c.bad("model.merges[" + std::to_string(r) + "]", "'" + s + "' is not 'left right'");
        a = s.substr(0, sp), b = s.substr(sp + 1);
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        a = e[0].get<std::string>(), b = e[1].get<std::string>();
      } else {
        c.bad("model.merges[" + std::to_string(r) + "]", "is neither \"a b\" nor [\"a\", \"b\"]");
      }
      const size_t cut = t.subword_prefix.size();
      if (b.size() < cut) c.bad("model.merges[" + std::to_string(r) + "]", "right part shorter than the subword prefix");
      auto ia = t.vocab.find(a), ib = t.vocab.find(b), im = t.vocab.find(a + b.substr(cut));
      if (ia == t.vocab.end() || ib == t.vocab.end() || im == t.vocab.end())
        c.bad("model.merges[" + std::to_string(r) + "]",
              "merge '" + a + " " + b + "' uses or makes a token that the vocabulary does not have");
      t.merges[pair_key(ia->second, ib->second)] = {uint32_t(r), im->second};
    }
  }

  // pipeline
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    parse_normalizer(c, j["normalizer"], t.normalizer, "normalizer");
  if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null())
    parse_pre_tokenizer(c, j["pre_tokenizer"], t.pre, "pre_tokenizer");
  if (j.contains("decoder") && !j["decoder"].is_null()) {
    t.has_decoder = true;
    parse_decoder(c, j["decoder"], t.decoder, "decoder");
  }

  // added tokens
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (size_t i = 0; i < j["added_tokens"].size(); i++) {
      const json& e = j["added_tokens"][i];
      const std::string where = "added_tokens[" + std::to_string(i) + "]";
      AddedToken a;
      a.content = str_field(c, e, "content", where, "", true);
      int64_t id = int_field(c, e, "id", where, -1);
      if (id < 0 || id > INT32_MAX) c.bad(where, "has no id >= 0");
      a.id = uint32_t(id);
      a.special = bool_field(c, e, "special", where, false);
      a.normalized = bool_field(c, e, "normalized", where, !a.special);
      a.lstrip = bool_field(c, e, "lstrip", where, false);
      a.rstrip = bool_field(c, e, "rstrip", where, false);
      a.single_word = bool_field(c, e, "single_word", where, false);
      t.added.push_back(a);
    }
  }
  for (AddedToken& a : t.added) a.pattern = a.normalized ? normalize(t, a.content) : a.content;

  if (j.contains("post_processor") && !j["post_processor"].is_null())
    parse_template(c, t, j["post_processor"], "post_processor");

  return finish(std::move(hp), "hf", "hf:fnv1a64=" + hex16(fnv1a64(text)));
}

// BERT's vocab.txt: one token per line, id = line number (from 0); the pipeline of
// transformers' BertTokenizerFast: BertNormalizer (clean text, CJK; lower-casing and accent
// stripping when `lowercase`), BertPreTokenizer, WordPiece with [UNK] and ##, max 100
// characters a word, the [PAD] [UNK] [CLS] [SEP] [MASK] tokens special, decoder WordPiece,
// template [CLS] A [SEP] (B [SEP]).
Tokenizer load_wordpiece_vocab(const std::string& path, bool lowercase) {
  const std::string text = read_file(path, "WordPiece vocab.txt");
  auto hp = std::make_shared<HfTokenizer>();
  HfTokenizer& t = *hp;
  t.path = path;
  t.wordpiece = true;
  uint32_t id = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string line = text.substr(pos, eol - pos);
    pos = eol + 1;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
    if (!t.vocab.emplace(line, id).second)
      fail("WordPiece vocab '", path, "' line ", id + 1, ": token '", line,
           "' is listed twice; give BERT's vocab.txt (one token per line)");
    id++;
  }
  if (t.vocab.empty()) fail("WordPiece vocab '", path, "' is empty; give BERT's vocab.txt");
  auto need = [&](const char* tok) {
    auto v = t.vocab.find(tok);
    if (v == t.vocab.end())
      fail("WordPiece vocab '", path, "' has no ", tok, " token; give BERT's vocab.txt (with [PAD] "
           "[UNK] [CLS] [SEP] [MASK])");
    return v->second;
  };
  t.unk_id = need("[UNK]");
  const uint32_t cls = need("[CLS]"), sep = need("[SEP]");
  for (const char* s : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}) {
    auto v = t.vocab.find(s);
    if (v == t.vocab.end()) continue;
    AddedToken a;
    a.content = a.pattern = s;
    a.id = v->second;
    a.special = true;
    t.added.push_back(a);
  }
  t.subword_prefix = "##";
  for (const auto& kv : t.vocab) t.max_token_bytes = std::max(t.max_token_bytes, kv.first.size());
  NormStep n;
  n.kind = Norm::bert;
  n.clean_text = n.chinese = true;
  n.lowercase = n.strip_accents = lowercase;
  t.normalizer.push_back(n);
  PreStep p;
  p.kind = Pre::bert;
  t.pre.push_back(p);
  DecStep d;
  d.kind = Dec::wordpiece;
  d.from = "##";
  d.cleanup = true;
  t.decoder.push_back(d);
  t.has_decoder = true;
  TemplateItem c0, a0, s0, b1, s1;
  c0.special = s0.special = s1.special = true;
  c0.ids = {cls};
  s0.ids = s1.ids = {sep};
  b1.sequence = 1;
  b1.type_id = s1.type_id = 1;
  t.has_template = true;
  t.single = {c0, a0, s0};
  t.pair = {c0, a0, s0, b1, s1};
  return finish(std::move(hp), "wordpiece",
                std::string(lowercase ? "wordpiece:lowercase:fnv1a64=" : "wordpiece:fnv1a64=") +
                    hex16(fnv1a64(text)));
}

// ---- encode / decode ------------------------------------------------------------------------

namespace {

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      i++;
      continue;
    }
    uint32_t cp;
    i += uc::utf8_decode(s, i, cp);
    if (cp == uc::kInvalid) return false;
  }
  return true;
}

void encode_text(HfTokenizer& t, std::string_view raw, std::vector<uint32_t>& out, bool allow_special) {
  std::string lossy;
  if (!t.byte_exact && !valid_utf8(raw)) {
    lossy = to_utf8(to_u32(raw));  // each bad byte -> U+FFFD
    raw = lossy;
  }
  std::vector<Piece> pieces;
  for (const Segment& seg : find_added(t, raw, false, allow_special)) {
    if (seg.id >= 0) {
      out.push_back(uint32_t(seg.id));
      continue;
    }
    const std::string norm = normalize(t, raw.substr(seg.start, seg.stop - seg.start));
    for (const Segment& sub : find_added(t, norm, true, allow_special)) {
      if (sub.id >= 0) {
        out.push_back(uint32_t(sub.id));
        continue;
      }
      pieces.clear();
      pieces.push_back({norm.substr(sub.start, sub.stop - sub.start), seg.start == 0 && sub.start == 0});
      pre_tokenize(t, pieces);
      for (const Piece& p : pieces) {
        if (p.text.empty()) continue;
        if (t.wordpiece)
          wordpiece_word(t, p.text, out);
        else
          bpe_word(t, p.text, out);
      }
    }
  }
}

}  // namespace

void hf_encode(const Tokenizer& tok, std::string_view text, std::vector<uint32_t>& out, bool allow_special) {
  encode_text(*tok.hf, text, out, allow_special);
}

std::string hf_decode(const Tokenizer& tok, const uint32_t* ids, size_t n) {
  const HfTokenizer& t = *tok.hf;
  std::vector<std::string> toks;
  toks.reserve(n);
  for (size_t i = 0; i < n; i++) {
    if (ids[i] >= uint32_t(tok.vocab_size))
      fail("cannot decode token id ", ids[i], ": tokenizer '", tok.name, "' has ids 0..",
           tok.vocab_size - 1, "; the ids come from a different tokenizer or vocabulary");
    toks.push_back(t.id_token[ids[i]]);
  }
  return run_decoders(t, std::move(toks), true);
}

void hf_decode_append(const Tokenizer& tok, int64_t id, std::string& out, bool at_start) {
  out += run_decoders(*tok.hf, {tok.hf->id_token[size_t(id)]}, at_start);
}

TemplateEncoding encode_with_template(const Tokenizer& tok, std::string_view a,
                                      const std::string_view* b, bool allow_special) {
  if (tok.kind != TokenizerKind::hf)
    fail("tokenizer '", tok.name, "' has no post-processor template; encode_with_template needs "
         "an hf: or wordpiece: tokenizer");
  std::vector<uint32_t> ids_a, ids_b;
  hf_encode(tok, a, ids_a, allow_special);
  if (b) hf_encode(tok, *b, ids_b, allow_special);
  return apply_template(tok, ids_a, b ? &ids_b : nullptr);
}

TemplateEncoding apply_template(const Tokenizer& tok, const std::vector<uint32_t>& ids_a,
                                const std::vector<uint32_t>* b) {
  if (tok.kind != TokenizerKind::hf)
    fail("tokenizer '", tok.name, "' has no post-processor template; apply_template needs "
         "an hf: or wordpiece: tokenizer");
  static const std::vector<uint32_t> kNone;
  const std::vector<uint32_t>& ids_b = b ? *b : kNone;
  TemplateEncoding e;
  const HfTokenizer& t = *tok.hf;
  if (!t.has_template) {
    e.ids = ids_a;
    e.type_ids.assign(ids_a.size(), 0);
    e.ids.insert(e.ids.end(), ids_b.begin(), ids_b.end());
    e.type_ids.resize(e.ids.size(), b ? 1 : 0);
    return e;
  }
  for (const TemplateItem& it : b ? t.pair : t.single) {
    const std::vector<uint32_t>& src = it.special ? it.ids : (it.sequence == 0 ? ids_a : ids_b);
    e.ids.insert(e.ids.end(), src.begin(), src.end());
    e.type_ids.resize(e.ids.size(), it.type_id);
  }
  return e;
}

}  // namespace llmpi
