// llmpi-prep's data sets and their making (issue 34 and issue 33's llmpi-prep parts):
//   - a split of shards reads as one stream (windows across shard ends), opened by DIR, DIR/train,
//     DIR/train.h5 or DIR/val; every shard is checked against the manifest; the identity covers
//     every shard; a directory without a manifest, a missing or changed shard are refused;
//   - streaming input: the documents of a file divided into byte ranges (any range size) are the
//     whole file's documents, for blank-line text and JSONL; gzip and zstd (several members or
//     frames) give the same documents; damaged or truncated data is an error naming the file;
//   - the validation choice takes exactly k documents, by seed;
//   - the output directory rules (another program's files need --overwrite; one run at a time);
//   - under MPI (Mpi*, -n 2): the data set made on 2 ranks is the one made on 1, and an error in
//     one rank's input reaches every rank and leaves the previous data set as it was.
#include <gtest/gtest.h>
#include <mpi.h>
#include <nlohmann/json.hpp>
#include <zlib.h>
#include <zstd.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "data/classification_file.h"
#include "data/content_hash.h"
#include "data/dataset_identity.h"
#include "data/prep_manifest.h"
#include "data/text_input.h"
#include "data/token_file.h"
#include "data/token_prep.h"
#include "file_test_util.h"
#include "mpi_test_data.h"

using namespace llmpi;
using test::error_of;
namespace fs = std::filesystem;

