// HDF5 classification file tests: round trips of random examples read back as arbitrary index
// subsets, attributes, atomic writes, the format probe, the error message for each kind of bad file
// or bad value, and a regression that pins the on-disk layout (a file made with the plain HDF5 API,
// as h5py would make it, reads back; our writer's types are the documented ones).
#include <gtest/gtest.h>
#include <hdf5.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "data/classification_file.h"
#include "data/token_file.h"
#include "file_test_util.h"
#include "runtime/error.h"

using namespace llmpi;

namespace {

using ClassificationFileTest = test::TempDirTest;
using test::error_of;

// n examples of seq_len tokens shaped like real ones: [CLS] a [SEP] b [SEP] then padding, with a
// random length, segment split and label.
ClassificationExamples random_examples(int64_t n, int seq_len, int32_t vocab, int num_labels,
                                       unsigned seed, int32_t pad_id = 0) {
  std::mt19937 rng(seed);
  ClassificationExamples ex;
  ex.seq_len = seq_len;
  for (int64_t i = 0; i < n; i++) {
    const int len = 1 + int(rng() % unsigned(seq_len));
    const int split = int(rng() % unsigned(len + 1));
    for (int p = 0; p < seq_len; p++) {
      const bool real = p < len;
      ex.input_ids.push_back(real ? int32_t(rng() % uint32_t(vocab)) : pad_id);
      ex.token_type_ids.push_back(real && p >= split ? 1 : 0);
      ex.attention_mask.push_back(real ? 1 : 0);
    }
    ex.labels.push_back(int32_t(rng() % unsigned(num_labels)));
  }
  return ex;
}

ClassificationAttrs attrs(int64_t vocab, int num_labels) {
  ClassificationAttrs a;
  a.vocab_size = vocab;
  a.num_labels = num_labels;
  for (int k = 0; k < num_labels; k++) a.label_names.push_back("label_" + std::to_string(k));
  a.pad_id = 0;
  a.tokenizer = "wordpiece:test";
  a.created_by = "llmpi-tests";
  return a;
}

// Example i of ex, as a one-example ClassificationExamples, for comparisons.
void expect_example_eq(const ClassificationExamples& got, size_t k, const ClassificationExamples& want,
                       int64_t i) {
  const size_t L = size_t(want.seq_len);
  ASSERT_EQ(got.seq_len, want.seq_len);
  for (size_t p = 0; p < L; p++) {
    ASSERT_EQ(got.input_ids[k * L + p], want.input_ids[i * L + p]) << "example " << i << " pos " << p;
    ASSERT_EQ(got.token_type_ids[k * L + p], want.token_type_ids[i * L + p]) << "example " << i;
    ASSERT_EQ(got.attention_mask[k * L + p], want.attention_mask[i * L + p]) << "example " << i;
  }
  ASSERT_EQ(got.labels[k], want.labels[i]) << "example " << i;
}

void expect_read_matches(ClassificationReader& r, const std::vector<int64_t>& indices,
                         const ClassificationExamples& want) {
  ClassificationExamples got;
  got.input_ids.assign(3, -9);  // stale contents are replaced
  r.read(indices, got);
  const size_t L = size_t(want.seq_len);
  ASSERT_EQ(got.labels.size(), indices.size());
  ASSERT_EQ(got.input_ids.size(), indices.size() * L);
  ASSERT_EQ(got.token_type_ids.size(), indices.size() * L);
  ASSERT_EQ(got.attention_mask.size(), indices.size() * L);
  for (size_t k = 0; k < indices.size(); k++) expect_example_eq(got, k, want, indices[k]);
}

// ---- helpers that damage a good file in one specific way ----

void with_file(const std::string& p, const std::function<void(hid_t)>& f) {
  hid_t file = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  f(file);
  H5Fclose(file);
}

void set_int_attr(const std::string& p, const char* name, int64_t v) {
  with_file(p, [&](hid_t file) {
    if (H5Aexists(file, name) > 0) H5Adelete(file, name);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(file, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(attr, H5T_NATIVE_INT64, &v);
    H5Aclose(attr);
    H5Sclose(space);
  });
}

// Fixed-length strings (as h5py writes numpy byte strings); one value, or a 1-D array of them.
void set_fixed_string_attr(hid_t file, const char* name, const std::vector<std::string>& v, bool array) {
  if (H5Aexists(file, name) > 0) H5Adelete(file, name);
  size_t width = 1;
  for (const auto& s : v) width = std::max(width, s.size());
  std::string buf(width * v.size(), '\0');
  for (size_t i = 0; i < v.size(); i++) buf.replace(i * width, v[i].size(), v[i]);
  hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, width);
  H5Tset_strpad(type, H5T_STR_NULLPAD);
  hsize_t n = v.size();
  hid_t space = array ? H5Screate_simple(1, &n, nullptr) : H5Screate(H5S_SCALAR);
  hid_t attr = H5Acreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(attr, type, buf.data());
  H5Aclose(attr);
  H5Sclose(space);
  H5Tclose(type);
}

void set_fixed_string_attr(const std::string& p, const char* name, const std::string& v) {
  with_file(p, [&](hid_t file) { set_fixed_string_attr(file, name, {v}, false); });
}

void delete_attr(const std::string& p, const char* name) {
  with_file(p, [&](hid_t file) { H5Adelete(file, name); });
}

// Replace a dataset with an empty one of the given type and shape (rank 0: just delete it).
void replace_dataset(const std::string& p, const char* name, hid_t type, std::vector<hsize_t> dims) {
  with_file(p, [&](hid_t file) {
    H5Ldelete(file, name, H5P_DEFAULT);
    if (dims.empty()) return;
    hid_t space = H5Screate_simple(int(dims.size()), dims.data(), nullptr);
    hid_t d = H5Dcreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dclose(d);
    H5Sclose(space);
  });
}

// Overwrite one value of a dataset (rank 1: col is ignored).
void poke(const std::string& p, const char* name, hsize_t row, hsize_t col, int32_t v) {
  with_file(p, [&](hid_t file) {
    hid_t d = H5Dopen2(file, name, H5P_DEFAULT);
    hid_t fs = H5Dget_space(d);
    const int rank = H5Sget_simple_extent_ndims(fs);
    hsize_t start[2] = {row, col}, count[2] = {1, 1};
    H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, nullptr, count, nullptr);
    hid_t ms = H5Screate_simple(rank, count, nullptr);
    EXPECT_GE(H5Dwrite(d, H5T_NATIVE_INT32, ms, fs, H5P_DEFAULT, &v), 0);
    H5Sclose(ms);
    H5Sclose(fs);
    H5Dclose(d);
  });
}

}  // namespace

