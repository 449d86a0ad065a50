// Checkpoints: one HDF5 file per save, readable with h5py / h5dump.
//
//   root attributes  format = "llmpi-checkpoint", version = 2, step (steps completed = the next
//                    step to run), optimizer_t, optimizer ("adamw" | "sgd"), sync, world_size,
//                    seed, family ("gpt2" | "llama" | "bert"), model (JSON: the model
//                    description, model/model_desc.h), n_layer, n_head, d_model, seq_len,
//                    vocab_size, config (the resolved config as JSON), param_table (JSON: name,
//                    shape, offset of every tensor)
//   Version 1 files (before model families) have no family/model attributes: they are gpt2
//   models, read as such.
//   datasets         params [rows, n] float32; adam_m, adam_v [rows, n] (AdamW only)
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

#include "model/model_desc.h"
#include "params/param_table.h"

namespace llmpi {

struct CheckpointInfo {
  std::string path;
  int64_t step = 0, optimizer_t = 0;
  std::string optimizer, sync, config_json, param_table_json;
  int64_t world_size = 1, rows = 1;
  uint64_t seed = 0;
  int version = 0;
  ModelDesc desc;  // version 1: the gpt2 description its shape attributes give
  size_t n = 0;  // floats per row
};

struct CheckpointData {
  CheckpointInfo info;
  std::vector<float> params, m, v;  // rows × n, row-major (m, v empty for SGD)
};

void write_checkpoint(const std::string& path, const CheckpointData& d);
CheckpointInfo read_checkpoint_info(const std::string& path);  // validates format and version
// Read one row (0 when the file has one row) of params and moments into the given buffers
// (n floats each; m and v may be null for SGD checkpoints).
void read_checkpoint_row(const CheckpointInfo& info, int64_t row, float* params, float* m, float* v);

// "dir/step-00001234.h5"
std::string checkpoint_path(const std::string& dir, int64_t step);
// The newest checkpoint in dir by step number ("" when there is none).
std::string latest_checkpoint(const std::string& dir);
// Delete all but the newest `keep` checkpoints in dir.
void prune_checkpoints(const std::string& dir, int keep);

}  // namespace llmpi
