// The NCCL communicator (dist_nccl.hpp): ncclAllGather (bytes for fp8) and ncclReduceScatter with
// ncclSum, enqueued on the caller's stream with the communicator's device current.
#include <nccl.h>

#include <memory>

#include "core/check.hpp"
#include "cuda/common/runtime.hpp"
#include "mlakit/dist_nccl.hpp"

namespace mlakit::dist {

namespace {

using detail::require;

void check_nccl(ncclResult_t status, ncclComm_t comm, const char* what) {
  if (status == ncclSuccess) return;
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  detail::fail(
      ErrorCode::kBackend,
      detail::str_cat("nccl communicator: ", what, " failed: ", ncclGetErrorString(status),
                      last != nullptr && *last != '\0' ? ": " : "", last != nullptr ? last : ""));
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kFp8E4m3:
    case DType::kU8:
      return ncclUint8;  // all-gather only: bytes are moved, never added
    default:
      detail::fail(ErrorCode::kInternal,
                   detail::str_cat("nccl communicator: unexpected dtype ", dtype_name(dtype)));
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int cuda_device, bool owned)
      : comm_(comm), device_(cuda_device), owned_(owned) {
    check_nccl(ncclCommUserRank(comm_, &rank_), comm_, "ncclCommUserRank");
    check_nccl(ncclCommCount(comm_, &size_), comm_, "ncclCommCount");
  }
  ~NcclCommunicator() override {
    if (owned_) ncclCommDestroy(comm_);  // nothing to report from a destructor
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  Device device() const override { return Device::cuda(device_); }
  const char* backend_name() const override { return "nccl"; }

 protected:
  void all_gather_impl(const void* send, void* recv, int64_t count, DType dtype,
                       Stream stream) override {
    cuda::DeviceGuard guard(device(), "nccl communicator");
    check_nccl(ncclAllGather(send, recv, static_cast<size_t>(count), nccl_type(dtype), comm_,
                             cuda::as_cuda_stream(stream)),
               comm_, "ncclAllGather");
  }

  void reduce_scatter_sum_impl(const void* send, void* recv, int64_t recv_count, DType dtype,
                               Stream stream) override {
    cuda::DeviceGuard guard(device(), "nccl communicator");
    check_nccl(ncclReduceScatter(send, recv, static_cast<size_t>(recv_count), nccl_type(dtype),
                                 ncclSum, comm_, cuda::as_cuda_stream(stream)),
               comm_, "ncclReduceScatter");
  }

 private:
  ncclComm_t comm_;
  int device_;
  bool owned_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(ncclComm_t comm, int cuda_device) {
  require(comm != nullptr, ErrorCode::kInvalidArgument,
          "make_nccl_communicator: comm must not be null");
  return std::make_unique<NcclCommunicator>(comm, cuda_device, /*owned=*/false);
}

std::unique_ptr<Communicator> make_nccl_communicator(const ncclUniqueId& id, int world_size,
                                                     int rank, int cuda_device) {
  require(world_size >= 1 && rank >= 0 && rank < world_size, ErrorCode::kInvalidArgument,
          "make_nccl_communicator: rank must be in [0, world_size = ", world_size, "), got ", rank);
  cuda::DeviceGuard guard(Device::cuda(cuda_device), "make_nccl_communicator");
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, world_size, id, rank), nullptr, "ncclCommInitRank");
  return std::make_unique<NcclCommunicator>(comm, cuda_device, /*owned=*/true);
}

}  // namespace mlakit::dist
