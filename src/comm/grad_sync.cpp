#include "comm/grad_sync.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>

#include "backend/cuda_ops.h"
#include "backend/nccl_sync.h"
#include "metrics/metrics.h"
#include "metrics/trace.h"
#include "runtime/error.h"

namespace llmpi {

namespace {

// The trace's name for one collective pass over bucket b.
std::string bucket_label(SyncMethod m, bool zero, bool params, size_t b) {
  if (params) return "all-gather parameters bucket " + std::to_string(b);
  return std::string(sync_method_name(m)) + (zero ? " reduce-scatter" : "") + " bucket " + std::to_string(b);
}

// MPI_Op for parallel.grad_dtype "bf16": inout[i] = bf16(float(in[i]) + float(inout[i])), over
// MPI_UINT16_T elements holding bfloat16 bits. Commutative (fp32 addition of two values is).
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; i++) b[i] = bf16_round(bf16_widen(a[i]) + bf16_widen(b[i]));
}

}  // namespace

SyncMethod parse_sync_method(const std::string& name) {
  if (name == "gather_scatter") return SyncMethod::gather_scatter;
  if (name == "allreduce") return SyncMethod::allreduce;
  if (name == "weights") return SyncMethod::weights;
  if (name == "nccl") return SyncMethod::nccl;
  fail("parallel.sync: unknown method '", name, "'; valid: \"gather_scatter\", \"allreduce\", \"weights\", \"nccl\"");
}

const char* sync_method_name(SyncMethod m) {
  switch (m) {
    case SyncMethod::gather_scatter: return "gather_scatter";
    case SyncMethod::allreduce: return "allreduce";
    case SyncMethod::weights: return "weights";
    case SyncMethod::nccl: return "nccl";
  }
  return "?";
}

