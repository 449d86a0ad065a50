// NCCL's API (include/nccl.h) over MPI, between the ranks' simulated cards (README.md, "NCCL").
//
// A communicator is an MPI communicator of its members, made by MPI_Comm_create_group from
// MPI_COMM_WORLD after a bootstrap in which every member tells the id's creator its rank (tags
// kJoinTag.. on MPI_COMM_WORLD), so any number of communicators (data-parallel groups, pipeline
// neighbours) coexist. An operation, or a group of them (ncclGroupStart/End), is one item of its
// stream (stream.h): it starts when the stream reaches it, reads its inputs then, waits for its
// peers, computes its result into memory of its own, and the result lands in the program's
// buffer when the stream needs it. Each communicator's operations start in the order the host
// called them (a ticket taken at the call), as NCCL's do whatever their streams.
//
// A collective's ranks first agree on what they call (operation, count, type, reduction, root);
// they exchange their data with MPI (reductions: every rank's values to every rank, summed
// there in rank order); a send carries the sender's call ahead of its data, checked by the
// receive. Sends are synchronous (MPI_Issend): like NCCL's, a send completes only once its
// receive has started, so two ranks that send to each other outside a group wait for ever here
// as on a card. A disagreement stops the job (MPI_Abort) with both calls printed.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/bf16.h"
#include "nccl.h"

struct ncclComm {
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0, nranks = 1;
  uint64_t key = 0;  // the same on every member: orders a group's communicators alike everywhere
  std::mutex mu;
  std::condition_variable cv;
  uint64_t tickets = 0;   // operations (groups) called so far
  uint64_t started = 0;   // of those, started: the next to start holds ticket `started`
  uint64_t finished = 0;  // of those, done with MPI (their results may not have landed yet)
  bool aborted = false;
};

namespace {

constexpr int kJoinTag = 19530, kReplyTag = 19531, kCreateTag = 19532;  // on MPI_COMM_WORLD
constexpr int kP2pTag = 7;                                               // on a communicator's own
constexpr char kMagic[16] = "llmpi-sim-nccl";
constexpr size_t kMaxBytes = static_cast<size_t>(INT32_MAX) - 64;  // MPI counts are int

thread_local std::string t_last_error;

ncclResult_t refuse(ncclResult_t r, const std::string& why) {
  t_last_error = why;
  return r;
}

[[noreturn]] void stop_the_job(const std::string& why) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "cuda_cpu_sim NCCL (world rank %d): %s\n", rank, why.c_str());
  std::fflush(stderr);
  // Every rank of the mismatched call reaches here; the pause lets the others print theirs and
  // mpiexec forward the lines before the abort tears the job down.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  MPI_Abort(MPI_COMM_WORLD, 3);
  std::abort();
}

size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

struct IdFields {
  char magic[16];
  int32_t creator;  // its world rank
  uint64_t serial;  // its count of ids made
};
static_assert(sizeof(IdFields) <= NCCL_UNIQUE_ID_BYTES);

// ---- operations ------------------------------------------------------------------------------

enum class Kind : int32_t { all_reduce, reduce_scatter, all_gather, broadcast, send, recv };
const char* kind_name(int32_t k) {
  static const char* const names[] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather",
                                      "ncclBroadcast", "ncclSend",          "ncclRecv"};
  return k >= 0 && k < 6 ? names[k] : "?";
}

// What the ranks of a collective, or a send and its receive, must agree on.
struct Call {
  int32_t kind, type, red, peer;  // peer: the root (broadcast), the other rank (send, recv)
  uint64_t count;
  bool operator==(const Call& o) const { return std::memcmp(this, &o, sizeof o) == 0; }
};
std::string describe(const Call& c) {
  std::string s = std::string(kind_name(c.kind)) + "(count " + std::to_string(c.count) + ", datatype " +
                  std::to_string(c.type);
  if (c.kind == static_cast<int32_t>(Kind::all_reduce) || c.kind == static_cast<int32_t>(Kind::reduce_scatter))
    s += ", op " + std::to_string(c.red);
  if (c.kind == static_cast<int32_t>(Kind::broadcast)) s += ", root " + std::to_string(c.peer);
  if (c.kind >= static_cast<int32_t>(Kind::send)) s += ", peer " + std::to_string(c.peer);
  return s + ")";
}

