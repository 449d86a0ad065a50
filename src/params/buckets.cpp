#include "params/buckets.h"

#include <algorithm>

namespace llmpi {

std::vector<Bucket> make_buckets(const ParamTable& t, double bucket_mb, double first_bucket_mb) {
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
             b.end - b.begin + t.slices[b.last_slice + 1].numel <= max_floats) {
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
                         bool overlap, int micro_batches, bool head_writes_last, size_t page_floats) {
  if (micro_batches > 1 || buckets.empty()) return (double)numel;
  double mine = 0;
  size_t largest = 0;
  for (const ShardPiece& p : pieces) mine += (double)(p.end - p.begin);
  for (const Bucket& b : buckets) largest = std::max(largest, b.end - b.begin);
  double whole = (double)(overlap ? 3 : 1) * (double)largest;
  if (head_writes_last) whole += (double)(buckets.back().end - buckets.back().begin);
  const double edges = 4.0 * (double)page_floats * (double)buckets.size();
  return std::min((double)numel, mine + whole + edges);
}

}  // namespace llmpi
