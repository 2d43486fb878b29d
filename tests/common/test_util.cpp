#include "common/test_util.hpp"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <sstream>

#include "mlakit/error.hpp"

namespace mlakit::test {

uint64_t test_seed() {
  static const uint64_t seed = [] {
    uint64_t s;
    if (const char* env = std::getenv("MLAKIT_TEST_SEED")) {
      s = std::strtoull(env, nullptr, 10);
    } else {
      std::random_device rd;
      s = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    }
    std::cerr << "[mlakit] test seed " << s << " (set MLAKIT_TEST_SEED to repeat)\n";
    return s;
  }();
  return seed;
}

std::mt19937_64 make_rng(uint64_t stream) {
  std::seed_seq seq{test_seed(), stream};
  return std::mt19937_64(seq);
}

Tensor random_tensor(std::mt19937_64& rng, std::initializer_list<int64_t> shape, DType dtype,
                     double stddev) {
  Tensor t = Tensor::empty(shape, dtype);
  std::normal_distribution<double> dist(0.0, stddev);
  for (int64_t i = 0; i < t.numel(); ++i) store_float(t.view().data, dtype, i, float(dist(rng)));
  return t;
}

void fill_nan(const TensorView& t) {
  const int64_t n = t.numel();
  if (!t.is_contiguous()) throw std::invalid_argument("fill_nan needs a contiguous view");
  switch (t.dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) store_float(t.data, t.dtype, i, NAN);
      break;
    default:
      std::memset(t.data, 0xff, n * t.element_size());  // 0xff is NaN in e4m3
  }
}

Tensor nan_tensor(std::initializer_list<int64_t> shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  fill_nan(t);
  return t;
}

Tensor tensor_from(const std::vector<double>& values, std::initializer_list<int64_t> shape,
                   DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  if (static_cast<int64_t>(values.size()) != t.numel())
    throw std::invalid_argument("tensor_from: value count does not match the shape");
  for (int64_t i = 0; i < t.numel(); ++i) store_float(t.view().data, dtype, i, float(values[i]));
  return t;
}

Tensor int_tensor(const std::vector<int64_t>& values, std::initializer_list<int64_t> shape,
                  DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  if (static_cast<int64_t>(values.size()) != t.numel())
    throw std::invalid_argument("int_tensor: value count does not match the shape");
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::kI32) {
      t.data<int32_t>()[i] = static_cast<int32_t>(values[i]);
    } else if (dtype == DType::kI64) {
      t.data<int64_t>()[i] = values[i];
    } else {
      throw std::invalid_argument("int_tensor: dtype must be i32 or i64");
    }
  }
  return t;
}

namespace {
double read_at(const TensorView& t, int64_t offset) {
  switch (t.dtype) {
    case DType::kI32:
      return static_cast<const int32_t*>(t.data)[offset];
    case DType::kI64:
      return static_cast<double>(static_cast<const int64_t*>(t.data)[offset]);
    default:
      return load_float(t.data, t.dtype, offset);
  }
}

// Offset (in elements) of the dense index `linear` of view t.
int64_t offset_of(const TensorView& t, int64_t linear, std::vector<int64_t>* index = nullptr) {
  int64_t offset = 0;
  if (index) index->assign(t.ndim, 0);
  for (int d = t.ndim - 1; d >= 0; --d) {
    const int64_t i = linear % t.shape[d];
    linear /= t.shape[d];
    offset += i * t.strides[d];
    if (index) (*index)[d] = i;
  }
  return offset;
}
}  // namespace

std::vector<double> to_doubles(const TensorView& t) {
  std::vector<double> out(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = read_at(t, offset_of(t, i));
  return out;
}

double element(const TensorView& t, std::initializer_list<int64_t> index) {
  int64_t offset = 0;
  int d = 0;
  for (int64_t i : index) offset += i * t.strides[d++];
  return read_at(t, offset);
}

Tolerance tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return {1e-2, 1.6e-2};  // bf16 keeps 8 significant bits: half an ulp is 2^-9 relative
    case DType::kF16:
      return {2e-3, 2e-3};  // f16 keeps 11 bits; results summed in f32 then rounded once
    default:
      return {2e-5, 2e-5};  // f32 results: f32 accumulation over a few thousand terms
  }
}

::testing::AssertionResult all_close(const TensorView& actual, std::span<const double> expected,
                                     Tolerance tol) {
  if (static_cast<int64_t>(expected.size()) != actual.numel()) {
    return ::testing::AssertionFailure()
           << "size mismatch: actual " << actual.to_string() << " has " << actual.numel()
           << " elements, expected " << expected.size();
  }
  int64_t bad = 0, worst = -1;
  double worst_excess = -1;
  for (int64_t i = 0; i < actual.numel(); ++i) {
    const double a = read_at(actual, offset_of(actual, i));
    const double r = expected[i];
    bool ok;
    double excess = 0;
    if (std::isnan(r) || std::isnan(a)) {
      ok = std::isnan(r) && std::isnan(a);
      excess = ok ? 0 : std::numeric_limits<double>::infinity();
    } else if (std::isinf(r) || std::isinf(a)) {
      ok = a == r;
      excess = ok ? 0 : std::numeric_limits<double>::infinity();
    } else {
      excess = std::fabs(a - r) - (tol.atol + tol.rtol * std::fabs(r));
      ok = excess <= 0;
    }
    if (!ok) ++bad;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::vector<int64_t> index;
  const double a = read_at(actual, offset_of(actual, worst, &index));
  std::ostringstream where;
  for (size_t d = 0; d < index.size(); ++d) where << (d ? ", " : "") << index[d];
  return ::testing::AssertionFailure()
         << bad << " of " << actual.numel() << " elements out of tolerance (atol " << tol.atol
         << ", rtol " << tol.rtol << "); worst at (" << where.str() << "): actual " << a
         << ", expected " << expected[worst];
}

}  // namespace mlakit::test