struct Op {
  Kind kind;
  const void* send;
  void* recv;
  size_t count;  // per rank: allreduce's and broadcast's count, reduce-scatter's recvcount, all-gather's sendcount
  ncclDataType_t type;
  ncclRedOp_t red;
  int peer;
  ncclComm* comm;
  cudaStream_t stream;
  size_t bytes() const { return count * type_bytes(type); }
  Call call() const {
    return {static_cast<int32_t>(kind), static_cast<int32_t>(type), static_cast<int32_t>(red), peer,
            static_cast<uint64_t>(count)};
  }
  bool collective() const { return kind != Kind::send && kind != Kind::recv; }
};

// One item of a stream: the operations of one call or one group, in call order.
struct Batch {
  struct Exec {
    Op op;
    std::vector<unsigned char> in;   // the inputs as read when the stream reached the batch
    std::vector<unsigned char> all;  // every rank's block (reductions), the received message (recv)
    std::vector<unsigned char> out;  // the result, until it lands in op.recv
  };
  std::vector<Exec> ops;
  std::vector<std::pair<ncclComm*, uint64_t>> turns;  // each communicator's ticket, by key
  std::vector<MPI_Request> requests;
  std::vector<size_t> request_op;  // the operation of each request
};

// The values of block r of `all`, reduced in rank order in fp32 (summed, or their maximum with
// ncclMax); bf16 rounded once (RNE).
void reduce(Batch::Exec& e, size_t block_bytes, int nranks) {
  const size_t n = e.op.count;
  const float scale = e.op.red == ncclAvg ? 1.0f / static_cast<float>(nranks) : 1.0f;
  const bool bf16 = e.op.type == ncclBfloat16;
  e.out.resize(e.op.bytes());
  for (size_t i = 0; i < n; i++) {
    float acc = 0.0f;
    for (int r = 0; r < nranks; r++) {
      const unsigned char* p = e.all.data() + r * block_bytes;
      float x;
      if (bf16) {
        uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        x = llmpi::bf16_bits_to_float(b);
      } else {
        std::memcpy(&x, p + 4 * i, 4);
      }
      if (e.op.red == ncclAvg) x *= scale;
      acc = r == 0 ? x : e.op.red == ncclMax ? (x > acc ? x : acc) : acc + x;
    }
    if (bf16) {
      const uint16_t b = llmpi::float_to_bf16_bits(acc);
      std::memcpy(e.out.data() + 2 * i, &b, 2);
    } else {
      std::memcpy(e.out.data() + 4 * i, &acc, 4);
    }
  }
}

// Waits for every request of the batch, the MPI progress engine polled with short sleeps (a
// waiting rank leaves the cores to the others); says so once if a peer is more than a minute late.
std::vector<MPI_Status> wait_all(std::vector<MPI_Request>& requests, const Batch& b) {
  std::vector<MPI_Status> status(requests.size());
  const auto t0 = std::chrono::steady_clock::now();
  bool said = false;
  for (int polls = 0;; polls++) {
    int done = 0;
    const int rc = MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, status.data());
    if (rc != MPI_SUCCESS) {
      for (size_t i = 0; i < status.size(); i++)
        if (status[i].MPI_ERROR != MPI_SUCCESS && status[i].MPI_ERROR != MPI_ERR_PENDING) {
          char msg[MPI_MAX_ERROR_STRING];
          int len = 0;
          MPI_Error_string(status[i].MPI_ERROR, msg, &len);
          const Op& op = b.ops[b.request_op[i]].op;
          stop_the_job(describe(op.call()) + " on rank " + std::to_string(op.comm->rank) + " failed in MPI (" +
                       std::string(msg, len) +
                       (op.kind == Kind::recv ? "): the peer's ncclSend sends more (its count or datatype differ)"
                                              : ")"));
        }
      stop_the_job("MPI_Testall failed");
    }
    if (done) return status;
    if (polls < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (!said && std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60)) {
      said = true;
      std::string what;
      for (const Batch::Exec& e : b.ops) what.append(" ").append(describe(e.op.call()));
      std::fprintf(stderr, "cuda_cpu_sim NCCL: rank %d has waited a minute for its peers in%s\n",
                   b.ops.front().op.comm->rank, what.c_str());
    }
  }
}

