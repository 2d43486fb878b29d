// ops::fill_token_to_seq: validation and dispatch by device.
#include "cpu/token_to_seq.hpp"

#include <cstdint>

#include "core/check.hpp"
#include "mlakit/ops.hpp"

#ifdef MLAKIT_WITH_CUDA
#include "cuda/cache/launch.hpp"
#endif

namespace mlakit::ops {

using detail::require;

void fill_token_to_seq(const TensorView& cu_seq_lens, const TensorView& token_to_seq,
                       int64_t num_tokens, Stream stream) {
  constexpr const char* kOp = "fill_token_to_seq";
  const Device device =
      detail::common_device(kOp, {{"cu_seq_lens", &cu_seq_lens}, {"token_to_seq", &token_to_seq}});
  for (const auto& [name, t] :
       {std::pair<const char*, const TensorView*>{"cu_seq_lens", &cu_seq_lens},
        {"token_to_seq", &token_to_seq}}) {
    detail::check_storage(kOp, name, *t);
    detail::check_ndim(kOp, name, *t, 1);
    detail::check_dtype(kOp, name, *t, {DType::kI32});
  }
  detail::check_outputs_apart(kOp, {{"token_to_seq", &token_to_seq}},
                              {{"cu_seq_lens", &cu_seq_lens}});
  require(cu_seq_lens.shape[0] >= 1, ErrorCode::kInvalidArgument, kOp,
          ": cu_seq_lens must have B + 1 >= 1 entries, got 0");
  require(num_tokens >= 0, ErrorCode::kInvalidArgument, kOp, ": num_tokens must be >= 0, got ",
          num_tokens);
  detail::check_min_size(kOp, "token_to_seq", token_to_seq, 0, num_tokens);
#ifdef MLAKIT_WITH_CUDA
  // Offsets stay on the device: rows outside every request get -1, which the gather reports.
  if (device.is_cuda()) {
    cuda::fill_token_to_seq(cu_seq_lens, token_to_seq, num_tokens, stream);
    return;
  }
#else
  (void)stream;
#endif
  if (!device.is_cpu()) detail::unsupported_device(kOp, device);
  const auto* cu = cu_seq_lens.data_as<const int32_t>();
  const int64_t batch = cu_seq_lens.shape[0] - 1, stride = cu_seq_lens.strides[0];
  require(cu[0] == 0, ErrorCode::kInvalidArgument, kOp, ": cu_seq_lens[0] must be 0, got ", cu[0]);
  for (int64_t b = 0; b < batch; ++b) {
    require(cu[(b + 1) * stride] >= cu[b * stride], ErrorCode::kInvalidArgument, kOp,
            ": cu_seq_lens must be non-decreasing, got cu_seq_lens[", b + 1,
            "] = ", cu[(b + 1) * stride], " < cu_seq_lens[", b, "] = ", cu[b * stride]);
  }
  require(cu[batch * stride] >= num_tokens, ErrorCode::kInvalidArgument, kOp, ": cu_seq_lens[B] (",
          cu[batch * stride], ") must cover num_tokens (", num_tokens, ")");
  cpu::fill_token_to_seq(cu_seq_lens, token_to_seq, num_tokens);
}

}  // namespace mlakit::ops
