// main() of the MPI test programs (run by ctest under `mpirun -np W`): one seed for all ranks,
// exceptions abort the job (a rank that stops must not leave the others waiting in a collective),
// and the exit status is a failure on every rank when any rank failed.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/test_util.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  uint64_t seed = rank == 0 ? mlakit::test::test_seed() : 0;
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  if (rank != 0) setenv("MLAKIT_TEST_SEED", std::to_string(seed).c_str(), 1);
  ::testing::InitGoogleTest(&argc, argv);
  GTEST_FLAG_SET(catch_exceptions, false);
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return failed;
}