uint64_t fnv1a(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ull;
  return h;
}

// The ranks of c agree on the collectives they make in this batch, or the job stops.
void agree(ncclComm* c, const std::vector<Call>& calls, const Batch& b) {
  uint64_t mine[2] = {calls.size(), fnv1a(calls.data(), calls.size() * sizeof(Call))};
  std::vector<uint64_t> all(2 * c->nranks);
  std::vector<MPI_Request> r(1);
  MPI_Iallgather(mine, 2, MPI_UINT64_T, all.data(), 2, MPI_UINT64_T, c->mpi, &r[0]);
  wait_all(r, b);
  bool same = true;
  for (int i = 0; i < c->nranks; i++) same = same && all[2 * i] == mine[0] && all[2 * i + 1] == mine[1];
  if (same) return;
  std::vector<int> counts(c->nranks), offsets(c->nranks);
  int total = 0;
  for (int i = 0; i < c->nranks; i++) {
    counts[i] = static_cast<int>(all[2 * i] * sizeof(Call));
    offsets[i] = total;
    total += counts[i];
  }
  std::vector<unsigned char> theirs(total);
  MPI_Iallgatherv(calls.data(), counts[c->rank], MPI_BYTE, theirs.data(), counts.data(), offsets.data(), MPI_BYTE,
                  c->mpi, &r[0]);
  wait_all(r, b);
  std::string why = "the ranks of a communicator of " + std::to_string(c->nranks) +
                    " make different collective calls (NCCL would hang or mix the data):";
  for (int i = 0; i < c->nranks; i++) {
    why += "\n  rank " + std::to_string(i) + ":";
    for (int j = 0; j < counts[i] / static_cast<int>(sizeof(Call)); j++) {
      Call k;
      std::memcpy(&k, theirs.data() + offsets[i] + j * sizeof(Call), sizeof k);
      why.append(" ").append(describe(k));
    }
  }
  stop_the_job(why);
}

// Starts the batch's operations on c (the batch holds c's turn): reads their inputs, posts their
// MPI requests.
void start_on(Batch& b, ncclComm* c) {
  std::vector<Call> calls;
  for (const Batch::Exec& e : b.ops)
    if (e.op.comm == c && e.op.collective()) calls.push_back(e.op.call());
  if (!calls.empty() && c->nranks > 1) agree(c, calls, b);
  for (size_t i = 0; i < b.ops.size(); i++) {
    Batch::Exec& e = b.ops[i];
    const Op& op = e.op;
    if (op.comm != c) continue;
    const auto* send = static_cast<const unsigned char*>(op.send);
    const size_t B = op.bytes();
    const int n = static_cast<int>(B);
    MPI_Request r = MPI_REQUEST_NULL;
    switch (op.kind) {
      case Kind::all_reduce:
      case Kind::all_gather:
        e.in.assign(send, send + B);
        e.all.resize(B * c->nranks);
        MPI_Iallgather(e.in.data(), n, MPI_BYTE, e.all.data(), n, MPI_BYTE, c->mpi, &r);
        break;
      case Kind::reduce_scatter:
        e.in.assign(send, send + B * c->nranks);
        e.all.resize(B * c->nranks);
        MPI_Ialltoall(e.in.data(), n, MPI_BYTE, e.all.data(), n, MPI_BYTE, c->mpi, &r);
        break;
      case Kind::broadcast:
        e.out.resize(B);
        if (c->rank == op.peer) std::memcpy(e.out.data(), send, B);
        MPI_Ibcast(e.out.data(), n, MPI_BYTE, op.peer, c->mpi, &r);
        break;
      case Kind::send: {
        const Call k = op.call();
        e.in.resize(sizeof k + B);
        std::memcpy(e.in.data(), &k, sizeof k);
        std::memcpy(e.in.data() + sizeof k, send, B);
        MPI_Issend(e.in.data(), static_cast<int>(e.in.size()), MPI_BYTE, op.peer, kP2pTag, c->mpi, &r);
        break;
      }
      case Kind::recv:
        e.all.resize(sizeof(Call) + B);
        MPI_Irecv(e.all.data(), static_cast<int>(e.all.size()), MPI_BYTE, op.peer, kP2pTag, c->mpi, &r);
        break;
    }
    b.requests.push_back(r);
    b.request_op.push_back(i);
  }
}

