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
// Every problem (missing file, not HDF5, not an llmpi token file, unsupported version, damaged
// or truncated file, id out of range, read out of range) is an llmpi::Error naming the file and
// the fix; the HDF5 library's own error printing is switched off.
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
};

// Write tokens to `path` atomically: the file is written as path + ".tmp", closed, synced and
// renamed, so `path` is either the old file, absent, or complete. Every token must be
// < a.vocab_size (checked before writing). Throws Error on failure and leaves no .tmp behind.
void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens,
                      const TokenFileAttrs& a);


// Reads windows of a token file. Open once, read many hyperslabs; closes itself.
struct TokenReader {
  TokenReader() = default;
  explicit TokenReader(const std::string& path) { open(path); }

  // Open and validate (attributes, dataset shape and type). Throws Error with the fix.
  void open(const std::string& path);
  void close();
  bool is_open() const { return dset_.valid(); }

  int64_t n_tokens() const { return info_.n_tokens; }
  const TokenFileInfo& info() const { return info_; }

  // Read tokens [start, start + count) into out[0..count) as int32, reading only that
  // hyperslab. Out of [0, n_tokens) is an Error; so is any id >= vocab_size.
  void read(int64_t start, int64_t count, int32_t* out);
  std::vector<int32_t> read(int64_t start, int64_t count);

 private:
  TokenFileInfo info_;
  h5::Id file_, dset_, fspace_;
};

// Open, validate and describe a token file (then close it).
TokenFileInfo open_token_file_info(const std::string& path);

}  // namespace llmpi