namespace {

struct PrepTest : test::TempDirTest {
  // Shards of one split written by hand, with their manifest entry.
  SplitEntry write_split(const std::string& split, const std::vector<std::vector<uint32_t>>& parts,
                         const std::string& tokenizer = "byte") {
    SplitEntry e;
    for (size_t j = 0; j < parts.size(); j++) {
      const std::string name = shard_file_name(split, int64_t(j), int64_t(parts.size()), 1);
      write_token_file(path(name), parts[j], TokenFileAttrs{257, 256, tokenizer, "llmpi-prep"});
      e.shards.push_back({name, int64_t(parts[j].size()), open_single_token_file_info(path(name)).content_hash});
      e.size += int64_t(parts[j].size());
    }
    e.documents = 1;
    e.content_hash = split_content_hash(e.shards);
    return e;
  }
  void write_manifest(const std::map<std::string, SplitEntry>& splits) {
    PrepManifest m;
    m.created_by = "llmpi-prep";
    m.tokenizer = "byte";
    m.vocab_size = 257;
    m.eot_id = 256;
    m.splits = splits;
    write_prep_manifest_v2(dir, m);
  }
};

std::vector<uint32_t> tokens_from(uint32_t seed, size_t n) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> t(n);
  for (auto& x : t) x = rng() % 257;
  return t;
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
void spit(const std::string& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

}  // namespace

// ---- sharded data sets ------------------------------------------------------------------------

TEST_F(PrepTest, ShardsReadAsOneStreamAcrossTheirEnds) {
  const std::vector<std::vector<uint32_t>> parts = {tokens_from(1, 1000), tokens_from(2, 1), tokens_from(3, 0),
                                                    tokens_from(4, 2500)};
  std::vector<uint32_t> all;
  for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
  write_manifest({{"train", write_split("train", parts)}, {"val", write_split("val", {tokens_from(9, 300)})}});

  for (const std::string& name : {dir, dir + "/", path("train"), path("train.h5")}) {
    TokenReader r(name);
    ASSERT_EQ(r.n_tokens(), int64_t(all.size())) << name;
    EXPECT_EQ(r.info().split, "train");
    EXPECT_EQ(r.info().n_shards, 4);
    EXPECT_EQ(r.shards().size(), 4u);
    // Windows of a few lengths at every start near the shard ends (1000|1 and 1|0|2500), and
    // at every 41st start elsewhere.
    for (int64_t len : {1, 2, 3, 17, 1002}) {
      for (int64_t s = 0; s + len <= r.n_tokens(); s++) {
        if (s % 41 != 0 && std::abs(s - 1000) > 20) continue;
        std::vector<int32_t> got = r.read(s, len);
        for (int64_t k = 0; k < len; k++)
          ASSERT_EQ(uint32_t(got[size_t(k)]), all[size_t(s + k)]) << name << " window " << s << "+" << len;
      }
    }
    EXPECT_ERROR_HAS(r.read(int64_t(all.size()) - 1, 2), "it has " + std::to_string(all.size()) + " tokens");
  }
  TokenReader v(path("val"));
  EXPECT_EQ(v.n_tokens(), 300);
  EXPECT_EQ(v.read(0, 300)[299], int32_t(tokens_from(9, 300)[299]));
  EXPECT_EQ(hdf5_format_of(dir), kTokenFileFormat);
  EXPECT_EQ(hdf5_format_of(path("val")), kTokenFileFormat);
}

TEST_F(PrepTest, ManyShardsStayWithinTheOpenFileLimit) {
  std::vector<std::vector<uint32_t>> parts;
  std::vector<uint32_t> all;
  for (uint32_t j = 0; j < 13; j++) {
    parts.push_back(tokens_from(100 + j, 50 + j));
    all.insert(all.end(), parts.back().begin(), parts.back().end());
  }
  write_manifest({{"train", write_split("train", parts)}});
  TokenReader r;
  r.set_max_open_shards(4);
  r.open(dir);
  std::mt19937 rng(5);
  for (int i = 0; i < 400; i++) {  // random windows revisit closed shards
    const int64_t len = 1 + int64_t(rng() % 120), s = int64_t(rng() % (all.size() - size_t(len)));
    std::vector<int32_t> got = r.read(s, len);
    for (int64_t k = 0; k < len; k++) ASSERT_EQ(uint32_t(got[size_t(k)]), all[size_t(s + k)]);
    ASSERT_LE(r.open_shard_files(), 4);
  }
  EXPECT_EQ(r.open_shard_files(), 4);
}

TEST_F(PrepTest, IdentityCoversEveryShard) {
  const std::vector<std::vector<uint32_t>> parts = {tokens_from(1, 400), tokens_from(2, 600)};
  write_manifest({{"train", write_split("train", parts)}});
  const DatasetIdentity a = dataset_identity(open_token_file_info(dir));
  EXPECT_EQ(a.size, 1000);
  Fnv1a64 h;  // the documented definition
  TokenReader r(dir);
  for (const TokenReader::Shard& s : r.shards()) {
    h.add_u64_le(uint64_t(s.n_tokens));
    h.add_u64_le(std::stoull(s.content_hash, nullptr, 16));
  }
  EXPECT_EQ(a.content_hash, h.hex());
  // Another second shard: another identity.
  write_manifest({{"train", write_split("train", {tokens_from(1, 400), tokens_from(3, 600)})}});
  EXPECT_NE(dataset_identity(open_token_file_info(dir)).content_hash, a.content_hash);
  // One shard: the file's own hash, as a single token file has always had.
  write_manifest({{"train", write_split("train", {tokens_from(1, 400)})}});
  EXPECT_EQ(open_token_file_info(dir).content_hash, open_single_token_file_info(path("train.h5")).content_hash);
}

TEST_F(PrepTest, IncompleteOrChangedDataSetsAreRefused) {
  EXPECT_ERROR_HAS(open_token_file_info(dir), "is a directory without an llmpi-prep manifest.json");
  const std::vector<std::vector<uint32_t>> parts = {tokens_from(1, 400), tokens_from(2, 600)};
  const SplitEntry train = write_split("train", parts);
  EXPECT_ERROR_HAS(open_token_file_info(dir), "without an llmpi-prep manifest.json");  // shards, no manifest
  write_manifest({{"train", train}});

  EXPECT_ERROR_HAS(open_token_file_info(path("val")), "has no split of that name (it has train)");
  // A shard replaced by other tokens.
  write_token_file(path("train-00001.h5"), tokens_from(7, 600), TokenFileAttrs{257, 256, "byte", "llmpi-prep"});
  EXPECT_ERROR_HAS(open_token_file_info(dir), "train-00001.h5' is not the file that '" + path("manifest.json") + "' names");
  // ... and the shard alone, named by its path, is checked too.
  EXPECT_ERROR_HAS(open_token_file_info(path("train-00001.h5")), "is not the file that");
  EXPECT_NO_THROW(open_token_file_info(path("train-00000.h5")));
  // A missing shard.
  fs::remove(path("train-00001.h5"));
  EXPECT_ERROR_HAS(open_token_file_info(dir), "split 'train' of '" + path("manifest.json") + "' is incomplete or damaged");
  // A manifest whose split hash is not its shard list's.
  std::string text = slurp(path("manifest.json"));
  text.replace(text.find(train.content_hash), 16, "0123456789abcdef");
  spit(path("manifest.json"), text);
  EXPECT_ERROR_HAS(open_token_file_info(dir), "is damaged: split 'train' has content hash 0123456789abcdef");
}

TEST_F(PrepTest, ValidationDataNamedByTheDirectoryAloneIsRefused) {
  write_manifest({{"train", write_split("train", {tokens_from(1, 400)})},
                  {"val", write_split("val", {tokens_from(2, 100)})}});
  const DatasetIdentity train = dataset_identity(open_token_file_info(dir));
  const DatasetIdentity val_dir = dataset_identity(open_token_file_info(dir));
  EXPECT_ERROR_HAS(check_training_data(train, &val_dir), "give its validation split as '" + path("val") + "'");
  const DatasetIdentity val = dataset_identity(open_token_file_info(path("val")));
  EXPECT_TRUE(check_training_data(train, &val).empty());
  // A leftover of an interrupted run is reported.
  write_token_file(path("train.g2.h5"), tokens_from(3, 10), TokenFileAttrs{257, 256, "byte", "llmpi-prep"});
  std::vector<std::string> w = check_training_data(train, &val);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find(path("train.g2.h5")), std::string::npos) << w[0];
}

