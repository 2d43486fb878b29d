// A bump allocator over one workspace buffer. The step planner carves every temporary of a
// forward step from it, in measuring mode (no buffer: only the size is counted) for the worst case
// of the engine's limits and for real per step, so the workspace is sized by the same code that
// uses it. Temporaries that are never live at the same time (the prefill and the decode phase of a
// step) share bytes: rewind() to a mark and carve again; peak() is the size the buffer needs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>

#include "core/check.hpp"
#include "mlakit/types.hpp"

namespace mlakit::detail {

class Arena {
 public:
  // Measuring arena: take() returns views without storage and only counts bytes.
  explicit Arena(Device device) : base_(nullptr), capacity_(-1), device_(device) {}
  Arena(void* base, int64_t capacity, Device device)
      : base_(static_cast<char*>(base)), capacity_(capacity), device_(device) {}

  TensorView take(std::initializer_list<int64_t> shape, DType dtype) {
    constexpr int64_t kAlignment = 256;  // keeps every carved tensor aligned for 16-byte vectors
                                         // and for cuBLAS (which wants 256-byte alignment)
    used_ = (used_ + kAlignment - 1) / kAlignment * kAlignment;
    TensorView t = TensorView::contiguous(nullptr, dtype, shape, device_);
    // Sizes from absurd limits (each dim and limit may be up to 2^31 - 1) must not wrap: a wrapped
    // count made workspace_bytes return a small wrong size. numel() saturates at INT64_MAX.
    int64_t bytes = 0, end = 0;
    require(t.numel() < std::numeric_limits<int64_t>::max() &&
                !__builtin_mul_overflow(t.numel(), int64_t{dtype_size(dtype)}, &bytes) &&
                !__builtin_add_overflow(used_, bytes, &end) &&
                end <= std::numeric_limits<int64_t>::max() - kAlignment,
            ErrorCode::kInvalidArgument, "workspace_bytes: a step temporary of shape ",
            shape_string(t), " ", dtype_name(dtype),
            " takes the workspace past 2^63 bytes; lower the configuration's limits "
            "(max_num_batched_tokens, max_num_seqs, max_model_len, workspace_tokens) or dims");
    if (base_ != nullptr) {
      require(used_ + bytes <= capacity_, ErrorCode::kInternal, "workspace arena overflow: need ",
              used_ + bytes, " bytes, have ", capacity_);
      t.data = base_ + used_;
    }
    used_ += bytes;
    peak_ = std::max(peak_, used_);
    return t;
  }
  int64_t mark() const { return used_; }
  // Later takes reuse the bytes from `mark` on (their earlier tenants must be dead by then).
  void rewind(int64_t mark) { used_ = mark; }
  int64_t peak() const { return peak_; }

 private:
  char* base_;
  int64_t capacity_;
  Device device_;
  int64_t used_ = 0;
  int64_t peak_ = 0;
};

}  // namespace mlakit::detail
