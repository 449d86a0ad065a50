// Data and checkpoint integrity (issue 14): the content hash and tokenizer identity of token and
// classification files, the checks training makes of its train/val pair and of llmpi-prep's
// manifest, per-chunk checksums in checkpoints, and a clean exit after HDF5 fails to write.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "checkpoint/checkpoint.h"
#include "runtime/crc32c.h"
#include "data/classification_file.h"
#include "data/content_hash.h"
#include "data/dataset_identity.h"
#include "data/h5_util.h"
#include "data/token_file.h"
#include "file_test_util.h"
#include "model_test_util.h"

using namespace llmpi;
using llmpi::test::error_of;
namespace fs = std::filesystem;

namespace {

struct Integrity : llmpi::test::TempDirTest {};

std::vector<uint32_t> some_tokens(size_t n, uint32_t seed) {
  std::vector<uint32_t> t(n);
  for (size_t i = 0; i < n; i++) t[i] = uint32_t((i * 7919u + seed * 104729u) % 257u);
  return t;
}

DatasetIdentity write_tokens(const std::string& path, const std::vector<uint32_t>& tokens,
                             const std::string& tokenizer = "byte") {
  TokenFileAttrs a;
  a.vocab_size = 257;
  a.eot_id = 256;
  a.tokenizer = tokenizer;
  a.created_by = "test";
  write_token_file(path, tokens, a);
  return dataset_identity(open_token_file_info(path));
}

CheckpointData checkpoint_data(size_t n) {
  CheckpointData d;
  d.info.step = 7;
  d.info.optimizer_t = 7;
  d.info.optimizer = "adamw";
  d.info.sync = "allreduce";
  d.info.world_size = 2;
  d.info.rows = 1;
  d.info.seed = 5;
  d.info.desc = test::desc_of("gpt2", 1, 2, 8, 16, 11);
  d.info.n = n;
  d.info.config_json = "{}";
  d.info.param_table_json = "[]";
  d.info.data_json = R"({"train":{"tokenizer":"byte"}})";
  for (size_t i = 0; i < n; i++) {
    d.params.push_back(0.001f * float(i));
    d.m.push_back(1e-4f * float(i));
    d.v.push_back(1e-8f * float(i));
  }
  return d;
}

// Overwrite 4 KB in the middle of `dataset`'s data with its bitwise complement.
void flip_4k_inside(const std::string& path, const char* dataset) {
  haddr_t addr = 0;
  hsize_t size = 0;
  {
    h5::Id f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    ASSERT_TRUE(f.valid());
    h5::Id d(H5Dopen2(f, dataset, H5P_DEFAULT), H5Dclose);
    addr = H5Dget_offset(d);
    size = H5Dget_storage_size(d);
    ASSERT_NE(addr, HADDR_UNDEF);
    ASSERT_GT(size, 3 * 4096u) << "the dataset is too small to flip 4 KB inside it";
  }
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  const std::streamoff at = std::streamoff(addr + size / 2 - 2048);
  std::vector<char> buf(4096);
  io.seekg(at);
  io.read(buf.data(), 4096);
  for (char& c : buf) c = char(~c);
  io.seekp(at);
  io.write(buf.data(), 4096);
}

std::string fixture(const std::string& name) {
  for (std::string base : {"tests/fixtures/gpt2-v1/", "../tests/fixtures/gpt2-v1/"})
    if (fs::exists(base + name)) return base + name;
  return "";
}

}  // namespace

// ---- dataset identity --------------------------------------------------------------------------

TEST_F(Integrity, TokenFileRecordsTokenizerAndContentHash) {
  const std::vector<uint32_t> tokens = some_tokens(5000, 1);
  DatasetIdentity id = write_tokens(path("a.h5"), tokens);
  Fnv1a64 want;
  for (uint32_t t : tokens) want.add_le(t, 4);
  EXPECT_EQ(id.content_hash, want.hex());
  EXPECT_EQ(id.tokenizer, "byte");
  EXPECT_EQ(id.size, 5000);
  // Another content gives another hash; the same content the same one.
  EXPECT_NE(write_tokens(path("b.h5"), some_tokens(5000, 2)).content_hash, id.content_hash);
  EXPECT_EQ(write_tokens(path("c.h5"), tokens).content_hash, id.content_hash);
}