std::vector<Bucket> make_buckets(const ParamTable& t, double bucket_mb, double first_bucket_mb) {
  // Counts stay far below INT_MAX, even multiplied by the world size for the gather buffer.
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

void piece_counts(size_t n, int world, std::vector<int>& counts, std::vector<int>& displs) {
  counts.assign(world, 0);
  displs.assign(world, 0);
  const size_t base = n / world, extra = n % world;
  size_t off = 0;
  for (int r = 0; r < world; r++) {
    counts[r] = (int)(base + ((size_t)r < extra ? 1 : 0));
    displs[r] = (int)off;
    off += counts[r];
  }
}

std::vector<ShardPiece> shard_pieces(const std::vector<Bucket>& buckets, int world, int rank) {
  std::vector<ShardPiece> out;
  std::vector<int> counts, displs;
  for (const Bucket& b : buckets) {
    piece_counts(b.end - b.begin, world, counts, displs);
    out.push_back({b.begin + displs[rank], b.begin + displs[rank] + counts[rank]});
  }
  return out;
}

GradSync::GradSync(const SyncOptions& o, MPI_Comm c, const Ops& ops_, float* g, const ParamTable& t, Tracer* tr)
    : opt(o), comm(c), grads(g), table(&t), ops(&ops_), tracer(tr) {
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  device_ = ops->on_gpu();
  // The small first bucket only helps when collectives start during backward (overlap).
  buckets = make_buckets(t, opt.bucket_mb, opt.overlap ? opt.first_bucket_mb : opt.bucket_mb);
  if (opt.zero && opt.method == SyncMethod::weights)
    fail("parallel.zero 1 shards the optimizer state of ranks that average gradients; parallel.sync \"weights\" "
         "gives every rank its own optimizer over every parameter: use \"allreduce\" or \"gather_scatter\"");
  if (opt.zero && opt.method == SyncMethod::nccl)
    fail("parallel.zero 1 with parallel.sync \"nccl\" is not implemented (NCCL takes one rank per GPU, so its "
         "reduce-scatter could only be verified on a machine with two or more GPUs, which we have not had): use "
         "parallel.zero 0 with nccl, or zero 1 with \"allreduce\" (staged through host memory)");
  if (opt.bf16 && opt.method != SyncMethod::allreduce && opt.method != SyncMethod::nccl)
    fail("parallel.grad_dtype \"bf16\" is implemented for parallel.sync \"allreduce\" (with or without zero 1) and "
         "\"nccl\", not \"", sync_method_name(opt.method), "\": use one of those, or grad_dtype \"fp32\"");
  shard = shard_pieces(buckets, opt.zero ? world : 1, opt.zero ? rank : 0);
  if (opt.zero && world > 1) {
    size_t largest = 0;
    for (const Bucket& b : buckets) largest = std::max(largest, (b.end - b.begin + world - 1) / world);
    piece_buf_.resize(largest);
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
  if (opt.bf16 && world > 1) MPI_Op_create(&bf16_sum, 1, &bf16_sum_);
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
  if (opt.method == SyncMethod::nccl && !nccl_) nccl_ = nccl_sync_create(comm);  // collective
}

GradSync::~GradSync() {
  nccl_.reset();
  cuda_host_free(staging_);
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_work_.notify_all();
    thread_.join();
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (bf16_sum_ != MPI_OP_NULL && !finalized) MPI_Op_free(&bf16_sum_);
}

double GradSync::expected_bytes_per_pass(size_t n) const {
  const double bytes = (double)n * sizeof(float);
  if (world == 1) return 0;
  if (opt.bf16) {  // allreduce or nccl: the gradient in bf16; with zero, the all-gather in fp32
    const double grad = (double)n * grad_wire_bytes();
    return (world - 1.0) / world * (opt.zero ? grad + bytes : 2.0 * grad);
  }
  switch (opt.method) {
    case SyncMethod::gather_scatter:
      // root: (W-1)·B in by gather, out by scatter; others B each way. Zero (sent): the root
      // scatters the others' pieces, ~(W-1)/W·B, and W-1 copies of the gathered bucket; the
      // others send B and their piece, ~B/W.
      if (opt.zero) return rank == 0 ? (world - 1) * bytes / world + (world - 1) * bytes : bytes + bytes / world;
      return rank == 0 ? (world - 1) * bytes : bytes;
    default:  // all-reduce (bandwidth-optimal algorithms), or reduce-scatter + all-gather: 2(W-1)/W · B each way
      return 2.0 * (world - 1) / world * bytes;
  }
}

void GradSync::begin_step() {
  step = SyncStats{};
  next_launch_ = 0;
  if (nccl_) {
    const size_t bucket_floats = opt.bucket_mb > 0 ? (size_t)(opt.bucket_mb * 1e6 / sizeof(float)) : 0;
    nccl_->begin(grads, table->numel, bucket_floats, opt.bf16);
  }
  std::lock_guard<std::mutex> lock(mu_);
  completed_ = 0;
}

void GradSync::wait_request(MPI_Request* req) {
  int done = 0;
  MPI_Test(req, &done, MPI_STATUS_IGNORE);
  while (!done) {
    std::this_thread::sleep_for(std::chrono::microseconds(opt.poll_us));
    MPI_Test(req, &done, MPI_STATUS_IGNORE);
  }
}

// One collective pass over base[begin, begin + n): afterwards it holds the mean over ranks (with
// zero: only this rank's piece of it does).
void GradSync::reduce(float* base, size_t begin, size_t n, const std::string& label) {
  const double t0 = now_ms();
  // On the GPU: through the host staging buffer.
  float* data = device_ ? staging_ + begin : base + begin;
  if (device_) ops->copy_to_host(data, base + begin, n * sizeof(float));
  const bool poll = opt.overlap && opt.poll_us > 0;
  const int count = (int)n;
  const float inv = 1.0f / (float)world;
  const double bytes = (double)n * sizeof(float);
  std::vector<int> counts, displs;
  if (opt.zero) piece_counts(n, world, counts, displs);
  const size_t mine = opt.zero ? (size_t)counts[rank] : n, at = opt.zero ? (size_t)displs[rank] : 0;
  double sent = 0, received = 0;
  int collectives = 0;
  if (opt.method == SyncMethod::gather_scatter) {
    // Gather every rank's slice at the root, average there, scatter the mean back: W copies of it,
    // or (zero) each rank's piece.
    if (rank == 0) {
      gather_buf_.resize(n * world);
      scatter_buf_.resize(n * world);
    }
    float* gbuf = rank == 0 ? gather_buf_.data() : nullptr;
    if (poll) {
      MPI_Request req;
      MPI_Igather(data, count, MPI_FLOAT, gbuf, count, MPI_FLOAT, 0, comm, &req);
      wait_request(&req);
    } else {
      MPI_Gather(data, count, MPI_FLOAT, gbuf, count, MPI_FLOAT, 0, comm);
    }
    if (rank == 0) {
      for (size_t i = 0; i < n; i++) {
        float s = 0;
        for (int r = 0; r < world; r++) s += gather_buf_[(size_t)r * n + i];
        scatter_buf_[i] = s * inv;
      }
      if (!opt.zero)
        for (int r = 1; r < world; r++) std::copy(scatter_buf_.begin(), scatter_buf_.begin() + n, scatter_buf_.begin() + (size_t)r * n);
    }
    // zero: the pieces padded to c = ceil(n/W) floats each and scattered with MPI_Scatter (MPICH's
    // Scatterv is as slow as its Allgatherv when ranks share cores; see all_gather).
    const size_t c = (n + world - 1) / world;
    if (opt.zero && rank == 0)
      for (int r = world - 1; r >= 0; r--)  // in place, from the back: piece r moves to r·c ≥ displs[r]
        std::copy_backward(scatter_buf_.begin() + displs[r], scatter_buf_.begin() + displs[r] + counts[r],
                           scatter_buf_.begin() + (size_t)r * c + counts[r]);
    if (opt.zero) gather_send_.resize(c);
    float* sbuf = rank == 0 ? scatter_buf_.data() : nullptr;
    MPI_Request req;
    if (opt.zero && poll)
      MPI_Iscatter(sbuf, (int)c, MPI_FLOAT, gather_send_.data(), (int)c, MPI_FLOAT, 0, comm, &req);
    else if (opt.zero)
      MPI_Scatter(sbuf, (int)c, MPI_FLOAT, gather_send_.data(), (int)c, MPI_FLOAT, 0, comm);
    else if (poll)
      MPI_Iscatter(sbuf, count, MPI_FLOAT, data, count, MPI_FLOAT, 0, comm, &req);
    else
      MPI_Scatter(sbuf, count, MPI_FLOAT, data, count, MPI_FLOAT, 0, comm);
    if (poll) wait_request(&req);
    if (opt.zero) std::copy(gather_send_.begin(), gather_send_.begin() + mine, data + at);
    collectives = 2;
    // root: (W−1)·B in, the others' copies or pieces out; the others: B out, B or their piece in
    const double back = opt.zero ? (double)mine * sizeof(float) : bytes;
    sent = rank == 0 ? (opt.zero ? bytes - back : (world - 1) * bytes) : bytes;
    received = rank == 0 ? (world - 1) * bytes : back;
  } else {
    // All-reduce, or (zero) reduce-scatter: the sum of piece r arrives at rank r. In fp32 on
    // `data`, or with bf16 on its rounded copy wire_ (the header's "Gradient type on the wire").
    const bool bf16 = opt.bf16;
    void* buf = data;
    if (bf16) {
      wire_.resize(n);
      for (size_t i = 0; i < n; i++) wire_[i] = bf16_round(data[i]);
      buf = wire_.data();
    }
    const MPI_Datatype type = bf16 ? MPI_UINT16_T : MPI_FLOAT;
    const MPI_Op sum = bf16 ? bf16_sum_ : MPI_SUM;
    MPI_Request req;
    if (opt.zero) {
      if (bf16) wire_piece_.resize(mine);
      void* piece = bf16 ? static_cast<void*>(wire_piece_.data()) : static_cast<void*>(piece_buf_.data());
      if (poll) {
        MPI_Ireduce_scatter(buf, piece, counts.data(), type, sum, comm, &req);
        wait_request(&req);
      } else {
        MPI_Reduce_scatter(buf, piece, counts.data(), type, sum, comm);
      }
      for (size_t i = 0; i < mine; i++) data[at + i] = (bf16 ? bf16_widen(wire_piece_[i]) : piece_buf_[i]) * inv;
      // bandwidth-optimal reduce-scatter
      sent = received = (world - 1) * ((double)n * grad_wire_bytes()) / world;
    } else {
      if (poll) {
        MPI_Iallreduce(MPI_IN_PLACE, buf, count, type, sum, comm, &req);
        wait_request(&req);
      } else {
        MPI_Allreduce(MPI_IN_PLACE, buf, count, type, sum, comm);
      }
      if (bf16)
        for (size_t i = 0; i < n; i++) data[i] = bf16_widen(wire_[i]) * inv;
      else
        for (size_t i = 0; i < n; i++) data[i] *= inv;
      sent = received = expected_bytes_per_pass(n);
    }
    collectives = 1;
  }
  // (The averaging multiply is local work; at about 1 ns a float it is counted as communication.)
  const double t_end = now_ms();
  if (device_) ops->copy_to_device(base + begin + at, data + at, mine * sizeof(float));
  account(t0, t_end, now_ms(), sent, received, collectives, label, n);
}

// zero: every rank's piece of bucket b (final on its owner) into every rank's copy of the bucket.
void GradSync::all_gather(float* base, size_t b, const std::string& label) {
  const double t0 = now_ms();
  const size_t begin = buckets[b].begin, n = buckets[b].end - begin;
  std::vector<int> counts, displs;
  piece_counts(n, world, counts, displs);
  const size_t mine = counts[rank], at = displs[rank];
  float* data = device_ ? staging_ + begin : base + begin;
  if (device_) ops->copy_to_host(data + at, base + begin + at, mine * sizeof(float));
  const bool poll = opt.overlap && opt.poll_us > 0;
  const double bytes = (double)n * sizeof(float);
  double sent = 0, received = 0;
  int collectives = 0;
  MPI_Request req;
  if (opt.method == SyncMethod::gather_scatter) {
    // Through rank 0: gather the pieces, scatter W copies of the whole bucket.
    if (rank == 0) {
      gather_buf_.resize(n * world);
      scatter_buf_.resize(n * world);
    }
    float* gbuf = rank == 0 ? gather_buf_.data() : nullptr;
    if (poll) {
      MPI_Igatherv(data + at, (int)mine, MPI_FLOAT, gbuf, counts.data(), displs.data(), MPI_FLOAT, 0, comm, &req);
      wait_request(&req);
    } else {
      MPI_Gatherv(data + at, (int)mine, MPI_FLOAT, gbuf, counts.data(), displs.data(), MPI_FLOAT, 0, comm);
    }
    if (rank == 0)
      for (int r = 0; r < world; r++) std::copy(gather_buf_.begin(), gather_buf_.begin() + n, scatter_buf_.begin() + (size_t)r * n);
    float* sbuf = rank == 0 ? scatter_buf_.data() : nullptr;
    if (poll) {
      MPI_Iscatter(sbuf, (int)n, MPI_FLOAT, data, (int)n, MPI_FLOAT, 0, comm, &req);
      wait_request(&req);
    } else {
      MPI_Scatter(sbuf, (int)n, MPI_FLOAT, data, (int)n, MPI_FLOAT, 0, comm);
    }
    collectives = 2;
    sent = rank == 0 ? (world - 1) * bytes : mine * sizeof(float);
    received = rank == 0 ? bytes - mine * sizeof(float) : bytes;
  } else {
    // MPI_Allgather of equal pieces of c = ceil(n/W) floats (the shorter ones padded) into a
    // W·c buffer, then each piece copied into place. Not MPI_Allgatherv: MPICH 4.0's Allgatherv
    // took 4.4 s where Allgather took 44 ms for 24 MB on 4 ranks sharing 2 cores (its pipelined
    // ring waits for the scheduler at every 32 kB piece; docs/PERF.md).
    const size_t c = (n + world - 1) / world;
    gather_send_.assign(c, 0.0f);
    gather_recv_.resize(c * world);
    std::copy(data + at, data + at + mine, gather_send_.begin());
    if (poll) {
      MPI_Iallgather(gather_send_.data(), (int)c, MPI_FLOAT, gather_recv_.data(), (int)c, MPI_FLOAT, comm, &req);
      wait_request(&req);
    } else {
      MPI_Allgather(gather_send_.data(), (int)c, MPI_FLOAT, gather_recv_.data(), (int)c, MPI_FLOAT, comm);
    }
    for (int r = 0; r < world; r++)
      std::copy(gather_recv_.begin() + (size_t)r * c, gather_recv_.begin() + (size_t)r * c + counts[r], data + displs[r]);
    collectives = 1;
    sent = received = (world - 1) * (double)c * sizeof(float);
  }
  const double t_end = now_ms();
  if (device_) ops->copy_to_device(base + begin, data, n * sizeof(float));
  account(t0, t_end, now_ms(), sent, received, collectives, label, n);
}

void GradSync::account(double t0, double t_end, double t1, double sent, double received, int collectives,
                       const std::string& label, size_t n) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    step.comm_ms += t_end - t0;
    step.bytes_sent += sent;
    step.bytes_received += received;
    step.collectives += collectives;
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
    const Bucket& bk = buckets[job.bucket];
    if (job.params)
      all_gather(params_, job.bucket, bucket_label(opt.method, opt.zero, true, job.bucket));
    else
      reduce(grads, bk.begin, bk.end - bk.begin, bucket_label(opt.method, opt.zero, false, job.bucket));
    {
      std::lock_guard<std::mutex> lock(mu_);
      completed_++;
    }
    cv_done_.notify_all();
  }
}

