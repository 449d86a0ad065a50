// Tokenizer tests: byte tokenizer, GPT-2 BPE against known GPT-2 outputs, round trips.
//
// The GPT-2 files and Tiny Shakespeare come from ../shared/data (relative to the repo root,
// where the tests run) or $LLMPI_SHARED_DATA; tests that need them skip when absent.
// Expected ids below: the README test vectors, and outputs of GPT-2's encoder.py rules worked
// through piece by piece (each case notes the pre-token pieces it exercises).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>

#include "runtime/error.h"
#include "tokenizer/tokenizer.h"
#include "file_test_util.h"

using namespace llmpi;
using llmpi::test::error_of;

namespace {

std::string shared_data_dir() {
  const char* env = std::getenv("LLMPI_SHARED_DATA");
  return env && *env ? std::string(env) : std::string("../shared/data");
}

bool file_exists(const std::string& p) {
  std::ifstream f(p);
  return bool(f);
}

std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Loaded once for all GPT-2 tests (loading parses 1.5 MB of files).
const Tokenizer* gpt2() {
  static bool tried = false;
  static Tokenizer tok;
  static bool ok = false;
  if (!tried) {
    tried = true;
    std::string d = shared_data_dir() + "/gpt2/";
    if (file_exists(d + "encoder.json") && file_exists(d + "vocab.bpe")) {
      tok = load_tokenizer("gpt2", d + "encoder.json", d + "vocab.bpe");
      ok = true;
    }
  }
  return ok ? &tok : nullptr;
}

#define REQUIRE_GPT2()                                                                       \
  const Tokenizer* tp = gpt2();                                                              \
  if (!tp)                                                                                   \
    GTEST_SKIP() << "GPT-2 BPE files not found in " << shared_data_dir()                     \
                 << "/gpt2/ (set LLMPI_SHARED_DATA to the shared data folder to run this)"; \
  const Tokenizer& tok = *tp;                                                                 \
  (void)tok

using Ids = std::vector<uint32_t>;

}  // namespace

// ---- byte tokenizer --------------------------------------------------------------------------

TEST(ByteTokenizer, IdsAreBytes) {
  Tokenizer t = load_tokenizer("byte");
  EXPECT_EQ(t.name, "byte");
  EXPECT_EQ(t.description, "byte");
  EXPECT_EQ(t.vocab_size, 257);
  EXPECT_EQ(t.eot_id, 256);
  EXPECT_EQ(encode(t, "Hi\n"), (Ids{'H', 'i', '\n'}));
  EXPECT_EQ(encode(t, std::string("\xff\x00", 2)), (Ids{255, 0}));
}

TEST(ByteTokenizer, AllBytesRoundTrip) {
  Tokenizer t = byte_tokenizer();
  std::string all;
  for (int i = 0; i < 256; i++) all.push_back(char(i));
  Ids ids = encode(t, all);
  ASSERT_EQ(ids.size(), 256u);
  for (int i = 0; i < 256; i++) EXPECT_EQ(ids[i], uint32_t(i));
  EXPECT_EQ(decode(t, ids), all);
}

TEST(ByteTokenizer, EndOfTextSpecial) {
  Tokenizer t = byte_tokenizer();
  EXPECT_EQ(encode(t, "a<|endoftext|>b", true), (Ids{'a', 256, 'b'}));
  EXPECT_EQ(encode(t, "<|endoftext|>", false).size(), 13u);  // plain text when not allowed
  EXPECT_EQ(decode(t, Ids{'a', 256}), "a<|endoftext|>");
  EXPECT_NE(error_of([&] { decode(t, Ids{257}); }).find("cannot decode token id 257"),
            std::string::npos);
  EXPECT_NE(error_of([&] { decode(t, std::vector<int32_t>{-1}); }).find("token id -1"),
            std::string::npos);
}

TEST(ByteTokenizer, TinyShakespeareRoundTrip) {
  std::string p = shared_data_dir() + "/tinyshakespeare/input.txt";
  if (!file_exists(p)) GTEST_SKIP() << "Tiny Shakespeare not found at " << p;
  std::string text = read_file(p);
  Tokenizer t = byte_tokenizer();
  Ids ids = encode(t, text);
  EXPECT_EQ(ids.size(), text.size());
  EXPECT_EQ(decode(t, ids), text);
}

TEST(Tokenizer, LoadErrors) {
  EXPECT_NE(error_of([] { load_tokenizer("sentencepiece"); }).find("unknown tokenizer 'sentencepiece'"),
            std::string::npos);
  EXPECT_NE(error_of([] { load_tokenizer("gpt2"); }).find("--gpt2-encoder"), std::string::npos);
  EXPECT_NE(error_of([] { load_tokenizer("byte", "x.json", ""); }).find("takes no files"),
            std::string::npos);
  std::string msg = error_of([] { load_tokenizer("gpt2", "/nonexistent/encoder.json", "/nonexistent/vocab.bpe"); });
  EXPECT_NE(msg.find("cannot open GPT-2 encoder.json file '/nonexistent/encoder.json'"),
            std::string::npos)
      << msg;
}

