// HDF5 token files ("token shards"): what llmpi-prep writes and llmpi-train reads.
//
// Layout (version 1; readable with h5py / h5dump):
//   /tokens          1-D dataset, uint16 (little-endian) when vocab_size <= 65535, else uint32;
//                    chunked (65,536 tokens per chunk); documents concatenated with eot_id
//                    between them
//   root attributes  format     = "llmpi-tokens"     (variable-length UTF-8 string)
//                    version    = 1                  (int64)
//                    vocab_size                      (int64) every id is < vocab_size
//                    eot_id                          (int64)
//                    tokenizer  = Tokenizer::description, e.g. "byte", "gpt2:fnv1a64=..."
//                    created_by = the program that wrote it, e.g. "llmpi-prep"
//                    content_fnv1a64 = FNV-1a 64 of the tokens, each as a uint32 little-endian,
//                                 16 hex digits (data/content_hash.h). Files written before it
//                                 existed have none; they still load (training warns).
//
// A reader opens one token file or a split of an llmpi-prep data set directory (data/prep_manifest.h:
// DIR, DIR/train, DIR/val.h5, ...): a split's shards are read as one stream, their concatenation in
// the manifest's order, so a window may span two shards; each read is a hyperslab of the shards it
// touches. Opening a split checks every shard (present, a valid token file, the token count and
// content hash the manifest gives, the manifest's vocabulary, end-of-text id and tokenizer); info()
// describes the whole split (its size, the split's content hash).
//
// Every problem (missing file, not HDF5, not an llmpi token file, unsupported version, damaged
// or truncated file, id out of range, read out of range, a shard that is not the manifest's) is an
// llmpi::Error naming the file and the fix; the HDF5 library's own error printing is switched off.
#pragma once

#include "data/h5_util.h"

#include <cstdint>
#include <string>
#include <vector>

namespace llmpi {

inline constexpr const char* kTokenFileFormat = "llmpi-tokens";
inline constexpr int kTokenFileVersion = 1;

// What the writer records besides the tokens.
struct TokenFileAttrs {
  int64_t vocab_size = 0;
  int64_t eot_id = 0;
  std::string tokenizer;   // Tokenizer::description
  std::string created_by;  // e.g. "llmpi-prep"
};

// What a reader finds in a file.
struct TokenFileInfo {
  std::string path;
  int version = 0;
  int64_t vocab_size = 0;
  int64_t eot_id = 0;
  std::string tokenizer;
  std::string created_by;  // "" when absent
  std::string content_hash;  // content_fnv1a64, "" when absent (an older file)
  int64_t n_tokens = 0;
  int dtype_bytes = 0;  // 2 (uint16) or 4 (uint32)
  std::string dtype;    // "uint16" | "uint32"
  int64_t chunk = 0;    // tokens per chunk, 0 when the dataset is not chunked
  // A split of a data set directory: its name, the manifest followed, the number of shards.
  std::string split;     // "" for a single file
  std::string manifest;  // "" for a single file
  int64_t n_shards = 1;
};

// Write tokens to `path` atomically: the file is written as path + ".tmp", closed, synced and
// renamed, so `path` is either the old file, absent, or complete. Every token must be
// < a.vocab_size (checked while writing). Throws Error on failure and leaves no .tmp behind.
void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens,
                      const TokenFileAttrs& a);

// The same file written in pieces, for files larger than memory: create() with the final token
// count, append() until that many tokens were given (pieces of any size: they are gathered into
// writes of kWriteTokens), finish() (attributes, flush, sync, rename; returns the content hash). A
// writer destroyed before finish() removes its .tmp.
struct TokenFileWriter {
  static constexpr size_t kWriteTokens = size_t(1) << 20;
  void create(const std::string& path, int64_t n_tokens, const TokenFileAttrs& a);
  void append(const uint32_t* tokens, size_t n);
  std::string finish();

 private:
  void write_pending();
  std::vector<uint32_t> pending_;
  h5::TmpFileGuard guard_{"", true};  // declared first: removes the .tmp after the handles close
  std::string path_, tmp_;
  TokenFileAttrs attrs_;
  int64_t n_tokens_ = 0, written_ = 0;
  uint64_t hash_ = 0;
  h5::Id file_, dset_, space_;
};

// Reads windows of a token file or of a data set's split. Open once, read many hyperslabs; closes
// itself. A split keeps at most kMaxOpenShards shard files open (the least recently read closes).
// Reads bypass HDF5's chunk cache: windows are scattered, and an open file then costs only its
// metadata.
struct TokenReader {
  static constexpr int kMaxOpenShards = 128;
  TokenReader() = default;
  explicit TokenReader(const std::string& path) { open(path); }

  // Open and validate (attributes, dataset shape and type; for a split every shard against the
  // manifest). Throws Error with the fix.
  void open(const std::string& path);
  void close();
  bool is_open() const { return !shards_.empty(); }

  int64_t n_tokens() const { return info_.n_tokens; }
  const TokenFileInfo& info() const { return info_; }
  // At most this many shard files open at once (>= 1; default kMaxOpenShards). Before open().
  void set_max_open_shards(int n) { max_open_shards_ = n < 1 ? 1 : n; }
  int open_shard_files() const { return n_open_; }

  // Read tokens [start, start + count) into out[0..count) as int32, reading only that
  // hyperslab (of each shard it spans). Out of [0, n_tokens) is an Error; so is any id >= vocab_size.
  void read(int64_t start, int64_t count, int32_t* out);
  std::vector<int32_t> read(int64_t start, int64_t count);

  // The files read, in stream order (one for a single file).
  struct Shard {
    std::string path;
    int64_t offset = 0, n_tokens = 0;  // where it starts in the stream, its size
    std::string content_hash;          // its content_fnv1a64 attribute
  };
  const std::vector<Shard>& shards() const { return shards_; }

 private:
  struct Handles {
    h5::Id file, dset, space;
    uint64_t last_use = 0;
  };
  TokenFileInfo info_;
  std::vector<Shard> shards_;
  std::vector<Handles> handles_;  // one per shard; closed ones are invalid
  uint64_t clock_ = 0;
  int n_open_ = 0, max_open_shards_ = kMaxOpenShards;
  Handles& open_shard(size_t i);
  void read_shard(size_t i, int64_t start, int64_t count, int32_t* out);
};

// Open, validate and describe a token file or split (then close it).
TokenFileInfo open_token_file_info(const std::string& path);
// The same for one file as it is, not followed through a data set's manifest.
TokenFileInfo open_single_token_file_info(const std::string& path);

}  // namespace llmpi
