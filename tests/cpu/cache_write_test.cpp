// concat_and_cache_mla (spec A.3, D.4) against a per-token reference written here: the cache is
// poisoned with NaN, every written entry is rebuilt independently (bit copy, a search-based
// e4m3 encoder, the ds_mla tile layout) and the whole cache buffer, padding and unused slots
// included, must match byte for byte.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/cache_write_inputs.hpp"
#include "common/fp8_reference.hpp"
#include "common/test_util.hpp"
#include "mlakit/dtype.hpp"
#include "mlakit/error.hpp"
#include "mlakit/kv_cache.hpp"
#include "mlakit/ops.hpp"

namespace mlakit {
namespace {

// ---- the independent e4m3 encoder (common/fp8_reference.hpp) ----------------------------------

TEST(CacheWriteReference, EncoderRoundsTiesToEvenAndSaturates) {
  EXPECT_EQ(test::e4m3_nearest(448.0), 0x7e);
  EXPECT_EQ(test::e4m3_nearest(1e9), 0x7e);
  EXPECT_EQ(test::e4m3_nearest(-1e9), 0xfe);
  EXPECT_EQ(test::e4m3_nearest(1.0625), 0x38);  // between 1 (0x38) and 1.125 (0x39): even code wins
  EXPECT_EQ(test::e4m3_nearest(1.1875), 0x3a);  // between 1.125 (0x39) and 1.25 (0x3a)
  EXPECT_EQ(test::e4m3_nearest(0.0), 0x00);
  for (int code = 0; code < 0x7f; ++code) {
    EXPECT_EQ(test::e4m3_nearest(test::e4m3_value(code)), code);
    EXPECT_EQ(test::e4m3_nearest(-test::e4m3_value(code)), code | 0x80);
  }
}

// ---- one write case -----------------------------------------------------------------------------

using WriteCase = test::CacheWriteCase;

// Expected bytes of token t's entry, built from the inputs without the code under test.
std::vector<uint8_t> expected_entry(const WriteCase& c, const TensorView& kv_c,
                                    const TensorView& k_pe, int64_t t) {
  const int64_t es = dtype_size(c.act);
  const auto* kv_c_row = static_cast<const uint8_t*>(kv_c.data) + t * kv_c.strides[0] * es;
  const auto* k_pe_row = static_cast<const uint8_t*>(k_pe.data) + t * k_pe.strides[0] * es;
  std::vector<uint8_t> entry;
  switch (c.kv_dtype) {
    case KvCacheDType::kAuto:
      entry.assign(kv_c_row, kv_c_row + c.latent * es);
      entry.insert(entry.end(), k_pe_row, k_pe_row + c.rope * es);
      break;
    case KvCacheDType::kFp8E4m3:
      for (int64_t i = 0; i < c.latent; ++i)
        entry.push_back(test::e4m3_nearest(load_float(kv_c_row, c.act, i) / c.k_scale));
      for (int64_t i = 0; i < c.rope; ++i)
        entry.push_back(test::e4m3_nearest(load_float(k_pe_row, c.act, i) / c.k_scale));
      break;
    case KvCacheDType::kFp8DsMla: {
      entry.assign(kDsMlaEntryBytes, 0);
      for (int64_t tile = 0; tile < 4; ++tile) {  // 4 tiles of 128 NoPE values
        float amax = 0.0f;
        for (int64_t i = tile * 128; i < (tile + 1) * 128; ++i)
          amax = std::max(amax, std::fabs(load_float(kv_c_row, c.act, i)));
        const float scale = std::max(amax / 448.0f, FLT_MIN);  // spec A.2, computed in f32
        std::memcpy(&entry[512 + 4 * tile], &scale, 4);        // f32 scales follow the NoPE bytes
        for (int64_t i = tile * 128; i < (tile + 1) * 128; ++i)
          entry[i] = test::e4m3_nearest(load_float(kv_c_row, c.act, i) / scale);
      }
      std::memcpy(&entry[528], k_pe_row, 64 * 2);  // rope: 64 16-bit values after the scales
      break;
    }
  }
  return entry;
}

void run_write_case(const WriteCase& c) {
  SCOPED_TRACE(test::describe(c));
  auto rng = test::make_rng(1000 + c.stream);
  const test::CacheWriteInputs in = test::make_cache_write_inputs(rng, c);
  const TensorView& cache = in.cache;
  const int64_t width = test::cache_entry_width(c);
  const int64_t es = dtype_size(test::cache_storage_dtype(c));
  const int64_t buffer_bytes = in.cache_buffer.numel() * es;
  std::vector<uint8_t> expected(buffer_bytes);
  std::memcpy(expected.data(), in.cache_buffer.data<uint8_t>(), buffer_bytes);

  ops::concat_and_cache_mla(in.kv_c, in.k_pe, cache, in.slot_mapping, c.kv_dtype, c.k_scale);

  std::vector<int64_t> token_of_slot(c.num_blocks * c.block_size, -1);
  for (int64_t t = 0; t < c.num_tokens; ++t) {
    const int64_t slot = in.slots[t];
    if (slot < 0) continue;
    token_of_slot[slot] = t;
    const int64_t block = slot / c.block_size, offset = slot % c.block_size;
    const std::vector<uint8_t> entry = expected_entry(c, in.kv_c, in.k_pe, t);
    ASSERT_EQ(static_cast<int64_t>(entry.size()), width * es);
    std::memcpy(&expected[(block * cache.strides[0] + offset * cache.strides[1]) * es],
                entry.data(), entry.size());
  }

  // Byte-exact over the whole buffer; report the first difference by slot and byte.
  const auto* actual = in.cache_buffer.data<uint8_t>();
  int64_t mismatches = 0, first = -1;
  for (int64_t i = 0; i < buffer_bytes; ++i) {
    if (actual[i] != expected[i]) {
      if (first < 0) first = i;
      ++mismatches;
    }
  }
  if (mismatches == 0) return;
  const int64_t element = first / es;
  std::string where = "padding";
  for (int64_t slot = 0; slot < c.num_blocks * c.block_size; ++slot) {
    const int64_t base =
        (slot / c.block_size) * cache.strides[0] + (slot % c.block_size) * cache.strides[1];
    if (element >= base && element < base + width) {
      where = "slot " + std::to_string(slot) + " (token " + std::to_string(token_of_slot[slot]) +
              ", -1 = unused) byte " + std::to_string(first - base * es);
    }
  }
  ADD_FAILURE() << mismatches << " of " << buffer_bytes << " cache bytes differ; first at " << where
                << ": got " << int(actual[first]) << ", expected " << int(expected[first]);
}

// ---- cases --------------------------------------------------------------------------------------

constexpr DType kActDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};

TEST(ConcatAndCacheMla, AutoIsBitCopyAtD4Sizes) {
  uint64_t stream = 0;
  for (DType act : kActDtypes) {
    for (bool sliced : {false, true}) {
      run_write_case({.act = act,
                      .kv_dtype = KvCacheDType::kAuto,
                      .sliced_inputs = sliced,
                      .stream = stream++});
    }
  }
}

TEST(ConcatAndCacheMla, Fp8E4m3MatchesNearestEvenEncoding) {
  uint64_t stream = 100;
  for (DType act : kActDtypes) {
    for (float k_scale : {0.1f, 1.0f, 3.0f, 7.0f}) {
      run_write_case({.act = act,
                      .kv_dtype = KvCacheDType::kFp8E4m3,
                      .k_scale = k_scale,
                      .sliced_inputs = stream % 2 == 0,
                      .stream = stream++});
    }
  }
}

TEST(ConcatAndCacheMla, Fp8E4m3OverBitPatternsIncludingInfAndNan) {
  run_write_case({.num_tokens = 256,
                  .latent = 120,
                  .rope = 24,
                  .block_size = 16,
                  .num_blocks = 16,
                  .act = DType::kF32,
                  .kv_dtype = KvCacheDType::kFp8E4m3,
                  .k_scale = 1.0f,
                  .bit_patterns = true,
                  .skip_fraction = 0.0,
                  .stream = 150});
}

TEST(ConcatAndCacheMla, DsMlaTileScalesNopeAndRopeExact) {
  uint64_t stream = 200;
  for (DType act : {DType::kBF16, DType::kF16}) {
    for (bool sliced : {false, true}) {
      run_write_case({.act = act,
                      .kv_dtype = KvCacheDType::kFp8DsMla,
                      .sliced_inputs = sliced,
                      .stream = stream++});
    }
  }
}

TEST(ConcatAndCacheMla, StridedCacheAndPaddedInputs) {
  uint64_t stream = 300;
  for (KvCacheDType kv : {KvCacheDType::kAuto, KvCacheDType::kFp8E4m3, KvCacheDType::kFp8DsMla}) {
    run_write_case({.num_tokens = 30,
                    .extra_rows = 5,
                    .act = DType::kBF16,
                    .kv_dtype = kv,
                    .k_scale = 0.5f,
                    .sliced_inputs = true,
                    .strided_cache = true,
                    .stream = stream++});
  }
}

TEST(ConcatAndCacheMla, RandomSizes) {
  auto rng = test::make_rng(400);
  std::uniform_int_distribution<int64_t> extra(0, 4);
  for (uint64_t i = 0; i < 12; ++i) {
    WriteCase c = test::random_cache_write_case(rng, i);
    c.extra_rows = extra(rng);
    run_write_case(c);
  }
}

TEST(ConcatAndCacheMla, AllTokensSkippedLeavesCacheUntouched) {
  run_write_case(
      {.num_tokens = 10, .kv_dtype = KvCacheDType::kFp8E4m3, .skip_fraction = 1.0, .stream = 600});
  run_write_case({.num_tokens = 0, .stream = 601});
}

// NumPy 2 gives a zero-size array zero strides (stress finding: an empty step failed with "must be
// contiguous in its last dimension, got stride 0"): no token, nothing written.
TEST(ConcatAndCacheMla, EmptyViewsWithZeroStridesAreANoOp) {
  uint16_t none[1] = {0};
  Tensor cache = test::nan_tensor({2, 4, 576}, DType::kBF16);
  const std::vector<uint8_t> before(cache.data<uint8_t>(),
                                    cache.data<uint8_t>() + cache.numel() * 2);
  const TensorView kv_c = TensorView::strided(none, DType::kBF16, {0, 512}, {0, 0});
  const TensorView k_pe = TensorView::strided(none, DType::kBF16, {0, 64}, {0, 0});
  const TensorView slots = TensorView::strided(none, DType::kI64, {0}, {0});
  EXPECT_NO_THROW(ops::concat_and_cache_mla(kv_c, k_pe, cache, slots, KvCacheDType::kAuto, 1.0f));
  EXPECT_EQ(0, std::memcmp(before.data(), cache.data<uint8_t>(), before.size()));
  const TensorView no_blocks = TensorView::strided(none, DType::kBF16, {0, 4, 576}, {0, 0, 0});
  EXPECT_NO_THROW(
      ops::concat_and_cache_mla(kv_c, k_pe, no_blocks, slots, KvCacheDType::kAuto, 1.0f));
}

// An empty entry (L + R = 0) lets an element-less cache claim any block count and size: their
// product (the slot count) overflowed int64 and came out 0, refusing a slot the cache has.
TEST(ConcatAndCacheMla, SlotCountOfAHugeEmptyCacheDoesNotWrap) {
  float none[1] = {0.0f};
  const int64_t slots[1] = {5};
  const TensorView cache =
      TensorView::strided(none, DType::kF32, {int64_t{1} << 40, int64_t{1} << 40, 0}, {0, 0, 1});
  EXPECT_NO_THROW(ops::concat_and_cache_mla(
      TensorView::contiguous(none, DType::kF32, {1, 0}),
      TensorView::contiguous(none, DType::kF32, {1, 0}), cache,
      TensorView::contiguous(const_cast<int64_t*>(slots), DType::kI64, {1}), KvCacheDType::kAuto,
      1.0f));
}

// ---- bad input ----------------------------------------------------------------------------------

struct WriteArgs {
  Tensor kv_c = Tensor::empty({4, 512}, DType::kBF16);         // [T', L]
  Tensor k_pe = Tensor::empty({4, 64}, DType::kBF16);          // [T', R]
  Tensor cache = test::nan_tensor({2, 4, 576}, DType::kBF16);  // [nb, bs, L + R]
  Tensor slots = test::int_tensor({0, 3, -1, 5}, {4}, DType::kI64);
};

TEST(ConcatAndCacheMlaErrors, SlotOutOfRangeNamesTokenAndWritesNothing) {
  WriteArgs a;
  a.slots = test::int_tensor({0, 3, 8, 5}, {4}, DType::kI64);  // 8 slots in 2 blocks of 4
  const std::vector<uint8_t> before(a.cache.data<uint8_t>(),
                                    a.cache.data<uint8_t>() + a.cache.numel() * 2);
  MLAKIT_EXPECT_THROW_MSG(
      ops::concat_and_cache_mla(a.kv_c, a.k_pe, a.cache, a.slots, KvCacheDType::kAuto, 1.0f),
      "token 2 has slot 8");
  try {
    ops::concat_and_cache_mla(a.kv_c, a.k_pe, a.cache, a.slots, KvCacheDType::kAuto, 1.0f);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
  }
  EXPECT_EQ(0, std::memcmp(before.data(), a.cache.data<uint8_t>(), before.size()))
      << "token 0 was written before the bad slot of token 2 was seen";
}

TEST(ConcatAndCacheMlaErrors, BadDtypesAndShapes) {
  const auto call = [](const WriteArgs& a, KvCacheDType kv, float k_scale = 1.0f) {
    ops::concat_and_cache_mla(a.kv_c, a.k_pe, a.cache, a.slots, kv, k_scale);
  };
  {
    WriteArgs a;
    a.slots = test::int_tensor({0, 1, 2, 3}, {4}, DType::kI32);
    MLAKIT_EXPECT_THROW_MSG(call(a, KvCacheDType::kAuto), "slot_mapping must have dtype i64");
  }
  {
    WriteArgs a;
    a.slots = test::int_tensor({0, 1, 2, 3, 4}, {5}, DType::kI64);  // more slots than rows
    MLAKIT_EXPECT_THROW_MSG(call(a, KvCacheDType::kAuto), "kv_c.shape[0] must be at least 5");
  }
  {
    WriteArgs a;
    a.cache = test::nan_tensor({2, 4, 575}, DType::kBF16);
    MLAKIT_EXPECT_THROW_MSG(call(a, KvCacheDType::kAuto),
                            "kv_c.shape[1] + k_pe.shape[1] (L + R) must add up to the cache entry "
                            "width kv_cache.shape[2] = 575, got 512 + 64 = 576");
  }
  {
    WriteArgs a;
    a.cache = test::nan_tensor({2, 4, 576}, DType::kF32);
    MLAKIT_EXPECT_THROW_MSG(call(a, KvCacheDType::kAuto), "kv_cache must have the dtype of kv_c");
  }
  {
    WriteArgs a;
    a.k_pe = Tensor::empty({4, 64}, DType::kF16);
    MLAKIT_EXPECT_THROW_MSG(call(a, KvCacheDType::kAuto), "k_pe must have the dtype of kv_c");
  }
  {
    WriteArgs a;
    a.kv_c = Tensor::empty({4, 512}, DType::kI32);
    MLAKIT_EXPECT_THROW_MSG(call(a, KvCacheDType::kAuto), "kv_c must have dtype f32 or f16");
  }
  {
    WriteArgs a;  // bf16 cache for fp8
    MLAKIT_EXPECT_THROW_MSG(call(a, KvCacheDType::kFp8E4m3), "must have dtype u8 or fp8_e4m3");
  }
  {
    WriteArgs a;
    a.cache = test::nan_tensor({2, 4, 576}, DType::kU8);
    MLAKIT_EXPECT_THROW_MSG(call(a, KvCacheDType::kFp8E4m3, 0.0f),
                            "concat_and_cache_mla: scale must be finite and > 0");
    MLAKIT_EXPECT_THROW_MSG(call(a, KvCacheDType::kFp8E4m3, -1.0f),
                            "concat_and_cache_mla: scale must be finite");
    MLAKIT_EXPECT_THROW_MSG(call(a, KvCacheDType::kFp8E4m3, NAN),
                            "concat_and_cache_mla: scale must be finite");
    MLAKIT_EXPECT_THROW_MSG(call(a, KvCacheDType::kFp8E4m3, INFINITY),
                            "concat_and_cache_mla: scale must be finite");
  }
  {
    WriteArgs a;
    const TensorView transposed =
        TensorView::strided(a.kv_c.data<void>(), DType::kBF16, {4, 512}, {1, 4});
    MLAKIT_EXPECT_THROW_MSG(
        ops::concat_and_cache_mla(transposed, a.k_pe, a.cache, a.slots, KvCacheDType::kAuto, 1.0f),
        "kv_c must be contiguous in its last dimension");
  }
  {
    WriteArgs a;  // entries of neighbouring slots overlap
    const TensorView overlapping =
        TensorView::strided(a.cache.data<void>(), DType::kBF16, {2, 4, 576}, {4 * 100, 100, 1});
    MLAKIT_EXPECT_THROW_MSG(
        ops::concat_and_cache_mla(a.kv_c, a.k_pe, overlapping, a.slots, KvCacheDType::kAuto, 1.0f),
        "kv_cache entries must not overlap");
  }
}

TEST(ConcatAndCacheMlaErrors, DsMlaNeedsItsLayout) {
  const Tensor slots = test::int_tensor({0, 1}, {2}, DType::kI64);
  const Tensor cache = test::nan_tensor({1, 4, 656}, DType::kU8);
  const Tensor kv_c_f32 = Tensor::empty({2, 512}, DType::kF32);
  const Tensor k_pe_f32 = Tensor::empty({2, 64}, DType::kF32);
  MLAKIT_EXPECT_THROW_MSG(
      ops::concat_and_cache_mla(kv_c_f32, k_pe_f32, cache, slots, KvCacheDType::kFp8DsMla, 1.0f),
      "kv_c must have dtype f16 or bf16 for fp8_ds_mla");
  const Tensor kv_c_256 = Tensor::empty({2, 256}, DType::kBF16);
  const Tensor k_pe = Tensor::empty({2, 64}, DType::kBF16);
  MLAKIT_EXPECT_THROW_MSG(
      ops::concat_and_cache_mla(kv_c_256, k_pe, cache, slots, KvCacheDType::kFp8DsMla, 1.0f),
      "kv_c.shape[1] and k_pe.shape[1] must be 512 and 64 for kv_cache_dtype fp8_ds_mla (the only "
      "dims its 656-byte entry holds), got 256 and 64");
  const Tensor kv_c = Tensor::empty({2, 512}, DType::kBF16);
  const Tensor k_pe_32 = Tensor::empty({2, 32}, DType::kBF16);
  MLAKIT_EXPECT_THROW_MSG(
      ops::concat_and_cache_mla(kv_c, k_pe_32, cache, slots, KvCacheDType::kFp8DsMla, 1.0f),
      "kv_c.shape[1] and k_pe.shape[1] must be 512 and 64 for kv_cache_dtype fp8_ds_mla (the only "
      "dims its 656-byte entry holds), got 512 and 32");
  const Tensor cache_576 = test::nan_tensor({1, 4, 576}, DType::kU8);
  MLAKIT_EXPECT_THROW_MSG(
      ops::concat_and_cache_mla(kv_c, k_pe, cache_576, slots, KvCacheDType::kFp8DsMla, 1.0f),
      "kv_cache.shape[2] must equal 656");
}

TEST(ConcatAndCacheMlaErrors, CudaTensorsHaveNoKernelYet) {
  WriteArgs a;
  auto on_cuda = [](const Tensor& t) {
    TensorView v = t.view();
    v.device = Device::cuda(0);
    return v;
  };
#ifndef MLAKIT_WITH_CUDA  // with CUDA the call reaches the CUDA kernels (tests/cuda)
  MLAKIT_EXPECT_THROW_MSG(
      ops::concat_and_cache_mla(on_cuda(a.kv_c), on_cuda(a.k_pe), on_cuda(a.cache),
                                on_cuda(a.slots), KvCacheDType::kAuto, 1.0f),
      "concat_and_cache_mla: no kernel for cuda:0");
#endif
  MLAKIT_EXPECT_THROW_MSG(ops::concat_and_cache_mla(on_cuda(a.kv_c), a.k_pe, a.cache, a.slots,
                                                    KvCacheDType::kAuto, 1.0f),
                          "all tensors must be on one device");
}

}  // namespace
}  // namespace mlakit