TEST_F(Integrity, ClassificationFileRecordsContentHash) {
  ClassificationExamples ex;
  ex.seq_len = 3;
  ex.input_ids = {5, 6, 7, 8, 9, 0};
  ex.token_type_ids = {0, 0, 1, 0, 1, 1};
  ex.attention_mask = {1, 1, 1, 1, 1, 0};
  ex.labels = {1, 0};
  ClassificationAttrs a;
  a.vocab_size = 10;
  a.num_labels = 2;
  a.label_names = {"no", "yes"};
  a.tokenizer = "wordpiece:fnv1a64=0123456789abcdef";
  write_classification_file(path("cls.h5"), ex, a);
  DatasetIdentity id = dataset_identity(open_classification_file_info(path("cls.h5")));
  Fnv1a64 want;
  for (int32_t v : ex.input_ids) want.add_le(uint32_t(v), 4);
  for (int32_t v : ex.token_type_ids) want.add_le(uint32_t(v), 1);
  for (int32_t v : ex.attention_mask) want.add_le(uint32_t(v), 1);
  for (int32_t v : ex.labels) want.add_le(uint32_t(v), 4);
  EXPECT_EQ(id.content_hash, want.hex());
  EXPECT_EQ(id.kind, "classification");
  EXPECT_EQ(id.size, 2);
  EXPECT_EQ(id.tokenizer, a.tokenizer);
}

// Finding 3: a validation file from another tokenizer is refused, also when its vocabulary is not
// larger than the training file's (the ids would fit, and val_loss would mean nothing).
TEST_F(Integrity, TrainAndValFromDifferentTokenizersAreRefused) {
  DatasetIdentity train = write_tokens(path("train.h5"), some_tokens(3000, 1), "gpt2:fnv1a64=1111222233334444");
  DatasetIdentity val = write_tokens(path("val.h5"), some_tokens(500, 2), "byte");
  const std::string e = error_of([&] { check_training_data(train, &val); });
  EXPECT_NE(e.find("'" + path("train.h5") + "' and the validation file '" + path("val.h5") +
                   "' were made by different tokenizers ('gpt2:fnv1a64=1111222233334444' and 'byte')"),
            std::string::npos)
      << e;
  DatasetIdentity val2 = write_tokens(path("val2.h5"), some_tokens(500, 2), "gpt2:fnv1a64=1111222233334444");
  EXPECT_TRUE(check_training_data(train, &val2).empty());
  EXPECT_TRUE(check_training_data(train, nullptr).empty());
}

// Finding 3: llmpi-prep interrupted between its renames leaves a new train.h5 beside an old
// val.h5 (and val.h5.new); the manifest written before the renames names the new pair.
TEST_F(Integrity, PairThatDisagreesWithTheManifestIsRefused) {
  DatasetIdentity old_val = write_tokens(path("val.h5"), some_tokens(500, 1));
  DatasetIdentity new_train = write_tokens(path("train.h5"), some_tokens(3000, 2));
  DatasetIdentity new_val = write_tokens(path("val.h5.new"), some_tokens(600, 3));
  new_val.path = path("val.h5");
  write_prep_manifest(dir, {new_train, new_val}, "test");
  const std::string e = error_of([&] { check_training_data(new_train, &old_val); });
  EXPECT_NE(e.find("'" + path("val.h5") + "' is not the file that '" + path("manifest.json") + "' names"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("interrupted"), std::string::npos) << e;
  EXPECT_NE(e.find(path("val.h5.new")), std::string::npos) << e;

  // Finishing the interrupted rename makes the pair whole; nothing is left over.
  fs::rename(path("val.h5.new"), path("val.h5"));
  DatasetIdentity val = dataset_identity(open_token_file_info(path("val.h5")));
  EXPECT_TRUE(check_training_data(new_train, &val).empty());
  EXPECT_TRUE(leftover_prep_files(dir).empty());

  // A leftover *.new beside a matching pair is reported, not refused.
  write_tokens(path("train.h5.new"), some_tokens(10, 4));
  std::vector<std::string> w = check_training_data(new_train, &val);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find(path("train.h5.new")), std::string::npos) << w[0];
}

TEST_F(Integrity, FilesWithoutContentHashLoadWithAWarning) {
  const std::string data = fixture("train.h5");
  ASSERT_FALSE(data.empty()) << "run the tests from the project root (tests/fixtures/gpt2-v1 not found)";
  DatasetIdentity id = dataset_identity(open_token_file_info(data));
  EXPECT_TRUE(id.content_hash.empty());
  std::vector<std::string> w = check_training_data(id, nullptr);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("has no content hash"), std::string::npos) << w[0];
}

// ---- checkpoint integrity ----------------------------------------------------------------------

