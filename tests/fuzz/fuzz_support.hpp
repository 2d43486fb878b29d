// Shared by the libFuzzer targets of tests/fuzz/: invariant checks that abort (libFuzzer then
// keeps the input as a crash file and the sanitizers' reports come with it), and the tensors the
// targets hand to the library: a DLPack description with exactly the memory it describes behind
// it (so any read or write outside the described elements is an AddressSanitizer report), filled
// after the description is final with finite floats, valid fp8 codes or chosen index values.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "mlakit/dlpack.h"
#include "mlakit/dtype.hpp"

namespace mlakit::fuzz {

// What the current execution called, printed with a violation (set by the targets).
inline std::string& call_description() {
  static std::string text;
  return text;
}

[[noreturn]] inline void violated(const char* file, int line, const char* condition,
                                  const std::string& detail) {
  std::fprintf(stderr, "%s:%d: fuzz invariant violated: %s\n  %s\n  call: %s\n", file, line,
               condition, detail.c_str(), call_description().c_str());
  std::abort();
}

}  // namespace mlakit::fuzz

// Aborts the run (a finding) unless `condition` holds; `detail` says what was seen.
#define MLAKIT_FUZZ_EXPECT(condition, detail)                                             \
  do {                                                                                    \
    if (!(condition)) ::mlakit::fuzz::violated(__FILE__, __LINE__, #condition, (detail)); \
  } while (0)

namespace mlakit::fuzz {

// Bulk contents come from a generator seeded by the input, so that they cost the input a few
// bytes only and the fuzzer's mutations go to shapes, strides and scalars.
using Rng = std::minstd_rand;

// The largest described extent a target backs with memory, and the most elements (zero strides
// describe many elements in little memory); bigger tensors get a NULL data pointer, which the
// library must reject. 4 MiB and 2^18 elements keep one execution around a millisecond.
inline constexpr int64_t kMaxBytes = int64_t{1} << 22;
inline constexpr int64_t kMaxElements = int64_t{1} << 18;

inline DLDataType dl(uint8_t code, uint8_t bits) { return DLDataType{code, bits, 1}; }
inline const DLDataType kDlF32 = dl(kDLFloat, 32), kDlF16 = dl(kDLFloat, 16),
                        kDlBF16 = dl(kDLBfloat, 16), kDlU8 = dl(kDLUInt, 8),
                        kDlFp8 = dl(kDLFloat8_e4m3fn, 8), kDlI32 = dl(kDLInt, 32),
                        kDlI64 = dl(kDLInt, 64);

// What the contents of a tensor are.
enum class Fill {
  kFinite,    // finite floats in [-4, 4] (any float dtype), fp8 codes that are not NaN
  kLse,       // finite floats, with an occasional -inf or +inf
  kIndex,     // `values` in logical order (integer dtypes); anything else after a dtype change
  kRawBytes,  // whatever the generator gives (NaN and inf included)
  kScales,    // finite floats in [0.01, 4] (f32): valid fp8 block scales
};

// One tensor argument: its description, its memory and its contents.
struct FuzzTensor {
  const char* name = "";
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // empty: DLPack NULL strides (dense)
  DLDataType dtype = kDlF32;
  DLDevice device{kDLCPU, 0};
  Fill fill = Fill::kFinite;
  std::vector<int64_t> values;  // kIndex contents, logical (row-major) order, cycled
  bool absent = false;          // passed as NULL
  bool null_data = false;       // data pointer NULL although elements exist
  uint64_t misalign = 0;        // extra bytes added to byte_offset

  // Set by materialize().
  DLTensor tensor{};
  std::vector<unsigned char> bytes;
  bool backed = false;  // the described elements have memory behind them

  const DLTensor* ptr() const { return absent ? nullptr : &tensor; }
};

inline int64_t element_bytes(DLDataType t) { return std::max(1, (t.bits * t.lanes + 7) / 8); }

inline std::optional<DType> to_mlakit_dtype(DLDataType t) {
  if (t.lanes != 1) return std::nullopt;
  if (t.code == kDLFloat && t.bits == 32) return DType::kF32;
  if (t.code == kDLFloat && t.bits == 16) return DType::kF16;
  if (t.code == kDLBfloat && t.bits == 16) return DType::kBF16;
  if (t.code == kDLFloat8_e4m3fn && t.bits == 8) return DType::kFp8E4m3;
  if (t.code == kDLUInt && t.bits == 8) return DType::kU8;
  if (t.code == kDLInt && t.bits == 32) return DType::kI32;
  if (t.code == kDLInt && t.bits == 64) return DType::kI64;
  return std::nullopt;
}

// Element offsets (in elements) of every logical index, row-major; empty when numel is 0.
inline std::vector<int64_t> logical_offsets(const std::vector<int64_t>& shape,
                                            const std::vector<int64_t>& strides) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  std::vector<int64_t> out;
  if (numel == 0) return out;
  out.reserve(static_cast<size_t>(numel));
  std::vector<int64_t> index(shape.size(), 0);
  for (int64_t i = 0; i < numel; ++i) {
    int64_t offset = 0;
    for (size_t d = 0; d < shape.size(); ++d) offset += index[d] * strides[d];
    out.push_back(offset);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

// The strides actually in effect: the given ones, or dense row-major (NULL strides).
inline std::vector<int64_t> effective_strides(const FuzzTensor& t) {
  if (!t.strides.empty()) return t.strides;
  std::vector<int64_t> dense(t.shape.size(), 1);
  int64_t stride = 1;
  for (size_t d = t.shape.size(); d-- > 0;) {
    dense[d] = stride;
    if (__builtin_mul_overflow(stride, std::max<int64_t>(t.shape[d], 1), &stride)) stride = 0;
  }
  return dense;
}

inline void store_finite(void* base, DType dtype, int64_t index, Rng& rng) {
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  if (dtype == DType::kU8 || dtype == DType::kFp8E4m3) {
    uint8_t code = static_cast<uint8_t>(rng());
    if ((code & 0x7f) == 0x7f) code &= 0xfe;  // 0x7f / 0xff are e4m3fn's NaNs
    static_cast<uint8_t*>(base)[index] = code;
    return;
  }
  store_float(base, dtype, index, value(rng));
}

// Gives the description its memory and contents (call once all mutations are done).
inline void materialize(FuzzTensor& t, Rng& rng) {
  t.tensor = DLTensor{};
  t.tensor.ndim = static_cast<int32_t>(t.shape.size());
  t.tensor.shape = t.shape.empty() ? nullptr : t.shape.data();
  t.tensor.strides = t.strides.empty() ? nullptr : t.strides.data();
  t.tensor.dtype = t.dtype;
  t.tensor.device = t.device;
  const int64_t esize = element_bytes(t.dtype);
  bool empty = false, negative = false, too_big = false;
  int64_t numel = 1;
  for (int64_t s : t.shape) {
    empty |= s == 0;
    negative |= s < 0;
    too_big |= __builtin_mul_overflow(numel, s, &numel) || numel > kMaxElements;
  }
  too_big |= negative;
  const std::vector<int64_t> strides = effective_strides(t);
  // Extent [lowest, highest] element offset; overflow or more than kMaxBytes: no memory.
  int64_t lowest = 0, highest = 0;
  for (size_t d = 0; d < t.shape.size() && !too_big && !empty; ++d) {
    int64_t reach = 0;
    too_big |= __builtin_mul_overflow(t.shape[d] - 1, strides[d], &reach);
    int64_t& end = reach < 0 ? lowest : highest;
    too_big |= __builtin_add_overflow(end, reach, &end);
  }
  int64_t span_bytes = 0;
  too_big = too_big || __builtin_mul_overflow(highest - lowest + 1, esize, &span_bytes) ||
            span_bytes > kMaxBytes;
  t.backed = !empty && !too_big && !t.null_data;
  if (empty || negative) {  // nothing may be read: a small buffer the library must not touch
    t.bytes.assign(16, 0xAB);
    t.tensor.data = t.null_data ? nullptr : t.bytes.data();
    t.bytes.resize(t.null_data ? 0 : 16);
    return;
  }
  if (!t.backed) {
    t.tensor.data = nullptr;
    // A NULL data pointer given an offset too: the library must not read at NULL + offset.
    if (t.null_data) t.tensor.byte_offset = 4096 + t.misalign;
    return;
  }
  t.bytes.assign(static_cast<size_t>(span_bytes + static_cast<int64_t>(t.misalign)), 0);
  t.tensor.data = t.bytes.data();
  t.tensor.byte_offset = static_cast<uint64_t>(-lowest * esize) + t.misalign;
  unsigned char* base = t.bytes.data() + t.tensor.byte_offset;
  // A misaligned tensor (which the library rejects) gets raw bytes: typed stores need alignment.
  const std::optional<DType> dtype =
      t.misalign % static_cast<uint64_t>(esize) == 0 ? to_mlakit_dtype(t.dtype) : std::nullopt;
  const int64_t slots = span_bytes / esize;
  for (int64_t i = lowest; i < lowest + slots; ++i) {  // every element slot, read or not
    const bool is_float = dtype && *dtype != DType::kI32 && *dtype != DType::kI64;
    if (is_float && t.fill != Fill::kRawBytes) {
      store_finite(base, *dtype, i, rng);
    } else {
      for (int64_t b = 0; b < esize; ++b) base[i * esize + b] = static_cast<unsigned char>(rng());
    }
  }
  if (t.fill == Fill::kScales && dtype == DType::kF32) {
    std::uniform_real_distribution<float> scale(0.01f, 4.0f);
    for (int64_t i = lowest; i < lowest + slots; ++i)
      reinterpret_cast<float*>(base)[i] = scale(rng);
  }
  if (t.fill == Fill::kLse && dtype == DType::kF32) {
    const float specials[] = {-INFINITY, INFINITY};
    for (int64_t offset : logical_offsets(t.shape, strides)) {
      if (rng() % 8 == 0) reinterpret_cast<float*>(base)[offset] = specials[rng() % 2];
    }
  }
  if (t.fill == Fill::kIndex && !t.values.empty() &&
      (dtype == DType::kI32 || dtype == DType::kI64)) {
    size_t next = 0;
    for (int64_t offset : logical_offsets(t.shape, strides)) {
      const int64_t v = t.values[next++ % t.values.size()];
      if (*dtype == DType::kI32) {
        reinterpret_cast<int32_t*>(base)[offset] = static_cast<int32_t>(v);
      } else {
        reinterpret_cast<int64_t*>(base)[offset] = v;
      }
    }
  }
}

// "name [2, 3] strides [3, 1] dtype (2, 32, 1) device 1 offset 0" (or "name NULL").
inline std::string describe(const FuzzTensor& t) {
  if (t.absent) return std::string(t.name) + " NULL";
  std::string text = std::string(t.name) + " [";
  for (size_t d = 0; d < t.shape.size(); ++d) text += (d ? ", " : "") + std::to_string(t.shape[d]);
  text += "]";
  if (!t.strides.empty()) {
    text += " strides [";
    for (size_t d = 0; d < t.strides.size(); ++d)
      text += (d ? ", " : "") + std::to_string(t.strides[d]);
    text += "]";
  }
  int32_t device_type = 0;  // any int (a defect): not read as the enum
  std::memcpy(&device_type, &t.device.device_type, sizeof(device_type));
  text += " dtype (" + std::to_string(t.dtype.code) + ", " + std::to_string(t.dtype.bits) + ", " +
          std::to_string(t.dtype.lanes) + ") device " + std::to_string(device_type) +
          (t.null_data ? " data NULL" : "") + (t.misalign ? " misaligned" : "");
  return text;
}

// Element `offset` (in elements, from the described start) of a materialized float tensor.
inline float float_at(const FuzzTensor& t, int64_t offset) {
  const unsigned char* base = t.bytes.data() + t.tensor.byte_offset;
  return load_float(base, *to_mlakit_dtype(t.dtype), offset);
}

// ---- mutations: what can be wrong with one tensor argument -------------------------------------

// A size the library must cope with: 0, 1, one off, twice, or absurd.
inline int64_t odd_size(FuzzedDataProvider& in, int64_t size) {
  size = std::clamp<int64_t>(size, -1, int64_t{1} << 20);  // an earlier defect may be absurd
  const int64_t choices[] = {0,
                             1,
                             size - 1,
                             size + 1,
                             2 * size,
                             -1,
                             int64_t{1} << 40,
                             INT64_MAX,
                             in.ConsumeIntegralInRange<int64_t>(0, 70)};
  return in.PickValueInArray(choices);
}

inline DLDataType odd_dtype(FuzzedDataProvider& in) {
  const DLDataType choices[] = {kDlF32,
                                kDlF16,
                                kDlBF16,
                                kDlU8,
                                kDlFp8,
                                kDlI32,
                                kDlI64,
                                dl(kDLFloat, 64),
                                dl(kDLInt, 8),
                                dl(kDLFloat8_e5m2, 8),
                                DLDataType{kDLFloat, 32, 4},
                                dl(kDLComplex, 64),
                                dl(kDLBool, 8),
                                dl(kDLFloat, 0)};
  DLDataType t = in.PickValueInArray(choices);
  if (in.ConsumeIntegralInRange(0, 15) == 0)
    t = DLDataType{in.ConsumeIntegral<uint8_t>(), in.ConsumeIntegral<uint8_t>(),
                   in.ConsumeIntegral<uint16_t>()};
  return t;
}

// Applies one random defect to `t`: a size, the rank, the dtype, the strides, the device, a
// misaligned or missing data pointer, or absence.
inline void mutate(FuzzedDataProvider& in, FuzzTensor& t) {
  const size_t rank = t.shape.size();
  const int64_t dim =
      rank ? in.ConsumeIntegralInRange<int64_t>(0, static_cast<int64_t>(rank) - 1) : 0;
  switch (in.ConsumeIntegralInRange(0, 9)) {
    case 0:
    case 1:
      if (rank) t.shape[dim] = odd_size(in, t.shape[dim]);
      break;
    case 2:  // one dimension more or fewer (up to rank 5: the C ABI takes at most 4)
      if (in.ConsumeBool() && rank < 5) {
        t.shape.insert(t.shape.begin() + dim, in.ConsumeIntegralInRange<int64_t>(0, 3));
      } else if (rank) {
        t.shape.erase(t.shape.begin() + dim);
      }
      t.strides.clear();
      break;
    case 3:
      t.dtype = odd_dtype(in);
      break;
    case 4:
    case 5: {  // explicit strides: dense, padded, transposed-ish, zero, negative or huge
      t.strides = effective_strides(t);
      if (!rank) break;
      const int64_t s = std::clamp<int64_t>(t.strides[dim], -(int64_t{1} << 40), int64_t{1} << 40);
      const int64_t choices[] = {0, 1, s + 1, 2 * s, -s, -1, int64_t{1} << 40, s * 3 + 7};
      t.strides[dim] = in.PickValueInArray(choices);
      break;
    }
    case 6: {
      const int32_t types[] = {kDLCPU,  kDLCUDA,        kDLCUDAHost, kDLOpenCL,
                               kDLROCM, kDLCUDAManaged, 0,           99};
      t.device = DLDevice{static_cast<DLDeviceType>(in.PickValueInArray(types)),
                          in.ConsumeIntegralInRange<int32_t>(-1, 1)};
      break;
    }
    case 7:
      t.misalign = in.ConsumeIntegralInRange<uint64_t>(1, 3);
      break;
    case 8:
      t.null_data = true;
      break;
    default:
      t.absent = true;
      break;
  }
}

}  // namespace mlakit::fuzz
