// Ranges of the flat parameter buffer (params/param_table.h) that the gradient sync and the
// optimizer work on, as pure functions of the table:
//
//   Bucket      a contiguous run of whole tensors, in backward order (a prefix of the flat
//               buffer is always final first, so a bucket is ready as one range). make_buckets
//               cuts the table into buckets of about bucket_mb MB; the first at most
//               first_bucket_mb (DDP's trick: the first collective can start early during
//               backward). bucket_mb 0 = one bucket per tensor; a huge bucket_mb = one bucket.
//   ShardPiece  ZeRO-1's cut of every bucket among the `world` ranks of a data-parallel group:
//               piece r of n floats holds n/world floats, one more for the first n mod world
//               ranks. Rank r owns piece r of every bucket: its optimizer state covers exactly
//               those floats (optim/optimizer.h), and the sync reduce-scatters into them
//               (comm/grad_sync.h).
#pragma once
#include <cstddef>
#include <vector>

#include "params/param_table.h"

namespace llmpi {

struct Bucket {
  size_t begin, end;                 // float offsets into the flat buffer, [begin, end)
  size_t first_slice, last_slice;    // table slices it holds, inclusive
};

// Contiguous buckets over the table's slices. Every slice is in exactly one bucket; a tensor is
// never split. at_layers: neither is a layer (a bucket holds one block's tensors, or only tensors
// outside the blocks), so that a block's parameters are whole buckets (ZeRO-3).
std::vector<Bucket> make_buckets(const ParamTable& table, double bucket_mb, double first_bucket_mb,
                                 bool at_layers = false);

struct ShardPiece {
  size_t begin, end;  // float offsets into the flat buffer, [begin, end)
};
// One piece per bucket, in bucket order (empty when a bucket has fewer floats than ranks).
std::vector<ShardPiece> shard_pieces(const std::vector<Bucket>& buckets, int world, int rank);
// The piece sizes and offsets (relative to the bucket's begin) of every rank, for a bucket of n.
void piece_counts(size_t n, int world, std::vector<size_t>& counts, std::vector<size_t>& displs);

// ZeRO-2's gradient at its peak on this rank (comm/grad_sync.h), in floats: with one micro-batch,
// its pieces, plus the buckets whole at once — the one backward is writing and, with overlap, the
// two before it the communication thread may still hold (the largest such run of consecutive
// buckets); plus the bucket of a tensor the head writes first
// and the embedding last (`head_writes_last`: the tied token embedding, the last slice), which stays
// whole all through backward — plus, per bucket, the four partial pages (page_floats each) at the
// ends of its piece and of itself, cleared but resident. With micro_batches > 1 the gradient
// accumulates whole until the last micro-batch (the whole table), unless each micro-batch is
// reduced (each_micro_batch, parallel.zero_reduce "micro_batch"): then the one-micro-batch figure,
// the running sum of the pieces standing in for the pieces between micro-batches, plus the two
// partial pages per bucket at the ends of its range in the sum.
double zero2_grad_floats(const std::vector<Bucket>& buckets, const std::vector<ShardPiece>& pieces, size_t numel,
                         bool overlap, int micro_batches, bool each_micro_batch, bool head_writes_last,
                         size_t page_floats);

// The floats of bucket b that belong to blocks (the rest lie outside them: embeddings, final norm,
// head).
size_t block_floats(const ParamTable& table, const Bucket& b);
// The chunk of device pages (backend/cuda_ops.h): the allocation granularity of current cards,
// which the estimates assume (the sync uses the card's own).
constexpr size_t kDeviceChunkBytes = size_t(2) << 20;
// ZeRO-2 on a GPU: what the sync lets be backed besides this rank's pieces, in floats — the
// tensors outside the blocks, three of the largest block part of a bucket with two partial chunks
// each, and two chunks more.
double device_pages_window_floats(const ParamTable& table, const std::vector<Bucket>& buckets, size_t chunk_floats);
// ZeRO-2 on a GPU (device pages, backend/cuda_ops.h; comm/grad_sync.h), in floats: the limit the
// sync sets on the backed gradient — this rank's pieces (each with up to two partial chunks of
// chunk_floats at its ends) and the tensors outside the blocks backed throughout, three of the
// largest block part of a bucket with two partial chunks each, and two chunks more — at most the whole table
// rounded up to chunks; with micro_batches > 1 the whole table unless each micro-batch is reduced
// (each_micro_batch), which adds the running sum of the pieces (plain device memory).
double device_zero2_grad_floats(const ParamTable& table, const std::vector<Bucket>& buckets,
                                const std::vector<ShardPiece>& pieces, int micro_batches, bool each_micro_batch,
                                size_t chunk_floats);

// ZeRO-3's parameters at their peak on this rank, in floats: the tensors outside the blocks whole,
// this rank's pieces of the blocks', one block whole (two with overlap: the next one's gather in
// flight), plus four partial pages per block bucket. `table`'s layer marks the blocks; the buckets
// are cut at layers (make_buckets at_layers).
double zero3_param_floats(const ParamTable& table, const std::vector<Bucket>& buckets,
                          const std::vector<ShardPiece>& pieces, bool overlap, size_t page_floats);
// ZeRO-3 on a GPU (device pages; comm/grad_sync.h), in floats: the limit the sync sets on the
// backed parameters — the tensors outside the blocks and this rank's pieces of the blocks' (each
// with up to two partial chunks at its ends) backed throughout, three of the largest block whole
// (the one computing, the next one's gather in flight, the one whose release the card has not yet
// passed) with two partial chunks each, and two chunks more — at most the whole table rounded up
// to chunks.
double device_zero3_param_floats(const ParamTable& table, const std::vector<Bucket>& buckets,
                                 const std::vector<ShardPiece>& pieces, size_t chunk_floats);

// Whether this rank writes tensor i of its chunk's table to a checkpoint (checkpoint/sharded.h):
// data-parallel replicas take tensors in turn, unless every rank holds values of its own (`own`:
// ZeRO-1's pieces of the moments, sync "weights"); of a tensor the whole tensor-parallel group
// holds (not `tp_sharded`), its ranks take turns too. Each value is so written once over the world.
inline bool writes_tensor(size_t i, bool tp_sharded, bool own, int dp, int dp_rank, int tp, int tp_rank) {
  if (!own && (int)(i % (size_t)dp) != dp_rank) return false;
  return tp_sharded || (int)((own ? i : i / (size_t)dp) % (size_t)tp) == tp_rank;
}

}  // namespace llmpi