TEST_F(PrepTest, OutputDirectoryRules) {
  // New or empty: generation 1.
  EXPECT_EQ(open_prep_destination(path("new"), false).next_generation, 1);
  // Another program's files: refused without --overwrite, naming one.
  const std::string out = path("out");
  fs::create_directory(out);
  spit(out + "/notes.txt", "mine");
  EXPECT_ERROR_HAS(open_prep_destination(out, false), "holds no llmpi-prep data set (it has 'notes.txt')");
  EXPECT_NO_THROW(open_prep_destination(out, true));
  // A token file of the same name that llmpi-prep did not write is not ours either.
  fs::remove(out + "/notes.txt");
  write_token_file(out + "/train.h5", tokens_from(1, 10), TokenFileAttrs{257, 256, "byte", "someone-else"});
  EXPECT_ERROR_HAS(open_prep_destination(out, false), "(it has 'train.h5')");
  // What an interrupted run leaves (no manifest yet) is ours: reported as leftovers.
  write_token_file(out + "/train.h5", tokens_from(1, 10), TokenFileAttrs{257, 256, "byte", "llmpi-prep"});
  spit(out + "/val.h5.tmp", "partial");
  fs::create_directory(out + "/" + kPrepWorkDirName);
  PrepDestination d = open_prep_destination(out, false);
  EXPECT_EQ(d.leftovers, (std::vector<std::string>{out + "/" + kPrepWorkDirName, out + "/train.h5", out + "/val.h5.tmp"}));
  // A data set: the next generation; its files are not leftovers; other files are left alone.
  d.lock.reset();  // (d's claim on the directory ends here)
  fs::remove_all(out + "/" + kPrepWorkDirName);
  fs::remove(out + "/val.h5.tmp");
  {
    PrepManifest m;
    m.tokenizer = "byte";
    m.vocab_size = 257;
    m.eot_id = 256;
    write_token_file(out + "/train.h5", tokens_from(1, 10), TokenFileAttrs{257, 256, "byte", "llmpi-prep"});
    m.splits["train"].shards = {{"train.h5", 10, open_single_token_file_info(out + "/train.h5").content_hash}};
    m.splits["train"].size = 10;
    m.splits["train"].content_hash = m.splits["train"].shards[0].content_hash;
    write_prep_manifest_v2(out, m);
  }
  spit(out + "/README", "about this data");
  d = open_prep_destination(out, false);
  EXPECT_EQ(d.next_generation, 2);
  EXPECT_TRUE(d.leftovers.empty());
  EXPECT_EQ(shard_file_name("train", 3, 12, 2), "train-00003.g2.h5");
  EXPECT_EQ(shard_file_name("val", 0, 1, 1), "val.h5");
}