// A receive got its sender's call ahead of the data: the two must match.
void check_received(Batch::Exec& e, const MPI_Status& st) {
  int got = 0;
  MPI_Get_count(&st, MPI_BYTE, &got);
  Call sent{};
  const bool header = static_cast<size_t>(got) >= sizeof sent;
  if (header) std::memcpy(&sent, e.all.data(), sizeof sent);
  const Call want{static_cast<int32_t>(Kind::send), static_cast<int32_t>(e.op.type), static_cast<int32_t>(ncclSum),
                  e.op.comm->rank, static_cast<uint64_t>(e.op.count)};
  if (static_cast<size_t>(got) != e.all.size() || !(sent == want))
    stop_the_job("rank " + std::to_string(e.op.comm->rank) + "'s " + describe(e.op.call()) + " received " +
                 (header ? "from the peer's " + describe(sent) : std::string("a short message")) +
                 ": a send and its receive must have the same count and datatype");
  e.out.assign(e.all.begin() + sizeof(Call), e.all.end());
}

// A batch's work on its stream's thread: each communicator's part started in its turn, then
// every request waited for, then the results computed (they land later: land()).
void run(Batch& b) {
  for (auto& [c, ticket] : b.turns) {
    std::unique_lock<std::mutex> l(c->mu);
    c->cv.wait(l, [&, t = ticket] { return c->started == t; });
    l.unlock();
    start_on(b, c);
    l.lock();
    c->started++;
    c->cv.notify_all();
  }
  std::vector<MPI_Request> requests = b.requests;
  const std::vector<MPI_Status> status = wait_all(requests, b);
  for (size_t i = 0; i < b.requests.size(); i++)
    if (b.ops[b.request_op[i]].op.kind == Kind::recv) check_received(b.ops[b.request_op[i]], status[i]);
  for (Batch::Exec& e : b.ops) {
    if (e.op.kind == Kind::all_reduce || e.op.kind == Kind::reduce_scatter)
      reduce(e, e.op.bytes(), e.op.comm->nranks);
    else if (e.op.kind == Kind::all_gather)
      e.out = std::move(e.all);
  }
  for (auto& [c, ticket] : b.turns) {
    std::lock_guard<std::mutex> l(c->mu);
    c->finished++;
    c->cv.notify_all();
  }
}

void land(const Batch& b) {
  for (const Batch::Exec& e : b.ops)
    if (!e.out.empty()) std::memcpy(e.op.recv, e.out.data(), e.out.size());
}

// ---- calls -----------------------------------------------------------------------------------

std::mutex g_ticket_mu;  // tickets of several communicators are taken together
thread_local int t_group_depth = 0;
thread_local std::vector<Op> t_group;
thread_local ncclResult_t t_group_error = ncclSuccess;

