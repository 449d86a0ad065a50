// Gradient synchronisation: how the ranks of a data-parallel group agree on an update. The
// method is chosen at run time (parallel.sync) and is one small type behind one interface
// (comm/exchange.h: allreduce, gather_scatter, nccl; "weights" averages parameters instead of
// gradients). GradSync is the driver every method shares: it cuts the flat gradient into buckets,
// starts each bucket's collective as soon as backward has finished it, runs them on a
// communication thread when overlapping, stages them through host memory when the gradients live
// on a GPU and the method is an MPI one, and counts the bytes.
//
//   gather_scatter  rank 0 MPI_Gathers every rank's gradient, averages element-wise, and
//                   MPI_Scatters the mean back (the textbook baseline)
//   allreduce       MPI_Allreduce(SUM), then divide by the world size
//   weights         no gradient exchange: every rank steps its own optimizer and the parameters
//                   are averaged (MPI_Allreduce) every parallel.average_every steps
//   nccl            (CUDA backend) ncclAllReduce(avg) per bucket on a communication stream that
//                   waits on an event per bucket, overlapping backward (comm/nccl.h)
//
// On the GPU the MPI methods stage each bucket through a host buffer (device -> host, MPI,
// host -> device); the copies synchronise the compute stream, so they do not overlap backward.
//
// Buckets (parallel.bucket_mb; params/buckets.h): the flat gradient is cut, at tensor boundaries
// and in the order backward finishes it, into contiguous buckets of about bucket_mb MB; the first
// is at most first_bucket_mb when overlapping (DDP's trick: the first collective starts early).
//
// ZeRO-1 (parallel.zero 1, SyncOptions::zero): rank r owns piece r of every bucket (shard_pieces)
// and keeps AdamW moments for those floats only (optim/optimizer.h). Per bucket, the gradient is
// reduce-scattered instead of all-reduced, so after finish() the averaged gradient is final only
// in this rank's pieces (the rest of the buffer holds this rank's own, unaveraged gradient and is
// not read); the optimizer updates the pieces and gather_params() all-gathers every bucket, after
// which every rank holds the same full parameters. Per rank and step that moves (W−1)/W·B for the
// reduce-scatter and (W−1)/W·B for the all-gather: all-reduce's 2(W−1)/W·B. "weights" refuses it
// (every rank steps its own optimizer over every parameter). nccl enqueues each bucket's
// ncclReduceScatter during backward as it does its all-reduces, and each bucket's ncclAllGather
// right after the optimizer has updated its piece (comm/nccl.h), the compute stream waiting for
// all of them before the next forward. With overlap,
// the reduce-scatters run on the communication thread during backward as the all-reduces do, and
// each bucket's all-gather runs there while the optimizer updates the next bucket's piece.
//
// ZeRO-2 (parallel.zero 2, SyncOptions::shard_grads): ZeRO-1, and the rank keeps only its pieces
// of the gradient in memory. The gradient buffer keeps its flat layout (the model's backward adds
// into it as ever), but on the CPU backend it is host memory resident only where written
// (backend/host_pages.h): as soon as bucket b is reduce-scattered, the rest of b — the other
// ranks' pieces, this rank's unaveraged copy of them — is released (zero again, its pages back to
// the system), so only the pieces stay resident. Each bucket is reduce-scattered the moment
// backward has finished it: on the communication thread with overlap, which then keeps at most
// two buckets queued (on_ready waits for the older ones first, so no more than three buckets' worth
// of the gradient is whole at once), or without overlap right there in on_ready. The next step
// clears only the pieces (zero_pieces: the rest is zero already), so their pages stay resident
// rather than being faulted in again; every other page is faulted in by the backward that writes
// it, the price of handing it back. The results are ZeRO-1's bit for bit: the same
// reduce-scatters of the same buckets, the same pieces updated.
//
// ZeRO-2 on a GPU (over NCCL, or an MPI method through the host staging; with pipeline stages and
// tensor parallelism too, the gradient then accumulating whole over a pipeline's micro-batches):
// a card does not fault memory in, so the gradient is device pages (backend/cuda_ops.h: address
// space backed chunk by chunk) that
// the sync backs before anything writes them: its pieces for good, the tensors outside the blocks
// before each micro-batch's forward (the fused LM head writes there), and each block's range
// before its backward (grads_needed, called by the engine). After a bucket's reduce-scatter is
// enqueued on NCCL's stream, the rest of the bucket is released on that stream: zeroed where a
// chunk holds other data, given back where whole, once NCCL has passed (with an MPI method: on the
// compute stream, after the staging copies the host waited for). The host runs ahead of
// the card, so backing waits for the oldest releases in flight rather than pass a limit of the
// pieces, the outside tensors and about three buckets. Reducing each micro-batch, the pieces are
// folded into a device sum on the compute stream after each micro-batch's passes, in the CPU's
// order of additions. The results are ZeRO-1's bit for bit with one micro-batch.
//
// ZeRO-2/3 with gradient accumulation (M micro-batches on one stage) reduce-scatter in one of two
// ways (parallel.zero_reduce, SyncOptions::reduce_each_micro_batch):
//   micro_batch  each micro-batch's gradient is reduce-scattered bucket by bucket as its backward
//                finishes it, as above; the reduced piece is added into this rank's running sum of
//                its pieces (the first micro-batch's is copied there) and released with the rest
//                of the bucket, so the next micro-batch's backward starts from a buffer that is
//                zero again; in the last micro-batch the piece becomes the sum plus itself and
//                the sum's pages of that bucket are released. The sum is host memory resident
//                only where written, like the gradient: a bucket's floats are in the sum or in the
//                piece, never both for long, so the gradient stays at its one-micro-batch size
//                (the pieces, the buckets in flight, edge pages), at M times the reduce-scatter
//                traffic. end_micro_batch() (the engine calls it after every micro-batch's
//                backward but the last) waits for that micro-batch's buckets.
//                The pieces hold (((g_1 + g_2) + g_3) ... ) + g_M of the per-micro-batch means,
//                where ZeRO-1 and zero_reduce "step" hold the mean of (g_1 + ... + g_M): the same
//                sum in another order, so equal within fp32 rounding, not bit for bit.
//   step         the gradient accumulates whole over the micro-batches and is reduced once, after
//                the last (as every other method here): ZeRO-1's traffic and bits, but the whole
//                gradient resident until then.
// With pipeline stages the gradient is reduced once per step (the micro-batches are the
// pipeline's, and a stage's tied copy is summed across stages first).
//
// ZeRO-3 (parallel.zero 3, SyncOptions::shard_params; FSDP's layout): ZeRO-2, and the parameters
// of the transformer blocks are held in this rank's pieces too. Buckets are cut at block boundaries
// (make_buckets at_layers), so each block is a run of whole buckets; the parameter buffer keeps its
// flat layout as host memory resident only where written. need_layer(l) all-gathers block l's
// buckets from their owners (the pieces the optimizer updated) just before its forward or backward,
// prefetch_layer starts the next block's gather on the communication thread (with overlap) while
// this one computes, and release_layer(l) hands the other ranks' pieces back afterwards: a rank
// holds its pieces plus at most two blocks whole. The tensors outside the blocks (embeddings, final
// norm, head) stay whole, as with ZeRO-1 (gathered after the update). The forward and backward see
// exactly ZeRO-1's parameters, so the results are ZeRO-1's with the same buckets.
//
// ZeRO-3 on a GPU: the parameters are device pages too, backed only where
// this rank's pieces of the blocks and the tensors outside them lie — initialisation, a checkpoint
// and Hugging Face weights write just those (load_params), so the whole never is on the card at
// once — and where the blocks in use are. need_layer(l) backs block
// l, enqueues its buckets' all-gathers on NCCL's stream (after the compute stream's work so far:
// the update of the pieces) and makes the compute stream wait for them; prefetch_layer enqueues
// the next block's the same way before this one computes, so the gather runs beside it (and, in
// backward, ahead of this block's reduce-scatters on the same stream); release_layer(l) gives the
// other ranks' pieces back once the compute stream has passed the block. The host waits only when
// backing would pass a limit of the pieces, the outside tensors and three blocks
// (device_zero3_param_floats). The gradient is ZeRO-2's device pages. With an MPI method every
// pass goes through the host staging (the host waiting for the copies), and the releases follow it
// on the compute stream.
//
// Gradient type on the wire (parallel.grad_dtype, SyncOptions::bf16): fp32, or bf16 for half the
// bytes, with allreduce (with or without ZeRO-1) and nccl (comm/exchange.h says how each rounds).
// ZeRO-1's all-gather of parameters stays fp32 (every rank must hold the same parameters).
// Accuracy: each rank's gradient is rounded once (relative error ≤ 2^-8, bf16's unit roundoff) and
// every partial sum once more, so an averaged element is within about (1 + ⌈log2 W⌉)·2^-8 of the
// fp32 average (relative to the magnitudes summed). Host staging on the GPU stays fp32 (PCIe).
//
// Overlap (parallel.overlap): a communication thread owns the collectives. Backward reports
// finished gradient prefixes (on_ready); every bucket that is complete is queued at once and
// reduced by that thread while backward goes on with earlier layers; finish() waits for the
// queue to drain. MPICH (ch4) makes progress only inside MPI calls, so a nonblocking collective
// started on the compute thread would sit idle until the next MPI call; the thread drives it.
// With parallel.poll_us > 0 the thread starts a nonblocking collective and polls it with
// MPI_Test, sleeping poll_us between polls, so it leaves the core to the compute thread while
// the network works; poll_us 0 calls the blocking collective (lowest latency, but it spins).
// NCCL needs no thread: its passes are enqueued on its own stream as buckets become ready.
#pragma once
#include <mpi.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <memory>