// ---- round trips -----------------------------------------------------------------------------

TEST_F(ClassificationFileTest, RoundTripRandomSubsets) {
  std::string p = path("train.h5");
  const int64_t N = 500;
  const int L = 37;
  ClassificationExamples ex = random_examples(N, L, 30522, 3, 1);
  ClassificationAttrs a = attrs(30522, 3);
  a.label_names = {"entailment", "neutral", "contradiction"};
  a.pad_id = 0;
  write_classification_file(p, ex, a);
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp"));

  ClassificationReader r(p);
  const ClassificationInfo& info = r.info();
  EXPECT_EQ(info.path, p);
  EXPECT_EQ(info.version, 1);
  EXPECT_EQ(info.n_examples, N);
  EXPECT_EQ(r.n_examples(), N);
  EXPECT_EQ(info.seq_len, L);
  EXPECT_EQ(info.vocab_size, 30522);
  EXPECT_EQ(info.num_labels, 3);
  EXPECT_EQ(info.label_names, (std::vector<std::string>{"entailment", "neutral", "contradiction"}));
  EXPECT_EQ(info.pad_id, 0);
  EXPECT_EQ(info.tokenizer, "wordpiece:test");
  EXPECT_EQ(info.created_by, "llmpi-tests");

  // Everything in order, then random batches like a sampler's: any order, any size in 1..64,
  // repeats allowed.
  std::vector<int64_t> all(N);
  for (int64_t i = 0; i < N; i++) all[i] = i;
  expect_read_matches(r, all, ex);
  std::mt19937 rng(7);
  for (int step = 0; step < 200; step++) {
    std::vector<int64_t> batch(1 + rng() % 64);
    for (auto& i : batch) i = int64_t(rng() % N);
    expect_read_matches(r, batch, ex);
  }
  // Runs of consecutive rows (merged into one block), unsorted, with repeats and both ends.
  expect_read_matches(r, {5, 6, 7, 100, 6, 0, 499, 498, 8, 5}, ex);
  expect_read_matches(r, {N - 1}, ex);

  ClassificationExamples none;
  r.read({}, none);
  EXPECT_EQ(none.seq_len, L);
  EXPECT_TRUE(none.labels.empty());
  EXPECT_TRUE(none.input_ids.empty());
}

