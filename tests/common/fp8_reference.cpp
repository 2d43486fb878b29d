#include "common/fp8_reference.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace mlakit::test {

double e4m3_value(int code) {
  const int e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::nan("");
  const double magnitude = e == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (code & 0x80) ? -magnitude : magnitude;
}

uint8_t e4m3_nearest(double x) {
  // Codes 0x00 to 0x7e are the finite magnitudes in increasing order.
  static const std::vector<double> magnitudes = [] {
    std::vector<double> m;
    for (int code = 0; code < 0x7f; ++code) m.push_back(e4m3_value(code));
    return m;
  }();
  if (std::isnan(x)) return std::signbit(x) ? 0xff : 0x7f;
  const double a = std::min(std::fabs(x), 448.0);
  const auto hi = std::lower_bound(magnitudes.begin(), magnitudes.end(), a);  // first >= a
  int code = static_cast<int>(hi - magnitudes.begin());
  if (code > 0) {
    const double below = a - magnitudes[code - 1], above = magnitudes[code] - a;
    if (below < above || (below == above && (code - 1) % 2 == 0)) code -= 1;
  }
  return static_cast<uint8_t>(code | (std::signbit(x) ? 0x80 : 0));
}

}  // namespace mlakit::test
