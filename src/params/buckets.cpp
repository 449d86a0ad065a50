#include "params/buckets.h"

#include <algorithm>
#include <cmath>

namespace llmpi {

std::vector<Bucket> make_buckets(const ParamTable& t, double bucket_mb, double first_bucket_mb, bool at_layers) {
  // Buckets of several tensors stay at most 2^28 floats; one tensor larger than that is a bucket of
  // its own, of any size (the exchanges move it in pieces of at most INT_MAX: runtime/large_count.h).
  const size_t max_floats = (size_t)1 << 28;
  std::vector<Bucket> out;
  size_t i = 0;
  while (i < t.slices.size()) {
    Bucket b{t.slices[i].offset, t.slices[i].offset + t.slices[i].numel, i, i};
    if (bucket_mb > 0) {
      const double mb = out.empty() ? std::min(first_bucket_mb, bucket_mb) : bucket_mb;
      const size_t cap = (size_t)std::min(mb * 1e6 / sizeof(float), (double)max_floats);
      // Whole tensors are added until the bucket reaches its size; a tensor is never split.
      while (b.end - b.begin < cap && b.last_slice + 1 < t.slices.size() &&
             b.end - b.begin + t.slices[b.last_slice + 1].numel <= max_floats &&
             (!at_layers || t.slices[b.last_slice + 1].layer == t.slices[i].layer)) {
        b.last_slice++;
        b.end += t.slices[b.last_slice].numel;
      }
    }
    out.push_back(b);
    i = b.last_slice + 1;
  }
  return out;
}

void piece_counts(size_t n, int world, std::vector<size_t>& counts, std::vector<size_t>& displs) {
  counts.assign(world, 0);
  displs.assign(world, 0);
  const size_t base = n / world, extra = n % world;
  size_t off = 0;
  for (int r = 0; r < world; r++) {
    counts[r] = base + ((size_t)r < extra ? 1 : 0);
    displs[r] = off;
    off += counts[r];
  }
}

std::vector<ShardPiece> shard_pieces(const std::vector<Bucket>& buckets, int world, int rank) {
  std::vector<ShardPiece> out;
  std::vector<size_t> counts, displs;
  for (const Bucket& b : buckets) {
    piece_counts(b.end - b.begin, world, counts, displs);
    out.push_back({b.begin + displs[rank], b.begin + displs[rank] + counts[rank]});
  }
  return out;
}

double zero2_grad_floats(const std::vector<Bucket>& buckets, const std::vector<ShardPiece>& pieces, size_t numel,
                         bool overlap, int micro_batches, bool each_micro_batch, bool head_writes_last,
                         size_t page_floats) {
  if ((micro_batches > 1 && !each_micro_batch) || buckets.empty()) return (double)numel;
  double mine = 0;
  for (const ShardPiece& p : pieces) mine += (double)(p.end - p.begin);
  // (the running sum's edge pages; the sum itself holds what the pieces hold, in turn)
  const double sum = micro_batches > 1 ? 2.0 * (double)page_floats * (double)buckets.size() : 0;
  // The buckets whole at once are consecutive: the most floats in any run of 1 (3 with overlap) of
  // them, the last bucket set apart when the head writes it first (it is whole throughout).
  const size_t n = buckets.size() - (head_writes_last ? 1 : 0), run = overlap ? 3 : 1;
  double whole = 0;
  for (size_t b = 0; b < n; b++) {
    double w = 0;
    for (size_t j = b; j < std::min(n, b + run); j++) w += (double)(buckets[j].end - buckets[j].begin);
    whole = std::max(whole, w);
  }
  if (head_writes_last) whole += (double)(buckets.back().end - buckets.back().begin);
  const double edges = 4.0 * (double)page_floats * (double)buckets.size();
  const double cap = (double)numel + (micro_batches > 1 ? mine : 0);  // (the buffer and the sum, whole)
  return std::min(cap, mine + whole + edges + sum);
}

size_t block_floats(const ParamTable& table, const Bucket& b) {
  size_t n = 0;
  for (size_t i = b.first_slice; i <= b.last_slice && i < table.slices.size(); i++)
    if (table.slices[i].layer >= 0) n += table.slices[i].numel;
  return n;
}

double device_zero2_grad_floats(const ParamTable& table, const std::vector<Bucket>& buckets,
                                const std::vector<ShardPiece>& pieces, int micro_batches, bool each_micro_batch,
                                size_t chunk_floats) {
  const double whole = std::ceil((double)std::max<size_t>(1, table.numel) / chunk_floats) * (double)chunk_floats;
  if ((micro_batches > 1 && !each_micro_batch) || buckets.empty()) return whole;
  double mine = 0, edges = 0;
  for (const ShardPiece& p : pieces)
    if (p.end > p.begin) mine += (double)(p.end - p.begin), edges += 2.0 * (double)chunk_floats;
  const double backed = mine + edges + device_pages_window_floats(table, buckets, chunk_floats);
  return std::min(whole, backed) + (micro_batches > 1 ? mine : 0);  // (the sum: the pieces' size)
}

double device_pages_window_floats(const ParamTable& table, const std::vector<Bucket>& buckets, size_t chunk_floats) {
  double outside = 0, largest = 0;
  for (const ParamSlice& s : table.slices)
    if (s.layer < 0) outside += (double)s.numel;
  for (const Bucket& b : buckets)  // (the tensors outside the blocks are counted with them)
    largest = std::max(largest, (double)block_floats(table, b));
  return outside + 3.0 * (largest + 2.0 * (double)chunk_floats) + 2.0 * (double)chunk_floats;
}

namespace {

// ZeRO-3's buckets (cut at the blocks) summed: the floats outside the blocks, this rank's pieces of
// the blocks' buckets, how many of those buckets (and how many with a non-empty piece), and the
// largest block.
struct BlockBuckets {
  double outside = 0, mine = 0, buckets = 0, pieces = 0, largest = 0;
  size_t blocks = 0;
};

BlockBuckets block_buckets(const ParamTable& table, const std::vector<Bucket>& buckets,
                           const std::vector<ShardPiece>& pieces) {
  BlockBuckets r;
  std::vector<double> layer_floats;
  for (size_t b = 0; b < buckets.size(); b++) {
    const int l = table.slices[buckets[b].first_slice].layer;
    const double n = (double)(buckets[b].end - buckets[b].begin);
    if (l < 0) {
      r.outside += n;
      continue;
    }
    if ((size_t)l >= layer_floats.size()) layer_floats.resize(l + 1, 0.0);
    layer_floats[l] += n;
    r.buckets += 1;
    if (b < pieces.size() && pieces[b].end > pieces[b].begin)
      r.mine += (double)(pieces[b].end - pieces[b].begin), r.pieces += 1;
  }
  for (double f : layer_floats) r.largest = std::max(r.largest, f), r.blocks += f > 0;
  return r;
}

}  // namespace

double zero3_param_floats(const ParamTable& table, const std::vector<Bucket>& buckets,
                          const std::vector<ShardPiece>& pieces, bool overlap, size_t page_floats) {
  const BlockBuckets k = block_buckets(table, buckets, pieces);
  const double whole = (double)std::min<size_t>(overlap ? 2 : 1, k.blocks) * k.largest;
  return std::min((double)table.numel, k.outside + k.mine + whole + 4.0 * (double)page_floats * k.buckets);
}

double device_zero3_param_floats(const ParamTable& table, const std::vector<Bucket>& buckets,
                                 const std::vector<ShardPiece>& pieces, size_t chunk_floats) {
  const double chunk = (double)chunk_floats;
  const double whole = std::ceil((double)std::max<size_t>(1, table.numel) / chunk) * chunk;
  const BlockBuckets k = block_buckets(table, buckets, pieces);
  return std::min(whole, k.outside + k.mine + 2.0 * chunk * k.pieces + 3.0 * (k.largest + 2.0 * chunk) + 2.0 * chunk);
}

}  // namespace llmpi
