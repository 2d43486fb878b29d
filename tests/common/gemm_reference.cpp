#include "common/gemm_reference.hpp"

#include <cmath>
#include <limits>

#include "common/test_util.hpp"
#include "mlakit/dtype.hpp"

namespace mlakit::test {
namespace {

// Unit roundoff of storing a result in `dtype` (half an ulp, relative).
double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return std::ldexp(1.0, -8);  // 8 significant bits
    case DType::kF16:
      return std::ldexp(1.0, -11);  // 11 significant bits
    default:
      return 0.0;  // f32 results are the accumulator itself
  }
}

}  // namespace

GemmOperand make_gemm_operand(std::mt19937_64& rng, int64_t batch, int64_t rows, int64_t cols,
                              DType dtype, bool transposed, int64_t pad, bool poison) {
  const int64_t outer = transposed ? cols : rows, inner = transposed ? rows : cols;
  Tensor storage = poison ? nan_tensor({batch, outer, inner + pad}, dtype)
                          : random_tensor(rng, {batch, outer, inner + pad}, dtype);
  TensorView view = storage.view().narrow(2, 0, inner);
  if (transposed) view = view.transpose(1, 2);
  return {storage, view};
}

GemmReference reference_bmm(const TensorView& a, const TensorView& w,
                            std::optional<DType> multiply_dtype) {
  const int64_t batch = a.shape[0], m = a.shape[1], k = a.shape[2], n = w.shape[2];
  std::vector<double> av = to_doubles(a), wv = to_doubles(w);
  if (multiply_dtype) {
    for (double& x : av) x = round_to_dtype(static_cast<float>(x), *multiply_dtype);
    for (double& x : wv) x = round_to_dtype(static_cast<float>(x), *multiply_dtype);
  }
  GemmReference r{std::vector<double>(batch * m * n), std::vector<double>(batch * m * n)};
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0, mag = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double x = av[(b * m + i) * k + p], y = wv[(b * k + p) * n + j];
          sum += x * y;
          mag += std::fabs(x * y);
        }
        r.value[(b * m + i) * n + j] = sum;
        r.magnitude[(b * m + i) * n + j] = mag;
      }
  return r;
}

::testing::AssertionResult within_gemm_bound(const TensorView& c, const GemmReference& ref,
                                             int64_t k, double accumulation_u) {
  const double u = accumulation_u;
  const double gamma = k * u / (1 - k * u);
  const double out_u = unit_roundoff(c.dtype);
  const double out_abs = c.dtype == DType::kF16 ? std::ldexp(1.0, -25) : 0.0;
  const std::vector<double> got = to_doubles(c);
  int64_t bad = 0, worst = -1;
  double worst_ratio = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double accum_err = gamma * ref.magnitude[i];
    const double bound =
        accum_err + out_u * (std::fabs(ref.value[i]) + accum_err) + out_abs + 1e-300;
    const double ratio = std::isfinite(got[i]) ? std::fabs(got[i] - ref.value[i]) / bound
                                               : std::numeric_limits<double>::infinity();
    if (ratio > 1) ++bad;
    if (worst < 0 || ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = static_cast<int64_t>(i);
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  const int64_t m = c.shape[1], n = c.shape[2];
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " elements beyond the f32 GEMM error bound (K " << k
         << ", u " << u << ", c " << dtype_name(c.dtype) << "); worst at (b " << worst / (m * n)
         << ", m " << worst / n % m << ", n " << worst % n << "): got " << got[worst]
         << ", expected " << ref.value[worst] << ", error " << worst_ratio << " x the bound";
}

int64_t count_nan(const TensorView& t) {
  int64_t count = 0;
  for (double x : to_doubles(t)) count += std::isnan(x);
  return count;
}

}  // namespace mlakit::test
