// Dataset identity: what a token file or a classification file holds, so that training refuses
// files that do not belong together instead of silently training (or evaluating) on them.
//
// A file's identity is
//   tokenizer     its `tokenizer` attribute: Tokenizer::description, the tokenizer's name and a
//                 hash of the files it was loaded from ("byte", "gpt2:fnv1a64=<16 hex>"); two
//                 files with the same tokenizer identity give the same ids to the same text;
//   content hash  its `content_fnv1a64` attribute (data/content_hash.h), written with the data;
//                 files written before it existed have none and load with a warning;
//   size          tokens (token file) or examples (classification file).
//
// A split of an llmpi-prep data set (data/prep_manifest.h) has the identity its manifest gives:
// the tokenizer, the split's content hash (covering every shard) and its size; the reader checked
// every shard against the manifest when it opened them.
//
// Version 1 (older llmpi-prep and `llmpi-prep glue` builds): DIR/train.h5 and DIR/val.h5 were written
// as one unit: first DIR/train.h5.new and DIR/val.h5.new (complete, each via .tmp + rename), then
// DIR/manifest.json naming both files with their content hashes (atomically), then the two files
// are renamed into place. A file whose directory holds a manifest.json that names it must have the
// content hash the manifest gives, so training either sees a matching pair or refuses (naming the
// leftover *.new files and saying to rerun llmpi-prep).
//
//   manifest.json  {"format": "llmpi-prep-manifest", "version": 1, "tokenizer": "...",
//                   "created_by": "llmpi-prep",
//                   "files": {"train.h5": {"kind": "tokens", "content_fnv1a64": "...", "size": N},
//                             "val.h5":   {...}}}
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "data/prep_manifest.h"

namespace llmpi {

struct TokenFileInfo;
struct ClassificationInfo;


struct DatasetIdentity {
  std::string path;
  std::string kind;          // "tokens" | "classification"
  std::string tokenizer;     // the tokenizer attribute
  std::string content_hash;  // "" when the file predates content hashes
  int64_t size = 0;          // tokens or examples

  // {"kind", "tokenizer", "content_fnv1a64", "size"} (no path: moving a file keeps its identity)
  nlohmann::json json() const;
  // "tokenizer T, content fnv1a64 H, N tokens" for messages
  std::string text() const;
};

DatasetIdentity dataset_identity(const TokenFileInfo& info);
DatasetIdentity dataset_identity(const ClassificationInfo& info);

// What training checks of its files before it starts. Fails (an Error naming both files and both
// identities, and the fix) when the validation file was made by another tokenizer than the
// training file, when a file is not the one its directory's version 1 manifest.json names (an
// interrupted older llmpi-prep), or when the validation data names a data set directory alone (its
// train split) and so is the training data. Returns the warnings to print once: a file without a
// content hash (made before content hashes), leftover files of an interrupted llmpi-prep.
std::vector<std::string> check_training_data(const DatasetIdentity& train, const DatasetIdentity* val);

// The files an interrupted llmpi-prep leaves in `dir` (sorted paths): *.new, *.tmp, its work
// directory, and token files it wrote that the manifest does not name.
std::vector<std::string> leftover_prep_files(const std::string& dir);

// Write a version 1 DIR/manifest.json naming `files` (by their base names) atomically (.tmp, fsync,
// rename), as older builds did (the tests of the version 1 checks use it).
void write_prep_manifest(const std::string& dir, const std::vector<DatasetIdentity>& files,
                         const std::string& created_by);

}  // namespace llmpi
