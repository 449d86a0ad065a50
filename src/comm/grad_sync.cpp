#include "comm/grad_sync.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>

#include "backend/cuda_ops.h"
#include "backend/host_pages.h"
#include "runtime/large_count.h"
#include "comm/nccl.h"
#include "runtime/clock.h"
#include "metrics/trace.h"
#include "runtime/error.h"

namespace llmpi {

namespace {

// The trace's name for one collective pass over bucket b.
std::string bucket_label(SyncMethod m, bool zero, bool params, size_t b) {
  if (params) return "all-gather parameters bucket " + std::to_string(b);
  return std::string(sync_method_name(m)) + (zero ? " reduce-scatter" : "") + " bucket " + std::to_string(b);
}

}  // namespace

SyncMethod parse_sync_method(const std::string& name) {
  SyncMethod m{};
  if (!parse_option(name, &m)) fail("parallel.sync: unknown method '", name, "'; valid: ", option_words<SyncMethod>());
  return m;
}

const char* sync_method_name(SyncMethod m) { return option_name(m); }

GradSync::GradSync(const SyncOptions& o, MPI_Comm c, const Ops& ops_, float* g, const ParamTable& t, Tracer* tr)
    : opt(o), comm(c), grads(g), table(&t), ops(&ops_), tracer(tr) {
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  device_ = ops->on_gpu();
  // The small first bucket only helps when collectives start during backward (overlap).
  buckets = make_buckets(t, opt.bucket_mb, opt.overlap ? opt.first_bucket_mb : opt.bucket_mb, opt.shard_params);
  const std::string err = sync_choice_error(opt.method, opt.zero, opt.bf16 ? GradDtype::bf16 : GradDtype::fp32,
                                            opt.overlap);
  if (!err.empty()) fail(err);
  if ((opt.shard_grads && !opt.zero) || (opt.shard_params && !opt.shard_grads))
    fail("internal: a ZeRO stage without the stages below it");
  shard = shard_pieces(buckets, opt.zero ? world : 1, opt.zero ? rank : 0);
  if (opt.reduce_each_micro_batch && !opt.shard_grads)
    fail("internal: reducing each micro-batch without ZeRO-2's gradient pieces");
  each_micro_ = opt.reduce_each_micro_batch && world > 1 && averages_gradients();
  // ZeRO-2 on a GPU: the gradient is device pages (the engine's Model, backend/cuda_ops.h) backed
  // where the pieces are now, and block by block before backward writes it (grads_needed).
  pages_ = opt.shard_grads && device_ && world > 1 && averages_gradients();
  pages_params_ = pages_ && opt.shard_params;  // (the Model's parameters: attach_params)
  if (pages_) {
    for (const ShardPiece& p : shard) cuda_pages_back(grads, p.begin * sizeof(float), (p.end - p.begin) * sizeof(float));
    for (const ParamSlice& s : t.slices) {
      if (s.layer < 0) {
        outside_.push_back({s.offset, s.offset + s.numel});
        continue;
      }
      std::pair<size_t, size_t>& r = layer_range_[s.layer];
      r = r.second == 0 ? std::make_pair(s.offset, s.offset + s.numel)
                        : std::make_pair(std::min(r.first, s.offset), std::max(r.second, s.offset + s.numel));
    }
    // At most about three buckets whole at once besides the pieces and the tensors outside the
    // blocks (as on the CPU), so that the host, which runs ahead of the card, waits for the oldest
    // releases rather than back the whole gradient.
    const size_t chunk_floats = cuda_pages_chunk(grads) / sizeof(float);
    cuda_pages_limit(grads, cuda_pages_backed(grads) +
                                (size_t)device_pages_window_floats(t, buckets, chunk_floats) * sizeof(float));
  }
  if (each_micro_) {
    size_t off = 0;
    for (const ShardPiece& p : shard) micro_sum_offset_.push_back(off), off += p.end - p.begin;
    micro_sum_floats_ = off;
    const size_t bytes = std::max<size_t>(1, off) * sizeof(float);
    micro_sum_ = static_cast<float*>(pages_ ? ops->alloc(bytes) : host_pages_alloc(bytes));
  }
  reduce_ticket_.assign(buckets.size(), 0);
  for (const Bucket& b : buckets) bucket_layer_.push_back(t.slices[b.first_slice].layer);
  if (opt.shard_params) {  // each block of the chunk: its run of whole buckets (make_buckets at_layers)
    int lo = INT_MAX, hi = -1;
    for (int l : bucket_layer_)
      if (l >= 0) lo = std::min(lo, l), hi = std::max(hi, l);
    if (hi >= 0) {
      l0_ = lo;
      layers_.assign(hi - lo + 1, LayerState{});
      for (size_t b = buckets.size(); b-- > 0;) {  // (the table holds the blocks from the last to the first)
        if (bucket_layer_[b] < 0) continue;
        LayerState& s = layers_[bucket_layer_[b] - lo];
        if (s.end == 0) s.first = b, s.end = b + 1;
        else if (b + 1 == s.first) s.first = b;
        else fail("internal: a block's parameters are not one run of buckets");
      }
    }
  }
  if (opt.method == SyncMethod::nccl) {
    std::string why;
    if (!device_)
      fail("parallel.sync \"nccl\" needs the CUDA backend on a GPU (runtime.device \"cuda\"); on the CPU use "
           "\"allreduce\"");
    if (!nccl_available(&why)) fail("parallel.sync \"nccl\": ", why, "; use \"allreduce\"");
    return;  // the communicator is made in connect(), after every rank's set-up has succeeded
  }
  if (device_) {
    if (opt.overlap)
      fail("parallel.overlap with an MPI method on the GPU is not supported yet (the host staging copies "
           "synchronise the compute stream): use parallel.sync \"nccl\", or parallel.overlap=false");
    // Pinned, so the device-host copies run at full speed; not needed when nothing is exchanged.
    if (world > 1) staging_ = static_cast<float*>(cuda_host_alloc(t.numel * sizeof(float)));
  }
  exchange_ = make_exchange(opt.method, opt.bf16, comm);
  if (opt.overlap && world > 1) {
    int provided = 0;
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_MULTIPLE)
      fail("parallel.overlap needs MPI_THREAD_MULTIPLE, but this MPI library provides level ", provided,
           ": set parallel.overlap=false or use an MPI built with thread support");
    thread_ = std::thread([this] { comm_loop(); });
  }
}

