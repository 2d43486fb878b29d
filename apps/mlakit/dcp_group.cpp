#include "dcp_group.hpp"

#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>

#include "mlakit/dist_mpi.hpp"
#include "mlakit/error.hpp"

namespace mlakit::cli {

// The MPI communicator, timed: each collective is a blocking MPI call, so its wall time is the
// communication time (waiting for the slowest rank included).
class DcpGroup::Timed : public dist::Communicator {
 public:
  explicit Timed(std::unique_ptr<dist::Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  Device device() const override { return inner_->device(); }
  const char* backend_name() const override { return inner_->backend_name(); }
  double seconds = 0.0;
  int64_t bytes = 0;

 protected:
  void all_gather_impl(const void* send, void* recv, int64_t count, DType dtype,
                       Stream stream) override {
    const int64_t world = world_size();
    timed(count * dtype_size(dtype), [&] {
      inner_->all_gather(view(send, count, dtype), view(recv, world * count, dtype), stream);
    });
  }
  void reduce_scatter_sum_impl(const void* send, void* recv, int64_t recv_count, DType dtype,
                               Stream stream) override {
    const int64_t world = world_size();
    timed(world * recv_count * dtype_size(dtype), [&] {
      inner_->reduce_scatter_sum(view(send, world * recv_count, dtype),
                                 view(recv, recv_count, dtype), stream);
    });
  }

 private:
  static TensorView view(const void* data, int64_t count, DType dtype) {
    return TensorView::contiguous(const_cast<void*>(data), dtype, {count});
  }
  template <class F>
  void timed(int64_t sent_bytes, F&& collective) {
    const auto start = std::chrono::steady_clock::now();
    collective();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    bytes += sent_bytes;
  }
  std::unique_ptr<dist::Communicator> inner_;
};

DcpGroup::DcpGroup(int64_t world_size) {
  MPI_Init(nullptr, nullptr);
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != world_size) {
    MPI_Finalize();
    throw Error(ErrorCode::kInvalidArgument, "--dcp " + std::to_string(world_size) +
                                                 " needs a job of as many ranks (mpirun -np " +
                                                 std::to_string(world_size) + "), this one has " +
                                                 std::to_string(size));
  }
  comm_ = std::make_unique<Timed>(dist::make_mpi_communicator(MPI_COMM_WORLD));
}

DcpGroup::~DcpGroup() {
  comm_.reset();
  MPI_Finalize();
}

int DcpGroup::rank() const { return comm_->rank(); }
dist::Communicator& DcpGroup::communicator() { return *comm_; }
double DcpGroup::comm_seconds() const { return comm_->seconds; }
int64_t DcpGroup::comm_bytes() const { return comm_->bytes; }

void DcpGroup::abort(const std::exception& error, int status) {
  std::cerr << "mlakit: error: DCP rank " << rank() << ": " << error.what() << "\n";
  std::cerr.flush();
  MPI_Abort(MPI_COMM_WORLD, status);
  std::exit(status);  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

bool DcpGroup::gather_rank_stats(RunResult& result, int64_t kv_blocks, bool verify_passed) {
  // One record a rank, as doubles (exact for these integer ranges).
  constexpr int kFields = 4;
  const double mine[kFields] = {static_cast<double>(kv_blocks),
                                static_cast<double>(result.scheduler.peak_blocks_used),
                                comm_->seconds, verify_passed ? 1.0 : 0.0};
  std::vector<double> all(static_cast<size_t>(kFields * comm_->world_size()));
  MPI_Gather(mine, kFields, MPI_DOUBLE, all.data(), kFields, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  int passed = verify_passed ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &passed, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (rank() == 0) {
    for (int k = 0; k < comm_->world_size(); ++k) {
      const double* r = &all[static_cast<size_t>(k * kFields)];
      result.ranks.push_back(
          {static_cast<int64_t>(r[0]), static_cast<int64_t>(r[1]), r[2], r[3] != 0.0});
    }
  }
  return passed != 0;
}

}  // namespace mlakit::cli
