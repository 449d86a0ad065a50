// UTF-8 and the lookups over the generated tables (unicode_tables.cpp); see unicode.h.
#include "tokenizer/unicode.h"

#include <algorithm>

namespace llmpi::unicode {

using namespace tables;

size_t utf8_decode(std::string_view s, size_t pos, uint32_t& cp) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  unsigned char c = b(pos);
  if (c < 0x80) {
    cp = c;
    return 1;
  }
  size_t len;
  uint32_t v, min;
  if ((c & 0xE0) == 0xC0) {
    len = 2, v = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, v = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, v = c & 0x07, min = 0x10000;
  } else {
    cp = kInvalid;
    return 1;
  }
  if (pos + len > s.size()) {
    cp = kInvalid;
    return 1;
  }
  for (size_t i = 1; i < len; i++) {
    unsigned char d = b(pos + i);
    if ((d & 0xC0) != 0x80) {
      cp = kInvalid;
      return 1;
    }
    v = (v << 6) | (d & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
    cp = kInvalid;
    return 1;
  }
  cp = v;
  return len;
}

void utf8_append(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

static bool in_ranges(const CodeRange* ranges, size_t n, uint32_t cp) {
  // First range whose hi >= cp; cp is inside when lo <= cp.
  const CodeRange* r = std::lower_bound(ranges, ranges + n, cp,
                                        [](const CodeRange& a, uint32_t c) { return a.hi < c; });
  return r != ranges + n && r->lo <= cp;
}

bool is_white_space(uint32_t cp) {
  if (cp < 128) return cp == ' ' || (cp >= 9 && cp <= 13);
  return in_ranges(kWhiteSpace, kWhiteSpaceCount, cp);
}

bool is_bert_control(uint32_t cp) { return in_ranges(kBertControl, kBertControlCount, cp); }

bool is_bert_punctuation(uint32_t cp) { return in_ranges(kBertPunct, kBertPunctCount, cp); }

bool is_nonspacing_mark(uint32_t cp) {
  return cp >= 0x300 && in_ranges(kNonspacingMark, kNonspacingMarkCount, cp);
}

// BertNormalizer's handle_chinese_chars ranges (the CJK Unified Ideographs blocks and the
// compatibility ideographs), as written in the tokenizers library.
bool is_cjk(uint32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
         (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

void append_nfd(uint32_t cp, std::u32string& out) {
  if (cp < 0xC0) {
    out.push_back(cp);
    return;
  }
  // Hangul syllable S = 0xAC00 + (L * 21 + V) * 28 + T -> L V [T] jamo.
  if (cp >= 0xAC00 && cp <= 0xD7A3) {
    uint32_t s = cp - 0xAC00;
    out.push_back(0x1100 + s / 588);
    out.push_back(0x1161 + (s % 588) / 28);
    if (s % 28) out.push_back(0x11A7 + s % 28);
    return;
  }
  const Decomposition* d = std::lower_bound(kNfd, kNfd + kNfdCount, cp,
                                            [](const Decomposition& a, uint32_t c) { return a.cp < c; });
  if (d != kNfd + kNfdCount && d->cp == cp)
    out.append(kNfdPool + d->offset, kNfdPool + d->offset + d->length);
  else
    out.push_back(cp);
}

void append_lower(uint32_t cp, std::u32string& out) {
  if (cp < 128) {
    out.push_back(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
    return;
  }
  const CodePair* p = std::lower_bound(kLower, kLower + kLowerCount, cp,
                                       [](const CodePair& a, uint32_t c) { return a.from < c; });
  if (p != kLower + kLowerCount && p->from == cp) {
    out.push_back(p->to);
    return;
  }
  for (size_t i = 0; i < kLowerMultiCount; i++) {
    if (kLowerMulti[i].cp == cp) {
      for (uint32_t t : kLowerMulti[i].to)
        if (t) out.push_back(t);
      return;
    }
  }
  out.push_back(cp);
}

}  // namespace llmpi::unicode
