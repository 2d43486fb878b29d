// Communicator: the argument checks shared by every backend (dist.hpp), and the build flags.
#include <cstdint>

#include "core/check.hpp"
#include "mlakit/dist.hpp"

namespace mlakit::dist {

namespace {

using detail::require;

const char* byte_begin(const TensorView& t) { return static_cast<const char*>(t.data); }
const char* byte_end(const TensorView& t) { return byte_begin(t) + t.numel() * t.element_size(); }

// A contiguous tensor of `allowed` dtypes on the communicator's device.
void check_buffer(const char* op, const char* name, const TensorView& t, Device device,
                  std::initializer_list<DType> allowed) {
  detail::check_storage(op, name, t);
  detail::check_contiguous(op, name, t);
  detail::check_dtype(op, name, t, allowed);
  detail::check_device(op, name, t, device);
}

}  // namespace

void Communicator::all_gather(const TensorView& send, const TensorView& recv, Stream stream) {
  constexpr const char* kOp = "Communicator::all_gather";
  const auto dtypes = {DType::kF32, DType::kF16, DType::kBF16, DType::kFp8E4m3, DType::kU8};
  check_buffer(kOp, "send", send, device(), dtypes);
  check_buffer(kOp, "recv", recv, device(), dtypes);
  require(send.element_size() == recv.element_size() &&
              (send.dtype == recv.dtype || !is_float16(send.dtype)),
          ErrorCode::kInvalidArgument, kOp, ": recv must have send's dtype ",
          dtype_name(send.dtype), ", got ", dtype_name(recv.dtype));
  const int64_t count = send.numel();
  require(recv.numel() == world_size() * count, ErrorCode::kInvalidArgument, kOp,
          ": recv must have world_size * send.numel() = ", world_size(), " * ", count,
          " elements, got ", recv.numel());
  const bool in_place = send.data == recv.element_ptr(rank() * count);
  const bool disjoint = byte_end(send) <= byte_begin(recv) || byte_end(recv) <= byte_begin(send);
  require(count == 0 || in_place || disjoint, ErrorCode::kInvalidArgument, kOp,
          ": send must be disjoint from recv or exactly its slice rank() = ", rank());
  if (count == 0) return;
  all_gather_impl(send.data, recv.data, count, send.dtype, stream);
}

void Communicator::reduce_scatter_sum(const TensorView& send, const TensorView& recv,
                                      Stream stream) {
  constexpr const char* kOp = "Communicator::reduce_scatter_sum";
  const auto dtypes = {DType::kF32, DType::kF16, DType::kBF16};
  check_buffer(kOp, "send", send, device(), dtypes);
  check_buffer(kOp, "recv", recv, device(), dtypes);
  require(send.dtype == recv.dtype, ErrorCode::kInvalidArgument, kOp,
          ": recv must have send's dtype ", dtype_name(send.dtype), ", got ",
          dtype_name(recv.dtype));
  const int64_t count = recv.numel();
  require(send.numel() == world_size() * count, ErrorCode::kInvalidArgument, kOp,
          ": send must have world_size * recv.numel() = ", world_size(), " * ", count,
          " elements, got ", send.numel());
  const bool disjoint = byte_end(send) <= byte_begin(recv) || byte_end(recv) <= byte_begin(send);
  require(count == 0 || disjoint, ErrorCode::kInvalidArgument, kOp, ": recv must not overlap send");
  if (count == 0) return;
  reduce_scatter_sum_impl(send.data, recv.data, count, send.dtype, stream);
}

bool built_with_mpi() {
#ifdef MLAKIT_WITH_MPI
  return true;
#else
  return false;
#endif
}

bool built_with_nccl() {
#ifdef MLAKIT_WITH_NCCL
  return true;
#else
  return false;
#endif
}

}  // namespace mlakit::dist