void GradSync::connect() {
  if (opt.method == SyncMethod::nccl && !exchange_) exchange_ = make_exchange(opt.method, opt.bf16, comm);  // collective
}

GradSync::~GradSync() {
  for (LayerState& s : layers_) cuda_event_free(s.gathered);
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_work_.notify_all();
    thread_.join();
  }
  exchange_.reset();
  cuda_host_free(staging_);
  if (pages_) ops->free(micro_sum_);
  else host_pages_free(micro_sum_, std::max<size_t>(1, micro_sum_floats_) * sizeof(float));
}

double GradSync::expected_bytes_per_pass(size_t n) const {
  if (world == 1 || !exchange_) return 0;
  return exchange_->expected_bytes_per_pass(n, opt.zero);
}

bool GradSync::zero_pieces() {
  if (pages_) {  // (every other float backed was zeroed as its bucket was released, or when backed)
    for (const ShardPiece& p : shard) ops->zero(grads + p.begin, (p.end - p.begin) * sizeof(float));
    return true;
  }
  if (!opt.shard_grads || world == 1 || !averages_gradients() || !reduced_all_) return false;
  for (const ShardPiece& p : shard) std::memset(grads + p.begin, 0, (p.end - p.begin) * sizeof(float));
  return true;
}

void GradSync::begin_step(int micro_batches) {
  step = SyncStats{};
  next_launch_ = 0;
  reduced_all_ = false;
  micro_batches_ = std::max(1, micro_batches);
  micro_ = 0;
  std::lock_guard<std::mutex> lock(mu_);
  if (completed_ != launched_) fail("internal: a step began with communication in flight");
  launched_ = completed_ = 0;
}