TEST_F(ClassificationFileTest, RoundTripLargeVocabAndExtremeValues) {
  std::string p = path("t.h5");
  ClassificationExamples ex = random_examples(40, 8, 250000, 7, 2, 1);
  ex.input_ids[0] = 249999;  // the largest id, beyond uint16
  ex.input_ids[1] = 0;
  ex.labels[3] = 6;
  ClassificationAttrs a = attrs(250000, 7);
  a.pad_id = 1;
  write_classification_file(p, ex, a);
  ClassificationReader r(p);
  EXPECT_EQ(r.info().pad_id, 1);
  expect_read_matches(r, {39, 0, 3, 3, 20}, ex);
}

TEST_F(ClassificationFileTest, EmptyFile) {
  std::string p = path("empty.h5");
  ClassificationExamples ex;
  ex.seq_len = 16;
  write_classification_file(p, ex, attrs(100, 2));
  ClassificationReader r(p);
  EXPECT_EQ(r.n_examples(), 0);
  EXPECT_EQ(r.info().seq_len, 16);
  ClassificationExamples got;
  r.read({}, got);
  EXPECT_TRUE(got.labels.empty());
  EXPECT_ERROR_HAS(r.read({0}, got), "it has 0 examples");
}

TEST_F(ClassificationFileTest, OverwriteReplacesWholeFile) {
  std::string p = path("t.h5");
  write_classification_file(p, random_examples(100, 12, 1000, 2, 3), attrs(1000, 2));
  ClassificationExamples small = random_examples(3, 5, 50, 4, 4);
  write_classification_file(p, small, attrs(50, 4));
  ClassificationReader r(p);
  EXPECT_EQ(r.n_examples(), 3);
  EXPECT_EQ(r.info().seq_len, 5);
  EXPECT_EQ(r.info().num_labels, 4);
  expect_read_matches(r, {2, 1, 0}, small);
}

TEST_F(ClassificationFileTest, ReaderReopensAndCloses) {
  ClassificationExamples a = random_examples(10, 4, 100, 2, 5), b = random_examples(6, 9, 100, 2, 6);
  write_classification_file(path("a.h5"), a, attrs(100, 2));
  write_classification_file(path("b.h5"), b, attrs(100, 2));
  ClassificationReader r(path("a.h5"));
  r.open(path("b.h5"));
  EXPECT_EQ(r.n_examples(), 6);
  expect_read_matches(r, {5, 0}, b);
  ClassificationReader moved = std::move(r);
  expect_read_matches(moved, {1}, b);
  moved.close();
  EXPECT_FALSE(moved.is_open());
  ClassificationExamples got;
  EXPECT_ERROR_HAS(moved.read({0}, got), "before open()");
  EXPECT_EQ(open_classification_file_info(path("a.h5")).seq_len, 4);
}

TEST_F(ClassificationFileTest, FormatProbe) {
  write_classification_file(path("c.h5"), random_examples(2, 3, 10, 2, 7), attrs(10, 2));
  TokenFileAttrs ta;
  ta.vocab_size = 257;
  ta.eot_id = 256;
  ta.tokenizer = "byte";
  write_token_file(path("lm.h5"), {1, 2, 3}, ta);
  std::ofstream(path("text.h5")) << "not HDF5\n";
  EXPECT_EQ(hdf5_format_of(path("c.h5")), "llmpi-classification");
  EXPECT_EQ(hdf5_format_of(path("lm.h5")), "llmpi-tokens");
  EXPECT_EQ(hdf5_format_of(path("text.h5")), "");
  EXPECT_EQ(hdf5_format_of(path("missing.h5")), "");
  EXPECT_EQ(hdf5_format_of(dir), "");
  delete_attr(path("c.h5"), "format");
  EXPECT_EQ(hdf5_format_of(path("c.h5")), "");
  set_int_attr(path("c.h5"), "format", 3);  // present but not a string
  EXPECT_EQ(hdf5_format_of(path("c.h5")), "");
}

// ---- writer errors ---------------------------------------------------------------------------

