// Sharded checkpoints (format version 3): every tensor is a dataset of its own, its values written
// by the ranks that hold them and read by the ranks that need them, whatever the layout of either
// run. No rank assembles the model.
//
// The file (HDF5, readable with h5py):
//   root attributes  those of version 2 (checkpoint/checkpoint.h), version = 3, and
//                    replicas: 1, or the world size under sync "weights" (each rank's own state)
//   params/NAME, adam_m/NAME, adam_v/NAME (AdamW)
//                    one float32 dataset per tensor of the whole model, NAME as in the parameter
//                    table, of the tensor's shape ([replicas, shape...] when replicas > 1),
//                    contiguous: its bytes lie at one offset of the file, row-major
//   each dataset's attribute crc32c_rects: int64 [k, 6] rows (replica, row0, rows, col0, cols,
//                    crc): the CRC-32C (runtime/crc32c.h) of the float32 little-endian bytes of
//                    each rectangle one rank wrote, row-major; together they cover the dataset
//                    exactly once. A tensor is seen as [rows, cols] (a vector as [n, 1]).
//
// Writing (train/checkpointing.cpp): every rank copies what it writes to host staging and sums
// its checksums; rank 0 gathers the checksums and creates NAME.tmp with every attribute and every
// dataset allocated (not filled); then each rank writes its rectangles' bytes at the datasets'
// offsets through MPI-IO (independent writes), syncs, and once every rank has, rank 0 renames the
// file into place. HDF5 is called by rank 0 alone, so the library needs no MPI (Debian's serial
// build) and no thread safety for the bytes written in the background (checkpoint.async).
//
// Reading: any process opens the file read-only and reads the rectangles it needs (HDF5
// hyperslabs). Verification reads every checksummed rectangle once, the rectangles shared among
// the readers (verify_share). Versions 1 and 2 are read the same way: their one [rows, n] dataset
// per state, a tensor at its table offset, their checksums in blocks of 2^20 values of a row.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "data/h5_util.h"
#include "params/param_table.h"

namespace llmpi {

// A rectangle of a whole tensor seen as [rows, cols].
// The version of the format this file describes (checkpoint.h: versions 1 and 2 before it).
constexpr int kShardedVersion = 3;

struct TensorRect {
  int64_t row0 = 0, rows = 0, col0 = 0, cols = 0;
  int64_t numel() const { return rows * cols; }
};

// A tensor of this shape seen as [rows, cols]: [n, 1] for a vector, [shape[0], rest] otherwise.
std::pair<int64_t, int64_t> rows_cols(const std::vector<int>& shape);

// The rectangles of the whole tensor whose values are slice s's values [lo, hi) in order: the
// rectangles' row-major values, one after the other, are those values. s may hold all of its
// tensor or a tensor-parallel shard (ParamSlice::split, ranges).
std::vector<TensorRect> slice_rects(const ParamSlice& s, size_t lo, size_t hi);

// The three states a checkpoint holds, as groups of the file (datasets of versions 1 and 2).
enum StateGroup : int { kParams = 0, kAdamM = 1, kAdamV = 2 };
const char* state_group_name(int group);

// One rectangle a rank writes: values of tensor `tensor` (index in the whole table) of `group`.
struct RectWrite {
  int group = 0;
  int tensor = 0;
  int64_t replica = 0;
  TensorRect rect;
  const float* data = nullptr;  // rect.numel() values, row-major
  uint32_t crc = 0;             // of those values (rect_crcs fills it)
};

// Fills every w.crc.
void rect_crcs(std::vector<RectWrite>& writes);

// Rank 0 of comm receives every rank's rectangles (without data) and creates `tmp`: the
// attributes of `info` (version 3, info.rows replicas), one allocated dataset per (group, tensor)
// for groups [0, groups), each with its rectangles' checksums. Checks that the rectangles cover
// each dataset exactly (an Error naming the tensor otherwise: a layout bug, never written).
// Returns on every rank the byte offset of every dataset in the file, index group * tensors +
// tensor. Collective over comm; an error on any rank is an Error with the same message on every rank.
std::vector<uint64_t> create_sharded_file(MPI_Comm comm, const std::string& tmp, const CheckpointInfo& info,
                                          const ParamTable& whole, int groups, const std::vector<RectWrite>& mine);

// Writes the rectangles' bytes into the open file at the datasets' offsets (independent MPI-IO
// writes; not collective, so it may run on a thread of its own). Returns "" or the error.
std::string write_rects(MPI_File fh, const ParamTable& whole, int64_t replicas, const std::vector<uint64_t>& offsets,
                        const std::vector<RectWrite>& writes, const std::string& tmp);

// A checkpoint open for reading by tensor rectangles, of any version.
struct CheckpointReader {
  CheckpointInfo info;
  ParamTable whole;  // the file's table (its param_table attribute)
  h5::Id file;

  explicit CheckpointReader(const CheckpointInfo& i);  // CheckpointDamaged when it cannot be opened
  // Reads rectangle r of tensor `tensor` (index in `whole`) of `group` of replica `replica` into
  // out, row-major. Unverified: CheckpointDamaged only when HDF5 cannot read it.
  void read(int group, size_t tensor, int64_t replica, const TensorRect& r, float* out) const;
  // Reads and checks the checksums of share `part` of `parts` of the file's checksummed units in
  // groups [0, groups); CheckpointDamaged naming the dataset and the values on a mismatch. With
  // parts = 1 the whole file (groups) is verified.
  void verify_share(int groups, int part, int parts) const;
};

// The whole table a checkpoint's param_table attribute describes (names, shapes, offsets).
ParamTable param_table_from_json(const std::string& json, const std::string& path);

}  // namespace llmpi
