// Google Test main for llmpi-tests. Initialises MPI so the same binary runs the serial unit tests
// (`llmpi-tests --gtest_filter=-Mpi*`) and, under `mpiexec -n 2`, the MPI tests (`Mpi*`).
// Rank 0 prints the usual report; other ranks print only their failures. The exit code is
// non-zero on every rank when any rank failed.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

namespace {
struct FailuresOnly : testing::EmptyTestEventListener {
  int rank;
  explicit FailuresOnly(int r) : rank(r) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
  }
};
}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailuresOnly(rank));
  }
  int rc = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
