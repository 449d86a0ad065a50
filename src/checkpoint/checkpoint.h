// Checkpoints: one HDF5 file per save, readable with h5py / h5dump. Training writes version 3,
// every tensor a dataset of its own written by the ranks that hold it (checkpoint/sharded.h);
// versions 1 and 2, below, are still read (and version 2 written by write_checkpoint, for tools).
//
//   root attributes  format = "llmpi-checkpoint", version = 2, step (steps completed = the next
//                    step to run), optimizer_t, optimizer ("adamw" | "sgd"), sync, world_size,
//                    seed, family ("gpt2" | "llama" | "bert"), model (JSON: the model
//                    description, model/model_desc.h), n_layer, n_head, d_model, seq_len,
//                    vocab_size, config (the resolved config as JSON), param_table (JSON: name,
//                    shape, offset of every tensor)
//   Version 1 files (before model families) have no family/model attributes: they are gpt2
//   models, read as such.
//                    data (JSON: the identity of the training and validation files,
//                    data/dataset_identity.h: {"train": {...}, "val": {...}}; absent in older files)
//                    lineage (the id of the run that wrote it, train/run_dir.h: pruning removes
//                    only the run's own lineage; absent in older files)
//   datasets         params [rows, n] float32; adam_m, adam_v [rows, n] (AdamW only); each
//                    with the attributes crc32c (uint32 [rows x ceil(n / crc32c_block)]: the
//                    CRC-32C, runtime/crc32c.h, of every block of crc32c_block = 2^20 values of
//                    a row, over their float32 little-endian bytes) and crc32c_block, computed
//                    from the data written and verified by every read. The file's metadata
//                    (superblock, object headers with the attributes) uses the HDF5 1.8 formats,
//                    which carry checksums too. Older files have no checksums: they load with a
//                    warning. (HDF5's own Fletcher-32 filter made writes 3-4x slower: docs/PERF.md.)
//
// rows = 1 when every rank holds the same state (gradient averaging), or the world size for
// sync "weights", whose ranks hold their own parameters between averages (row r = rank r).
// The RNG and sampler state are functions of (seed, step), and the LR schedule of the step, so
// `step` restores them exactly; a resumed run repeats an uninterrupted one bit for bit.
//
// Files are written to NAME.tmp, flushed, fsynced and renamed (then the directory fsynced), so a
// crash or a full disk never destroys the previous checkpoint.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/h5_util.h"
#include "model/model_desc.h"
#include "params/param_table.h"
#include "runtime/error.h"

namespace llmpi {

// The file cannot be used: unreadable, truncated, not a checkpoint, or a checksum does not match.
// (A checkpoint that reads fine but belongs to another configuration is a plain Error.) The
// message names the file and, for a checksum, the dataset and row. `--resume auto` skips such
// files and falls back to the newest one that verifies.
struct CheckpointDamaged : Error {
  using Error::Error;
};

struct CheckpointInfo {
  std::string path;
  int64_t step = 0, optimizer_t = 0;
  std::string optimizer, sync, config_json, param_table_json;
  int64_t world_size = 1, rows = 1;
  uint64_t seed = 0;
  int version = 0;
  ModelDesc desc;  // version 1: the gpt2 description its shape attributes give
  size_t n = 0;  // floats per row
  std::string data_json;    // identity of the data files ("" in older files)
  bool checksummed = false;  // the datasets carry CRC-32C block checksums (false: an older file)
  std::string lineage;       // the run that wrote it (train/run_dir.h); "" in older files
};

struct CheckpointData {
  CheckpointInfo info;
  std::vector<float> params, m, v;  // rows × n, row-major (m, v empty for SGD)
};

// Writes a version-2 file (one [rows, n] dataset per state) from one process.
void write_checkpoint(const std::string& path, const CheckpointData& d);
// The root attributes every version shares (format, version, step, ..., lineage), on `file`.
void write_checkpoint_attributes(hid_t file, const CheckpointInfo& i, int version, const std::string& what);
// Opens a checkpoint read-only: an Error when it does not exist, CheckpointDamaged when it is not
// a readable HDF5 file.
h5::Id open_checkpoint_file(const std::string& path);
// Validates format and version. A file that cannot be read is CheckpointDamaged; a version this
// build does not read is a plain Error.
CheckpointInfo read_checkpoint_info(const std::string& path);
// Read one row (0 when the file has one row; of version 3, replica `row`) of params and moments into the given buffers
// (n floats each; m and v may be null for SGD checkpoints). A checksum mismatch or read failure
// is CheckpointDamaged naming the dataset, the row and the elements.
void read_checkpoint_row(const CheckpointInfo& info, int64_t row, float* params, float* m, float* v);
// Read (and so verify) every row of every dataset; CheckpointDamaged on the first failure.
void verify_checkpoint(const CheckpointInfo& info);

// "dir/step-00001234.h5"
std::string checkpoint_path(const std::string& dir, int64_t step);
// The newest checkpoint in dir by step number ("" when there is none).
std::string latest_checkpoint(const std::string& dir);
// Every checkpoint in dir, newest (highest step) first.
std::vector<std::string> checkpoints_newest_first(const std::string& dir);
// Delete all but the newest `keep` checkpoints of `lineage` in dir; checkpoints of other lineages,
// older files without one and files that cannot be read are never touched.
void prune_checkpoints(const std::string& dir, int keep, const std::string& lineage);

}  // namespace llmpi
