// Fast random activations: rows copied from random offsets of a pool of N(0, stddev^2) values
// already rounded to the activation dtype. Filling a row costs one memcpy, so input generation
// stays far below the cost of forward even for DeepSeek-V3's 24576-value query rows.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "mlakit/types.hpp"

namespace mlakit::cli {

class RandomRows {
 public:
  // pool_size: values in the pool; rows are at most pool_size / 2 wide.
  RandomRows(DType dtype, double stddev, uint64_t seed, int64_t pool_size = int64_t{1} << 20);

  // Fills rows [0, rows) of a host view [>= rows, width] (dtype of the pool, contiguous rows).
  void fill(const TensorView& dst, int64_t rows);

 private:
  DType dtype_;
  int64_t element_size_;
  int64_t pool_size_;
  std::vector<unsigned char> pool_;  // pool_size values of dtype_
  std::mt19937_64 rng_;
};

// Host tensor [rows, cols] of N(0, stddev^2) values rounded to dtype (one draw per element).
Tensor random_matrix(int64_t rows, int64_t cols, DType dtype, double stddev, uint64_t seed);

}  // namespace mlakit::cli
