// A bump allocator over one workspace buffer. The orchestrator carves every temporary of a
// forward step from it, first in measuring mode (no buffer: only the size is counted), then for
// real, so the workspace is sized by the same code that uses it.
#pragma once

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
    return t;
  }
  int64_t used() const { return used_; }

 private:
  char* base_;
  int64_t capacity_;
  Device device_;
  int64_t used_ = 0;
};

}  // namespace mlakit::detail
