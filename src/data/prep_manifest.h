// An llmpi-prep data set directory: its manifest (version 2), how a path names a split of it, and
// the rules for writing into a directory.
//
// A data set is a directory DIR that llmpi-prep wrote:
//   DIR/manifest.json        the data set: each split with its files ("shards"), in stream order
//   DIR/train.h5, DIR/val.h5 a split held in one token file (at most --shard-tokens tokens), or
//   DIR/train-00000.h5 ...   a split cut into numbered shards of --shard-tokens tokens each (the last
//                            one shorter); the split is their concatenation, one token stream
//   DIR/train.h5, DIR/dev.h5 `llmpi-prep glue`'s classification splits (kind "classification",
//                            data/classification_file.h): one file each; sizes count examples
// Re-making DIR writes the new files under names the current manifest does not use (generation
// G > 1: train.gG.h5, train-00000.gG.h5), then replaces manifest.json with one rename (the switch),
// then deletes the previous generation's files. Readers follow the manifest, so DIR holds one
// complete data set at every moment: the old one until the rename, the new one after it.
//
// manifest.json, version 2:
//   {"format": "llmpi-prep-manifest", "version": 2, "generation": G, "created_by": "llmpi-prep",
//    "tokenizer": T, "vocab_size": V, "eot_id": E,
//    "splits": {"train": {"kind": "tokens", "content_fnv1a64": H, "size": TOKENS, "documents": D,
//                         "shards": [{"file": "train-00000.h5", "tokens": n, "content_fnv1a64": h},
//                                    ...]},
//               "val": {...}}}
// A split's content_fnv1a64 (its identity, data/dataset_identity.h) is its file's when it has one
// shard; with several it is FNV-1a 64 over, for each shard in order, its token count and its content
// hash, each as 8 bytes little-endian (split_content_hash). A data set of classification splits
// only has eot_id -1 (none); its "tokens" and "size" count examples. Version 1 manifests (an older
// llmpi-prep or `llmpi-prep glue`) list "files" by name; dataset_identity.h checks files against them.
//
// Naming a split (data.train, data.val, llmpi-prep inspect): DIR means its train split; DIR/train
// and DIR/train.h5 the train split, DIR/val and DIR/val.h5 the val split, resolved through the
// manifest whether or not a file of that name exists. A path to one shard file is that file alone,
// which must be the file the manifest names. A directory of shards without a manifest is refused.
// Classification splits are named the same way (DIR/train.h5, DIR/dev.h5, DIR/dev); their reader
// (data/classification_file.h) follows the manifest to the split's one file.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/dir_lock.h"

