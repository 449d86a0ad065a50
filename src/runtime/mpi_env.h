// MPI bootstrap (RAII) and the two ways a job ends on an error.
//
//   MpiEnv env(&argc, &argv);     MPI_Init_thread ... MPI_Finalize; rank, world, local rank
//   agree_on_error(comm, err)     start-up checks: every rank learns the first rank's error, so
//                                 the job prints one message and every rank exits non-zero
//   fatal(msg)                    mid-run, one rank: print "[rank r] msg" and MPI_Abort the job
#pragma once
#include <mpi.h>

#include <string>

namespace llmpi {

struct MpiEnv {
  int rank = 0, world = 1;
  int local_rank = 0, local_size = 1;  // within this node (MPI_Comm_split_type SHARED)
  int thread_level = 0;
  MpiEnv(int* argc, char*** argv);
  ~MpiEnv();
  MpiEnv(const MpiEnv&) = delete;
  MpiEnv& operator=(const MpiEnv&) = delete;
};

// Every rank passes its own error text ("" when it has none). Returns, on every rank, the error of
// the lowest-numbered rank that had one (prefixed "rank N: " when not every rank failed), or ""
// when all succeeded. Collective over comm.
std::string agree_on_error(MPI_Comm comm, const std::string& local_error);

// Print "<program>: error: [rank r] msg" on stderr and end the whole job with MPI_Abort(code).
[[noreturn]] void fatal(const std::string& msg, int code = 1);

// Program name used in messages ("llmpi-train"); set once by the main.
void set_program_name(const char* name);
const char* program_name();

}  // namespace llmpi