#include "backend/ops.h"
#include "comm/exchange.h"
#include "params/buckets.h"
#include "params/param_table.h"

namespace llmpi {

struct Tracer;
struct Exchange;

SyncMethod parse_sync_method(const std::string& name);  // throws Error naming the valid ones
const char* sync_method_name(SyncMethod m);

struct SyncOptions {
  SyncMethod method = SyncMethod::allreduce;
  double bucket_mb = 25;
  double first_bucket_mb = 1;
  bool overlap = false;
  int poll_us = 50;
  int average_every = 1;
  bool zero = false;         // ZeRO-1 (above): the optimizer's state and update in pieces
  bool shard_grads = false;  // ZeRO-2 (above): and the gradient's memory too (zero is set)
  bool shard_params = false; // ZeRO-3 (above): and the blocks' parameters (shard_grads is set)
  bool bf16 = false;  // gradients exchanged as bfloat16 (parallel.grad_dtype "bf16"; above)
  bool reduce_each_micro_batch = false;  // ZeRO-2/3 with accumulation: parallel.zero_reduce "micro_batch" (above)
};

// bfloat16 as the exchange stores it (the top 16 bits of an IEEE float): rounding to nearest,
// ties to even (a NaN stays a quiet NaN; values past the largest bf16 round to infinity), and
// the exact widening back.
inline uint16_t bf16_round(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_widen(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

struct SyncStats {
  double comm_ms = 0;          // wall time inside collectives (summed over buckets)
  double exposed_comm_ms = 0;  // time the compute thread waited for communication
  double bytes_sent = 0;       // per rank, as the algorithm moves them
  double bytes_received = 0;
  int collectives = 0;
};

struct GradSync {
  SyncOptions opt;
  MPI_Comm comm;
  int rank = 0, world = 1;
  float* grads;  // the backend's memory (host for cpu, device for cuda)
  const ParamTable* table;
  const Ops* ops;
  std::vector<Bucket> buckets;
  SyncStats step;        // this step's accounting (valid after finish / average_params)
  Tracer* tracer = nullptr;

  // Checks the options and allocates; makes no collective call, so a rank that fails here (or
  // earlier in set-up) cannot leave the others waiting in one. Call connect() once every rank of
  // comm has agreed that set-up succeeded.
  GradSync(const SyncOptions& opt, MPI_Comm comm, const Ops& ops, float* grads, const ParamTable& table,
           Tracer* tracer);
  // Collective over comm: joins the NCCL communicator (parallel.sync = nccl); nothing otherwise.
  // An error on any rank (rank 0 could not make the NCCL id, say) is reported on every rank.
  void connect();
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  bool averages_gradients() const { return opt.method != SyncMethod::weights; }
  // A step of `micro_batches` micro-batches (gradient accumulation; 1 without) begins.
  void begin_step(int micro_batches = 1);
  // ZeRO-2/3 across ranks: the gradient zeroed for the next step by clearing only this rank's
  // pieces (every other float was released, so is zero, when its bucket was reduced), which keeps
  // the pieces' pages resident instead of faulting them in again; returns false (nothing done)
  // otherwise, where the caller zeroes the whole gradient.
  bool zero_pieces();
  void on_ready(size_t k);  // backward: the gradient prefix [0, k) is final (ZeRO-2: reduced here)
  void finish();            // gradients averaged on every rank (no-op for weights)
  // ZeRO-2/3 reducing each micro-batch (above), after the backward of every micro-batch but the
  // last: its remaining buckets reduce-scattered, every bucket's piece added into the running sum,
  // and the buffer zero again before the next micro-batch writes it. No-op otherwise.
  void end_micro_batch();
  // Whether this sync reduces each micro-batch of this step as its backward finishes it.
  bool reducing_micro_batches() const { return micro_batches_ > 1 && each_micro_; }
  // ZeRO-2 on a GPU ("ZeRO-2 on a GPU" above), no-ops otherwise: the gradient of block l backed
  // before its backward writes it, or with l < 0 every tensor outside the blocks (before each
  // micro-batch's forward: the fused LM head writes its gradient there).
  bool pages_grads() const { return pages_; }
  void grads_needed(int l);
  size_t grads_backed_peak() const;  // the most gradient bytes backed at once so far (else 0)
  size_t params_backed_peak() const; // ZeRO-3 on a GPU: the most parameter bytes backed at once (else 0)
  // weights: average `params` over ranks when (step + 1) % average_every == 0. Returns whether it did.
  bool average_params(float* params, int64_t step);

  // Bytes of one gradient element in the exchange: 2 with bf16, else 4.
  size_t grad_wire_bytes() const { return opt.bf16 ? 2 : sizeof(float); }
  // Expected bytes one rank sends (and receives) for one collective pass over n floats (with
  // zero: the reduce-scatter, in grad_wire_bytes() per element, and the all-gather, in fp32).
  double expected_bytes_per_pass(size_t n_floats) const;

  // ZeRO-1. shard: this rank's piece of every bucket (the whole bucket when zero is off).
  std::vector<ShardPiece> shard;
  // After finish(): update(b) is called for every bucket b in order (the optimizer on piece b),
  // and bucket b's parameters are all-gathered from their owners, so that every rank holds the
  // full updated parameters; with overlap, bucket b's all-gather runs while update(b+1) computes.
  // Without zero (or at world size 1) it only calls update(b) for every b. ZeRO-3 gathers only
  // the buckets outside the blocks (the blocks' are gathered when used: need_layer).
  void gather_params(float* params, const std::function<void(size_t)>& update);

  // ZeRO-3 (no-ops otherwise, and at world size 1). `params`: the model's parameters (set before
  // the first call). Block l of this chunk's [l0, l1) whole on return from need_layer(l) (gathered
  // now unless prefetched); prefetch_layer(l) starts that gather on the communication thread (with
  // overlap; nothing without, or for l outside the chunk); release_layer(l) keeps only this rank's
  // pieces of block l. release_layers() releases every block: after the parameters were written
  // whole (initialisation, a checkpoint, Hugging Face weights).
  float* params = nullptr;
  // Sets params (written whole on the CPU: ZeRO-3 hands the blocks back to this rank's pieces);
  // on a GPU it sets the limit of the parameters' device pages, and nothing of them is backed
  // until load_params.
  void attach_params(float* p);
  // The parameters from a whole host copy in the table's layout: ZeRO-3 on a GPU writes (and
  // backs) only this rank's pieces of the blocks and the tensors outside them; otherwise the whole
  // is copied and the blocks released (release_layers).
  void load_params(const float* host);
  void need_layer(int l);
  void prefetch_layer(int l);
  void release_layer(int l);
  void release_layers();
  // ZeRO-3: whether bucket b holds a block's parameters (gathered when used, not after the update).
  bool layer_bucket(size_t b) const { return opt.shard_params && bucket_layer_[b] >= 0; }
  // Checkpoints: the per-rank state `compact` (host memory; the concatenation of this rank's
  // pieces in bucket order, as optim/optimizer.h stores m and v) assembled in the flat layout on
  // rank 0 of comm, into `full` (resized there to the table's numel; untouched elsewhere).
  // Collective over comm.
  void gather_sharded(const float* compact, std::vector<float>& full);
  // The reverse, with no communication: this rank's pieces of a flat-layout `full` (host memory).
  std::vector<float> pieces_of(const float* full) const;
  // The same from the backend's memory (device memory on a GPU): reads only the pieces.
  std::vector<float> pieces_to_host(const float* full) const;

 private:
  std::unique_ptr<Exchange> exchange_;  // the method's collectives (comm/exchange.h); nccl: from connect()
  size_t next_launch_ = 0;         // buckets [0, next_launch_) have been started this step
  bool reduced_all_ = false;       // finish() has reduced every bucket since begin_step
  bool device_ = false;            // buffers live in device memory
  float* staging_ = nullptr;       // page-locked host copy of the gradients (an MPI method on a GPU, world > 1)
  // communication thread (overlap)
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  struct Job {
    size_t bucket;
    float* params;  // all-gather these parameters (zero), or average the gradient when null
  };
  std::deque<Job> queue_;
  size_t launched_ = 0, completed_ = 0;  // jobs this step (a job's ticket: launched_ after it)
  std::vector<size_t> reduce_ticket_;    // ZeRO-2 with overlap: bucket b's reduce job
  // ZeRO-3: each bucket's block (-1 outside the blocks); per block of the chunk its buckets
  // [first, end), whether it is whole, and the ticket of its gather in flight (0: none).
  std::vector<int> bucket_layer_;
  struct LayerState {
    size_t first = 0, end = 0;
    bool whole = true;
    size_t ticket = 0;            // (on a GPU: 1 while its gathers are enqueued and not waited for)
    void* gathered = nullptr;     // on a GPU: the event after its gathers on NCCL's stream
  };
  int l0_ = 0;
  std::vector<LayerState> layers_;
  bool stop_ = false;
  // Reducing each micro-batch: whether that applies to this sync (ZeRO-2/3, more than one rank),
  // this step's micro-batches, those ended so far, and the running sum of this rank's pieces
  // (bucket b's at micro_sum_offset_[b]).
  bool each_micro_ = false;
  int micro_batches_ = 1, micro_ = 0;
  float* micro_sum_ = nullptr;  // host_pages_alloc'd: resident only where written
  size_t micro_sum_floats_ = 0;
  std::vector<size_t> micro_sum_offset_;
  // Reducing each micro-batch: bucket b's reduced piece into the running sum and cleared (a
  // micro-batch but the last), or the sum added into it (the last).
  void fold_micro_batch(size_t b);
  // ZeRO-2 on a GPU: the gradient as device pages; its ranges outside the blocks and per block.
  bool pages_ = false;
  std::vector<std::pair<size_t, size_t>> outside_;
  std::map<int, std::pair<size_t, size_t>> layer_range_;
  void fold_pieces_on_device(bool last);
  // ZeRO-3 on a GPU ("ZeRO-3 on a GPU" above): the parameters as device pages; block s's gathers
  // enqueued on NCCL's stream.
  bool pages_params_ = false;
  void gather_layer_on_device(LayerState& s);

  // Queues a job for the communication thread, bucket b's gradient average or, given `params`, the
  // all-gather of those parameters, and returns its ticket (0 without a thread).
  size_t launch(size_t b, float* params = nullptr);
  void wait_ticket(size_t ticket);  // the jobs up to this ticket done
  // The buckets not started yet this step (or micro-batch) reduced, on the thread (and every job
  // waited for) or here: what finish() and end_micro_batch() wait for.
  void reduce_the_rest();
  // ZeRO-2/3: bucket b's floats of base outside this rank's piece, released (zero, pages returned).
  void release_others(float* base, size_t b);
  LayerState* layer_state(int l);   // ZeRO-3 and world > 1: block l's state, else null
  // One collective pass over bucket b of base (gradients or parameters), averaged; with zero,
  // gradients are reduce-scattered (mean in this rank's piece only).
  void reduce(float* base, size_t b, const std::string& label);
  // zero: bucket b's pieces of base, each from its owner, gathered into every rank's copy.
  void all_gather(float* base, size_t b, const std::string& label);
  void account(double t0, double t_end, double t1, const Traffic& moved, const std::string& label, size_t n);
  void comm_loop();
};

}  // namespace llmpi