// One collective pass over bucket b of base: afterwards it holds the mean over ranks (with zero:
// only this rank's piece of it does).
void GradSync::reduce(float* base, size_t b, const std::string& label) {
  const double t0 = now_ms();
  const size_t begin = buckets[b].begin, n = buckets[b].end - begin;
  const bool staged = device_ && !exchange_->device_memory();  // an MPI method on a GPU: through the host
  float* data = staged ? staging_ + begin : base + begin;
  if (staged) ops->copy_to_host(data, base + begin, n * sizeof(float));
  const int poll = opt.overlap ? opt.poll_us : 0;
  const bool zero = opt.zero && averages_gradients();
  const Traffic moved = zero ? exchange_->reduce_scatter_mean(data, n, poll) : exchange_->average(data, n, poll);
  // (The averaging multiply is local work; at about 1 ns a float it is counted as communication.)
  if (zero && base == grads && reducing_micro_batches() && !pages_) fold_micro_batch(b);
  if (opt.shard_grads && zero && base == grads) release_others(grads, b);
  const double t_end = now_ms();
  if (staged) {  // back: the whole bucket, or this rank's piece
    const ShardPiece p = zero ? shard[b] : ShardPiece{begin, begin + n};
    ops->copy_to_device(base + p.begin, staging_ + p.begin, (p.end - p.begin) * sizeof(float));
  }
  account(t0, t_end, now_ms(), moved, label, n);
}

// zero: every rank's piece of bucket b (final on its owner) into every rank's copy of the bucket.
void GradSync::all_gather(float* base, size_t b, const std::string& label) {
  const double t0 = now_ms();
  const size_t begin = buckets[b].begin, n = buckets[b].end - begin;
  const bool staged = device_ && !exchange_->device_memory();
  float* data = staged ? staging_ + begin : base + begin;
  if (staged) ops->copy_to_host(staging_ + shard[b].begin, base + shard[b].begin,
                                (shard[b].end - shard[b].begin) * sizeof(float));
  const Traffic moved = exchange_->all_gather(data, n, opt.overlap ? opt.poll_us : 0);
  const double t_end = now_ms();
  if (staged) ops->copy_to_device(base + begin, data, n * sizeof(float));
  account(t0, t_end, now_ms(), moved, label, n);
}

void GradSync::fold_micro_batch(size_t b) {
  const ShardPiece& p = shard[b];
  float* piece = grads + p.begin;
  float* sum = micro_sum_ + micro_sum_offset_[b];
  const size_t n = p.end - p.begin;
  if (micro_ + 1 < micro_batches_) {
    if (micro_ == 0) std::memcpy(sum, piece, n * sizeof(float));
    else
      for (size_t i = 0; i < n; i++) sum[i] += piece[i];
    host_pages_release(piece, n * sizeof(float));  // (with the rest of the bucket: zero for the next one)
    return;
  }
  for (size_t i = 0; i < n; i++) piece[i] = sum[i] + piece[i];
  host_pages_release(sum, n * sizeof(float));
}

// Device pages: every bucket's reduced piece into the running sum and cleared (a micro-batch but
// the last: the sum, the first time, is a copy), or the sum added into it (the last), in
// fold_micro_batch's order of additions, on the compute stream.
void GradSync::fold_pieces_on_device(bool last) {
  for (size_t b = 0; b < buckets.size(); b++) {
    const ShardPiece& p = shard[b];
    const size_t n = p.end - p.begin;
    if (n == 0) continue;
    float* piece = grads + p.begin;
    float* sum = micro_sum_ + micro_sum_offset_[b];
    if (last) {
      ops->residual_forward(piece, sum, piece, n);
      continue;
    }
    if (micro_ == 0) ops->copy(sum, piece, n * sizeof(float));
    else ops->residual_forward(sum, sum, piece, n);
    ops->zero(piece, n * sizeof(float));
  }
}

void GradSync::grads_needed(int l) {
  if (!pages_) return;
  if (l < 0) {
    for (const auto& [lo, hi] : outside_) cuda_pages_back(grads, lo * sizeof(float), (hi - lo) * sizeof(float));
    return;
  }
  auto it = layer_range_.find(l);
  if (it == layer_range_.end()) return;
  cuda_pages_back(grads, it->second.first * sizeof(float), (it->second.second - it->second.first) * sizeof(float));
}

size_t GradSync::grads_backed_peak() const { return pages_ ? cuda_pages_peak(grads) : 0; }
size_t GradSync::params_backed_peak() const { return pages_params_ && params ? cuda_pages_peak(params) : 0; }

