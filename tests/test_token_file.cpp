// HDF5 token file tests: round trips (uint16 and uint32 storage), attributes, hyperslab reads,
// atomic writes, and the error message for each kind of bad file.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "data/token_file.h"
#include "file_test_util.h"
#include "runtime/error.h"

using namespace llmpi;

namespace {

using TokenFileTest = test::TempDirTest;
using test::error_of;

std::vector<uint32_t> random_tokens(size_t n, uint32_t vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> v(n);
  for (auto& x : v) x = rng() % vocab;
  return v;
}

TokenFileAttrs attrs(int64_t vocab, int64_t eot, const std::string& tokenizer = "byte") {
  TokenFileAttrs a;
  a.vocab_size = vocab;
  a.eot_id = eot;
  a.tokenizer = tokenizer;
  a.created_by = "llmpi-tests";
  return a;
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

// A fixed-length string this time (the reader accepts both kinds).
void set_fixed_string_attr(const std::string& p, const char* name, const std::string& v) {
  with_file(p, [&](hid_t file) {
    if (H5Aexists(file, name) > 0) H5Adelete(file, name);
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, v.size());
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(attr, type, v.data());
    H5Aclose(attr);
    H5Sclose(space);
    H5Tclose(type);
  });
}

void delete_attr(const std::string& p, const char* name) {
  with_file(p, [&](hid_t file) { H5Adelete(file, name); });
}

// Replace /tokens with a dataset of the given type and shape.
void replace_tokens(const std::string& p, hid_t type, int rank, const hsize_t* dims) {
  with_file(p, [&](hid_t file) {
    H5Ldelete(file, "tokens", H5P_DEFAULT);
    if (rank == 0) return;  // just delete it
    hid_t space = H5Screate_simple(rank, dims, nullptr);
    hid_t d = H5Dcreate2(file, "tokens", type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dclose(d);
    H5Sclose(space);
  });
}

}  // namespace

// ---- round trips -----------------------------------------------------------------------------

TEST_F(TokenFileTest, RoundTripUint16) {
  std::string p = path("train.h5");
  auto tokens = random_tokens(200000, 257, 1);  // spans 4 chunks
  write_token_file(p, tokens, attrs(257, 256, "byte"));
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp"));

  TokenReader r(p);
  const TokenFileInfo& info = r.info();
  EXPECT_EQ(info.path, p);
  EXPECT_EQ(info.version, 1);
  EXPECT_EQ(info.vocab_size, 257);
  EXPECT_EQ(info.eot_id, 256);
  EXPECT_EQ(info.tokenizer, "byte");
  EXPECT_EQ(info.created_by, "llmpi-tests");
  EXPECT_EQ(info.dtype, "uint16");
  EXPECT_EQ(info.dtype_bytes, 2);
  EXPECT_EQ(info.chunk, 65536);
  ASSERT_EQ(r.n_tokens(), 200000);
  std::vector<int32_t> all = r.read(0, r.n_tokens());
  for (size_t i = 0; i < tokens.size(); i++) ASSERT_EQ(all[i], int32_t(tokens[i])) << "at " << i;
}

TEST_F(TokenFileTest, RoundTripUint32) {
  std::string p = path("big-vocab.h5");
  auto tokens = random_tokens(70000, 100000, 2);
  tokens[5] = 99999;  // above uint16 range
  tokens[6] = 65536;
  write_token_file(p, tokens, attrs(100000, 0, "test"));
  TokenFileInfo info = open_token_file_info(p);
  EXPECT_EQ(info.dtype, "uint32");
  EXPECT_EQ(info.dtype_bytes, 4);
  EXPECT_EQ(info.vocab_size, 100000);
  EXPECT_EQ(info.n_tokens, 70000);
  TokenReader r(p);
  std::vector<int32_t> all = r.read(0, 70000);
  for (size_t i = 0; i < tokens.size(); i++) ASSERT_EQ(all[i], int32_t(tokens[i])) << "at " << i;
}

TEST_F(TokenFileTest, VocabBoundaryPicksType) {
  write_token_file(path("a.h5"), {0, 65534}, attrs(65535, 0));
  write_token_file(path("b.h5"), {0, 65535}, attrs(65536, 0));
  EXPECT_EQ(open_token_file_info(path("a.h5")).dtype, "uint16");
  EXPECT_EQ(open_token_file_info(path("b.h5")).dtype, "uint32");
  EXPECT_EQ(TokenReader(path("b.h5")).read(1, 1)[0], 65535);
}

TEST_F(TokenFileTest, HyperslabReads) {
  std::string p = path("h.h5");
  std::vector<uint32_t> tokens(150000);
  for (size_t i = 0; i < tokens.size(); i++) tokens[i] = uint32_t(i % 50000);
  write_token_file(p, tokens, attrs(50257, 50256, "gpt2:fnv1a64=0123456789abcdef"));
  TokenReader r(p);
  const int64_t windows[][2] = {{0, 1}, {65530, 20}, {65536, 65536}, {131000, 19000},
                                {149999, 1}, {12345, 0}, {150000, 0}};
  for (auto& w : windows) {
    std::vector<int32_t> got = r.read(w[0], w[1]);
    ASSERT_EQ(int64_t(got.size()), w[1]);
    for (int64_t i = 0; i < w[1]; i++)
      ASSERT_EQ(got[i], int32_t((w[0] + i) % 50000)) << "window at " << w[0] << " index " << i;
  }
  // Reading into a caller's buffer leaves the rest of it alone.
  std::vector<int32_t> buf(10, -7);
  r.read(100, 5, buf.data() + 2);
  EXPECT_EQ(buf[1], -7);
  EXPECT_EQ(buf[2], 100);
  EXPECT_EQ(buf[6], 104);
  EXPECT_EQ(buf[7], -7);
}

TEST_F(TokenFileTest, EmptyFile) {
  write_token_file(path("empty.h5"), {}, attrs(257, 256));
  TokenReader r(path("empty.h5"));
  EXPECT_EQ(r.n_tokens(), 0);
  EXPECT_TRUE(r.read(0, 0).empty());
  EXPECT_ERROR_HAS(r.read(0, 1), "has 0 tokens");
}

TEST_F(TokenFileTest, OverwriteReplacesWholeFile) {
  std::string p = path("t.h5");
  write_token_file(p, random_tokens(1000, 257, 3), attrs(257, 256));
  write_token_file(p, {1, 2, 3}, attrs(257, 256));
  TokenReader r(p);
  EXPECT_EQ(r.n_tokens(), 3);
  EXPECT_EQ(r.read(0, 3), (std::vector<int32_t>{1, 2, 3}));
}

TEST_F(TokenFileTest, FixedLengthStringAttributesAreAccepted) {
  std::string p = path("t.h5");
  write_token_file(p, {1, 2}, attrs(257, 256));
  set_fixed_string_attr(p, "format", "llmpi-tokens");
  set_fixed_string_attr(p, "tokenizer", "byte");
  EXPECT_EQ(open_token_file_info(p).tokenizer, "byte");
}

TEST_F(TokenFileTest, ReaderMovesAndReopens) {
  write_token_file(path("a.h5"), {1, 2, 3}, attrs(257, 256));
  write_token_file(path("b.h5"), {4, 5}, attrs(257, 256));
  TokenReader r(path("a.h5"));
  r.open(path("b.h5"));
  EXPECT_EQ(r.n_tokens(), 2);
  EXPECT_EQ(r.read(0, 2), (std::vector<int32_t>{4, 5}));
  r.close();
  EXPECT_FALSE(r.is_open());
  EXPECT_ERROR_HAS(r.read(0, 1), "before open()");
}

// ---- writer errors ---------------------------------------------------------------------------

TEST_F(TokenFileTest, WriteRejectsIdAboveVocabAndLeavesNothing) {
  std::string p = path("bad.h5");
  EXPECT_ERROR_HAS(write_token_file(p, {1, 2, 300}, attrs(257, 256)),
                   "token 2 has id 300, which is not below vocab_size 257");
  EXPECT_FALSE(std::filesystem::exists(p));
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp"));
  EXPECT_ERROR_HAS(write_token_file(p, {1}, attrs(257, 257)), "eot_id 257");
}

TEST_F(TokenFileTest, WriteIntoMissingDirectory) {
  std::string p = path("no/such/dir/t.h5");
  EXPECT_ERROR_HAS(write_token_file(p, {1}, attrs(257, 256)), "check that its directory exists");
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp"));
}

// ---- reader errors ---------------------------------------------------------------------------

TEST_F(TokenFileTest, MissingFile) {
  EXPECT_ERROR_HAS(open_token_file_info(path("nope.h5")), "token file '" + path("nope.h5") +
                                                     "' does not exist; check the path, or make "
                                                     "it with llmpi-prep");
  EXPECT_ERROR_HAS(open_token_file_info(dir), "is a directory");
}

TEST_F(TokenFileTest, NotHdf5) {
  std::string p = path("text.h5");
  std::ofstream(p) << "just some text, not HDF5\n";
  EXPECT_ERROR_HAS(open_token_file_info(p), "'" + p + "' is not an HDF5 file");
  std::ofstream(path("empty")) << "";
  EXPECT_ERROR_HAS(open_token_file_info(path("empty")), "is not an HDF5 file");
}

TEST_F(TokenFileTest, WrongOrMissingFormat) {
  std::string p = path("t.h5");
  write_token_file(p, {1, 2}, attrs(257, 256));
  set_fixed_string_attr(p, "format", "something-else");
  EXPECT_ERROR_HAS(open_token_file_info(p), "has format 'something-else', not 'llmpi-tokens': it is not an "
                                   "llmpi token file; make one with llmpi-prep");
  delete_attr(p, "format");
  EXPECT_ERROR_HAS(open_token_file_info(p), "not an llmpi token file; make one with llmpi-prep");
  EXPECT_ERROR_HAS(open_token_file_info(p), "has no 'format' attribute");
}

TEST_F(TokenFileTest, UnsupportedVersion) {
  std::string p = path("t.h5");
  write_token_file(p, {1, 2}, attrs(257, 256));
  set_int_attr(p, "version", 2);
  EXPECT_ERROR_HAS(open_token_file_info(p), "has version 2, but this llmpi reads version 1");
}

TEST_F(TokenFileTest, MissingAttributes) {
  std::string p = path("t.h5");
  write_token_file(p, {1, 2}, attrs(257, 256));
  delete_attr(p, "vocab_size");
  EXPECT_ERROR_HAS(open_token_file_info(p), "has no 'vocab_size' attribute");
}

TEST_F(TokenFileTest, MissingOrWrongTokensDataset) {
  std::string p = path("t.h5");
  write_token_file(p, {1, 2}, attrs(257, 256));
  replace_tokens(p, H5T_NATIVE_INT, 0, nullptr);
  EXPECT_ERROR_HAS(open_token_file_info(p), "has no 'tokens' dataset");

  hsize_t dims2[2] = {4, 3};
  replace_tokens(p, H5T_STD_U16LE, 2, dims2);
  EXPECT_ERROR_HAS(open_token_file_info(p), "'tokens' has 2 dimensions, but must be 1-D");

  hsize_t dims1[1] = {8};
  replace_tokens(p, H5T_IEEE_F32LE, 1, dims1);
  EXPECT_ERROR_HAS(open_token_file_info(p), "must hold uint16 or uint32 values");
  replace_tokens(p, H5T_STD_I32LE, 1, dims1);
  EXPECT_ERROR_HAS(open_token_file_info(p), "must hold uint16 or uint32 values");
}

TEST_F(TokenFileTest, TruncatedFile) {
  std::string p = path("t.h5");
  write_token_file(p, random_tokens(300000, 257, 4), attrs(257, 256));
  auto size = std::filesystem::file_size(p);
  std::filesystem::resize_file(p, size / 2);
  std::string msg = error_of([&] {
    TokenReader r(p);
    r.read(0, r.n_tokens());
  });
  EXPECT_NE(msg.find("damaged or truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("remake it with llmpi-prep"), std::string::npos) << msg;
}

TEST_F(TokenFileTest, TokenIdAboveVocab) {
  std::string p = path("t.h5");
  std::vector<uint32_t> tokens(1000, 5);
  tokens[700] = 250;
  write_token_file(p, tokens, attrs(257, 256));
  set_int_attr(p, "vocab_size", 200);
  set_int_attr(p, "eot_id", 0);
  TokenReader r(p);
  EXPECT_EQ(r.read(0, 700).size(), 700u);  // the good part reads fine
  EXPECT_ERROR_HAS(r.read(600, 200), "token file '" + p + "' holds token id 250 at position 700, "
                                     "but its vocab_size is 200");
  EXPECT_ERROR_HAS(r.read(600, 200), "the file, its tokenizer and the model's vocabulary do not match");
}

TEST_F(TokenFileTest, ReadOutOfRange) {
  std::string p = path("t.h5");
  write_token_file(p, random_tokens(100, 257, 5), attrs(257, 256));
  TokenReader r(p);
  std::vector<int32_t> buf(20);
  EXPECT_ERROR_HAS(r.read(95, 10, buf.data()), "cannot read tokens [95, 105) from '" + p +
                                                   "': it has 100 tokens");
  EXPECT_ERROR_HAS(r.read(-1, 1, buf.data()), "cannot read tokens [-1, 0)");
  EXPECT_ERROR_HAS(r.read(101, 0, buf.data()), "it has 100 tokens");
  EXPECT_ERROR_HAS(r.read(0, -1, buf.data()), "cannot read tokens");
}
