// Host side of backend/nccl_sync.h: the MPI bootstrap of the NCCL communicator, and, in a build
// without NCCL (or without CUDA), the API's stand-ins (nccl_available() = false with the reason,
// the rest throws Error). With NCCL, kernels/nccl_sync.cu defines the NcclSync members.
#include "backend/nccl_sync.h"

#include "backend/cuda_ops.h"
#include "runtime/error.h"
#include "runtime/mpi_env.h"

namespace llmpi {

#ifdef LLMPI_HAVE_NCCL

bool nccl_available(std::string* why) { return cuda_available(why); }

std::unique_ptr<NcclSync> nccl_sync_create(MPI_Comm comm) {
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
      id = NcclSync::make_id();
    } catch (const Error& e) {
      err = e.what();
    }
  }
  err = agree_on_error(comm, err);
  if (!err.empty()) throw Error(err);  // every rank throws the same error
  MPI_Bcast(id.bytes, static_cast<int>(sizeof id.bytes), MPI_BYTE, 0, comm);
  std::unique_ptr<NcclSync> sync;
  try {
    sync = std::make_unique<NcclSync>(id, rank, world);
  } catch (const Error& e) {
    err = e.what();
  }
  err = agree_on_error(comm, err);
  if (!err.empty()) throw Error(err);  // every rank throws the same error
  return sync;
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

struct NcclSync::Impl {};

bool nccl_available(std::string* why) {
  if (why) *why = kNoNccl;
  return false;
}
std::unique_ptr<NcclSync> nccl_sync_create(MPI_Comm) { no_nccl(); }
NcclId NcclSync::make_id() { no_nccl(); }
NcclSync::NcclSync(const NcclId&, int, int) { no_nccl(); }
NcclSync::~NcclSync() = default;
void NcclSync::allreduce_avg(float*, size_t) { no_nccl(); }
void NcclSync::begin(float*, size_t, size_t, bool) { no_nccl(); }
void NcclSync::ready(size_t) { no_nccl(); }
void NcclSync::finish() { no_nccl(); }
void NcclSync::synchronize() { no_nccl(); }

#endif

}  // namespace llmpi