void GradSync::release_others(float* base, size_t b) {
  const Bucket& k = buckets[b];
  const ShardPiece& p = shard[b];
  const size_t lo = p.end > p.begin ? p.begin : k.end;  // (an empty piece: the whole bucket)
  if ((pages_ && base == grads) || (pages_params_ && base == params)) {
    // gradients: zero after NCCL's pass has read the bucket, given back then; parameters: after the
    // compute stream's work so far (the block's forward or backward)
    void* s = base == grads ? exchange_->device_stream() : nullptr;
    cuda_pages_release(base, k.begin * sizeof(float), (lo - k.begin) * sizeof(float), s);
    if (p.end > p.begin) cuda_pages_release(base, p.end * sizeof(float), (k.end - p.end) * sizeof(float), s);
    return;
  }
  host_pages_release(base + k.begin, (lo - k.begin) * sizeof(float));
  if (p.end > p.begin) host_pages_release(base + p.end, (k.end - p.end) * sizeof(float));
}

void GradSync::account(double t0, double t_end, double t1, const Traffic& moved, const std::string& label,
                       size_t n) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    step.comm_ms += t_end - t0;
    step.bytes_sent += moved.sent;
    step.bytes_received += moved.received;
    step.collectives += moved.collectives;
  }
  if (tracer && tracer->enabled) {
    char args[96];
    std::snprintf(args, sizeof args, "{\"floats\":%zu,\"MB\":%.3f}", n, n * 4 / 1e6);
    tracer->span(label, opt.overlap ? 1 : 0, t0, t1, args);
  }
}

void GradSync::comm_loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_work_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_
      job = queue_.front();
      queue_.pop_front();
    }
    if (job.params)
      all_gather(job.params, job.bucket, bucket_label(opt.method, opt.zero, true, job.bucket));
    else
      reduce(grads, job.bucket, bucket_label(opt.method, opt.zero, false, job.bucket));
    {
      std::lock_guard<std::mutex> lock(mu_);
      completed_++;
    }
    cv_done_.notify_all();
  }
}

size_t GradSync::launch(size_t b, float* params) {
  if (!thread_.joinable()) return 0;  // no overlap: finish() reduces every bucket in order
  size_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({b, params});
    ticket = ++launched_;
  }
  cv_work_.notify_one();
  return ticket;
}

void GradSync::wait_ticket(size_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_done_.wait(lock, [&] { return completed_ >= ticket; });
}

void GradSync::on_ready(size_t k) {
  if (!averages_gradients() || world == 1) return;
  // Reduced here: enqueued on the device as each bucket fills (no thread needed), or ZeRO-2 without
  // a thread (each bucket's memory returned as backward goes on). Else queued for the thread, or
  // (no thread) left to finish().
  const bool here = exchange_->device_memory() || (opt.shard_grads && !thread_.joinable());
  if (!here && !thread_.joinable()) return;
  const double t0 = now_ms();
  bool waited = false;
  while (next_launch_ < buckets.size() && buckets[next_launch_].end <= k) {
    const size_t b = next_launch_++;
    if (here) {
      reduce(grads, b, bucket_label(opt.method, opt.zero, false, b));
      continue;
    }
    if (opt.shard_grads && b >= 2) {  // ZeRO-2: at most two buckets queued (the gradient whole in at most three)
      waited = true;
      wait_ticket(reduce_ticket_[b - 2]);
    }
    reduce_ticket_[b] = launch(b);
  }
  if (!exchange_->device_memory() && (here || waited)) step.exposed_comm_ms += now_ms() - t0;
}

void GradSync::finish() {
  if (!averages_gradients() || world == 1) return;
  const double t0 = now_ms();
  if (exchange_->device_memory()) {
    // Enqueued: the compute stream waits for every bucket, the host does not. The time on the
    // communication stream is not measured here (see the trace / Nsight).
    for (; next_launch_ < buckets.size(); next_launch_++)
      reduce(grads, next_launch_, bucket_label(opt.method, opt.zero, false, next_launch_));
    exchange_->order_compute_after();
    if (pages_ && reducing_micro_batches()) fold_pieces_on_device(true);
    step.comm_ms = 0;
    return;
  }
  reduce_the_rest();
  if (pages_ && reducing_micro_batches()) fold_pieces_on_device(true);  // (an MPI method on a GPU)
  const double t1 = now_ms();
  step.exposed_comm_ms += t1 - t0;
  reduced_all_ = true;
  if (tracer && tracer->enabled && thread_.joinable()) tracer->span("wait for gradients", 0, t0, t1);
}

