// An e4m3fn reference written from the format's definition, independent of the library's own
// conversions (mlakit/dtype.hpp), for the tests that check those conversions or the ops built on
// them.
#pragma once

#include <cstdint>

namespace mlakit::test {

// The value of an e4m3fn code: sign, 4 exponent bits (bias 7), 3 mantissa bits, subnormals in
// units of 2^-9; 0x7f and 0xff are NaN (e4m3fn has no infinities).
double e4m3_value(int code);

// The nearest e4m3fn code to x, by search over the 127 finite magnitudes: ties go to the even
// code, magnitudes past 448 saturate to +-448 (0x7e / 0xfe), and NaN keeps its sign (0x7f / 0xff).
uint8_t e4m3_nearest(double x);

}  // namespace mlakit::test