// One llmpi-prep at a time per directory: while a run holds --out's lock, a second one is refused
// before it removes or writes anything, naming the first; after it, the directory is free; a lock
// left by a run that died is taken over, saying whose.
TEST_F(PrepTest, ASecondRunOnTheSameOutIsRefusedAndTouchesNothing) {
  const std::string out = path("out");
  std::string text;
  for (int i = 0; i < 20; i++) text += "document " + std::to_string(i) + " of the first corpus\n\n";
  spit(path("first.txt"), text);
  spit(path("second.txt"), text + "and a last document, of the second corpus only\n");
  TokenPrepOptions o;
  o.tokenizer = "byte";
  o.inputs = {path("first.txt")};
  o.out = out;
  o.val_fraction = 0.1;
  run_token_prep(o, MPI_COMM_SELF);  // the data set a second run must not harm
  const std::string manifest = slurp(out + "/manifest.json");
  ASSERT_FALSE(fs::exists(out + "/" + kPrepLockName)) << "a run releases (and removes) its lock when it ends";

  // The first run, at work: it holds the lock and has work files.
  PrepDestination first = open_prep_destination(out, false);
  ASSERT_TRUE(first.lock && first.lock->fd >= 0) << "no lock taken (a file system without flock?)";
  EXPECT_TRUE(first.notes.empty());
  fs::create_directory(out + "/" + kPrepWorkDirName);
  spit(out + "/" + kPrepWorkDirName + "/u0000000.tok", "the first run's tokens");
  std::vector<std::string> before;
  for (const auto& e : fs::directory_iterator(out)) before.push_back(e.path().filename().string());
  std::sort(before.begin(), before.end());

  TokenPrepOptions second = o;
  second.inputs = {path("second.txt")};
  const std::string e = error_of([&] { run_token_prep(second, MPI_COMM_SELF); });
  EXPECT_NE(e.find("--out '" + out + "' is in use by another llmpi-prep run (host " + host_name() + ", pid " +
                   std::to_string(getpid()) + ", started "),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("Wait for that llmpi-prep run to end, or choose another --out; if that process is gone (its node "
                   "crashed), delete " + out + "/" + kPrepLockName),
            std::string::npos)
      << e;
  EXPECT_ERROR_HAS(open_prep_destination(out, true), "is in use by another llmpi-prep run");  // --overwrite too
  std::vector<std::string> after;
  for (const auto& f : fs::directory_iterator(out)) after.push_back(f.path().filename().string());
  std::sort(after.begin(), after.end());
  EXPECT_EQ(after, before) << "the refused run changed the directory";
  EXPECT_EQ(slurp(out + "/" + kPrepWorkDirName + "/u0000000.tok"), "the first run's tokens");
  EXPECT_EQ(slurp(out + "/manifest.json"), manifest);
  EXPECT_NO_THROW(open_token_file_info(out + "/train"));

  // The first run ends: the directory is free again.
  first = PrepDestination();
  EXPECT_FALSE(fs::exists(out + "/" + kPrepLockName));
  run_token_prep(second, MPI_COMM_SELF);
  EXPECT_EQ(read_prep_manifest(out)->generation, 2);

  // A lock file left by a run that died (its flock went with it): taken over, saying whose.
  spit(out + "/" + kPrepLockName, "host " + host_name() + "\npid 999999999\nstarted 2026-01-01T00:00:00Z\n");
  PrepDestination again = open_prep_destination(out, false);
  ASSERT_EQ(again.notes.size(), 1u);
  EXPECT_NE(again.notes[0].find("taking over the output directory lock left by host " + host_name() +
                                ", pid 999999999, started 2026-01-01T00:00:00Z, an llmpi-prep run that ended"),
            std::string::npos)
      << again.notes[0];
  EXPECT_TRUE(again.leftovers.empty()) << "the lock file is not one of the data set's files";
}

// ---- streaming input --------------------------------------------------------------------------

