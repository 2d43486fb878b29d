#include "cpu/abs_max.hpp"

#include <algorithm>
#include <cmath>

#include "cpu/strided.hpp"
#include "mlakit/dtype.hpp"

namespace mlakit::cpu {

float abs_max(const TensorView& x) {
  float most = 0.0f;
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::fabs(load_float(x.data, x.dtype, strided_offset(x, i)));
    if (std::isnan(v)) return v;
    most = std::max(most, v);
  }
  return most;
}

}  // namespace mlakit::cpu
