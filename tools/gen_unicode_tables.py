#!/usr/bin/env python3
"""Generate src/tokenizer/unicode_tables.cpp: the Unicode tables the Hugging Face tokenizers need.

Needs: Python 3.9+, PyPI `tokenizers` (0.2x). Not run by the build; its output is committed.
  python3 tools/gen_unicode_tables.py > src/tokenizer/unicode_tables.cpp

The tables describe what the `tokenizers` library (Rust) does to each code point, so the oracle
is the library itself: every code point (surrogates excluded) is run through its normalizers and
pre-tokenizer one at a time, and the maximal runs with the same answer are written out:
  white space   Rust's char::is_whitespace (Unicode White_Space): BertPreTokenizer drops it
  bert control  removed by BertNormalizer(clean_text=True) (NUL, U+FFFD, categories Cc Cf Co Cs
                except tab, LF, CR)
  bert punct    isolated by BertPreTokenizer (ASCII punctuation and categories Pc Pd Pe Pf Pi Po Ps)
  nonspacing    category Mn: what BertNormalizer's accent stripping drops after NFD
  nfd           canonical decomposition (normalizers.NFD on the single code point), Hangul
                syllables excluded (decomposed algorithmically in C++)
  lowercase     normalizers.Lowercase on the single code point (Rust char::to_lowercase; one
                code point may become two)
The script checks that accent stripping = NFD then drop Mn for every code point, and reports how
the library's classes differ from Python's unicodedata (for information only).
"""
import sys
import unicodedata

from tokenizers import normalizers, pre_tokenizers

MAX_CP = 0x10FFFF


def code_points():
    for c in range(MAX_CP + 1):
        if 0xD800 <= c <= 0xDFFF:
            continue
        yield c


def runs(cps):
    """Sorted code points -> maximal (lo, hi) runs."""
    out = []
    for c in sorted(cps):
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return out


def emit_ranges(name, comment, cps):
    rs = runs(cps)
    print(f"// {comment}: {len(cps)} code points in {len(rs)} ranges.")
    print(f"const CodeRange {name}[] = {{")
    line = "   "
    for lo, hi in rs:
        item = f" {{0x{lo:X}, 0x{hi:X}}},"
        if len(line) + len(item) > 100:
            print(line)
            line = "   "
        line += item
    print(line)
    print("};")
    print(f"const size_t {name}Count = sizeof({name}) / sizeof({name}[0]);")
    print()