void GradSync::reduce_the_rest() {
  if (thread_.joinable()) {
    while (next_launch_ < buckets.size()) launch(next_launch_++);
    size_t last = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last = launched_;
    }
    wait_ticket(last);
  } else {  // (ZeRO-2 reduced the buckets backward finished in on_ready)
    for (; next_launch_ < buckets.size(); next_launch_++)
      reduce(grads, next_launch_, bucket_label(opt.method, opt.zero, false, next_launch_));
  }
}

void GradSync::end_micro_batch() {
  if (!reducing_micro_batches()) return;
  if (micro_ + 1 >= micro_batches_) fail("internal: end_micro_batch after the step's last micro-batch");
  const double t0 = now_ms();
  reduce_the_rest();
  if (pages_) {  // the pieces into the sum on the compute stream, once NCCL's passes have finished
    exchange_->order_compute_after();
    fold_pieces_on_device(false);
  }
  const double t1 = now_ms();
  step.exposed_comm_ms += t1 - t0;
  if (tracer && tracer->enabled && thread_.joinable()) tracer->span("wait for the micro-batch's gradients", 0, t0, t1);
  next_launch_ = 0;  // the next micro-batch's backward starts the buckets again
  micro_++;
}

void GradSync::gather_params(float* params, const std::function<void(size_t)>& update) {
  if (!opt.zero || world == 1) {
    for (size_t b = 0; b < buckets.size(); b++) update(b);
    return;
  }
  const double t0 = now_ms();
  double update_ms = 0;
  if (thread_.joinable()) {
    size_t last = 0;
    for (size_t b = 0; b < buckets.size(); b++) {
      const double u0 = now_ms();
      update(b);
      if (device_) cuda_synchronize();  // the piece is on the device before the thread copies it
      update_ms += now_ms() - u0;
      if (!layer_bucket(b)) last = launch(b, params);
    }
    wait_ticket(last);
  } else {
    for (size_t b = 0; b < buckets.size(); b++) {
      const double u0 = now_ms();
      update(b);
      update_ms += now_ms() - u0;
      if (!layer_bucket(b)) all_gather(params, b, bucket_label(opt.method, opt.zero, true, b));
    }
    // nccl: bucket b's all-gather was enqueued after update(b) and overlaps update(b+1); the next
    // forward waits for all of them
    if (exchange_->device_memory()) exchange_->order_compute_after();
  }
  const double t1 = now_ms();
  step.exposed_comm_ms += t1 - t0 - update_ms;
  if (tracer && tracer->enabled && thread_.joinable()) tracer->span("update and gather parameters", 0, t0, t1);
}

void GradSync::gather_sharded(const float* compact, std::vector<float>& full) {
  if (rank == 0) full.assign(table->numel, 0.0f);
  std::vector<size_t> counts, displs;
  size_t off = 0;
  for (size_t b = 0; b < buckets.size(); b++) {
    const size_t n = buckets[b].end - buckets[b].begin;
    if (!opt.zero || world == 1) {
      if (rank == 0) std::copy(compact + off, compact + off + n, full.begin() + buckets[b].begin);
      off += shard[b].end - shard[b].begin;
      continue;
    }
    piece_counts(n, world, counts, displs);
    large::gatherv(compact + off, counts, displs, MPI_FLOAT, rank == 0 ? full.data() + buckets[b].begin : nullptr, 0,
                   comm);
    off += counts[rank];
  }
}

std::vector<float> GradSync::pieces_of(const float* full) const {
  std::vector<float> out;
  for (const ShardPiece& p : shard) out.insert(out.end(), full + p.begin, full + p.end);
  return out;
}

std::vector<float> GradSync::pieces_to_host(const float* full) const {
  if (!device_) return pieces_of(full);
  size_t n = 0;
  for (const ShardPiece& p : shard) n += p.end - p.begin;
  std::vector<float> out(n);
  size_t at = 0;
  for (const ShardPiece& p : shard) {
    if (p.end > p.begin) ops->copy_to_host(out.data() + at, full + p.begin, (p.end - p.begin) * sizeof(float));
    at += p.end - p.begin;
  }
  return out;
}

bool GradSync::average_params(float* params, int64_t s) {
  if (opt.method != SyncMethod::weights || world == 1) return false;
  if ((s + 1) % opt.average_every != 0) return false;
  const double t0 = now_ms();
  for (size_t b = 0; b < buckets.size(); b++) reduce(params, b, "average parameters bucket " + std::to_string(b));
  step.exposed_comm_ms += now_ms() - t0;
  return true;
}

