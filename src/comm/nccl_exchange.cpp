// Host side of comm/nccl.h: the MPI bootstrap of an NCCL communicator, the nccl method's Exchange,
// and, in a build without NCCL (or without CUDA), the API's stand-ins (nccl_available() = false
// with the reason, the rest throws Error). With NCCL, kernels/nccl_sync.cu defines the NcclComm
// members.
#include "backend/cuda_ops.h"
#include "comm/nccl.h"
#include "runtime/error.h"
#include "runtime/mpi_env.h"

namespace llmpi {

#ifdef LLMPI_HAVE_NCCL

bool nccl_available(std::string* why) { return cuda_available(why); }

std::unique_ptr<NcclComm> nccl_comm_create(MPI_Comm comm) {
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  // Rank 0 makes the id; if that fails, every rank must learn it (the others would otherwise wait in
  // the broadcast, or in ncclCommInitRank, for ever). Then each joins; a rank whose join fails
  // tells the others through the agreement below (a join that hangs inside NCCL is bounded by
  // the watchdog, not here).
  NcclId id{};
  std::string err;
  if (rank == 0) {
    try {
      id = NcclComm::make_id();
    } catch (const Error& e) {
      err = e.what();
    }
  }
  err = agree_on_error(comm, err);
  if (!err.empty()) throw Error(err);  // every rank throws the same error
  MPI_Bcast(id.bytes, static_cast<int>(sizeof id.bytes), MPI_BYTE, 0, comm);
  std::unique_ptr<NcclComm> c;
  try {
    c = std::make_unique<NcclComm>(id, rank, world);
  } catch (const Error& e) {
    err = e.what();
  }
  err = agree_on_error(comm, err);
  if (!err.empty()) throw Error(err);  // every rank throws the same error
  return c;
}

#else  // no NCCL

namespace {
#ifdef LLMPI_HAVE_CUDA
constexpr const char* kNoNccl = "built without NCCL (nccl.h not found under NCCL_HOME)";
#else
constexpr const char* kNoNccl = "built without CUDA (make CUDA=0 or no nvcc), so without NCCL";
#endif
[[noreturn]] void no_nccl() { fail("parallel.sync = nccl: this llmpi was ", kNoNccl); }
}  // namespace

struct NcclComm::Impl {};

bool nccl_available(std::string* why) {
  if (why) *why = kNoNccl;
  return false;
}
std::unique_ptr<NcclComm> nccl_comm_create(MPI_Comm) { no_nccl(); }
NcclId NcclComm::make_id() { no_nccl(); }
NcclComm::NcclComm(const NcclId&, int, int) { no_nccl(); }
NcclComm::~NcclComm() = default;
void NcclComm::allreduce_avg(float*, size_t, bool) { no_nccl(); }
void NcclComm::allreduce(float*, size_t, bool) { no_nccl(); }
void NcclComm::all_gather_pieces(const float*, float*, size_t) { no_nccl(); }
void NcclComm::reduce_scatter_pieces(const float*, float*, size_t) { no_nccl(); }
void NcclComm::reduce_scatter_avg(float*, size_t, bool) { no_nccl(); }
void NcclComm::all_gather(float*, size_t) { no_nccl(); }
void NcclComm::send(const float*, size_t, int) { no_nccl(); }
void NcclComm::recv(float*, size_t, int) { no_nccl(); }
bool NcclComm::finished() { no_nccl(); }
void NcclComm::compute_waits() { no_nccl(); }
void NcclComm::synchronize() { no_nccl(); }
void* NcclComm::stream() { no_nccl(); }

#endif

namespace {

// The nccl method: every pass enqueued on NCCL's stream (device memory, no host wait).
struct NcclExchange final : Exchange {
  std::unique_ptr<NcclComm> nccl;
  bool bf16;
  NcclExchange(bool bf16_, MPI_Comm comm) : nccl(nccl_comm_create(comm)), bf16(bf16_) {}
  bool device_memory() const override { return true; }
  Traffic average(float* data, size_t n, int) override {
    nccl->allreduce_avg(data, n, bf16);
    Traffic t;
    t.collectives = 1;
    t.sent = t.received = expected_bytes_per_pass(n, false);
    return t;
  }
  // ZeRO-1: through W padded pieces of ceil(n/W) floats (comm/nccl.h), counted as NCCL's ring
  // moves them: (W-1) pieces each way.
  Traffic reduce_scatter_mean(float* data, size_t n, int) override {
    nccl->reduce_scatter_avg(data, n, bf16);
    Traffic t;
    t.collectives = 1;
    t.sent = t.received = padded_pieces_bytes(n, bf16 ? 2 : sizeof(float));
    return t;
  }
  Traffic all_gather(float* data, size_t n, int) override {
    nccl->all_gather(data, n);
    Traffic t;
    t.collectives = 1;
    t.sent = t.received = padded_pieces_bytes(n, sizeof(float));
    return t;
  }
  void order_compute_after() override { nccl->compute_waits(); }
  void* device_stream() override { return nccl->stream(); }
  double expected_bytes_per_pass(size_t n, bool zero) const override {
    const int W = nccl->world();
    if (W == 1) return 0;
    const size_t grad = bf16 ? 2 : sizeof(float);
    if (zero) return padded_pieces_bytes(n, grad) + padded_pieces_bytes(n, sizeof(float));
    return (W - 1.0) / W * 2.0 * (double)n * grad;
  }
  double padded_pieces_bytes(size_t n, size_t bytes) const {
    const size_t W = (size_t)nccl->world();
    return (double)(W - 1) * (double)((n + W - 1) / W) * (double)bytes;
  }
};

}  // namespace

std::unique_ptr<Exchange> make_nccl_exchange(bool bf16, MPI_Comm comm) {
  return std::make_unique<NcclExchange>(bf16, comm);
}

}  // namespace llmpi
