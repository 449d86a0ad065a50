// llmpi-prep glue (src/data/glue.h): GLUE TSVs to classification files.
//
// Against transformers: the first RTE dev pairs tokenized by all-MiniLM-L6-v2's tokenizer equal
// tests/fixtures/hf_tokenizers/minilm_rte.json (recorded by tools/hf_fixtures/tokenizers.py; needs
// `make pretrained` and ../shared/data/glue/RTE, skipped with a message otherwise). The rest uses
// the small WordPiece fixture tokenizer on TSVs written here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "data/classification_file.h"
#include "data/glue.h"
#include "file_test_util.h"
#include "runtime/error.h"
#include "tokenizer/tokenizer.h"

using namespace llmpi;
using llmpi::test::error_of;
using llmpi::test::TempDirTest;
namespace fs = std::filesystem;

namespace {

std::string find_first(std::initializer_list<const char*> candidates) {
  for (const char* c : candidates)
    if (fs::exists(c)) return c;
  return "";
}

std::string small_tokenizer_json() {
  return find_first({"tests/fixtures/hf_tokenizers/wordpiece_small/tokenizer.json",
                     "../tests/fixtures/hf_tokenizers/wordpiece_small/tokenizer.json"});
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<uint32_t> ids_of(const Tokenizer& tok, const std::string& s) {
  return encode(tok, s, /*allow_special=*/true);
}

struct GlueSmall : TempDirTest {
  Tokenizer tok;
  int64_t pad = -1;
  uint32_t cls = 0, sep = 0;
  void SetUp() override {
    TempDirTest::SetUp();
    const std::string path = small_tokenizer_json();
    ASSERT_FALSE(path.empty()) << "tests/fixtures/hf_tokenizers/wordpiece_small/tokenizer.json not found";
    tok = load_tokenizer("hf:" + path);
    pad = glue_pad_id(tok);
    cls = ids_of(tok, "[CLS]").at(0);
    sep = ids_of(tok, "[SEP]").at(0);
  }
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(path(name), std::ios::binary) << text;
    return path(name);
  }
  // Row i of ex without its padding, after checking that the padding is pad / type 0 / mask 0.
  std::vector<uint32_t> row(const ClassificationExamples& ex, int64_t i, std::vector<uint32_t>* types = nullptr) {
    std::vector<uint32_t> ids;
    const size_t L = size_t(ex.seq_len);
    size_t n = 0;
    while (n < L && ex.attention_mask[size_t(i) * L + n] == 1) n++;
    for (size_t k = 0; k < L; k++) {
      const size_t j = size_t(i) * L + k;
      if (k < n) {
        ids.push_back(uint32_t(ex.input_ids[j]));
        if (types) types->push_back(uint32_t(ex.token_type_ids[j]));
      } else {
        EXPECT_EQ(ex.attention_mask[j], 0) << "example " << i << " position " << k;
        EXPECT_EQ(ex.input_ids[j], pad) << "example " << i << " position " << k;
        EXPECT_EQ(ex.token_type_ids[j], 0) << "example " << i << " position " << k;
      }
    }
    return ids;
  }
  std::vector<uint32_t> pair(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
    std::vector<uint32_t> v{cls};
    v.insert(v.end(), a.begin(), a.end());
    v.push_back(sep);
    v.insert(v.end(), b.begin(), b.end());
    v.push_back(sep);
    return v;
  }
};

}  // namespace

// ---- against transformers ----------------------------------------------------------------------