namespace {

std::vector<std::string> documents_of(const InputUnit& u, DocSplit split = DocSplit::blank_line) {
  DocumentReader r(u, split);
  std::vector<std::string> docs;
  std::string_view d;
  while (r.next(d)) docs.emplace_back(d);
  return docs;
}

// The documents of `path` read as ranges of `range` bytes, in order.
std::vector<std::string> documents_by_ranges(const std::string& path, InputFormat f, int64_t range) {
  InputUnit u;
  u.path = path;
  u.format = f;
  const int64_t size = int64_t(fs::file_size(path));
  std::vector<std::string> docs;
  for (int64_t b = 0; b < size; b += range) {
    u.begin = b;
    u.end = b + range;
    u.bytes = std::min(range, size - b);
    for (std::string& d : documents_of(u)) docs.push_back(std::move(d));
  }
  return docs;
}

// Blank-line text with the awkward cases: CRLF, whitespace-only lines, runs of blank lines,
// leading and trailing blank lines, a long line, no newline at the end.
std::string awkward_text(unsigned seed, std::vector<std::string>& docs_out) {
  std::mt19937 rng(seed);
  std::string text = rng() % 2 ? "\n \t\n" : "";
  const char* blanks[] = {"\n", " \n", "\t \r\n", "\r\n", "\f\n"};
  for (int d = 0; d < 60; d++) {
    std::string doc;
    const int lines = 1 + int(rng() % 4);
    const bool crlf = rng() % 3 == 0;
    for (int l = 0; l < lines; l++) {
      std::string line = (rng() % 5 == 0 ? " " : "") + std::string("doc") + std::to_string(d) + " line" + std::to_string(l);
      if (rng() % 17 == 0) line += std::string(3000, 'x');
      doc += line + (crlf ? "\r" : "");
      text += line + (crlf ? "\r\n" : "\n");
      if (l + 1 < lines) doc += "\n";
    }
    if (crlf) doc.pop_back();  // the "\r" before the document's last line break is not part of it
    docs_out.push_back(doc);
    const int gaps = 1 + int(rng() % 3);
    for (int g = 0; g < gaps; g++) text += blanks[rng() % 5];
  }
  if (rng() % 2) text.pop_back();
  return text;
}

std::string gzip_of(const std::string& s) {
  z_stream z{};
  deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&z, uLong(s.size())) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(s.data()));
  z.avail_in = uInt(s.size());
  z.next_out = reinterpret_cast<Bytef*>(&out[0]);
  z.avail_out = uInt(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string zstd_of(const std::string& s) {
  std::string out(ZSTD_compressBound(s.size()), '\0');
  out.resize(ZSTD_compress(&out[0], out.size(), s.data(), s.size(), 3));
  return out;
}

}  // namespace

TEST_F(PrepTest, BlankLineDocumentsAreTheSameReadInAnyRanges) {
  for (unsigned seed : {1u, 2u, 3u}) {
    std::vector<std::string> want;
    spit(path("t.txt"), awkward_text(seed, want));
    InputUnit whole;
    whole.path = path("t.txt");
    ASSERT_EQ(documents_of(whole), want) << "seed " << seed;
    for (int64_t range : {1, 2, 3, 5, 16, 100, 1000, 4096, 100000}) {
      if (range < 5 && seed != 1) continue;  // a unit per byte or two: slow, once is enough
      ASSERT_EQ(documents_by_ranges(path("t.txt"), InputFormat::text, range), want) << "seed " << seed << " range " << range;
    }
  }
}

TEST_F(PrepTest, JsonlDocumentsAreTheSameReadInAnyRanges) {
  std::string text;
  std::vector<std::string> want;
  for (int i = 0; i < 80; i++) {
    const std::string t = "story " + std::to_string(i) + (i % 7 == 0 ? std::string(900, 'y') : "") + "\n\"quoted\"";
    text += nlohmann::json{{"text", t}, {"id", i}}.dump() + (i % 9 == 0 ? "\n\n" : "\n");
    want.push_back(t);
    if (i % 11 == 0) text += "{\"text\": \"\"}\n";  // empty: skipped
  }
  spit(path("t.jsonl"), text);
  for (int64_t range : {3, 7, 64, 999, 1 << 20})
    ASSERT_EQ(documents_by_ranges(path("t.jsonl"), InputFormat::jsonl, range), want) << "range " << range;
  // A bad line is named by its line number in the file, also from a range that starts later.
  spit(path("bad.jsonl"), text + "{\"txt\": 1}\n");
  const int64_t bad_line = int64_t(std::count(text.begin(), text.end(), '\n')) + 1;
  for (int64_t range : {int64_t(1) << 20, int64_t(100)}) {
    const std::string e = error_of([&] { documents_by_ranges(path("bad.jsonl"), InputFormat::jsonl, range); });
    EXPECT_NE(e.find(path("bad.jsonl") + ":" + std::to_string(bad_line) + ": expected an object with a string \"text\""),
              std::string::npos) << e;
  }
}