namespace llmpi {

inline constexpr const char* kPrepManifestName = "manifest.json";
inline constexpr const char* kPrepManifestFormat = "llmpi-prep-manifest";
inline constexpr int kPrepManifestVersion = 2;
// Where llmpi-prep keeps its intermediate files while it runs (inside --out).
inline constexpr const char* kPrepWorkDirName = ".llmpi-prep-work";
// The lock llmpi-prep holds on --out while it writes there (open_prep_destination).
inline constexpr const char* kPrepLockName = ".llmpi-prep.lock";

struct ShardEntry {
  std::string file;  // name inside the data set directory
  int64_t tokens = 0;
  std::string content_hash;  // the file's content_fnv1a64
};

inline constexpr const char* kTokensSplitKind = "tokens";
inline constexpr const char* kClassificationSplitKind = "classification";

struct SplitEntry {
  std::string kind = kTokensSplitKind;  // or kClassificationSplitKind
  std::string content_hash;  // split_content_hash(shards)
  int64_t size = 0;          // tokens, the shards' sum
  int64_t documents = 0;
  std::vector<ShardEntry> shards;
};

struct PrepManifest {
  int version = kPrepManifestVersion;
  int64_t generation = 1;
  std::string created_by, tokenizer;
  int64_t vocab_size = 0, eot_id = 0;
  std::map<std::string, SplitEntry> splits;  // version 2
  std::map<std::string, std::string> v1_files;  // version 1: file name -> content hash
  // Every file the manifest names (shards, or version 1 files), by name.
  std::vector<std::string> files() const;
};

// FNV-1a 64 of a split's shard list (see above); one shard: its own hash.
std::string split_content_hash(const std::vector<ShardEntry>& shards);

// "train.h5" / "train-00003.h5" for generation 1, "train.g2.h5" / "train-00003.g2.h5" after it.
std::string shard_file_name(const std::string& split, int64_t index, int64_t n_shards, int64_t generation);

// DIR/manifest.json: nullopt when there is none or it is another program's file (no llmpi-prep
// format); an Error when it is llmpi-prep's but unreadable, not JSON or malformed.
std::optional<PrepManifest> read_prep_manifest(const std::string& dir);
// Write DIR/manifest.json (version 2) atomically: .tmp, fsync, rename, fsync DIR. The rename is
// the data set's switch.
void write_prep_manifest_v2(const std::string& dir, const PrepManifest& m);
// Write `text` as DIR/manifest.json that way (any version).
void write_manifest_file(const std::string& dir, const std::string& text);

// What a data path names (see "Naming a split" above).
struct TokenDataRef {
  std::string path;   // as given
  std::string dir;    // the data set directory when a manifest was followed, else ""
  std::string split;  // the split's name when the path names a split, else ""
  std::vector<std::string> files;  // the token files to read, in order (full paths)
  std::optional<PrepManifest> manifest;
  // A single file named by a version 2 manifest: what the manifest says it holds.
  std::optional<ShardEntry> listed;
  const SplitEntry* split_entry() const { return split.empty() ? nullptr : &manifest->splits.at(split); }
  std::string manifest_path() const;
};
// Resolve `path`; an Error naming the problem and the fix when it names a directory without a
// manifest, a split the manifest lacks, ...
TokenDataRef resolve_token_data(const std::string& path);

// The format a data path holds when it names a split through a manifest ("llmpi-tokens" or
// "llmpi-classification"), else "".
std::string manifest_format_of(const std::string& path);

// Writing into an output directory: llmpi-prep writes into a directory that does not exist, is
// empty (but for the run's own input files), or holds an llmpi-prep data set (a manifest), and
// otherwise only when told to overwrite. Files it may replace or delete there are its own: names
// it gives (train*.h5 / val*.h5 / dev*.h5 written by llmpi-prep or llmpi-prep glue, *.tmp, *.new),
// the manifest's files, its work directory.
// One llmpi-prep at a time in a directory: the run holds DIR/.llmpi-prep.lock (runtime/dir_lock.h)
// from before it looks at DIR until it ends, so a second run on the same --out is refused before it
// removes or writes anything, naming the first (host, pid); a lock whose holder died is taken over.
struct PrepDestination {
  std::string dir;
  std::optional<PrepManifest> manifest;  // the current data set, if any
  std::vector<std::string> leftovers;    // its own files the manifest does not name (full paths)
  int64_t next_generation = 1;
  bool created = false;  // the directory did not exist before
  std::unique_ptr<DirLock> lock;         // held while this value lives (reset it to let go earlier)
  std::vector<std::string> notes;        // lines to print: a stale lock taken over, no lock support
};
// Claim `dir` (creating it when missing; taking its lock) and inspect it. Error when another
// llmpi-prep holds it (naming that run and the fix), and when it holds files llmpi-prep did not make
// (other than `inputs`) and `overwrite` is false, naming one of them and the fix (another --out, or
// --overwrite).
PrepDestination open_prep_destination(const std::string& dir, bool overwrite,
                                      const std::vector<std::string>& inputs = {});
// The tests' fault injection at the steps of a switch: with LLMPI_PREP_TEST_CRASH=NAME in the
// environment, the process kills itself (SIGKILL) at the point called NAME.
void prep_crash_point(const char* name);

// Is this entry of an output directory one llmpi-prep may have written (by name, and for a final
// token file name, by its created_by attribute)?
bool is_prep_output(const std::string& dir, const std::string& name);

}  // namespace llmpi