def main():
    clean = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=False,
                                       strip_accents=False, lowercase=False)
    strip = normalizers.BertNormalizer(clean_text=False, handle_chinese_chars=False,
                                       strip_accents=True, lowercase=False)
    nfd = normalizers.NFD()
    lower = normalizers.Lowercase()
    bert_pre = pre_tokenizers.BertPreTokenizer()

    space, control, punct, nonspacing = set(), set(), set(), set()
    decomp = {}   # cp -> tuple of cps (NFD), non-Hangul
    lowers = {}   # cp -> tuple of cps
    for c in code_points():
        ch = chr(c)
        cl = clean.normalize_str(ch)
        if cl == "":
            control.add(c)
        pieces = [p for p, _ in bert_pre.pre_tokenize_str("a" + ch + "a")]
        if pieces == ["a", ch, "a"]:
            punct.add(c)
        elif pieces == ["a", "a"]:
            space.add(c)
        if c not in control and (cl == " " and c != 0x20) != (c in space and c != 0x20):
            raise SystemExit(f"U+{c:04X}: clean_text's white space differs from BertPreTokenizer's; "
                             "the tables' model does not hold")
        d = nfd.normalize_str(ch)
        if d != ch and not (0xAC00 <= c <= 0xD7A3):
            decomp[c] = tuple(ord(x) for x in d)
        if d == ch and strip.normalize_str(ch) == "":
            nonspacing.add(c)
        lo = lower.normalize_str(ch)
        if lo != ch:
            lowers[c] = tuple(ord(x) for x in lo)

    # Check: strip_accents(c) == NFD(c) without the nonspacing marks, for every code point.
    for c in code_points():
        ch = chr(c)
        d = nfd.normalize_str(ch)
        want = "".join(x for x in d if ord(x) not in nonspacing)
        if strip.normalize_str(ch) != want:
            raise SystemExit(f"U+{c:04X}: strip_accents is not NFD minus Mn; the model does not hold")
    # Hangul: the algorithmic decomposition matches the library's.
    for c in range(0xAC00, 0xD7A4):
        s = c - 0xAC00
        want = [0x1100 + s // 588, 0x1161 + (s % 588) // 28] + ([0x11A7 + s % 28] if s % 28 else [])
        if [ord(x) for x in nfd.normalize_str(chr(c))] != want:
            raise SystemExit(f"U+{c:04X}: Hangul decomposition differs")

    # For information: differences from Python's unicodedata.
    ud_mn = {c for c in code_points() if unicodedata.category(chr(c)) == "Mn"}
    ud_p = {c for c in code_points() if unicodedata.category(chr(c)).startswith("P")
            or (c < 128 and chr(c) in "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")}
    print(f"// unicodedata {unicodedata.unidata_version} vs tokenizers: Mn differs at "
          f"{len(ud_mn ^ nonspacing)} code points, punctuation at {len(ud_p ^ punct)}.", file=sys.stderr)

    import tokenizers
    print("// GENERATED FILE - do not edit. Made by tools/gen_unicode_tables.py with PyPI tokenizers "
          f"{tokenizers.__version__}")
    print("// (the library itself is the oracle: every code point is run through its normalizers and")
    print("// BertPreTokenizer). Regenerate with:")
    print("//   python tools/gen_unicode_tables.py > src/tokenizer/unicode_tables.cpp")
    print('#include "tokenizer/unicode.h"')
    print()
    print("namespace llmpi::unicode::tables {")
    print()
    emit_ranges("kWhiteSpace", "Rust char::is_whitespace (Unicode White_Space)", space)
    emit_ranges("kBertControl", "removed by BertNormalizer clean_text", control)
    emit_ranges("kBertPunct", "isolated by BertPreTokenizer", punct)
    emit_ranges("kNonspacingMark", "category Mn (dropped by accent stripping after NFD)", nonspacing)

    # NFD: sorted {cp, offset, length} into one pool.
    pool = []
    entries = []
    for c in sorted(decomp):
        entries.append((c, len(pool), len(decomp[c])))
        pool.extend(decomp[c])
    print(f"// Canonical decompositions (NFD of one code point; Hangul syllables excluded): "
          f"{len(entries)} code points.")
    print("const Decomposition kNfd[] = {")
    line = "   "
    for c, off, n in entries:
        item = f" {{0x{c:X}, {off}, {n}}},"
        if len(line) + len(item) > 100:
            print(line)
            line = "   "
        line += item
    print(line)
    print("};")
    print("const size_t kNfdCount = sizeof(kNfd) / sizeof(kNfd[0]);")
    print("const uint32_t kNfdPool[] = {")
    line = "   "
    for x in pool:
        item = f" 0x{x:X},"
        if len(line) + len(item) > 100:
            print(line)
            line = "   "
        line += item
    print(line)
    print("};")
    print()

    # Lowercase: sorted one-to-one pairs, then the code points that become more than one.
    single = {c: v[0] for c, v in lowers.items() if len(v) == 1}
    multi = {c: v for c, v in lowers.items() if len(v) > 1}
    print(f"// Lowercase, one code point to one: {len(single)} pairs {{c, lower(c)}}.")
    print("const CodePair kLower[] = {")
    line = "   "
    for c in sorted(single):
        item = f" {{0x{c:X}, 0x{single[c]:X}}},"
        if len(line) + len(item) > 100:
            print(line)
            line = "   "
        line += item
    print(line)
    print("};")
    print("const size_t kLowerCount = sizeof(kLower) / sizeof(kLower[0]);")
    print(f"// Lowercase to more than one code point: {len(multi)}.")
    print("const LowerMulti kLowerMulti[] = {")
    for c, v in sorted(multi.items()):
        vals = ", ".join(f"0x{x:X}" for x in v) + ", 0" * (3 - len(v))
        print(f"    {{0x{c:X}, {{{vals}}}}},")
    print("};")
    print("const size_t kLowerMultiCount = sizeof(kLowerMulti) / sizeof(kLowerMulti[0]);")
    print()
    print("}  // namespace llmpi::unicode::tables")


if __name__ == "__main__":
    main()