TEST_F(ClassificationFileTest, WriteRejectsBadValuesAndLeavesNothing) {
  std::string p = path("bad.h5");
  const auto expect_rejected = [&](const ClassificationExamples& ex, const ClassificationAttrs& a,
                                   const std::string& text) {
    std::string msg = error_of([&] { write_classification_file(p, ex, a); });
    EXPECT_NE(msg.find("cannot write classification file '" + p + "': "), std::string::npos) << msg;
    EXPECT_NE(msg.find(text), std::string::npos) << msg;
    EXPECT_FALSE(std::filesystem::exists(p)) << text;
    EXPECT_FALSE(std::filesystem::exists(p + ".tmp")) << text;
  };
  const ClassificationExamples good = random_examples(10, 6, 100, 3, 8);
  const ClassificationAttrs a = attrs(100, 3);

  ClassificationExamples ex = good;
  ex.labels[4] = 3;
  expect_rejected(ex, a, "example 4 has label 3, which is not in 0..2 (num_labels 3)");
  ex.labels[4] = -1;
  expect_rejected(ex, a, "example 4 has label -1");

  ex = good;
  ex.input_ids[2 * 6 + 5] = 100;
  expect_rejected(ex, a, "example 2 has token id 100 at position 5, which is not in 0..99 (vocab_size 100); "
                         "the examples and the tokenizer do not match");
  ex.input_ids[2 * 6 + 5] = -3;
  expect_rejected(ex, a, "example 2 has token id -3 at position 5");

  ex = good;
  ex.token_type_ids[7 * 6 + 1] = 2;
  expect_rejected(ex, a, "example 7 has token_type_ids value 2 at position 1, but token types must be 0");
  ex = good;
  ex.attention_mask[9 * 6] = 5;
  expect_rejected(ex, a, "example 9 has attention_mask value 5 at position 0, but the mask must be 1 "
                         "(real token) or 0 (padding)");

  // Sizes that do not line up.
  ex = good;
  ex.input_ids.pop_back();
  expect_rejected(ex, a, "input_ids holds 59 values, but 10 examples (the size of labels) of seq_len 6 "
                         "need 60");
  ex = good;
  ex.attention_mask.push_back(1);
  expect_rejected(ex, a, "attention_mask holds 61 values");
  ex = good;
  ex.labels.pop_back();
  expect_rejected(ex, a, "input_ids holds 60 values, but 9 examples");
  ex = good;
  ex.seq_len = 0;
  expect_rejected(ex, a, "seq_len 0 must be at least 1");

  // Attributes.
  ClassificationAttrs b = a;
  b.label_names.pop_back();
  expect_rejected(good, b, "there are 2 label_names for num_labels 3; give one name per label");
  b = a;
  b.pad_id = 100;
  expect_rejected(good, b, "pad_id 100 is not below vocab_size 100");
  b = a;
  b.vocab_size = 0;
  expect_rejected(good, b, "vocab_size 0 must be in 1..2147483647");
  b = a;
  b.num_labels = 0;
  b.label_names.clear();
  expect_rejected(good, b, "num_labels 0 must be at least 1");
}

TEST_F(ClassificationFileTest, FailedWriteKeepsOldFile) {
  std::string p = path("t.h5");
  ClassificationExamples good = random_examples(5, 4, 100, 2, 9);
  write_classification_file(p, good, attrs(100, 2));
  ClassificationExamples bad = good;
  bad.labels[0] = 2;
  EXPECT_ERROR_HAS(write_classification_file(p, bad, attrs(100, 2)), "example 0 has label 2");
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp"));
  ClassificationReader r(p);
  expect_read_matches(r, {0, 4}, good);
}

TEST_F(ClassificationFileTest, AtomicWriteLeavesNoTmpOnFailure) {
  // The .tmp cannot be created.
  std::string p = path("no/such/dir/t.h5");
  ClassificationExamples ex = random_examples(5, 4, 100, 2, 10);
  EXPECT_ERROR_HAS(write_classification_file(p, ex, attrs(100, 2)), "check that its directory exists");
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp"));

  // The .tmp is written completely, but the rename fails (the target is a non-empty directory):
  // the .tmp is removed and the directory is untouched.
  std::string target = path("out.h5");
  std::filesystem::create_directory(target);
  std::ofstream(target + "/keep") << "x";
  EXPECT_ERROR_HAS(write_classification_file(target, ex, attrs(100, 2)),
                   "cannot rename '" + target + ".tmp' to '" + target + "'");
  EXPECT_FALSE(std::filesystem::exists(target + ".tmp"));
  EXPECT_TRUE(std::filesystem::exists(target + "/keep"));
}

// ---- reader errors ---------------------------------------------------------------------------