// The operations of one call or one group become one item of the first one's stream. A group
// over several streams is joined as NCCL joins it: it starts after the work enqueued on each,
// and each's later work waits for it.
ncclResult_t submit(std::vector<Op> ops) {
  if (ops.empty()) return ncclSuccess;
  auto b = std::make_shared<Batch>();
  for (Op& op : ops) b->ops.push_back({op, {}, {}, {}});
  CUstream_st* const carrier = llmpi::sim::resolve(ops.front().stream);
  std::vector<CUstream_st*> others;
  for (const Op& op : ops) {
    CUstream_st* s = llmpi::sim::resolve(op.stream);
    if (s != carrier && std::find(others.begin(), others.end(), s) == others.end()) others.push_back(s);
  }
  for (CUstream_st* s : others) {
    CUevent_st e;
    llmpi::sim::record(&e, s);
    llmpi::sim::wait_event(carrier, &e);
  }
  std::vector<ncclComm*> comms;
  for (const Op& op : ops)
    if (std::find(comms.begin(), comms.end(), op.comm) == comms.end()) comms.push_back(op.comm);
  std::sort(comms.begin(), comms.end(), [](const ncclComm* a, const ncclComm* c) { return a->key < c->key; });
  {
    std::lock_guard<std::mutex> g(g_ticket_mu);
    for (ncclComm* c : comms) {
      std::lock_guard<std::mutex> l(c->mu);
      b->turns.push_back({c, c->tickets++});
    }
  }
  llmpi::sim::enqueue(carrier, {[b] { run(*b); }, [b] { land(*b); }});
  for (CUstream_st* s : others) {
    CUevent_st e;
    llmpi::sim::record(&e, carrier);
    llmpi::sim::wait_event(s, &e);
  }
  return ncclSuccess;
}

ncclResult_t check_comm(const ncclComm* c) {
  if (!c) return refuse(ncclInvalidArgument, "the communicator is NULL");
  if (c->aborted) return refuse(ncclInvalidUsage, "the communicator was aborted (ncclCommAbort)");
  return ncclSuccess;
}

ncclResult_t add(const Op& op) {
  ncclResult_t r = check_comm(op.comm);
  const bool reduction = op.kind == Kind::all_reduce || op.kind == Kind::reduce_scatter;
  const bool p2p = !op.collective();
  const size_t per_rank_blocks =
      r == ncclSuccess && (op.kind == Kind::reduce_scatter || op.kind == Kind::all_gather) ? op.comm->nranks : 1;
  if (r != ncclSuccess) {
  } else if (type_bytes(op.type) == 0) {
    r = refuse(ncclInvalidArgument, "datatype " + std::to_string(op.type) + " is not one of NCCL's");
  } else if (reduction && op.type != ncclFloat32 && op.type != ncclBfloat16) {
    r = refuse(ncclInvalidArgument, std::string(kind_name(static_cast<int32_t>(op.kind))) +
                                        ": the simulator reduces ncclFloat32 and ncclBfloat16 only");
  } else if (reduction && op.red != ncclSum && op.red != ncclAvg && op.red != ncclMax) {
    r = refuse(ncclInvalidArgument, std::string(kind_name(static_cast<int32_t>(op.kind))) +
                                        ": the simulator reduces with ncclSum, ncclAvg and ncclMax only");
  } else if ((op.kind == Kind::broadcast || p2p) && (op.peer < 0 || op.peer >= op.comm->nranks)) {
    r = refuse(ncclInvalidArgument, std::string(kind_name(static_cast<int32_t>(op.kind))) + ": " +
                                        (p2p ? "peer " : "root ") + std::to_string(op.peer) +
                                        " is not a rank of a communicator of " + std::to_string(op.comm->nranks));
  } else if (op.count > 0 && ((op.kind != Kind::recv && !op.send) || (op.kind != Kind::send && !op.recv))) {
    r = refuse(ncclInvalidArgument, std::string(kind_name(static_cast<int32_t>(op.kind))) + ": a NULL buffer");
  } else if (op.count > 0 && (op.bytes() / op.count != type_bytes(op.type) || op.bytes() > kMaxBytes ||
                              op.bytes() > SIZE_MAX / per_rank_blocks)) {
    r = refuse(ncclInvalidArgument, std::string(kind_name(static_cast<int32_t>(op.kind))) +
                                        ": the simulator moves at most 2 GiB a rank in one operation");
  }
  if (r != ncclSuccess) {
    if (t_group_depth > 0) t_group_error = r;
    return r;
  }
  if (op.count == 0) return ncclSuccess;  // nothing to do, as in NCCL
  if (t_group_depth > 0) {
    t_group.push_back(op);
    return ncclSuccess;
  }
  return submit({op});
}

