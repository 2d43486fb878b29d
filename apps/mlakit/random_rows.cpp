#include "random_rows.hpp"

#include <cstring>
#include <string>

#include "mlakit/error.hpp"

namespace mlakit::cli {

RandomRows::RandomRows(DType dtype, double stddev, uint64_t seed, int64_t pool_size)
    : dtype_(dtype),
      element_size_(dtype_size(dtype)),
      pool_size_(pool_size),
      pool_(static_cast<size_t>(pool_size * dtype_size(dtype))),
      rng_(seed) {
  std::normal_distribution<float> normal(0.0f, static_cast<float>(stddev));
  for (int64_t i = 0; i < pool_size_; ++i) store_float(pool_.data(), dtype_, i, normal(rng_));
}

void RandomRows::fill(const TensorView& dst, int64_t rows) {
  const int64_t width = dst.ndim == 2 ? dst.size(1) : 0;
  if (dst.ndim != 2 || dst.dtype != dtype_ || !dst.device.is_cpu() || dst.stride(1) != 1 ||
      rows > dst.size(0) || width > pool_size_ / 2) {
    throw Error(ErrorCode::kInternal, "RandomRows::fill: needs a host [>= " + std::to_string(rows) +
                                          ", <= pool/2] view with contiguous rows, got " +
                                          dst.to_string());
  }
  const auto bytes = static_cast<size_t>(width * element_size_);
  const auto span = static_cast<uint64_t>(pool_size_ - width + 1);
  for (int64_t r = 0; r < rows; ++r) {
    const auto offset = static_cast<int64_t>(rng_() % span);
    std::memcpy(dst.element_ptr(r * dst.stride(0)), pool_.data() + offset * element_size_, bytes);
  }
}

Tensor random_matrix(int64_t rows, int64_t cols, DType dtype, double stddev, uint64_t seed) {
  Tensor t = Tensor::empty({rows, cols}, dtype);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, static_cast<float>(stddev));
  for (int64_t i = 0; i < rows * cols; ++i) store_float(t.view().data, dtype, i, normal(rng));
  return t;
}

}  // namespace mlakit::cli
