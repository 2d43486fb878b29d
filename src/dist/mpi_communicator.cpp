// The MPI communicator (dist_mpi.hpp): MPI_Allgather of raw bytes; the reduce-scatter is an
// MPI_Alltoall of raw bytes followed by a local f32 sum in rank order, rounded once: the result
// does not depend on the MPI library's reduction algorithm.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/check.hpp"
#include "cpu/float_rows.hpp"
#include "cpu/parallel.hpp"
#include "mlakit/dist_mpi.hpp"

namespace mlakit::dist {

namespace {

using detail::require;

// Elements summed per parallel work item: 4096 f32 accumulators (16 KiB) stay in L1 and a
// decode step's [T, H, 512] result still splits into many items.
constexpr int64_t kSumChunk = 4096;

void check_mpi(int status, const char* what) {
  if (status == MPI_SUCCESS) return;
  char message[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(status, message, &length);
  detail::fail(ErrorCode::kBackend, detail::str_cat("mpi communicator: ", what,
                                                    " failed: ", std::string(message, length)));
}

// MPI counts are int: one rank's share of a collective must stay below 2 GiB.
int byte_count(int64_t count, DType dtype, const char* what) {
  const int64_t bytes = count * dtype_size(dtype);
  require(bytes <= INT_MAX, ErrorCode::kUnsupported, "mpi communicator: ", what, " of ", bytes,
          " bytes per rank exceeds MPI's int count (", INT_MAX, ")");
  return static_cast<int>(bytes);
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  Device device() const override { return Device::cpu(); }
  const char* backend_name() const override { return "mpi"; }

 protected:
  void all_gather_impl(const void* send, void* recv, int64_t count, DType dtype, Stream) override {
    const int bytes = byte_count(count, dtype, "all_gather");
    const bool in_place = send == static_cast<char*>(recv) + int64_t{rank_} * bytes;
    check_mpi(MPI_Allgather(in_place ? MPI_IN_PLACE : send, bytes, MPI_BYTE, recv, bytes, MPI_BYTE,
                            comm_),
              "MPI_Allgather");
  }

  void reduce_scatter_sum_impl(const void* send, void* recv, int64_t recv_count, DType dtype,
                               Stream) override {
    const int bytes = byte_count(recv_count, dtype, "reduce_scatter_sum");
    // Scratch for every rank's slice of this rank: grows on the first call of a larger size.
    received_.resize(static_cast<size_t>(bytes) * size_);
    check_mpi(MPI_Alltoall(send, bytes, MPI_BYTE, received_.data(), bytes, MPI_BYTE, comm_),
              "MPI_Alltoall");
    const int64_t chunks = (recv_count + kSumChunk - 1) / kSumChunk;
    cpu::parallel_for(0, chunks, [&](int64_t chunk) {
      float acc[kSumChunk], part[kSumChunk];
      const int64_t first = chunk * kSumChunk;
      const int64_t n = std::min(kSumChunk, recv_count - first);
      std::fill_n(acc, n, 0.0f);
      for (int k = 0; k < size_; ++k) {
        cpu::load_row(received_.data() + int64_t{k} * bytes + first * dtype_size(dtype), dtype, 1,
                      n, part);
        for (int64_t i = 0; i < n; ++i) acc[i] += part[i];
      }
      cpu::store_row(acc, n, static_cast<char*>(recv) + first * dtype_size(dtype), dtype, 1);
    });
  }

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<char> received_;  // [world_size, recv bytes]
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  require(initialized != 0, ErrorCode::kInvalidArgument,
          "make_mpi_communicator: MPI must be initialized (MPI_Init) first");
  require(comm != MPI_COMM_NULL, ErrorCode::kInvalidArgument,
          "make_mpi_communicator: comm must not be MPI_COMM_NULL");
  return std::make_unique<MpiCommunicator>(comm);
}

}  // namespace mlakit::dist
