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
// llmpi-prep writes DIR/train.h5 and DIR/val.h5 as one unit: first DIR/train.h5.new and
// DIR/val.h5.new (complete, each via .tmp + rename), then DIR/manifest.json naming both files with
// their content hashes (atomically), then renames the two files into place. A file whose directory
// holds a manifest.json that names it must have the content hash the manifest gives, so whatever
// moment llmpi-prep is killed at, training either sees a matching pair or refuses (naming the
// leftover *.new files and saying to rerun llmpi-prep).
//
//   manifest.json  {"format": "llmpi-prep-manifest", "version": 1, "tokenizer": "...",
//                   "created_by": "llmpi-prep",
//                   "files": {"train.h5": {"kind": "tokens", "content_fnv1a64": "...", "size": N},
//                             "val.h5":   {...}}}
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace llmpi {

struct TokenFileInfo;
struct ClassificationInfo;

inline constexpr const char* kPrepManifestName = "manifest.json";
inline constexpr const char* kPrepManifestFormat = "llmpi-prep-manifest";

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
// training file, or when a file is not the one its directory's manifest.json names (an
// interrupted llmpi-prep). Returns the warnings to print once: a file without a content hash
// (made before content hashes), leftover *.new files of an interrupted llmpi-prep.
std::vector<std::string> check_training_data(const DatasetIdentity& train, const DatasetIdentity* val);

// The *.new files llmpi-prep leaves in `dir` when it is interrupted (sorted paths).
std::vector<std::string> leftover_prep_files(const std::string& dir);

// Write DIR/manifest.json naming `files` (by their base names) atomically (.tmp, fsync, rename).
void write_prep_manifest(const std::string& dir, const std::vector<DatasetIdentity>& files,
                         const std::string& created_by);

}  // namespace llmpi
