// HDF5 classification files (GLUE-style sentence / sentence-pair tasks): what `llmpi-prep glue`
// writes and a model.family bert run reads. The language-modelling layout is in token_file.h.
//
// Layout (version 1; readable with h5py / h5dump). N examples, each padded to L tokens:
//   /input_ids       [N, L] int32 (little-endian)   every id is in [0, vocab_size)
//   /token_type_ids  [N, L] uint8                   0 = first segment, 1 = second segment
//   /attention_mask  [N, L] uint8                   1 = real token, 0 = padding
//   /labels          [N]    int32 (little-endian)   every label is in [0, num_labels)
//   All four are contiguous (not chunked): training reads a few dozen scattered rows per step,
//   and a contiguous row is one read of L values, where a chunk would read (and cache) many rows.
//   root attributes  format      = "llmpi-classification"   (variable-length UTF-8 string)
//                    version     = 1                        (int64)
//                    vocab_size                             (int64)
//                    num_labels                             (int64) >= 1
//                    label_names = 1-D attribute of num_labels variable-length UTF-8 strings,
//                                  label_names[k] naming label k (h5py: list of str)
//                    pad_id                                 (int64) in [0, vocab_size)
//                    tokenizer   = Tokenizer::description
//                    created_by  = the program that wrote it, e.g. "llmpi-prep glue"
//                    content_fnv1a64 = FNV-1a 64 (data/content_hash.h) of input_ids (int32 LE),
//                                  then token_type_ids and attention_mask (one byte each), then
//                                  labels (int32 LE), 16 hex digits; older files have none
//
// Every problem (missing file, not HDF5, not a classification file — in particular a
// language-modelling token file —, unsupported version, damaged or truncated file, shape or type
// mismatch, value out of range, index out of range) is an llmpi::Error naming the file, the problem
// and the fix; the HDF5 library's own error printing is switched off.
#pragma once

#include "data/h5_util.h"

#include <cstdint>
#include <string>
#include <vector>

namespace llmpi {

inline constexpr const char* kClassificationFileFormat = "llmpi-classification";
inline constexpr int kClassificationFileVersion = 1;

// What the writer records besides the examples.
struct ClassificationAttrs {
  int64_t vocab_size = 0;
  int num_labels = 0;
  std::vector<std::string> label_names;  // exactly num_labels names, label k is label_names[k]
  int64_t pad_id = 0;
  std::string tokenizer;   // Tokenizer::description
  std::string created_by;  // e.g. "llmpi-prep glue"
};

// What a reader finds in a file.
struct ClassificationInfo {
  std::string path;
  int version = 0;
  int64_t n_examples = 0;
  int seq_len = 0;
  int64_t vocab_size = 0;
  int num_labels = 0;
  std::vector<std::string> label_names;
  int64_t pad_id = 0;
  std::string tokenizer;
  std::string created_by;    // "" when absent
  std::string content_hash;  // content_fnv1a64, "" when absent (an older file)
};

// n examples of seq_len tokens, row-major: input_ids, token_type_ids and attention_mask hold
// n * seq_len values (example i is [i * seq_len, (i + 1) * seq_len)), labels holds n. All int32 in
// memory, whatever their type in the file, so the model needs no conversions.
struct ClassificationExamples {
  int seq_len = 0;
  std::vector<int32_t> input_ids, token_type_ids, attention_mask, labels;
  int64_t size() const { return int64_t(labels.size()); }
};

// Write examples to `path` atomically: the file is written as path + ".tmp", closed, synced and
// renamed, so `path` is either the old file, absent, or complete. Everything is checked before
// anything is written (seq_len >= 1, consistent sizes, ids < vocab_size, labels in
// [0, num_labels), token types and mask values 0/1, num_labels names, pad_id < vocab_size).
// Throws Error on failure and leaves no .tmp behind.
void write_classification_file(const std::string& path, const ClassificationExamples& ex,
                               const ClassificationAttrs& a);

// Reads examples of a classification file. Open once, read many; closes itself.
struct ClassificationReader {
  ClassificationReader() = default;
  explicit ClassificationReader(const std::string& path) { open(path); }

  // Open and validate (attributes, dataset ranks, shapes and types). Throws Error with the fix.
  void open(const std::string& path);
  void close();
  bool is_open() const { return input_ids_.valid(); }

  int64_t n_examples() const { return info_.n_examples; }
  const ClassificationInfo& info() const { return info_; }

  // Read the examples with the given indices (any order, repeats allowed, each in [0, n_examples))
  // into out (resized; out.seq_len = info().seq_len), reading only those rows of each dataset.
  // An index out of range, an id >= vocab_size, a label outside [0, num_labels) or a token type /
  // mask value other than 0/1 is an Error naming the file and the example.
  void read(const std::vector<int64_t>& indices, ClassificationExamples& out);

 private:
  ClassificationInfo info_;
  h5::Id file_, input_ids_, token_type_ids_, attention_mask_, labels_;
};

// Open, validate and describe a classification file (then close it). Both this and
// ClassificationReader::open take a file, or a classification split of a data set directory
// (data/prep_manifest.h: DIR/train.h5, DIR/dev.h5, DIR/dev; DIR alone is its train split).
ClassificationInfo open_classification_file_info(const std::string& path);

// The root 'format' attribute of an HDF5 file: "llmpi-classification", "llmpi-tokens", ... or ""
// when the file is missing, unreadable, not HDF5 or has no string 'format'; for a split of an
// llmpi-prep data set directory (data/prep_manifest.h) the format of its files. Never throws, so a
// program can choose its message before opening the file with the reader it expects, e.g. "this is
// a language-modelling token file, but model.family bert needs a classification file".
std::string hdf5_format_of(const std::string& path);

}  // namespace llmpi