void GradSync::launch(size_t b, bool params) {
  if (!thread_.joinable()) return;  // no overlap: finish() reduces every bucket in order
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({b, params});
  }
  cv_work_.notify_one();
}

void GradSync::wait_all(size_t jobs) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_done_.wait(lock, [&] { return completed_ == jobs; });
}

void GradSync::on_ready(size_t k) {
  if (!averages_gradients() || world == 1) return;
  if (nccl_) {
    nccl_->ready(k);
    return;
  }
  while (next_launch_ < buckets.size() && buckets[next_launch_].end <= k) launch(next_launch_++);
}

void GradSync::finish() {
  if (!averages_gradients() || world == 1) return;
  const double t0 = now_ms();
  if (nccl_) {
    // Enqueued: the compute stream waits for every bucket, the host does not. Bytes as all-reduce;
    // the time on the communication stream is not measured here (see the trace / Nsight).
    nccl_->finish();
    step.bytes_sent = step.bytes_received = expected_bytes_per_pass(table->numel);
    step.collectives = (int)nccl_->buckets_launched();
    return;
  }
  if (thread_.joinable()) {
    while (next_launch_ < buckets.size()) launch(next_launch_++);
    wait_all(buckets.size());
  } else {
    for (size_t b = 0; b < buckets.size(); b++)
      reduce(grads, buckets[b].begin, buckets[b].end - buckets[b].begin,
             bucket_label(opt.method, opt.zero, false, b));
  }
  const double t1 = now_ms();
  step.exposed_comm_ms += t1 - t0;
  if (tracer && tracer->enabled && thread_.joinable()) tracer->span("wait for gradients", 0, t0, t1);
}

