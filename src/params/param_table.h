// The flat parameter buffer's table of contents: every tensor of a model (or of the part of it a
// rank holds) as a named slice of ONE contiguous float buffer. Gradients, AdamW moments and any
// low-precision copies use the same layout, so a slice's offset means the same thing in all of
// them.
//
// Order = the order backward finishes the tensors (the model family decides it: head first, the
// last layer down to the first, the embeddings last). The gradients finished so far are then
// always a prefix [0, k) of the flat gradient buffer, so a bucket of them is one contiguous range
// that can be reduced in place, and "gradient ready" is one number: k.
//
// This header knows nothing about any model. params/buckets.h cuts the buffer into the ranges the
// gradient sync and a sharded optimizer work on.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace llmpi {

// How a tensor starts: N(0, std) from a stream keyed by its name, or a constant.
enum class InitKind { normal, zeros, ones };

struct ParamSlice {
  std::string name;        // Hugging Face name, e.g. "h.3.mlp.c_fc.weight"
  std::vector<int> shape;  // row-major, [out, in] for dense weights
  std::string dtype = "float32";
  int layer = -1;          // transformer block index, -1 for embeddings and head
  int role = -1;           // the model's tag for what the tensor does (model/model_desc.h)
  size_t offset = 0, numel = 0;
  bool decay = false;      // AdamW weight decay applies (2-D weights and embeddings)
  InitKind init = InitKind::zeros;
  double init_std = 0;     // for InitKind::normal
  // Tensor parallelism: the slice may hold a shard of the whole model's tensor `name`, of shape
  // whole_shape (empty: the slice is the whole tensor, the same on every rank of the group).
  // split 0: the whole tensor's rows in `ranges` ([begin, end) pairs, concatenated in order);
  // split 1: its columns ranges[0] (a 2-D tensor).
  std::vector<int> whole_shape;
  int split = -1;
  std::vector<std::pair<int, int>> ranges;
  bool sharded() const { return !whole_shape.empty(); }
  size_t whole_numel() const;
};

// A shard's values from the whole tensor's (whole: whole_numel() values; shard: numel), and back.
void take_shard(const ParamSlice& s, const float* whole, float* shard);
void put_shard(const ParamSlice& s, const float* shard, float* whole);

// Slices are appended with add() only (never pushed onto `slices` directly, nor renamed): add()
// keeps the index from name to slice that find() and at() look up, so building a table of n slices
// and looking each up takes time linear in n.
struct ParamTable {
  std::vector<ParamSlice> slices;
  size_t numel = 0;

  // Appends a slice at the end of the buffer; numel from the shape. Throws Error for a duplicate
  // name or a non-positive dimension.
  ParamSlice& add(ParamSlice s);
  const ParamSlice& at(const std::string& name) const;  // throws Error for an unknown name
  const ParamSlice* find(const std::string& name) const;  // null for an unknown name
  size_t end_of(size_t i) const { return slices[i].offset + slices[i].numel; }

 private:
  std::unordered_map<std::string, size_t> index_;  // name -> position in slices
};

// The layout of a 2-byte copy of the buffer (a bf16 Model's weight copy, model/transformer.h):
// each tensor — the adjacent slices of one (layer, role), e.g. BERT's q, k and v parts of one
// QKV weight — starts at a multiple of 128 values (256 bytes), so that every GEMM operand the copy
// hands out is as aligned as cuBLAS's fastest kernels want. The fp32 buffer itself is packed: after
// BERT's classifier ([labels, C] and [labels]) every later tensor starts at an odd float when the
// label count is odd. Fills (*offsets)[i] = slice i's first value in the copy; returns the copy's
// length in values.
size_t aligned_copy_layout(const ParamTable& t, std::vector<size_t>* offsets);

// The table as stored in checkpoints and compared on resume: [{name, shape, offset}, ...].
std::string param_table_json(const ParamTable& t);

// Initial values of every slice into host[0, t.numel): constants, or N(0, init_std) drawn from a
// stream keyed by (seed, the slice's name) — so a tensor gets the same values whatever else is in
// the table (a pipeline stage initialises exactly like the whole model), and a shard the values
// of its part of the whole tensor.
void init_param_values(const ParamTable& t, uint64_t seed, float* host);

// Tracks which slices' gradients are final and reports the growing final prefix: the model calls
// done(i) for each slice whose gradient is complete, then flush(), which calls ready(k) with the
// new prefix end when [0, k) has grown. The ready points are thus derived from the table and the
// order in which backward finishes tensors, never listed by hand.
struct GradReadyTracker {
  const ParamTable* table = nullptr;
  std::vector<char> finished;
  size_t next = 0;      // slices [0, next) are final and reported
  size_t reported = 0;  // the last k reported

  void reset(const ParamTable& t);
  void done(size_t slice) { finished[slice] = 1; }
  // Advance over finished slices; returns the new prefix end when it grew, else 0.
  size_t advance();
  bool complete() const { return next == finished.size(); }
};

}  // namespace llmpi