TEST(GlueMiniLM, FirstRteDevPairsEqualTransformers) {
  const char* env = std::getenv("LLMPI_PRETRAINED");
  std::string tok_json = env && *env ? std::string(env) + "/tokenizer.json"
                                     : find_first({"pretrained/all-MiniLM-L6-v2/tokenizer.json",
                                                   "../pretrained/all-MiniLM-L6-v2/tokenizer.json"});
  if (tok_json.empty() || !fs::exists(tok_json))
    GTEST_SKIP() << "pretrained/all-MiniLM-L6-v2/tokenizer.json not found: run `make pretrained`";
  const char* data_env = std::getenv("LLMPI_SHARED_DATA");
  const std::string rte = (data_env && *data_env ? std::string(data_env) : std::string("../shared/data")) +
                          "/glue/RTE/dev.tsv";
  if (!fs::exists(rte)) GTEST_SKIP() << rte << " not found (the shared GLUE data; set LLMPI_SHARED_DATA)";
  const std::string fx_path = find_first({"tests/fixtures/hf_tokenizers/minilm_rte.json",
                                          "../tests/fixtures/hf_tokenizers/minilm_rte.json"});
  ASSERT_FALSE(fx_path.empty()) << "tests/fixtures/hf_tokenizers/minilm_rte.json not found";
  const nlohmann::json fx = nlohmann::json::parse(read_all(fx_path));

  Tokenizer tok = load_tokenizer("hf:" + tok_json);
  const int64_t pad = glue_pad_id(tok);
  EXPECT_EQ(pad, 0);  // [PAD] of the BERT uncased vocabulary
  const int L = 128;
  ClassificationExamples ex = glue_examples(find_glue_task("rte"), rte, read_all(rte), tok, L, pad);
  EXPECT_EQ(ex.size(), 277);
  ASSERT_GE(ex.size(), int64_t(fx["pairs"].size()));
  // The fixture was recorded without truncation or padding (tok(s1, s2)). A pair shorter than L
  // is our row followed by padding; a longer one (pair 2 has 164 ids) is cut as transformers'
  // truncation=True does: with room R = L - 3 for the sentences, a sentence of at most R / 2 ids
  // stays whole and the other gets the rest, else the first keeps ceil(R / 2), the second floor.
  int longer = 0;
  for (size_t i = 0; i < fx["pairs"].size(); i++) {
    const nlohmann::json& p = fx["pairs"][i];
    std::vector<int32_t> full_ids = p["input_ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> full_types = p["token_type_ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> want_ids = full_ids, want_types = full_types;
    if (full_ids.size() > size_t(L)) {
      longer++;
      size_t na = 0;  // [CLS] a [SEP] have type 0
      while (full_types[na] == 0) na++;
      na -= 2;
      const size_t nb = full_ids.size() - na - 3, R = size_t(L) - 3;
      size_t ka, kb;
      if (std::min(na, nb) <= R / 2) {
        ka = na <= nb ? na : R - nb;
        kb = R - ka;
      } else {
        ka = (R + 1) / 2;
        kb = R / 2;
      }
      want_ids.assign(full_ids.begin(), full_ids.begin() + long(1 + ka));
      want_ids.push_back(full_ids[1 + na]);  // [SEP]
      want_ids.insert(want_ids.end(), full_ids.begin() + long(2 + na), full_ids.begin() + long(2 + na + kb));
      want_ids.push_back(full_ids.back());
      want_types.assign(2 + ka, 0);
      want_types.resize(size_t(L), 1);
    }
    const int32_t* ids = &ex.input_ids[i * L];
    const int32_t* types = &ex.token_type_ids[i * L];
    const int32_t* mask = &ex.attention_mask[i * L];
    for (size_t k = 0; k < size_t(L); k++) {
      if (k < want_ids.size()) {
        ASSERT_EQ(ids[k], want_ids[k]) << "pair " << i << " position " << k;
        ASSERT_EQ(types[k], want_types[k]) << "pair " << i << " position " << k;
        ASSERT_EQ(mask[k], 1) << "pair " << i << " position " << k;
      } else {
        ASSERT_EQ(ids[k], pad) << "pair " << i << " position " << k;
        ASSERT_EQ(types[k], 0) << "pair " << i << " position " << k;
        ASSERT_EQ(mask[k], 0) << "pair " << i << " position " << k;
      }
    }
  }
  EXPECT_GE(longer, 1);  // the truncation path was exercised
  EXPECT_EQ(ex.labels[0], 1);  // not_entailment
  EXPECT_EQ(ex.labels[1], 0);  // entailment
}

// ---- the small WordPiece fixture tokenizer -----------------------------------------------------

TEST(GlueTruncation, LongestFirstRemovesFromTheLongerAndFromTheSecondOnATie) {
  auto lens = [](size_t na, size_t nb, size_t max) {
    std::vector<uint32_t> a(na), b(nb);
    for (size_t i = 0; i < na; i++) a[i] = uint32_t(i);
    for (size_t i = 0; i < nb; i++) b[i] = uint32_t(100 + i);
    truncate_longest_first(a, b, max);
    for (size_t i = 0; i < a.size(); i++) EXPECT_EQ(a[i], i);  // the end is what goes
    for (size_t i = 0; i < b.size(); i++) EXPECT_EQ(b[i], 100 + i);
    return std::make_pair(a.size(), b.size());
  };
  EXPECT_EQ(lens(10, 3, 8), std::make_pair(size_t(5), size_t(3)));   // the shorter fits: kept whole
  EXPECT_EQ(lens(3, 10, 8), std::make_pair(size_t(3), size_t(5)));
  EXPECT_EQ(lens(10, 10, 7), std::make_pair(size_t(4), size_t(3)));  // tie: the second loses first
  EXPECT_EQ(lens(10, 9, 6), std::make_pair(size_t(3), size_t(3)));
  EXPECT_EQ(lens(9, 10, 7), std::make_pair(size_t(4), size_t(3)));
  EXPECT_EQ(lens(2, 3, 8), std::make_pair(size_t(2), size_t(3)));    // short enough: untouched
  EXPECT_EQ(lens(5, 0, 3), std::make_pair(size_t(3), size_t(0)));
}

TEST_F(GlueSmall, QuotesAreOrdinaryCharactersAndFieldsSplitOnTabsOnly) {
  // A csv reader would join lines 2-3 (an open quote) and drop the quotes of line 4.
  const std::string f = write("train.tsv",
                              "index\tsentence1\tsentence2\tlabel\n"
                              "0\t\"The cat sat.\tIt sat\tentailment\n"
                              "1\tA dog.\t\"A dog.\"\tnot_entailment\r\n"
                              "2\tx \"y\" z\t'q'\tentailment\n");
  ClassificationExamples ex = glue_examples(find_glue_task("rte"), f, read_all(f), tok, 32, pad);
  ASSERT_EQ(ex.size(), 3);
  std::vector<uint32_t> types;
  EXPECT_EQ(row(ex, 0, &types), pair(ids_of(tok, "\"The cat sat."), ids_of(tok, "It sat")));
  const size_t na = ids_of(tok, "\"The cat sat.").size();
  for (size_t k = 0; k < types.size(); k++) EXPECT_EQ(types[k], k <= na + 1 ? 0u : 1u) << k;
  EXPECT_EQ(ids_of(tok, "\"The cat sat.").at(0), ids_of(tok, "\"").at(0));  // the quote is a token
  EXPECT_EQ(row(ex, 1), pair(ids_of(tok, "A dog."), ids_of(tok, "\"A dog.\"")));
  EXPECT_EQ(row(ex, 2), pair(ids_of(tok, "x \"y\" z"), ids_of(tok, "'q'")));
  EXPECT_EQ(ex.labels, (std::vector<int32_t>{0, 1, 0}));
}

TEST_F(GlueSmall, PairsAreTruncatedLongestFirstToMaxSeqLen) {
  const std::string s1 = "the cat sat on the mat and the dog sat on the log", s2 = "a cat";
  const std::string f = write("dev.tsv", "index\tsentence1\tsentence2\tlabel\n0\t" + s1 + "\t" + s2 +
                                             "\tentailment\n1\t" + s1 + "\t" + s1 + "\tentailment\n");
  std::vector<uint32_t> a = ids_of(tok, s1), b = ids_of(tok, s2);
  ASSERT_GT(a.size(), 8u);
  ASSERT_LE(b.size(), 3u);
  const int L = 12;  // 9 tokens for the sentences
  ClassificationExamples ex = glue_examples(find_glue_task("rte"), f, read_all(f), tok, L, pad);
  std::vector<uint32_t> a_cut(a.begin(), a.begin() + long(9 - b.size()));
  EXPECT_EQ(row(ex, 0), pair(a_cut, b));  // the short second sentence is kept whole
  std::vector<uint32_t> a5(a.begin(), a.begin() + 5), a4(a.begin(), a.begin() + 4);
  EXPECT_EQ(row(ex, 1), pair(a5, a4));  // equal lengths: the second gives up the odd token
  EXPECT_EQ(ex.attention_mask[size_t(L) - 1], 1);
}

TEST_F(GlueSmall, LabelsAndColumnsFollowEachTasksLayout) {
  // MRPC: label first ("0"/"1"), sentences in columns 3 and 4, a byte-order mark before the header.
  fs::create_directories(path("MRPC"));
  write("MRPC/train.tsv", "\xEF\xBB\xBFQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
                          "1\t11\t12\tThe cat.\tA cat.\n0\t13\t14\tThe dog.\tA log.\n");
  write("MRPC/dev.tsv", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n0\t1\t2\tX.\tY.\n");
  GluePrepOptions o;
  o.task = "MRPC";
  o.data_dir = path("MRPC");
  o.tokenizer = "hf:" + small_tokenizer_json();
  o.max_seq_len = 16;
  o.out = path("out");
  run_glue_prep(o);
  ClassificationReader r(path("out/train.h5"));
  EXPECT_EQ(r.n_examples(), 2);
  EXPECT_EQ(r.info().num_labels, 2);
  EXPECT_EQ(r.info().label_names, (std::vector<std::string>{"not_equivalent", "equivalent"}));
  EXPECT_EQ(r.info().pad_id, pad);
  EXPECT_EQ(r.info().seq_len, 16);
  EXPECT_EQ(r.info().created_by, "llmpi-prep glue");
  EXPECT_EQ(r.info().tokenizer, tok.description);
  ClassificationExamples ex;
  r.read({0, 1}, ex);
  EXPECT_EQ(ex.labels, (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(row(ex, 0), pair(ids_of(tok, "The cat."), ids_of(tok, "A cat.")));
  EXPECT_EQ(open_classification_file_info(path("out/dev.h5")).n_examples, 1);
  EXPECT_TRUE(fs::exists(path("out/manifest.json")));
  EXPECT_FALSE(fs::exists(path("out/train.h5.new")));

  // CoLA: no header, one sentence (column 3), label in column 1.
  const std::string f = write("cola.tsv", "gj04\t1\t\tThe cat sat.\ngj04\t0\t*\tCat the sat.\n");
  ClassificationExamples c = glue_examples(find_glue_task("cola"), f, read_all(f), tok, 10, pad);
  EXPECT_EQ(c.labels, (std::vector<int32_t>{1, 0}));
  std::vector<uint32_t> types, single{cls};
  for (uint32_t id : ids_of(tok, "Cat the sat.")) single.push_back(id);
  single.push_back(sep);
  EXPECT_EQ(row(c, 1, &types), single);
  for (uint32_t t : types) EXPECT_EQ(t, 0u);

  // SST-2: sentence then label.
  const std::string s = write("sst.tsv", "sentence\tlabel\nit 's good \t1\n");
  EXPECT_EQ(glue_examples(find_glue_task("sst-2"), s, read_all(s), tok, 10, pad).labels,
            (std::vector<int32_t>{1}));
}

TEST_F(GlueSmall, EachErrorNamesTheFileAndLine) {
  const GlueTask& rte = find_glue_task("rte");
  EXPECT_NE(error_of([] { find_glue_task("mnli-mm"); })
                .find("unknown GLUE task 'mnli-mm'; known tasks: rte, mrpc, sst-2, qnli, cola"),
            std::string::npos);
  const std::string header = "index\tsentence1\tsentence2\tlabel\n";
  auto err = [&](const std::string& name, const std::string& text, const GlueTask& t) {
    const std::string f = write(name, text);
    return error_of([&] { glue_examples(t, f, read_all(f), tok, 32, pad); });
  };
  std::string e = err("missing.tsv", header + "0\ta\tb\tentailment\n1\ta\tentailment\n", rte);
  EXPECT_NE(e.find(path("missing.tsv") + ":3: 3 tab-separated columns, but a GLUE rte line has 4 (a missing column)"),
            std::string::npos) << e;
  e = err("label.tsv", header + "0\ta\tb\tentailment\n1\ta\tb\tcontradiction\n", rte);
  EXPECT_NE(e.find(path("label.tsv") + ":3: unknown label 'contradiction'; GLUE rte's labels are entailment, not_entailment"),
            std::string::npos) << e;
  e = err("nottsv.tsv", "index,sentence1,sentence2,label\n0,a,b,entailment\n", rte);
  EXPECT_NE(e.find(path("nottsv.tsv") + ":1: not a GLUE rte TSV: the header is 'index,sentence1,sentence2,label'"),
            std::string::npos) << e;
  e = err("extra.tsv", header + "0\ta\tb\tc\tentailment\n", rte);
  EXPECT_NE(e.find(path("extra.tsv") + ":2: 5 tab-separated columns"), std::string::npos) << e;
  e = err("cola.tsv", "gj04\t1\tThe cat sat.\n", find_glue_task("cola"));
  EXPECT_NE(e.find(path("cola.tsv") + ":1: 3 tab-separated columns, but a GLUE cola line has 4"), std::string::npos) << e;
  e = err("empty.tsv", header, rte);
  EXPECT_NE(e.find("no examples"), std::string::npos) << e;
  e = err("short.tsv", header + "0\ta\tb\tentailment\n", rte);
  EXPECT_EQ(e, "(no error)");
  const std::string f = write("ok.tsv", header + "0\ta\tb\tentailment\n");
  e = error_of([&] { glue_examples(rte, f, read_all(f), tok, 4, pad); });
  EXPECT_NE(e.find("--max-seq-len 4 leaves no room"), std::string::npos) << e;

  // run_glue_prep: a bad dev.tsv fails before anything is written.
  fs::create_directories(path("RTE"));
  write("RTE/train.tsv", header + "0\ta\tb\tentailment\n");
  write("RTE/dev.tsv", header + "0\ta\tb\tmaybe\n");
  GluePrepOptions o;
  o.task = "rte";
  o.data_dir = path("RTE");
  o.tokenizer = "hf:" + small_tokenizer_json();
  o.out = path("out");
  e = error_of([&] { run_glue_prep(o); });
  EXPECT_NE(e.find(path("RTE/dev.tsv") + ":2: unknown label 'maybe'"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(path("out")));
  o.tokenizer = "byte";
  e = error_of([&] { run_glue_prep(o); });
  EXPECT_NE(e.find("needs --tokenizer hf:PATH/tokenizer.json or wordpiece:PATH/vocab.txt"), std::string::npos) << e;
}

// BERT's plain uncased vocab.txt (wordpiece: --lowercase) gives all-MiniLM-L6-v2's ids on RTE dev.
TEST(GlueMiniLM, WordpieceVocabTxtGivesTheSameRteExamples) {
  const std::string tok_json = find_first({"pretrained/all-MiniLM-L6-v2/tokenizer.json",
                                           "../pretrained/all-MiniLM-L6-v2/tokenizer.json"});
  if (tok_json.empty()) GTEST_SKIP() << "pretrained/all-MiniLM-L6-v2/tokenizer.json not found: run `make pretrained`";
  const char* data_env = std::getenv("LLMPI_SHARED_DATA");
  const std::string data = data_env && *data_env ? std::string(data_env) : std::string("../shared/data");
  const std::string rte = data + "/glue/RTE/dev.tsv", vocab = data + "/bert/uncased/vocab.txt";
  if (!fs::exists(rte) || !fs::exists(vocab))
    GTEST_SKIP() << rte << " or " << vocab << " not found (the shared data; set LLMPI_SHARED_DATA)";
  Tokenizer hf = load_tokenizer("hf:" + tok_json);
  Tokenizer wp = load_tokenizer("wordpiece:" + vocab, "", "", /*lowercase=*/true);
  const std::string text = read_all(rte);
  ClassificationExamples a = glue_examples(find_glue_task("rte"), rte, text, hf, 128, glue_pad_id(hf));
  ClassificationExamples b = glue_examples(find_glue_task("rte"), rte, text, wp, 128, glue_pad_id(wp));
  EXPECT_EQ(a.input_ids, b.input_ids);
  EXPECT_EQ(a.token_type_ids, b.token_type_ids);
  EXPECT_EQ(a.attention_mask, b.attention_mask);
  EXPECT_EQ(a.labels, b.labels);
}