void GradSync::gather_params(float* params, const std::function<void(size_t)>& update) {
  if (!opt.zero || world == 1) {
    for (size_t b = 0; b < buckets.size(); b++) update(b);
    return;
  }
  const double t0 = now_ms();
  double update_ms = 0;
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      completed_ = 0;
      params_ = params;
    }
    for (size_t b = 0; b < buckets.size(); b++) {
      const double u0 = now_ms();
      update(b);
      if (device_) cuda_synchronize();  // the piece is on the device before the thread copies it
      update_ms += now_ms() - u0;
      launch(b, true);
    }
    wait_all(buckets.size());
    {
      std::lock_guard<std::mutex> lock(mu_);
      completed_ = buckets.size();  // as after finish()
    }
  } else {
    for (size_t b = 0; b < buckets.size(); b++) {
      const double u0 = now_ms();
      update(b);
      update_ms += now_ms() - u0;
      all_gather(params, b, bucket_label(opt.method, opt.zero, true, b));
    }
  }
  const double t1 = now_ms();
  step.exposed_comm_ms += t1 - t0 - update_ms;
  if (tracer && tracer->enabled && thread_.joinable()) tracer->span("update and gather parameters", 0, t0, t1);
}

void GradSync::gather_sharded(const float* compact, std::vector<float>& full) {
  if (rank == 0) full.assign(table->numel, 0.0f);
  std::vector<int> counts, displs;
  size_t off = 0;
  for (size_t b = 0; b < buckets.size(); b++) {
    const size_t n = buckets[b].end - buckets[b].begin;
    if (!opt.zero || world == 1) {
      if (rank == 0) std::copy(compact + off, compact + off + n, full.begin() + buckets[b].begin);
      off += shard[b].end - shard[b].begin;
      continue;
    }
    piece_counts(n, world, counts, displs);
    MPI_Gatherv(compact + off, counts[rank], MPI_FLOAT, rank == 0 ? full.data() + buckets[b].begin : nullptr,
                counts.data(), displs.data(), MPI_FLOAT, 0, comm);
    off += counts[rank];
  }
}

std::vector<float> GradSync::pieces_of(const float* full) const {
  std::vector<float> out;
  for (const ShardPiece& p : shard) out.insert(out.end(), full + p.begin, full + p.end);
  return out;
}

bool GradSync::average_params(float* params, int64_t s) {
  if (opt.method != SyncMethod::weights || world == 1) return false;
  if ((s + 1) % opt.average_every != 0) return false;
  const double t0 = now_ms();
  for (size_t b = 0; b < buckets.size(); b++)
    reduce(params, buckets[b].begin, buckets[b].end - buckets[b].begin, "average parameters bucket " + std::to_string(b));
  step.exposed_comm_ms += now_ms() - t0;
  return true;
}

}  // namespace llmpi