TEST_F(ClassificationFileTest, MissingFileOrDirectory) {
  EXPECT_ERROR_HAS(open_classification_file_info(path("nope.h5")),
                   "classification file '" + path("nope.h5") +
                       "' does not exist; check the path, or make it with `llmpi-prep glue`");
  EXPECT_ERROR_HAS(open_classification_file_info(dir), "is a directory");
}

TEST_F(ClassificationFileTest, NotHdf5) {
  std::string p = path("text.h5");
  std::ofstream(p) << "sentence1\tsentence2\tlabel\n";
  EXPECT_ERROR_HAS(open_classification_file_info(p),
                   "'" + p + "' is not an HDF5 file, so not an llmpi classification file; make one "
                             "with `llmpi-prep glue`");
  std::ofstream(path("empty")) << "";
  EXPECT_ERROR_HAS(open_classification_file_info(path("empty")), "is not an HDF5 file");
}

TEST_F(ClassificationFileTest, LanguageModellingTokenFileGiven) {
  std::string p = path("lm.h5");
  TokenFileAttrs ta;
  ta.vocab_size = 257;
  ta.eot_id = 256;
  ta.tokenizer = "byte";
  write_token_file(p, {1, 2, 3}, ta);
  EXPECT_ERROR_HAS(open_classification_file_info(p),
                   "'" + p + "' is a language-modelling token file (format 'llmpi-tokens'), not a "
                             "classification file (format 'llmpi-classification'); make one from a "
                             "GLUE-style task with `llmpi-prep glue`");
  // And the other way round: the token reader refuses a classification file, and the probe lets a
  // program say which kind it got.
  std::string c = path("c.h5");
  write_classification_file(c, random_examples(2, 3, 10, 2, 11), attrs(10, 2));
  EXPECT_ERROR_HAS(open_token_file_info(c), "has format 'llmpi-classification', not 'llmpi-tokens'");
  EXPECT_EQ(hdf5_format_of(c), kClassificationFileFormat);
}

TEST_F(ClassificationFileTest, WrongOrMissingFormat) {
  std::string p = path("t.h5");
  write_classification_file(p, random_examples(2, 3, 10, 2, 12), attrs(10, 2));
  set_fixed_string_attr(p, "format", "something-else");
  EXPECT_ERROR_HAS(open_classification_file_info(p),
                   "has format 'something-else', not 'llmpi-classification': it is not an llmpi "
                   "classification file; make one with `llmpi-prep glue`");
  delete_attr(p, "format");
  EXPECT_ERROR_HAS(open_classification_file_info(p),
                   "has no 'format' attribute: it is an HDF5 file but not an llmpi classification file");
}

TEST_F(ClassificationFileTest, UnsupportedVersion) {
  std::string p = path("t.h5");
  write_classification_file(p, random_examples(2, 3, 10, 2, 13), attrs(10, 2));
  set_int_attr(p, "version", 2);
  EXPECT_ERROR_HAS(open_classification_file_info(p),
                   "classification file '" + p + "' has version 2, but this llmpi reads version 1; "
                                                 "remake it with this build's `llmpi-prep glue`");
}

TEST_F(ClassificationFileTest, BadOrMissingAttributes) {
  std::string p = path("t.h5");
  const auto fresh = [&] { write_classification_file(p, random_examples(4, 3, 10, 3, 14), attrs(10, 3)); };
  fresh();
  delete_attr(p, "num_labels");
  EXPECT_ERROR_HAS(open_classification_file_info(p), "has no 'num_labels' attribute");
  fresh();
  delete_attr(p, "vocab_size");
  EXPECT_ERROR_HAS(open_classification_file_info(p), "has no 'vocab_size' attribute");
  fresh();
  delete_attr(p, "pad_id");
  EXPECT_ERROR_HAS(open_classification_file_info(p), "has no 'pad_id' attribute");
  fresh();
  delete_attr(p, "tokenizer");
  EXPECT_ERROR_HAS(open_classification_file_info(p), "has no 'tokenizer' attribute");
  fresh();
  delete_attr(p, "created_by");  // optional
  EXPECT_EQ(open_classification_file_info(p).created_by, "");
  fresh();
  delete_attr(p, "label_names");
  EXPECT_ERROR_HAS(open_classification_file_info(p), "has no 'label_names' attribute");
  fresh();
  set_int_attr(p, "num_labels", 2);
  EXPECT_ERROR_HAS(open_classification_file_info(p), "has 3 label_names but num_labels 2");
  fresh();
  set_int_attr(p, "num_labels", 0);
  EXPECT_ERROR_HAS(open_classification_file_info(p), "has num_labels 0, outside 1..2147483647");
  fresh();
  set_int_attr(p, "pad_id", 10);
  EXPECT_ERROR_HAS(open_classification_file_info(p), "has pad_id 10, not below its vocab_size 10");
  fresh();
  set_fixed_string_attr(p, "label_names", "[\"a\", \"b\", \"c\"]");  // a scalar, not an array
  EXPECT_ERROR_HAS(open_classification_file_info(p),
                   "attribute 'label_names' must be a 1-D array of strings");
  fresh();
  set_int_attr(p, "vocab_size", -5);
  EXPECT_ERROR_HAS(open_classification_file_info(p), "has vocab_size -5, outside 1..2147483647");
}