// Waits until every operation called on c is done with MPI.
void drain(ncclComm* c) {
  std::unique_lock<std::mutex> l(c->mu);
  c->cv.wait(l, [&] { return c->finished == c->tickets; });
}

// The bootstrap: every member tells the id's creator its rank; the creator answers each with the
// world ranks of all (or why not). Returns the world ranks by communicator rank, or an error.
struct Join {
  uint64_t serial;
  int32_t nranks, rank, world_rank;
};
std::map<uint64_t, std::vector<Join>>& early_joins() {  // joins for ids the creator has not reached
  static std::map<uint64_t, std::vector<Join>> m;
  return m;
}

ncclResult_t bootstrap(const IdFields& id, int nranks, int rank, std::vector<int>& world_ranks) {
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  // reply: serial, status (0 ok, else the rank that joined twice + 1, or -1 for differing nranks),
  // then the world ranks
  std::vector<int64_t> reply(2 + nranks, -1);
  if (me != id.creator) {
    const Join j{id.serial, nranks, rank, me};
    MPI_Send(&j, sizeof j, MPI_BYTE, id.creator, kJoinTag, MPI_COMM_WORLD);
    MPI_Recv(reply.data(), static_cast<int>(reply.size()), MPI_INT64_T, id.creator, kReplyTag, MPI_COMM_WORLD,
             MPI_STATUS_IGNORE);
    if (reply[0] != static_cast<int64_t>(id.serial))
      return refuse(ncclInvalidUsage, "the id's creator answered for another of its ids: the ranks join "
                                      "communicators in different orders");
  } else {
    std::vector<Join> joins{{id.serial, nranks, rank, me}};
    auto& early = early_joins()[id.serial];
    joins.insert(joins.end(), early.begin(), early.end());
    early_joins().erase(id.serial);
    while (static_cast<int>(joins.size()) < nranks) {
      Join j;
      MPI_Recv(&j, sizeof j, MPI_BYTE, MPI_ANY_SOURCE, kJoinTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      if (j.serial == id.serial)
        joins.push_back(j);
      else
        early_joins()[j.serial].push_back(j);
    }
    reply[0] = static_cast<int64_t>(id.serial);
    reply[1] = 0;
    for (const Join& j : joins) {
      if (j.nranks != nranks) reply[1] = -1;
      else if (reply[2 + j.rank] != -1) reply[1] = j.rank + 1;
      else reply[2 + j.rank] = j.world_rank;
    }
    for (const Join& j : joins)
      if (j.world_rank != me)
        MPI_Send(reply.data(), static_cast<int>(reply.size()), MPI_INT64_T, j.world_rank, kReplyTag, MPI_COMM_WORLD);
  }
  if (reply[1] == -1)
    return refuse(ncclInvalidUsage, "the ranks joining one id give different nranks to ncclCommInitRank");
  if (reply[1] > 0)
    return refuse(ncclInvalidUsage, "two ranks join one id as rank " + std::to_string(reply[1] - 1));
  world_ranks.assign(reply.begin() + 2, reply.end());
  return ncclSuccess;
}

}  // namespace