TEST_F(PrepTest, CompressedInputsGiveTheSameDocuments) {
  std::vector<std::string> want;
  const std::string text = awkward_text(4, want);
  const size_t half = text.size() / 2;
  // Two gzip members, two zstd frames: as `cat a.gz b.gz` makes.
  spit(path("t.txt.gz"), gzip_of(text.substr(0, half)) + gzip_of(text.substr(half)));
  spit(path("t.txt.zst"), zstd_of(text.substr(0, half)) + zstd_of(text.substr(half)));
  spit(path("no-suffix"), zstd_of(text));  // told by its first bytes
  for (const char* name : {"t.txt.gz", "t.txt.zst", "no-suffix"}) {
    std::vector<InputUnit> units = plan_input_units({path(name)}, "auto", DocSplit::blank_line, 4096);
    ASSERT_EQ(units.size(), 1u) << name << ": a compressed input is one unit";
    EXPECT_TRUE(units[0].compressed);
    EXPECT_EQ(documents_of(units[0]), want) << name;
  }
  // JSONL inside gzip: by its name before the suffix.
  spit(path("d.jsonl.gz"), gzip_of("{\"text\": \"a\"}\n{\"text\": \"b\"}\n"));
  std::vector<InputUnit> units = plan_input_units({path("d.jsonl.gz")}, "auto", DocSplit::blank_line, 4096);
  EXPECT_EQ(documents_of(units[0]), (std::vector<std::string>{"a", "b"}));
  // Truncated and damaged data.
  const std::string z = zstd_of(text), g = gzip_of(text);
  spit(path("cut.zst"), z.substr(0, z.size() / 2));
  spit(path("cut.gz"), g.substr(0, g.size() / 2));
  std::string bad = g;
  bad[20] = char(bad[20] ^ 0x55), bad[21] = char(bad[21] ^ 0x55);
  spit(path("bad.gz"), bad);
  for (const char* name : {"cut.zst", "cut.gz"}) {
    InputUnit u = plan_input_units({path(name)}, "text", DocSplit::blank_line, 4096)[0];
    EXPECT_ERROR_HAS(documents_of(u), "input '" + path(name) + "' ends inside");
  }
  InputUnit u = plan_input_units({path("bad.gz")}, "text", DocSplit::blank_line, 4096)[0];
  EXPECT_ERROR_HAS(documents_of(u), "input '" + path("bad.gz") + "' is");
}

TEST_F(PrepTest, InputPlanning) {
  spit(path("b.txt"), std::string(10000, 'a'));
  spit(path("a.txt"), "x");
  spit(path("c.jsonl"), "{\"text\": \"x\"}\n");
  // A pattern, sorted; large plain files in ranges; --split-docs file keeps files whole.
  std::vector<InputUnit> u = plan_input_units({path("*.txt"), path("c.jsonl")}, "auto", DocSplit::blank_line, 4096);
  ASSERT_EQ(u.size(), 5u);
  EXPECT_EQ(u[0].path, path("a.txt"));
  EXPECT_EQ(u[1].path, path("b.txt"));
  EXPECT_EQ(u[3].begin, 8192);
  EXPECT_EQ(u[3].bytes, 10000 - 8192);
  EXPECT_EQ(u[4].format, InputFormat::jsonl);
  EXPECT_EQ(plan_input_units({path("b.txt")}, "auto", DocSplit::file, 4096).size(), 1u);
  EXPECT_ERROR_HAS(plan_input_units({path("*.none")}, "auto", DocSplit::blank_line, 4096), "matches no file");
  EXPECT_ERROR_HAS(plan_input_units({path("missing.txt")}, "auto", DocSplit::blank_line, 4096),
                   "cannot read input '" + path("missing.txt") + "'");
  EXPECT_ERROR_HAS(plan_input_units({dir}, "auto", DocSplit::blank_line, 4096), "is a directory");
  EXPECT_ERROR_HAS(plan_input_units({"-", "-"}, "auto", DocSplit::blank_line, 4096), "--input - is given twice");
}

TEST(PrepValidation, ExactlyKDocumentsBySeed) {
  for (int64_t n : {1, 2, 10, 1000, 100003})
    for (int64_t k : {int64_t(0), int64_t(1), n / 20, n - 1, n}) {
      if (k < 0 || k > n) continue;
      for (uint64_t seed : {1ull, 1234ull}) {
        ValidationChoice c{n, k, seed};
        int64_t chosen = 0;
        for (int64_t i = 0; i < n; i++) chosen += c.is_val(i, chosen);
        ASSERT_EQ(chosen, k) << "n " << n << " k " << k;
      }
    }
  // The seed changes which documents, not how many; spread over the whole range.
  ValidationChoice a{1000, 50, 1}, b{1000, 50, 2};
  int64_t ca = 0, cb = 0, differ = 0, in_last_half = 0;
  for (int64_t i = 0; i < 1000; i++) {
    const bool va = a.is_val(i, ca), vb = b.is_val(i, cb);
    ca += va, cb += vb, differ += va != vb, in_last_half += va && i >= 500;
  }
  EXPECT_GT(differ, 20);
  EXPECT_GT(in_last_half, 10);
  EXPECT_LT(in_last_half, 40);
}