TEST_F(ClassificationFileTest, WrongShapes) {
  std::string p = path("t.h5");
  const auto fresh = [&] { write_classification_file(p, random_examples(4, 3, 10, 2, 15), attrs(10, 2)); };
  fresh();
  replace_dataset(p, "token_type_ids", H5T_STD_U8LE, {4, 5});
  EXPECT_ERROR_HAS(open_classification_file_info(p),
                   "classification file '" + p + "': 'token_type_ids' has shape [4, 5], but 'input_ids' "
                                                 "has shape [4, 3]; input_ids, token_type_ids and "
                                                 "attention_mask must all be [N, L] and labels [N]");
  fresh();
  replace_dataset(p, "attention_mask", H5T_STD_U8LE, {5, 3});
  EXPECT_ERROR_HAS(open_classification_file_info(p), "'attention_mask' has shape [5, 3]");
  fresh();
  replace_dataset(p, "labels", H5T_STD_I32LE, {3});
  EXPECT_ERROR_HAS(open_classification_file_info(p), "'labels' has shape [3], but 'input_ids' has shape [4, 3]");
  fresh();
  replace_dataset(p, "labels", H5T_STD_I32LE, {4, 1});
  EXPECT_ERROR_HAS(open_classification_file_info(p), "'labels' has 2 dimensions, but must be 1-D [examples]");
  fresh();
  replace_dataset(p, "input_ids", H5T_STD_I32LE, {12});
  EXPECT_ERROR_HAS(open_classification_file_info(p),
                   "'input_ids' has 1 dimensions, but must be 2-D [examples, seq_len]");
  fresh();
  replace_dataset(p, "input_ids", H5T_STD_I32LE, {4, 0});
  EXPECT_ERROR_HAS(open_classification_file_info(p), "seq_len (the second dimension) must be in 1..");
  fresh();
  replace_dataset(p, "attention_mask", H5T_STD_U8LE, {});
  EXPECT_ERROR_HAS(open_classification_file_info(p),
                   "has no 'attention_mask' dataset; it is damaged or was not written by `llmpi-prep glue`");
}

TEST_F(ClassificationFileTest, WrongTypes) {
  std::string p = path("t.h5");
  const auto fresh = [&] { write_classification_file(p, random_examples(4, 3, 10, 2, 16), attrs(10, 2)); };
  fresh();
  replace_dataset(p, "input_ids", H5T_STD_I64LE, {4, 3});
  EXPECT_ERROR_HAS(open_classification_file_info(p), "'input_ids' must hold int32 values, but holds int64");
  fresh();
  replace_dataset(p, "input_ids", H5T_STD_U32LE, {4, 3});
  EXPECT_ERROR_HAS(open_classification_file_info(p), "'input_ids' must hold int32 values, but holds uint32");
  fresh();
  replace_dataset(p, "attention_mask", H5T_STD_I32LE, {4, 3});
  EXPECT_ERROR_HAS(open_classification_file_info(p), "'attention_mask' must hold uint8 values, but holds int32");
  fresh();
  replace_dataset(p, "token_type_ids", H5T_STD_I8LE, {4, 3});
  EXPECT_ERROR_HAS(open_classification_file_info(p), "'token_type_ids' must hold uint8 values, but holds int8");
  fresh();
  replace_dataset(p, "labels", H5T_IEEE_F32LE, {4});
  EXPECT_ERROR_HAS(open_classification_file_info(p), "'labels' must hold int32 values, but holds float32");
}