// ---- the API ---------------------------------------------------------------------------------

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return refuse(ncclInvalidArgument, "ncclGetVersion: NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uid) {
  static std::atomic<uint64_t> serial{0};
  int up = 0;
  MPI_Initialized(&up);
  if (!uid) return refuse(ncclInvalidArgument, "ncclGetUniqueId: NULL");
  if (!up) return refuse(ncclSystemError, "the simulator's NCCL runs over MPI: call MPI_Init first");
  IdFields f{};
  std::memcpy(f.magic, kMagic, sizeof f.magic);
  MPI_Comm_rank(MPI_COMM_WORLD, &f.creator);
  f.serial = serial++;
  std::memset(uid->internal, 0, sizeof uid->internal);
  std::memcpy(uid->internal, &f, sizeof f);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId uid, int rank) {
  if (!out) return refuse(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
  *out = nullptr;
  int up = 0, level = 0;
  MPI_Initialized(&up);
  if (!up) return refuse(ncclSystemError, "the simulator's NCCL runs over MPI: call MPI_Init first");
  MPI_Query_thread(&level);
  if (level < MPI_THREAD_MULTIPLE)
    return refuse(ncclSystemError, "the simulator's NCCL needs MPI_THREAD_MULTIPLE (its streams' threads call MPI): "
                                   "initialise MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...)");
  IdFields id;
  std::memcpy(&id, uid.internal, sizeof id);
  if (std::memcmp(id.magic, kMagic, sizeof kMagic) != 0)
    return refuse(ncclInvalidArgument, "ncclCommInitRank: not an id made by ncclGetUniqueId");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return refuse(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " of " +
                                           std::to_string(nranks));
  auto c = std::make_unique<ncclComm>();
  c->rank = rank;
  c->nranks = nranks;
  c->key = static_cast<uint64_t>(id.creator) << 40 | id.serial;
  if (nranks == 1) {
    MPI_Comm_dup(MPI_COMM_SELF, &c->mpi);
  } else {
    std::vector<int> world_ranks;
    const ncclResult_t r = bootstrap(id, nranks, rank, world_ranks);
    if (r != ncclSuccess) return r;
    MPI_Group world_group, group;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Group_incl(world_group, nranks, world_ranks.data(), &group);
    MPI_Comm_create_group(MPI_COMM_WORLD, group, kCreateTag, &c->mpi);
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
  }
  MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN);
  *out = c.release();
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (const ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  drain(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return refuse(ncclInvalidArgument, "ncclCommDestroy: NULL");
  if (comm->aborted) {  // its memory stays (operations in flight may still name it), kept reachable
    static std::mutex mu;
    static auto* aborted = new std::vector<ncclComm_t>;  // never destroyed: reachable at exit
    std::lock_guard<std::mutex> l(mu);
    aborted->push_back(comm);
    return ncclSuccess;
  }
  drain(comm);
  MPI_Comm_free(&comm->mpi);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return refuse(ncclInvalidArgument, "ncclCommAbort: NULL");
  std::lock_guard<std::mutex> l(comm->mu);
  comm->aborted = true;  // later calls are refused; operations in flight are left as they are
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t) { return t_last_error.c_str(); }

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (!comm || !async_error) return refuse(ncclInvalidArgument, "ncclCommGetAsyncError: NULL");
  *async_error = ncclSuccess;  // a failure in flight stops the job instead
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!comm || !count) return refuse(ncclInvalidArgument, "ncclCommCount: NULL");
  *count = comm->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (!comm || !device) return refuse(ncclInvalidArgument, "ncclCommCuDevice: NULL");
  *device = 0;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!comm || !rank) return refuse(ncclInvalidArgument, "ncclCommUserRank: NULL");
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return add({Kind::broadcast, comm && comm->rank == root ? sendbuff : recvbuff, recvbuff, count, datatype, ncclSum,
              root, comm, stream});
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return add({Kind::all_reduce, sendbuff, recvbuff, count, datatype, op, 0, comm, stream});
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return add({Kind::reduce_scatter, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream});
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return add({Kind::all_gather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream});
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return add({Kind::send, sendbuff, nullptr, count, datatype, ncclSum, peer, comm, stream});
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return add({Kind::recv, nullptr, recvbuff, count, datatype, ncclSum, peer, comm, stream});
}

ncclResult_t ncclGroupStart() {
  t_group_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (t_group_depth == 0) return refuse(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--t_group_depth > 0) return ncclSuccess;
  std::vector<Op> ops;
  ops.swap(t_group);
  const ncclResult_t error = t_group_error;
  t_group_error = ncclSuccess;
  if (error != ncclSuccess) return error;  // a call of the group was refused: none of it runs
  return submit(std::move(ops));
}