// ---- MPI: the same data set on 1 and 2 ranks -------------------------------------------------

namespace {

TokenPrepOptions prep_options(const std::string& dir, const std::string& out) {
  TokenPrepOptions o;
  o.tokenizer = "byte";
  o.inputs = {dir + "/*.txt", dir + "/*.jsonl"};
  o.out = out;
  o.val_fraction = 0.1;
  o.shard_tokens = 3000;
  o.split_bytes = 4096;
  return o;
}

void write_inputs(const std::string& dir) {
  std::vector<std::string> unused;
  spit(dir + "/a.txt", awkward_text(11, unused));
  spit(dir + "/b.txt", awkward_text(12, unused));
  std::string jl;
  for (int i = 0; i < 40; i++) jl += nlohmann::json{{"text", "json document " + std::to_string(i)}}.dump() + "\n";
  spit(dir + "/c.jsonl", jl);
}

// A directory every rank sees, with the inputs written by rank 0.
std::string shared_inputs() {
  const std::string dir = testing_support::shared_temp_dir(MPI_COMM_WORLD);
  if (testing_support::world_rank() == 0) write_inputs(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  return dir;
}

}  // namespace

TEST(MpiPrep, SameDataSetOnOneAndTwoRanks) {
  const std::string dir = shared_inputs();
  const int rank = testing_support::world_rank();
  run_token_prep(prep_options(dir, dir + "/two"), MPI_COMM_WORLD);
  if (rank == 0) run_token_prep(prep_options(dir, dir + "/one"), MPI_COMM_SELF);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    EXPECT_EQ(slurp(dir + "/one/manifest.json"), slurp(dir + "/two/manifest.json"));
    PrepManifest m = *read_prep_manifest(dir + "/two");
    EXPECT_GT(m.splits["train"].shards.size(), 2u) << "the test should cut the train split into shards";
    EXPECT_FALSE(fs::exists(dir + "/two/" + kPrepWorkDirName));
    // The stream is what one file of the same documents holds.
    TokenPrepOptions single = prep_options(dir, dir + "/single");
    single.shard_tokens = 1000000;
    run_token_prep(single, MPI_COMM_SELF);
    TokenReader sharded(dir + "/two/train"), file(dir + "/single/train.h5");
    ASSERT_EQ(sharded.n_tokens(), file.n_tokens());
    EXPECT_EQ(sharded.read(0, sharded.n_tokens()), file.read(0, file.n_tokens()));
    fs::remove_all(dir);
  }
}

TEST(MpiPrep, AnErrorOnOneRankReachesAllAndKeepsThePreviousDataSet) {
  const std::string dir = shared_inputs();
  const int rank = testing_support::world_rank();
  run_token_prep(prep_options(dir, dir + "/out"), MPI_COMM_WORLD);
  const std::string before = rank == 0 ? slurp(dir + "/out/manifest.json") : "";
  // A bad line in the JSONL input, which is one unit of one rank.
  if (rank == 0) spit(dir + "/c.jsonl", slurp(dir + "/c.jsonl") + "not json\n");
  MPI_Barrier(MPI_COMM_WORLD);
  TokenPrepOptions o = prep_options(dir, dir + "/out");
  o.seed = 99;
  const std::string e = error_of([&] { run_token_prep(o, MPI_COMM_WORLD); });
  EXPECT_NE(e.find("c.jsonl:41: not valid JSON"), std::string::npos) << e;
  EXPECT_EQ(e.rfind("rank ", 0), 0u) << "one rank read the bad line, and says which: " << e;
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    EXPECT_EQ(slurp(dir + "/out/manifest.json"), before);
    EXPECT_NO_THROW(open_token_file_info(dir + "/out/train"));
    EXPECT_NO_THROW(open_token_file_info(dir + "/out/val"));
    EXPECT_TRUE(leftover_prep_files(dir + "/out").empty());
    fs::remove_all(dir);
  }
}
