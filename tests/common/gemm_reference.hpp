// The batched-GEMM test helpers of the CPU and GPU matmul tests: operands laid out as BLAS sees
// them, an fp64 product with the sum of magnitudes of its terms, and the f32-accumulation error
// bound results are held to.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "mlakit/types.hpp"

namespace mlakit::test {

// A view into storage it owns; the storage may be larger than the view (padding, other fields).
struct GemmOperand {
  Tensor storage;
  TensorView view;
};

// [batch, rows, cols] whose matrices are row-major, or column-major (`transposed`), with `pad`
// unused elements after every contiguous run (a leading stride larger than the dense one). Random
// values, or NaN everywhere with `poison`.
GemmOperand make_gemm_operand(std::mt19937_64& rng, int64_t batch, int64_t rows, int64_t cols,
                              DType dtype, bool transposed, int64_t pad, bool poison = false);

// Products of the operands summed in fp64, and the sums of their magnitudes.
struct GemmReference {
  std::vector<double> value;      // [batch, M, N]
  std::vector<double> magnitude;  // [batch, M, N]: sum_k |a| |w|
};

// a: [batch, M, K], w: [batch, K, N]. The stored values are used as they are (exact products), or
// each first rounded to `multiply_dtype` when given (the type a backend multiplies in).
GemmReference reference_bmm(const TensorView& a, const TensorView& w,
                            std::optional<DType> multiply_dtype = std::nullopt);

// Every element of c [batch, M, N] within the error bound of a dot product of K terms accumulated
// in f32 with unit roundoff `accumulation_u`, in any order, with or without FMA:
// gamma_K * sum|a||w| with gamma_K = K u / (1 - K u), plus half an ulp of c's dtype for a 16-bit c
// (and f16's subnormal spacing 2^-24 / 2 near zero). Names the worst element on failure.
::testing::AssertionResult within_gemm_bound(const TensorView& c, const GemmReference& ref,
                                             int64_t k, double accumulation_u);

// Elements of a host view that are NaN (poisoned elements left unwritten).
int64_t count_nan(const TensorView& t);

}  // namespace mlakit::test
