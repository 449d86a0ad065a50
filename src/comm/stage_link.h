// Messages between pipeline stages: a micro-batch's hidden state forward, its gradient backward
// (engine/engine.h "messages"). One small type whose way is chosen once, when it is built, so the
// schedule's executor is one loop whatever the backend and the sync method:
//
//   mpi_direct   MPI_Irecv / MPI_Isend straight from backend memory (a message of more than
//                INT_MAX floats in several pieces: runtime/large_count.h): the CPU backend, or a GPU
//                when the MPI library says it is CUDA-aware (MPIX_Query_cuda_support, where the
//                library has it: MPICH and Open MPI)
//   mpi_staged   a GPU whose MPI is not CUDA-aware (Debian's MPICH): every message through a
//                page-locked host buffer of its own: a send copies device -> host, then
//                MPI_Isend; a receive is an MPI_Irecv whose wait copies host -> device
//   nccl         parallel.sync "nccl" on a GPU: ncclSend / ncclRecv, each on the stream of a
//                communicator of its own direction between two neighbouring stages (a two-rank
//                communicator for s -> s+1 and one for s+1 -> s; with interleaving also S-1 <-> 0).
//                A direction's stream holds only sends on one side and only receives on the
//                other, in the same order, so a message waits only for its own peer's post, as
//                MPI_Isend / MPI_Irecv do: no stream holds a send behind a receive (or the
//                reverse) that waits for it, and every schedule that runs over MPI runs here
//                (1F1B's crossing sends included). NCCL matches by posting order (it has no
//                tags): every schedule posts a direction's messages in the same order on both
//                ends (tests/test_pipeline_schedule.cpp). A compute that reads a receive has the
//                compute stream wait for its direction's stream (no host wait): for everything
//                posted there so far, which is no more than that receive, as a schedule posts a
//                receive right before the compute that reads it; a send is done when its stream
//                has passed it (an event query).
//
// post_recv / post_send return a message id. wait(id): a receive's values are where the next
// compute reads them, a send's buffer may be written again; done(id): a send has finished (never
// waits); drain(): every message has finished. Buffers passed in stay valid and untouched until
// their message has finished. Not thread-safe: the compute thread calls it.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <map>
#include <memory>
#include <vector>

#include "backend/ops.h"

namespace llmpi {

class NcclComm;

enum class LinkWay { mpi_direct, mpi_staged, nccl };
const char* link_way_name(LinkWay w);  // "MPI from backend memory", ...

// Whether the MPI library reports CUDA-aware support at run time (false where it cannot say).
bool mpi_cuda_aware();

class StageLink {
 public:
  // Not collective. nccl: the sync method is "nccl" (a GPU only; GradSync refuses it elsewhere).
  // max_floats: the largest message. wrap: messages also go between the last stage and the
  // first (interleaved schedules).
  StageLink(const Ops& ops, MPI_Comm pipeline, bool nccl, size_t max_floats, bool wrap);
  ~StageLink();
  StageLink(const StageLink&) = delete;
  StageLink& operator=(const StageLink&) = delete;
  // Collective over the pipeline: makes the NCCL communicator of each direction between
  // neighbours (nccl); nothing otherwise.
  void connect();

  LinkWay way() const { return way_; }
  // The host must wait for the compute stream before posting a send (MPI reading device memory).
  bool host_waits_before_send() const { return ops_.on_gpu() && way_ == LinkWay::mpi_direct; }

  int post_recv(float* dst, size_t n, int peer, int tag);
  int post_send(const float* src, size_t n, int peer, int tag);
  void wait(int id);
  bool done(int id);
  void drain();

 private:
  struct Message {
    std::vector<MPI_Request> reqs;  // MPI: one per piece of the message (runtime/large_count.h)
    float* staging = nullptr;  // mpi_staged: the page-locked copy
    float* dst = nullptr;      // a receive's destination (mpi_staged: copied there by wait)
    size_t n = 0;
    bool recv = false;
    NcclComm* channel = nullptr;  // nccl: its direction's communicator
  };
  struct Channel {  // nccl: one direction between two stages
    int from = 0, to = 0;
    MPI_Comm mpi = MPI_COMM_NULL;
    std::unique_ptr<NcclComm> nccl;
    int peer = 0;  // the other end's rank in it
  };
  const Ops& ops_;
  MPI_Comm comm_;
  LinkWay way_;
  size_t max_floats_;
  bool wrap_;
  std::vector<Channel> channels_;
  std::map<int, Message> messages_;  // in flight
  std::vector<float*> staging_free_, staging_all_;
  int next_id_ = 0;

  float* take_staging();
  Channel& channel(int from, int to);
  int rank_of_comm() const;
  void finish(std::map<int, Message>::iterator it);  // after completion: land a staged receive, free its buffer
};

}  // namespace llmpi
