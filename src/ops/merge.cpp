// ops::merge_attn_states: argument validation (backend independent) and device dispatch.
#include "cpu/merge.hpp"

#include <optional>

#include "core/check.hpp"
#include "mlakit/ops.hpp"

#ifdef MLAKIT_WITH_CUDA
#include "cuda/merge/launch.hpp"
#endif

namespace mlakit::ops {

namespace {

constexpr const char* kOp = "merge_attn_states";

// Byte range [first, last) a view can touch (empty views touch nothing).
struct ByteRange {
  const char* first;
  const char* last;
};
ByteRange byte_range(const TensorView& t) {
  const char* base = static_cast<const char*>(t.data);
  if (t.numel() == 0) return {base, base};
  int64_t last_elem = 0;
  for (int d = 0; d < t.ndim; ++d) last_elem += (t.shape[d] - 1) * t.strides[d];
  return {base, base + (last_elem + 1) * t.element_size()};
}

bool same_view(const TensorView& a, const TensorView& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.ndim != b.ndim) return false;
  for (int d = 0; d < a.ndim; ++d) {
    if (a.shape[d] != b.shape[d] || a.strides[d] != b.strides[d]) return false;
  }
  return true;
}

// A result may be written in place over an input only when both are the same view; any other
// overlap would let the kernel overwrite input elements it has not read yet.
void check_alias(const char* out_name, const TensorView& out, const char* in_name,
                 const TensorView& in) {
  const ByteRange o = byte_range(out), i = byte_range(in);
  const bool overlap = o.first < i.last && i.first < o.last;
  detail::require(!overlap || same_view(out, in), ErrorCode::kInvalidArgument, kOp, ": ", out_name,
                  " overlaps ", in_name, " without being the same view (in-place merging needs ",
                  "identical data pointer, shape and strides)");
}

// prefix_output / suffix_output: [T, H, D] like `output` (each f32, f16 or bf16), D contiguous.
void check_states(const char* name, const TensorView& t, const TensorView& output) {
  detail::check_storage(kOp, name, t);
  detail::check_ndim(kOp, name, t, 3);
  detail::check_float_activation(kOp, name, t);
  for (int d = 0; d < 3; ++d) detail::check_size(kOp, name, t, d, output.shape[d]);
  detail::check_inner_contiguous(kOp, name, t);
}

// LSE of the merge: f32 [H, T], any strides.
void check_lse(const char* name, const TensorView& t, int64_t heads, int64_t tokens) {
  detail::check_storage(kOp, name, t);
  detail::check_ndim(kOp, name, t, 2);
  detail::check_dtype(kOp, name, t, {DType::kF32});
  detail::check_size(kOp, name, t, 0, heads);
  detail::check_size(kOp, name, t, 1, tokens);
}

}  // namespace

void merge_attn_states(const TensorView& output,
                       const std::optional<TensorView>& output_lse_heads_tokens,
                       const TensorView& prefix_output, const TensorView& prefix_lse_heads_tokens,
                       const TensorView& suffix_output, const TensorView& suffix_lse_heads_tokens,
                       Stream stream) {
  detail::check_storage(kOp, "output", output);
  detail::check_ndim(kOp, "output", output, 3);
  detail::check_float_activation(kOp, "output", output);
  detail::check_inner_contiguous(kOp, "output", output);
  check_states("prefix_output", prefix_output, output);
  check_states("suffix_output", suffix_output, output);
  const int64_t tokens = output.shape[0], heads = output.shape[1];
  check_lse("prefix_lse_heads_tokens", prefix_lse_heads_tokens, heads, tokens);
  check_lse("suffix_lse_heads_tokens", suffix_lse_heads_tokens, heads, tokens);
  check_alias("output", output, "prefix_output", prefix_output);
  check_alias("output", output, "suffix_output", suffix_output);
  Device device =
      detail::common_device(kOp, {{"output", &output},
                                  {"prefix_output", &prefix_output},
                                  {"prefix_lse_heads_tokens", &prefix_lse_heads_tokens},
                                  {"suffix_output", &suffix_output},
                                  {"suffix_lse_heads_tokens", &suffix_lse_heads_tokens}});
  if (output_lse_heads_tokens) {
    const TensorView& lse = *output_lse_heads_tokens;
    check_lse("output_lse_heads_tokens", lse, heads, tokens);
    check_alias("output_lse_heads_tokens", lse, "prefix_lse_heads_tokens", prefix_lse_heads_tokens);
    check_alias("output_lse_heads_tokens", lse, "suffix_lse_heads_tokens", suffix_lse_heads_tokens);
    check_alias("output_lse_heads_tokens", lse, "output", output);
    device = detail::common_device(kOp, {{"output", &output}, {"output_lse_heads_tokens", &lse}});
  }

  if (device.is_cpu()) {
    cpu::merge_attn_states(output, output_lse_heads_tokens, prefix_output, prefix_lse_heads_tokens,
                           suffix_output, suffix_lse_heads_tokens);
    return;
  }
#ifdef MLAKIT_WITH_CUDA
  cuda::merge_attn_states(output, output_lse_heads_tokens, prefix_output, prefix_lse_heads_tokens,
                          suffix_output, suffix_lse_heads_tokens, stream);
#else
  (void)stream;  // no CUDA backend in this build
  detail::unsupported_device(kOp, device);
#endif
}

}  // namespace mlakit::ops
