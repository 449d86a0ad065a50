// Messages between pipeline stages (comm/stage_link.h).
#include "comm/stage_link.h"

#if defined(OPEN_MPI) && OPEN_MPI && __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include "backend/cuda_ops.h"
#include "runtime/large_count.h"
#include "comm/nccl.h"
#include "runtime/error.h"

namespace llmpi {

const char* link_way_name(LinkWay w) {
  switch (w) {
    case LinkWay::mpi_direct: return "MPI from backend memory";
    case LinkWay::mpi_staged: return "MPI through page-locked host buffers";
    case LinkWay::nccl: return "NCCL send/receive";
  }
  return "?";
}

bool mpi_cuda_aware() {
#if defined(MPICH) && defined(MPIX_GPU_SUPPORT_CUDA)
  return MPIX_Query_cuda_support() == 1;
#elif defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

StageLink::StageLink(const Ops& ops, MPI_Comm pipeline, bool nccl, size_t max_floats, bool wrap)
    : ops_(ops), comm_(pipeline), max_floats_(max_floats), wrap_(wrap) {
  if (!ops.on_gpu()) way_ = LinkWay::mpi_direct;
  else if (nccl) way_ = LinkWay::nccl;
  else way_ = mpi_cuda_aware() ? LinkWay::mpi_direct : LinkWay::mpi_staged;
}

StageLink::~StageLink() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  for (Channel& c : channels_) {
    c.nccl.reset();  // waits for its stream
    if (c.mpi != MPI_COMM_NULL && !finalized) MPI_Comm_free(&c.mpi);
  }
  for (float* p : staging_all_) cuda_host_free(p);
}

void StageLink::connect() {
  if (way_ != LinkWay::nccl || !channels_.empty()) return;
  int rank = 0, S = 1;
  MPI_Comm_rank(comm_, &rank);
  MPI_Comm_size(comm_, &S);
  // The directions between neighbours, in one order on every rank: each two-rank communicator is
  // made by its two ranks alone (MPI_Comm_create_group, then NCCL's bootstrap), and going through
  // the pairs in the same order everywhere leaves no rank waiting in a cycle.
  std::vector<std::pair<int, int>> pairs;
  for (int s = 0; s + 1 < S; s++) pairs.push_back({s, s + 1});
  if (wrap_ && S > 2) pairs.push_back({0, S - 1});
  MPI_Group all;
  MPI_Comm_group(comm_, &all);
  for (const auto& [a, b] : pairs) {
    if (rank != a && rank != b) continue;
    const int members[2] = {a, b};
    MPI_Group two;
    MPI_Group_incl(all, 2, members, &two);
    for (int dir = 0; dir < 2; dir++) {  // a -> b, then b -> a
      Channel c;
      c.from = dir == 0 ? a : b;
      c.to = dir == 0 ? b : a;
      MPI_Comm_create_group(comm_, two, 0, &c.mpi);
      c.peer = rank == a ? 1 : 0;
      c.nccl = nccl_comm_create(c.mpi);  // collective over the two
      channels_.push_back(std::move(c));
    }
    MPI_Group_free(&two);
  }
  MPI_Group_free(&all);
}

StageLink::Channel& StageLink::channel(int from, int to) {
  for (Channel& c : channels_)
    if (c.from == from && c.to == to) return c;
  fail("internal: no NCCL channel from pipeline rank ", from, " to ", to, " (StageLink::connect not called?)");
}

int StageLink::rank_of_comm() const {
  int rank = 0;
  MPI_Comm_rank(comm_, &rank);
  return rank;
}

float* StageLink::take_staging() {
  if (staging_free_.empty()) {
    staging_all_.push_back(static_cast<float*>(cuda_host_alloc(max_floats_ * sizeof(float))));
    staging_free_.push_back(staging_all_.back());
  }
  float* p = staging_free_.back();
  staging_free_.pop_back();
  return p;
}

int StageLink::post_recv(float* dst, size_t n, int peer, int tag) {
  if (n > max_floats_) fail("internal: a pipeline message of ", n, " floats, more than the ", max_floats_, " expected");
  Message m;
  m.recv = true;
  m.dst = dst;
  m.n = n;
  switch (way_) {
    case LinkWay::mpi_direct:
      large::irecv(dst, n, MPI_FLOAT, peer, tag, comm_, m.reqs);
      break;
    case LinkWay::mpi_staged:
      m.staging = take_staging();
      large::irecv(m.staging, n, MPI_FLOAT, peer, tag, comm_, m.reqs);
      break;
    case LinkWay::nccl: {
      Channel& c = channel(peer, rank_of_comm());
      c.nccl->recv(dst, n, c.peer);
      m.channel = c.nccl.get();
      break;
    }
  }
  messages_[next_id_] = m;
  return next_id_++;
}

int StageLink::post_send(const float* src, size_t n, int peer, int tag) {
  if (n > max_floats_) fail("internal: a pipeline message of ", n, " floats, more than the ", max_floats_, " expected");
  Message m;
  m.n = n;
  switch (way_) {
    case LinkWay::mpi_direct:
      large::isend(src, n, MPI_FLOAT, peer, tag, comm_, m.reqs);
      break;
    case LinkWay::mpi_staged:
      m.staging = take_staging();
      ops_.copy_to_host(m.staging, src, n * sizeof(float));  // waits for the compute that wrote src
      large::isend(m.staging, n, MPI_FLOAT, peer, tag, comm_, m.reqs);
      break;
    case LinkWay::nccl: {
      Channel& c = channel(rank_of_comm(), peer);
      c.nccl->send(src, n, c.peer);
      m.channel = c.nccl.get();
      break;
    }
  }
  messages_[next_id_] = m;
  return next_id_++;
}

void StageLink::finish(std::map<int, Message>::iterator it) {
  Message& m = it->second;
  if (m.staging) {
    if (m.recv) ops_.copy_to_device(m.dst, m.staging, m.n * sizeof(float));
    staging_free_.push_back(m.staging);
  }
  messages_.erase(it);
}

void StageLink::wait(int id) {
  auto it = messages_.find(id);
  if (it == messages_.end()) return;  // finished already
  if (way_ == LinkWay::nccl) {
    it->second.channel->compute_waits();  // the next compute sees the values (and may overwrite a sent buffer)
  } else {
    large::wait_all(it->second.reqs);
  }
  finish(it);
}

bool StageLink::done(int id) {
  auto it = messages_.find(id);
  if (it == messages_.end()) return true;
  if (way_ == LinkWay::nccl) {
    if (!it->second.channel->finished()) return false;
  } else {
    if (!large::test_all(it->second.reqs)) return false;
  }
  finish(it);
  return true;
}

void StageLink::drain() {
  while (!messages_.empty()) wait(messages_.begin()->first);
}

}  // namespace llmpi