// ---- ZeRO-3: the blocks' parameters gathered when used ------------------------------------------

GradSync::LayerState* GradSync::layer_state(int l) {
  if (!opt.shard_params || world == 1 || layers_.empty()) return nullptr;
  if (l < l0_ || l >= l0_ + (int)layers_.size()) return nullptr;
  return &layers_[l - l0_];
}

void GradSync::attach_params(float* p) {
  params = p;
  if (!pages_params_ || !params) return release_layers();
  const size_t chunk_floats = cuda_pages_chunk(params) / sizeof(float);
  cuda_pages_limit(params, (size_t)device_zero3_param_floats(*table, buckets, shard, chunk_floats) * sizeof(float));
  for (LayerState& s : layers_) s.whole = false;  // (nothing backed yet)
}

void GradSync::load_params(const float* host) {
  if (!pages_params_) {
    ops->copy_to_device(params, host, table->numel * sizeof(float));
    return release_layers();
  }
  for (size_t i = 0; i < layers_.size(); i++) {  // no gather in flight, no block whole: pieces only
    LayerState& s = layers_[i];
    if (s.ticket) cuda_compute_waits(s.gathered), s.ticket = 0;
    if (s.whole) release_layer(l0_ + (int)i);
  }
  for (size_t b = 0; b < buckets.size(); b++) {
    const ShardPiece keep = layer_bucket(b) ? shard[b] : ShardPiece{buckets[b].begin, buckets[b].end};
    const size_t n = keep.end - keep.begin;
    cuda_pages_back(params, keep.begin * sizeof(float), n * sizeof(float));
    if (n) ops->copy_to_device(params + keep.begin, host + keep.begin, n * sizeof(float));
  }
}

void GradSync::gather_layer_on_device(LayerState& s) {
  size_t lo = SIZE_MAX, hi = 0;
  for (size_t b = s.first; b < s.end; b++) lo = std::min(lo, buckets[b].begin), hi = std::max(hi, buckets[b].end);
  cuda_pages_back(params, lo * sizeof(float), (hi - lo) * sizeof(float));  // (zeroed on the compute stream)
  for (size_t b = s.first; b < s.end; b++) all_gather(params, b, bucket_label(opt.method, opt.zero, true, b));
  if (!s.gathered) s.gathered = cuda_event_new();
  cuda_event_record(s.gathered, exchange_->device_stream());
  s.ticket = 1;
}

void GradSync::prefetch_layer(int l) {
  LayerState* s = layer_state(l);
  if (!s || s->whole || s->ticket) return;
  if (pages_params_) return gather_layer_on_device(*s);
  if (!thread_.joinable()) return;
  for (size_t b = s->first; b < s->end; b++) s->ticket = launch(b, params);
}

void GradSync::need_layer(int l) {
  LayerState* s = layer_state(l);
  if (!s || s->whole) return;
  if (pages_params_) {  // the compute stream waits; the host goes on
    if (!s->ticket) gather_layer_on_device(*s);
    cuda_compute_waits(s->gathered);
    s->whole = true;
    s->ticket = 0;
    return;
  }
  const double t0 = now_ms();
  if (thread_.joinable()) {
    prefetch_layer(l);  // (no-op when already in flight)
    wait_ticket(s->ticket);
  } else {
    for (size_t b = s->first; b < s->end; b++) all_gather(params, b, bucket_label(opt.method, opt.zero, true, b));
  }
  step.exposed_comm_ms += now_ms() - t0;
  s->whole = true;
  s->ticket = 0;
}

void GradSync::release_layer(int l) {
  LayerState* s = layer_state(l);
  if (!s || !s->whole) return;
  for (size_t b = s->first; b < s->end; b++) release_others(params, b);
  s->whole = false;
}

void GradSync::release_layers() {
  if (pages_params_) fail("internal: release_layers on device pages (load_params writes the pieces)");
  for (size_t i = 0; i < layers_.size(); i++) {
    LayerState* s = layer_state(l0_ + (int)i);
    if (!s) return;
    if (s->ticket) wait_ticket(s->ticket);
    s->ticket = 0;
    s->whole = true;  // (written whole)
    release_layer(l0_ + (int)i);
  }
}

}  // namespace llmpi