TEST(Tokenizer, Fnv1a64KnownValues) {
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a64("foobar"), 0x85944171f73967e8ull);
  EXPECT_EQ(fnv1a64("bar", fnv1a64("foo")), fnv1a64("foobar"));  // continues across files
}

// ---- GPT-2 pre-tokenization ------------------------------------------------------------------

TEST(Gpt2Pretokenize, Pieces) {
  using P = std::vector<std::string_view>;
  EXPECT_EQ(gpt2_pretokenize("This is some text"), (P{"This", " is", " some", " text"}));
  // Contractions are separate pieces, case-sensitive: "'S" is "'" + "S".
  EXPECT_EQ(gpt2_pretokenize("I'm it's 'S"), (P{"I", "'m", " it", "'s", " '", "S"}));
  // A whitespace run gives up its last character to the next word; at the end it stays whole.
  EXPECT_EQ(gpt2_pretokenize("a \n\n  b  "), (P{"a", " \n\n ", " b", "  "}));
  EXPECT_EQ(gpt2_pretokenize("a   b"), (P{"a", "  ", " b"}));
  // A lone non-space whitespace before a word is its own piece (\s+ fallback).
  EXPECT_EQ(gpt2_pretokenize("\t\tTab"), (P{"\t", "\t", "Tab"}));
  // Numbers, punctuation runs, the optional space in front of each.
  EXPECT_EQ(gpt2_pretokenize("x=12.5!!  ?"), (P{"x", "=", "12", ".", "5", "!!", " ", " ?"}));
  // Non-ASCII letters (é, ö), non-ASCII numbers (², ½, Ⅻ), emoji as punctuation.
  EXPECT_EQ(gpt2_pretokenize("h\xc3\xa9llo w\xc3\xb6rld"), (P{"h\xc3\xa9llo", " w\xc3\xb6rld"}));
  EXPECT_EQ(gpt2_pretokenize("x\xc2\xb2\xc2\xbd \xe2\x85\xab"), (P{"x", "\xc2\xb2\xc2\xbd", " \xe2\x85\xab"}));
  EXPECT_EQ(gpt2_pretokenize("go \xf0\x9f\x98\x80!"), (P{"go", " \xf0\x9f\x98\x80!"}));
  // U+00A0 (no-break space) is \s but not the optional " ": a piece of its own.
  EXPECT_EQ(gpt2_pretokenize("\xc2\xa0nbsp"), (P{"\xc2\xa0", "nbsp"}));
  // Invalid UTF-8 bytes count as "other" characters.
  EXPECT_EQ(gpt2_pretokenize("\xff\xfe" "abc"), (P{"\xff\xfe", "abc"}));
  EXPECT_TRUE(gpt2_pretokenize("").empty());
}

// ---- GPT-2 BPE -------------------------------------------------------------------------------

TEST(Gpt2Tokenizer, ReadmeVectors) {
  REQUIRE_GPT2();
  EXPECT_EQ(tok.vocab_size, 50257);
  EXPECT_EQ(tok.eot_id, 50256);
  EXPECT_EQ(encode(tok, "This is some text"), (Ids{1212, 318, 617, 2420}));
  EXPECT_EQ(encode(tok, " "), (Ids{220}));
  EXPECT_EQ(encode(tok, "<|endoftext|>", /*allow_special=*/true), (Ids{50256}));
}

TEST(Gpt2Tokenizer, Description) {
  REQUIRE_GPT2();
  EXPECT_EQ(tok.name, "gpt2");
  // FNV-1a 64 of OpenAI's published encoder.json followed by vocab.bpe.
  EXPECT_EQ(tok.description, "gpt2:fnv1a64=f1c9dc14a36a3b68");
}

