// Helpers shared by the tests: seeded random inputs, dense double copies of views, and the
// elementwise comparator of DESIGN.md §5 (NaN/inf positions must match; |a - r| <= atol + rtol|r|;
// the worst element is reported with its index).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "mlakit/error.hpp"
#include "mlakit/types.hpp"

namespace mlakit::test {

// Seed of this test process: MLAKIT_TEST_SEED if set, else a fresh random seed. Printed once.
uint64_t test_seed();
// A generator seeded from test_seed() and `stream` (a per-test constant keeps tests independent).
std::mt19937_64 make_rng(uint64_t stream);

// Host tensor of `dtype` filled with N(0, stddev^2) values (rounded to dtype).
Tensor random_tensor(std::mt19937_64& rng, std::initializer_list<int64_t> shape, DType dtype,
                     double stddev = 1.0);
// Host tensor filled with NaN (every byte 0xff for integer types).
Tensor nan_tensor(std::initializer_list<int64_t> shape, DType dtype);
void fill_nan(const TensorView& t);
// Host tensor from values (converted to dtype with round-to-nearest-even).
Tensor tensor_from(const std::vector<double>& values, std::initializer_list<int64_t> shape,
                   DType dtype);
Tensor int_tensor(const std::vector<int64_t>& values, std::initializer_list<int64_t> shape,
                  DType dtype);  // kI32 or kI64

// Dense row-major copy of a (possibly strided) host float view as doubles.
std::vector<double> to_doubles(const TensorView& t);
// Element at a multi-index of a host view, as a double (any float or integer dtype).
double element(const TensorView& t, std::initializer_list<int64_t> index);

struct Tolerance {
  double atol;
  double rtol;
};
// Tolerance for results stored in `dtype` after f32 accumulation, for O(1) values.
Tolerance tolerance_for(DType dtype);

// Compares a host view against reference values laid out densely in the view's shape.
// Returns a gtest failure naming the worst element (its multi-index) and the counts.
::testing::AssertionResult all_close(const TensorView& actual, std::span<const double> expected,
                                     Tolerance tol);

}  // namespace mlakit::test

// Expects `statement` to throw mlakit::Error whose message contains `substring`.
#define MLAKIT_EXPECT_THROW_MSG(statement, substring)                                          \
  do {                                                                                         \
    bool mlakit_threw_ = false;                                                                \
    try {                                                                                      \
      statement;                                                                               \
    } catch (const ::mlakit::Error& e) {                                                       \
      mlakit_threw_ = true;                                                                    \
      EXPECT_NE(std::string(e.what()).find(substring), std::string::npos)                      \
          << "message was: " << e.what();                                                      \
    }                                                                                          \
    EXPECT_TRUE(mlakit_threw_) << "expected mlakit::Error containing '" << (substring) << "'"; \
  } while (0)
