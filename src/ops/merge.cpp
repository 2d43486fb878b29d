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

// A [T, H, D] state (f32, f16 or bf16), D contiguous.
void check_state(const char* name, const TensorView& t) {
  detail::check_storage(kOp, name, t);
  detail::check_ndim(kOp, name, t, 3);
  detail::check_float_activation(kOp, name, t);
  detail::check_inner_contiguous(kOp, name, t);
}

bool same_shape(const TensorView& a, const TensorView& b) {
  for (int d = 0; d < 3; ++d)
    if (a.shape[d] != b.shape[d]) return false;
  return true;
}

// output, prefix_output and suffix_output share one [T, H, D] shape. The message blames the one
// whose shape differs from the other two (output when all three differ).
void check_state_shapes(const TensorView& output, const TensorView& prefix,
                        const TensorView& suffix) {
  if (same_shape(output, prefix) && same_shape(output, suffix)) return;
  struct Named {
    const char* name;
    const TensorView* t;
  };
  Named odd{"output", &output}, a{"prefix_output", &prefix}, b{"suffix_output", &suffix};
  if (same_shape(output, prefix)) {
    odd = {"suffix_output", &suffix};
    b = {"output", &output};
  } else if (same_shape(output, suffix)) {
    odd = {"prefix_output", &prefix};
    a = {"output", &output};
  }
  detail::fail(ErrorCode::kInvalidArgument,
               detail::str_cat(kOp, ": ", odd.name, " must have the [T, H, D] shape of ", a.name,
                               " and ", b.name, " ", detail::shape_string(*a.t), ", got ",
                               detail::shape_string(*odd.t)));
}

// LSE of the merge: f32 [H, T] for an [T, H, D] output, any strides.
void check_lse(const char* name, const TensorView& t, const TensorView& output) {
  detail::check_storage(kOp, name, t);
  detail::check_ndim(kOp, name, t, 2);
  detail::check_dtype(kOp, name, t, {DType::kF32});
  detail::check_size_matches(kOp, name, t, 0, "output", output, 1, "heads H");
  detail::check_size_matches(kOp, name, t, 1, "output", output, 0, "tokens T");
}

}  // namespace

void merge_attn_states(const TensorView& output, const std::optional<TensorView>& output_lse,
                       const TensorView& prefix_output, const TensorView& prefix_lse,
                       const TensorView& suffix_output, const TensorView& suffix_lse,
                       Stream stream) {
  check_state("output", output);
  check_state("prefix_output", prefix_output);
  check_state("suffix_output", suffix_output);
  check_state_shapes(output, prefix_output, suffix_output);
  check_lse("prefix_lse", prefix_lse, output);
  check_lse("suffix_lse", suffix_lse, output);
  detail::check_no_self_overlap(kOp, "output", output);
  check_alias("output", output, "prefix_output", prefix_output);
  check_alias("output", output, "suffix_output", suffix_output);
  Device device = detail::common_device(kOp, {{"output", &output},
                                              {"prefix_output", &prefix_output},
                                              {"prefix_lse", &prefix_lse},
                                              {"suffix_output", &suffix_output},
                                              {"suffix_lse", &suffix_lse}});
  // output may be prefix_output or suffix_output exactly (in place); it must not share memory
  // with an LSE, which the merge reads while it writes output.
  detail::check_outputs_apart(kOp, {{"output", &output}},
                              {{"prefix_lse", &prefix_lse}, {"suffix_lse", &suffix_lse}});
  if (output_lse) {
    const TensorView& lse = *output_lse;
    check_lse("output_lse", lse, output);
    detail::check_no_self_overlap(kOp, "output_lse", lse);
    check_alias("output_lse", lse, "prefix_lse", prefix_lse);
    check_alias("output_lse", lse, "suffix_lse", suffix_lse);
    check_alias("output_lse", lse, "output", output);
    // output_lse may be an input LSE exactly, never a state the merge reads.
    detail::check_outputs_apart(
        kOp, {{"output_lse", &lse}},
        {{"prefix_output", &prefix_output}, {"suffix_output", &suffix_output}});
    device = detail::common_device(kOp, {{"output", &output}, {"output_lse", &lse}});
  }

  if (device.is_cpu()) {
    cpu::merge_attn_states(output, output_lse, prefix_output, prefix_lse, suffix_output,
                           suffix_lse);
    return;
  }
#ifdef MLAKIT_WITH_CUDA
  cuda::merge_attn_states(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse,
                          stream);
#else
  (void)stream;  // no CUDA backend in this build
  detail::unsupported_device(kOp, device);
#endif
}

}  // namespace mlakit::ops