TEST_F(ClassificationFileTest, TruncatedFile) {
  std::string p = path("t.h5");
  write_classification_file(p, random_examples(2000, 64, 30522, 2, 17), attrs(30522, 2));
  std::filesystem::resize_file(p, std::filesystem::file_size(p) / 2);
  std::string msg = error_of([&] {
    ClassificationReader r(p);
    std::vector<int64_t> all(size_t(r.n_examples()));
    for (size_t i = 0; i < all.size(); i++) all[i] = int64_t(i);
    ClassificationExamples got;
    r.read(all, got);
  });
  EXPECT_NE(msg.find("damaged or truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'" + p + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("remake it with `llmpi-prep glue`"), std::string::npos) << msg;
}

TEST_F(ClassificationFileTest, OutOfRangeValuesInFile) {
  std::string p = path("t.h5");
  ClassificationExamples ex = random_examples(50, 8, 500, 3, 18);  // ids < 500, so 999 is only where poked
  const auto fresh = [&] { write_classification_file(p, ex, attrs(1000, 3)); };
  ClassificationExamples got;

  // A label beyond num_labels: the rows around it read fine, the row itself is an Error.
  fresh();
  poke(p, "labels", 30, 0, 3);
  {
    ClassificationReader r(p);
    expect_read_matches(r, {29, 31, 0}, ex);
    EXPECT_ERROR_HAS(r.read({31, 30, 2}, got),
                     "classification file '" + p + "': example 30 has label 3, which is not in 0..2 "
                                                   "(num_labels 3); the file is damaged or was not "
                                                   "made by `llmpi-prep glue`");
  }
  // A token id >= vocab_size (the file's vocab_size lowered below an id that is in it).
  fresh();
  poke(p, "input_ids", 12, 4, 999);
  set_int_attr(p, "vocab_size", 999);
  {
    ClassificationReader r(p);
    EXPECT_ERROR_HAS(r.read({12}, got),
                     "classification file '" + p + "': example 12 has token id 999 at position 4, which "
                                                   "is not in 0..998 (vocab_size 999): the file, its "
                                                   "tokenizer and the model's vocabulary do not match; "
                                                   "remake the file with `llmpi-prep glue` using the "
                                                   "model's tokenizer");
  }
  fresh();
  poke(p, "input_ids", 3, 0, -1);
  EXPECT_ERROR_HAS(ClassificationReader(p).read({3}, got), "example 3 has token id -1 at position 0");
  fresh();
  poke(p, "attention_mask", 44, 7, 2);
  EXPECT_ERROR_HAS(ClassificationReader(p).read({1, 44}, got),
                   "example 44 has attention_mask value 2 at position 7, but the mask must be 1");
  fresh();
  poke(p, "token_type_ids", 0, 2, 255);
  EXPECT_ERROR_HAS(ClassificationReader(p).read({0}, got),
                   "example 0 has token_type_ids value 255 at position 2");
}

TEST_F(ClassificationFileTest, IndexOutOfRange) {
  std::string p = path("t.h5");
  write_classification_file(p, random_examples(10, 4, 100, 2, 19), attrs(100, 2));
  ClassificationReader r(p);
  ClassificationExamples got;
  EXPECT_ERROR_HAS(r.read({3, 10}, got),
                   "cannot read example 10 from classification file '" + p + "': it has 10 examples "
                                                                             "(valid indices 0..9)");
  EXPECT_ERROR_HAS(r.read({-1}, got), "cannot read example -1");
}

TEST_F(ClassificationFileTest, FixedLengthStringAttributesAreAccepted) {
  std::string p = path("t.h5");
  ClassificationExamples ex = random_examples(3, 4, 10, 2, 20);
  write_classification_file(p, ex, attrs(10, 2));
  set_fixed_string_attr(p, "format", "llmpi-classification");
  set_fixed_string_attr(p, "tokenizer", "byte");
  with_file(p, [](hid_t f) { set_fixed_string_attr(f, "label_names", {"not_equivalent", "equivalent"}, true); });
  ClassificationInfo info = open_classification_file_info(p);
  EXPECT_EQ(info.tokenizer, "byte");
  EXPECT_EQ(info.label_names, (std::vector<std::string>{"not_equivalent", "equivalent"}));
}

// ---- regression: the on-disk layout ----------------------------------------------------------

// The layout is a contract with other tools (h5py scripts, other writers), not just with our own
// writer: a file made with the plain HDF5 API — chunked and deflate-compressed datasets, int64
// attributes, fixed-length strings, the way h5py writes numpy data — must read back; and the
// files our writer makes must hold exactly the documented types and attributes.
TEST_F(ClassificationFileTest, LayoutRegression) {
  std::string p = path("by-hand.h5");
  const hsize_t N = 3, L = 4;
  const int32_t ids[N][L] = {{101, 7592, 102, 0}, {101, 2023, 102, 2003}, {101, 102, 0, 0}};
  const uint8_t types[N][L] = {{0, 0, 0, 0}, {0, 0, 0, 1}, {0, 0, 0, 0}};
  const uint8_t mask[N][L] = {{1, 1, 1, 0}, {1, 1, 1, 1}, {1, 1, 0, 0}};
  const int32_t labels[N] = {1, 0, 1};
  {
    hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    const auto dataset = [&](const char* name, hid_t type, int rank, const void* data) {
      const hsize_t dims[2] = {N, L}, chunk[2] = {2, L};
      hid_t space = H5Screate_simple(rank, dims, nullptr);
      hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
      H5Pset_chunk(dcpl, rank, chunk);
      if (H5Zfilter_avail(H5Z_FILTER_DEFLATE) > 0) H5Pset_deflate(dcpl, 4);
      hid_t d = H5Dcreate2(f, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
      EXPECT_GE(H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0);
      H5Dclose(d);
      H5Pclose(dcpl);
      H5Sclose(space);
    };
    dataset("input_ids", H5T_NATIVE_INT32, 2, ids);
    dataset("token_type_ids", H5T_NATIVE_UINT8, 2, types);
    dataset("attention_mask", H5T_NATIVE_UINT8, 2, mask);
    dataset("labels", H5T_NATIVE_INT32, 1, labels);
    set_fixed_string_attr(f, "format", {"llmpi-classification"}, false);
    set_fixed_string_attr(f, "tokenizer", {"wordpiece:bert-base-uncased"}, false);
    set_fixed_string_attr(f, "label_names", {"not_equivalent", "equivalent"}, true);
    H5Fclose(f);
  }
  set_int_attr(p, "version", 1);
  set_int_attr(p, "vocab_size", 30522);
  set_int_attr(p, "num_labels", 2);
  set_int_attr(p, "pad_id", 0);

  ClassificationReader r(p);
  EXPECT_EQ(r.info().created_by, "");
  EXPECT_EQ(r.info().label_names, (std::vector<std::string>{"not_equivalent", "equivalent"}));
  ClassificationExamples got;
  r.read({2, 0, 1}, got);
  EXPECT_EQ(got.seq_len, 4);
  EXPECT_EQ(got.input_ids, (std::vector<int32_t>{101, 102, 0, 0, 101, 7592, 102, 0, 101, 2023, 102, 2003}));
  EXPECT_EQ(got.token_type_ids, (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}));
  EXPECT_EQ(got.attention_mask, (std::vector<int32_t>{1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1}));
  EXPECT_EQ(got.labels, (std::vector<int32_t>{1, 1, 0}));

  // What our writer stores, read with the plain API.
  std::string q = path("ours.h5");
  write_classification_file(q, random_examples(3, 4, 100, 2, 21), attrs(100, 2));
  hid_t f = H5Fopen(q.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const auto stored_type_is = [&](const char* name, hid_t want) {
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    hid_t t = H5Dget_type(d);
    EXPECT_GT(H5Tequal(t, want), 0) << name;
    hid_t dcpl = H5Dget_create_plist(d);
    EXPECT_EQ(H5Pget_layout(dcpl), H5D_CONTIGUOUS) << name;
    H5Pclose(dcpl);
    H5Tclose(t);
    H5Dclose(d);
  };
  stored_type_is("input_ids", H5T_STD_I32LE);
  stored_type_is("token_type_ids", H5T_STD_U8LE);
  stored_type_is("attention_mask", H5T_STD_U8LE);
  stored_type_is("labels", H5T_STD_I32LE);
  for (const char* name : {"format", "version", "vocab_size", "num_labels", "label_names", "pad_id",
                           "tokenizer", "created_by"})
    EXPECT_GT(H5Aexists(f, name), 0) << name;
  hid_t a = H5Aopen(f, "label_names", H5P_DEFAULT);
  hid_t t = H5Aget_type(a), s = H5Aget_space(a);
  EXPECT_GT(H5Tis_variable_str(t), 0);
  EXPECT_EQ(H5Tget_cset(t), H5T_CSET_UTF8);
  EXPECT_EQ(H5Sget_simple_extent_ndims(s), 1);
  EXPECT_EQ(H5Sget_simple_extent_npoints(s), 2);
  H5Sclose(s);
  H5Tclose(t);
  H5Aclose(a);
  H5Fclose(f);
}