// Finding 5: a checkpoint with 4 KB flipped inside the parameters is refused, not trained from.
TEST_F(Integrity, CheckpointWithFlippedParametersIsRefused) {
  const size_t n = 50000;
  const std::string p = checkpoint_path(dir, 7);
  write_checkpoint(p, checkpoint_data(n));
  CheckpointInfo info = read_checkpoint_info(p);
  EXPECT_TRUE(info.checksummed);
  EXPECT_EQ(info.data_json, R"({"train":{"tokenizer":"byte"}})");
  std::vector<float> a(n), m(n), v(n);
  read_checkpoint_row(info, 0, a.data(), m.data(), v.data());
  EXPECT_EQ(a[1000], 0.001f * 1000);  // Exact: the float written (0.001f · 1000.0f), read back

  flip_4k_inside(p, "params");
  info = read_checkpoint_info(p);  // the metadata is intact
  bool damaged = false;
  std::string e;
  try {
    read_checkpoint_row(info, 0, a.data(), m.data(), v.data());
  } catch (const CheckpointDamaged& x) {
    damaged = true;
    e = x.what();
  }
  EXPECT_TRUE(damaged) << "a checkpoint with 4 KB flipped in 'params' must not load";
  EXPECT_NE(e.find("dataset 'params' fails its checksum in row 0"), std::string::npos) << e;
  EXPECT_THROW(verify_checkpoint(info), CheckpointDamaged);

  // The optimizer state is covered as well.
  const std::string q = checkpoint_path(dir, 8);
  write_checkpoint(q, checkpoint_data(n));
  flip_4k_inside(q, "adam_v");
  CheckpointInfo qi = read_checkpoint_info(q);
  EXPECT_NE(error_of([&] { read_checkpoint_row(qi, 0, a.data(), m.data(), v.data()); })
                .find("dataset 'adam_v' fails its checksum"),
            std::string::npos);
  EXPECT_EQ(checkpoints_newest_first(dir), (std::vector<std::string>{q, p}));
}

TEST(Crc32c, KnownValuesAndContinuation) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the standard check value
  EXPECT_EQ(crc32c("", 0), 0u);
  std::vector<unsigned char> bytes(1000);
  for (size_t i = 0; i < bytes.size(); i++) bytes[i] = (unsigned char)(i * 131 + 7);
  // Any split of the input gives the same CRC (covers the 8-byte and the byte-at-a-time paths).
  const uint32_t whole = crc32c(bytes.data(), bytes.size());
  for (size_t cut : {1, 7, 8, 13, 999}) EXPECT_EQ(crc32c(bytes.data() + cut, bytes.size() - cut, crc32c(bytes.data(), cut)), whole);
}

TEST_F(Integrity, CheckpointsWithoutChecksumsStillLoad) {
  const std::string ck = fixture("step-00000003.h5");
  ASSERT_FALSE(ck.empty()) << "run the tests from the project root (tests/fixtures/gpt2-v1 not found)";
  CheckpointInfo info = read_checkpoint_info(ck);
  EXPECT_FALSE(info.checksummed);
  EXPECT_TRUE(info.data_json.empty());
  std::vector<float> a(info.n), m(info.n), v(info.n);
  EXPECT_NO_THROW(read_checkpoint_row(info, 0, a.data(), m.data(), v.data()));
  EXPECT_NO_THROW(verify_checkpoint(info));
}

// Finding 6: when HDF5 cannot write (a full disk; here a file-size limit, which fails the same
// write() calls with EFBIG after the space reservation succeeded), the error is clean and the
// process exits normally (HDF5's own exit handler, which would crash on the half-closed file, is off).
TEST_F(Integrity, FailedCheckpointWriteExitsCleanly) {
  const std::string p = checkpoint_path(dir, 9);
  std::fflush(nullptr);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(60);
    signal(SIGXFSZ, SIG_IGN);
    rlimit lim{256 * 1024, 256 * 1024};
    setrlimit(RLIMIT_FSIZE, &lim);
    int code = 3;  // the write succeeded: wrong
    try {
      write_checkpoint(p, checkpoint_data(200000));  // 2.4 MB
    } catch (const Error& e) {
      code = std::string(e.what()).find("the previous checkpoint is untouched") != std::string::npos ? 0 : 4;
    }
    std::exit(code);  // runs the exit handlers, as the program's own exit does
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the process died from signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0)
                                 << " after a failed checkpoint write";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: the write did not fail; 4: the error did not say what happened";
  EXPECT_FALSE(fs::exists(p));
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}
