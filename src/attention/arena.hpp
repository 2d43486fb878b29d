// A bump allocator over one workspace buffer. The step planner carves every temporary of a
// forward step from it, in measuring mode (no buffer: only the size is counted) for the worst case
// of the engine's limits and for real per step, so the workspace is sized by the same code that
// uses it. Temporaries that are never live at the same time (the prefill and the decode phase of a
// step) share bytes: rewind() to a mark and carve again; peak() is the size the buffer needs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>

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
    const int64_t bytes = t.numel() * dtype_size(dtype);
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
