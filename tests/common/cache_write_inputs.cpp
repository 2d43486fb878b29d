#include "common/cache_write_inputs.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <initializer_list>
#include <numeric>
#include <sstream>

#include "common/test_util.hpp"
#include "mlakit/dtype.hpp"

namespace mlakit::test {
namespace {

// Stores x as element i of a [rows, cols] view counted in row-major order (rows may be padded).
void store_row_major(const TensorView& v, int64_t i, float x) {
  store_float(v.data, v.dtype, i / v.shape[1] * v.strides[0] + i % v.shape[1], x);
}

// Stores values[i] * factor at element i of v (row-major), as far as v has elements.
void store_leading(const TensorView& v, std::initializer_list<float> values, float factor) {
  int64_t i = 0;
  for (float x : values) {
    if (i >= v.numel()) return;
    store_row_major(v, i++, x * factor);
  }
}

void fill_bit_patterns(std::mt19937_64& rng, const TensorView& v) {
  std::uniform_int_distribution<uint32_t> bits, exponent(127 - 22, 127 + 10);
  for (int64_t r = 0; r < v.shape[0]; ++r) {
    auto* row = static_cast<uint32_t*>(v.data) + r * v.strides[0];
    for (int64_t i = 0; i < v.shape[1]; ++i) {
      const uint32_t u = bits(rng);
      row[i] = (r * v.shape[1] + i) % 16 == 0 ? u : (u & 0x807fffffu) | (exponent(rng) << 23);
    }
  }
  store_leading(v,
                {INFINITY, -INFINITY, NAN, -NAN, FLT_MAX, 448.0f, 464.0f, -480.0f, FLT_MIN,
                 1e-40f /* f32 subnormal */, 0.0f, -0.0f},
                1.0f);
}

}  // namespace

std::string describe(const CacheWriteCase& c) {
  std::ostringstream os;
  os << "T=" << c.num_tokens << "+" << c.extra_rows << " L=" << c.latent << " R=" << c.rope
     << " bs=" << c.block_size << " nb=" << c.num_blocks << " act=" << dtype_name(c.act)
     << " kv=" << kv_cache_dtype_name(c.kv_dtype) << " k_scale=" << c.k_scale
     << " sliced=" << c.sliced_inputs << "+" << c.input_pad << " strided_cache=" << c.strided_cache;
  return os.str();
}

CacheWriteCase random_cache_write_case(std::mt19937_64& rng, uint64_t i) {
  constexpr DType kActDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  constexpr int64_t kBlockSizes[] = {1, 5, 16, 64};
  std::uniform_int_distribution<int64_t> latent(1, 96), rope(1, 40), blocks(1, 12);
  CacheWriteCase c;
  c.kv_dtype = i % 3 == 0 ? KvCacheDType::kAuto : KvCacheDType::kFp8E4m3;
  c.act = kActDtypes[i % 3];
  c.latent = latent(rng);
  c.rope = rope(rng);
  c.block_size = kBlockSizes[i % 4];
  c.num_blocks = blocks(rng);
  c.num_tokens = std::uniform_int_distribution<int64_t>(0, c.num_blocks * c.block_size)(rng);
  c.k_scale = i % 2 ? 0.25f : 2.0f;
  c.sliced_inputs = i % 2 == 0;
  c.input_pad = i % 4 == 0 ? 3 : 0;
  c.strided_cache = i % 4 == 1;
  c.stream = 500 + i;
  return c;
}

int64_t cache_entry_width(const CacheWriteCase& c) {
  return c.kv_dtype == KvCacheDType::kFp8DsMla ? kDsMlaEntryBytes : c.latent + c.rope;
}

DType cache_storage_dtype(const CacheWriteCase& c) {
  return c.kv_dtype == KvCacheDType::kAuto ? c.act : DType::kU8;
}

CacheWriteInputs make_cache_write_inputs(std::mt19937_64& rng, const CacheWriteCase& c) {
  CacheWriteInputs in;
  const int64_t rows = c.num_tokens + c.extra_rows;
  if (c.sliced_inputs) {
    in.kv_c_storage = random_tensor(rng, {rows, c.latent + c.rope + c.input_pad}, c.act);
    in.k_pe_storage = in.kv_c_storage;
    in.kv_c = in.kv_c_storage.view().narrow(1, 0, c.latent);
    in.k_pe = in.k_pe_storage.view().narrow(1, c.latent, c.rope);
  } else {
    in.kv_c_storage = random_tensor(rng, {rows, c.latent}, c.act);
    in.k_pe_storage = random_tensor(rng, {rows, c.rope}, c.act);
    in.kv_c = in.kv_c_storage;
    in.k_pe = in.k_pe_storage;
  }
  if (c.bit_patterns) {
    fill_bit_patterns(rng, in.kv_c);
    fill_bit_patterns(rng, in.k_pe);
  } else if (c.kv_dtype == KvCacheDType::kFp8E4m3) {
    // Values far beyond 448 * k_scale must saturate to +-448. Then midpoints between two e4m3
    // values times k_scale (exact in every act dtype for k_scale 1, 3 and 7): x / k_scale is a
    // tie that rounds to the even code, where x * (1 / k_scale) lands past the tie for k_scale 7.
    store_leading(in.kv_c, {1000.0f, -1000.0f, 1.0625f, -1.8125f, 0.0048828125f, 200.0f},
                  c.k_scale);
  }
  if (c.kv_dtype == KvCacheDType::kFp8DsMla && rows > 0) {
    for (int64_t i = 0; i < 128; ++i) store_float(in.kv_c.data, c.act, i, 0.0f);  // a zero tile
  }

  // Cache, poisoned: dense [nb, bs, W], or [nb, bs, W] viewed in a [bs, nb, W + 8] buffer.
  const int64_t width = cache_entry_width(c);
  const DType storage = cache_storage_dtype(c);
  in.cache_buffer = c.strided_cache ? nan_tensor({c.block_size, c.num_blocks, width + 8}, storage)
                                    : nan_tensor({c.num_blocks, c.block_size, width}, storage);
  in.cache = c.strided_cache ? in.cache_buffer.view().transpose(0, 1).narrow(2, 0, width)
                             : in.cache_buffer.view();

  // Distinct random slots; some tokens skipped with slot -1.
  std::vector<int64_t> all_slots(c.num_blocks * c.block_size);
  std::iota(all_slots.begin(), all_slots.end(), 0);
  std::shuffle(all_slots.begin(), all_slots.end(), rng);
  std::bernoulli_distribution skip(c.skip_fraction);
  in.slots.assign(all_slots.begin(), all_slots.begin() + c.num_tokens);
  for (int64_t& s : in.slots) s = skip(rng) ? -1 : s;
  in.slot_mapping = int_tensor(in.slots, {c.num_tokens}, DType::kI64);
  return in;
}

}  // namespace mlakit::test