TEST(Gpt2Tokenizer, SpecialTokenOnlyWhenAllowed) {
  REQUIRE_GPT2();
  // Not allowed: ordinary text, pieces "<|" "endoftext" "|>".
  EXPECT_EQ(encode(tok, "<|endoftext|>"), (Ids{27, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_EQ(encode(tok, "Hello world<|endoftext|>Next doc", true),
            (Ids{15496, 995, 50256, 10019, 2205}));
  EXPECT_EQ(decode(tok, Ids{15496, 995, 50256, 10019, 2205}), "Hello world<|endoftext|>Next doc");
}

TEST(Gpt2Tokenizer, WordsAndPunctuation) {
  REQUIRE_GPT2();
  EXPECT_EQ(encode(tok, "hello world"), (Ids{31373, 995}));
  EXPECT_EQ(encode(tok, "Hello, World!"), (Ids{15496, 11, 2159, 0}));
  EXPECT_EQ(encode(tok, "The quick brown fox jumps over the lazy dog."),
            (Ids{464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13}));
}

TEST(Gpt2Tokenizer, Contractions) {
  REQUIRE_GPT2();
  EXPECT_EQ(encode(tok, "I'm can't we'll they've you're he'd it's"),
            (Ids{40, 1101, 460, 470, 356, 1183, 484, 1053, 345, 821, 339, 1549, 340, 338}));
  // Upper-case contractions are not special in GPT-2: "'" then the letters.
  EXPECT_EQ(encode(tok, "'S 'sup"), (Ids{6, 50, 705, 37330}));
  EXPECT_EQ(encode(tok, "you'RE"), (Ids{5832, 6, 2200}));
}

TEST(Gpt2Tokenizer, Numbers) {
  REQUIRE_GPT2();
  EXPECT_EQ(encode(tok, "12345 67 3.14159"), (Ids{10163, 2231, 8275, 513, 13, 1415, 19707}));
  EXPECT_EQ(encode(tok, "x\xc2\xb2\xc2\xbd \xe2\x85\xab"),  // "x²½ Ⅻ"
            (Ids{87, 31185, 23141, 2343, 227, 104}));
}

TEST(Gpt2Tokenizer, Whitespace) {
  REQUIRE_GPT2();
  EXPECT_EQ(encode(tok, "a   b"), (Ids{64, 220, 220, 275}));
  EXPECT_EQ(encode(tok, "a \n\n  b  "), (Ids{64, 220, 628, 220, 275, 220, 220}));
  EXPECT_EQ(encode(tok, "line1\nline2\n\n"), (Ids{1370, 16, 198, 1370, 17, 628}));
  EXPECT_EQ(encode(tok, "  \n  x"), (Ids{220, 220, 198, 220, 2124}));
  EXPECT_EQ(encode(tok, "\t\tTab"), (Ids{197, 197, 33349}));
  EXPECT_EQ(encode(tok, "trailing   "), (Ids{9535, 4386, 220, 220, 220}));
  EXPECT_EQ(encode(tok, "\xc2\xa0nbsp"), (Ids{1849, 77, 24145}));
}

TEST(Gpt2Tokenizer, NonAsciiUtf8) {
  REQUIRE_GPT2();
  EXPECT_EQ(encode(tok, "h\xc3\xa9llo w\xc3\xb6rld"),  // "héllo wörld"
            (Ids{71, 2634, 18798, 266, 30570, 335}));
  // "emoji 😀👍🏽!": the emoji and "!" form one punctuation piece, BPE splits its bytes.
  EXPECT_EQ(encode(tok, "emoji \xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd!"),
            (Ids{368, 31370, 30325, 222, 41840, 235, 8582, 237, 121, 0}));
  // "日本語テキスト"
  EXPECT_EQ(encode(tok, "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9"
                        "\xe3\x83\x88"),
            (Ids{33768, 98, 17312, 105, 45739, 252, 24336, 25084, 43302}));
  // "ﬁrst Ωmega ß"
  EXPECT_EQ(encode(tok, "\xef\xac\x81rst \xce\xa9mega \xc3\x9f"),
            (Ids{171, 105, 223, 81, 301, 7377, 102, 13731, 6184, 253}));
}

TEST(Gpt2Tokenizer, InvalidUtf8RoundTrips) {
  REQUIRE_GPT2();
  std::string s = "ok \xff\xfe\xc3 bad \xe2\x82 end\x80";
  EXPECT_EQ(decode(tok, encode(tok, s)), s);
}

TEST(Gpt2Tokenizer, DecodeRejectsBadIds) {
  REQUIRE_GPT2();
  std::string msg = error_of([&] { decode(tok, Ids{50257}); });
  EXPECT_NE(msg.find("cannot decode token id 50257"), std::string::npos) << msg;
}

TEST(Gpt2Tokenizer, MismatchedFilesAreErrors) {
  REQUIRE_GPT2();
  std::string d = shared_data_dir() + "/gpt2/";
  // Files swapped: vocab.bpe is not JSON.
  std::string msg = error_of([&] { load_gpt2_tokenizer(d + "vocab.bpe", d + "encoder.json"); });
  EXPECT_NE(msg.find("is not valid JSON"), std::string::npos) << msg;
}

TEST(Gpt2Tokenizer, TinyShakespeareRoundTrip) {
  REQUIRE_GPT2();
  std::string p = shared_data_dir() + "/tinyshakespeare/input.txt";
  if (!file_exists(p)) GTEST_SKIP() << "Tiny Shakespeare not found at " << p;
  std::string text = read_file(p);
  Tokenizer fresh = load_tokenizer("gpt2", shared_data_dir() + "/gpt2/encoder.json",
                                   shared_data_dir() + "/gpt2/vocab.bpe");  // empty cache
  auto t0 = std::chrono::steady_clock::now();
  Ids ids = encode(fresh, text);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[          ] Tiny Shakespeare: %zu bytes -> %zu GPT-2 tokens in %.3f s\n", text.size(),
              ids.size(), s);
  // 338,025 tokens with GPT-2's tokenizer (nanoGPT's prepare.py: 301,966 train + 36,059 val).
  EXPECT_EQ(ids.size(), 338025u);
  EXPECT_EQ(ids[0], 5962u);  // "First"
  EXPECT_EQ(decode(fresh, ids), text);
  // Encoding again (now from the cache) gives the same ids.
  EXPECT_EQ(encode(fresh, text), ids);
}
