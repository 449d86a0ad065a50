#include "runtime/mpi_env.h"

#include <chrono>
#include <cstdio>
#include <thread>
#include <cstring>
#include <vector>

#include "runtime/large_count.h"

namespace llmpi {

static const char* g_program = "llmpi";
void set_program_name(const char* name) { g_program = name; }
const char* program_name() { return g_program; }

MpiEnv::MpiEnv(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &thread_level);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);
}

MpiEnv::~MpiEnv() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::string agree_on_error(MPI_Comm comm, const std::string& local_error) {
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  int mine = local_error.empty() ? world : rank, first = world;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first == world) return "";
  int failed_here = local_error.empty() ? 0 : 1, failed = 0;
  MPI_Allreduce(&failed_here, &failed, 1, MPI_INT, MPI_SUM, comm);
  int len = rank == first ? mpi_count(local_error.size(), "an error message") : 0;
  MPI_Bcast(&len, 1, MPI_INT, first, comm);
  std::vector<char> buf(len + 1, '\0');
  if (rank == first) std::memcpy(buf.data(), local_error.data(), len);
  MPI_Bcast(buf.data(), len, MPI_CHAR, first, comm);
  std::string msg(buf.data(), len);
  if (failed < world) msg = "rank " + std::to_string(first) + ": " + msg;
  return msg;
}

void fatal(const std::string& msg, int code) {
  int rank = 0, initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "%s: error: [rank %d] %s\n", g_program, rank, msg.c_str());
  std::fflush(stderr);
  // mpiexec forwards our stderr through its proxy; MPI_Abort tears the job down at once, and on
  // a busy node the proxy was seen to drop this last line. Give it time to pass it on.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  if (initialized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace llmpi
