// concat_and_cache_mla on the GPU (spec A.3): the CUDA op and the CPU op (tests/cpu checks it
// against an independent reference) write copies of one NaN-poisoned cache from the same inputs;
// the two caches must be equal byte for byte, unused slots and padding included. Bad slots must be
// skipped and reported through cuda::check_device_errors, never written out of bounds.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "common/cache_write_inputs.hpp"
#include "common/test_util.hpp"
#include "gpu_test_util.hpp"
#include "mlakit/error.hpp"
#include "mlakit/kv_cache.hpp"
#include "mlakit/ops.hpp"

namespace mlakit {
namespace {

using test::Mirrored;

using WriteCase = test::CacheWriteCase;

// Rows of kv_c / k_pe past num_tokens in most cases (CUDA-graph padding): never read.
constexpr int64_t kPaddingRows = 3;

void run_write_case(const WriteCase& c) {
  SCOPED_TRACE(test::describe(c));
  auto rng = test::make_rng(7000 + c.stream);
  const test::CacheWriteInputs in = test::make_cache_write_inputs(rng, c);

  // Device copies before the CPU op writes the host cache; sliced kv_c and k_pe share one.
  const Mirrored d_kv_c(in.kv_c_storage),
      d_k_pe = c.sliced_inputs ? d_kv_c : Mirrored(in.k_pe_storage), d_cache(in.cache_buffer),
      d_slots(in.slot_mapping);

  ops::concat_and_cache_mla(in.kv_c, in.k_pe, in.cache, in.slot_mapping, c.kv_dtype, c.k_scale);
  ops::concat_and_cache_mla(d_kv_c.on_device(in.kv_c), d_k_pe.on_device(in.k_pe),
                            d_cache.on_device(in.cache), d_slots.device, c.kv_dtype, c.k_scale);
  EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0)));
  // fp8_e4m3 caches hold only codes: NaN codes of either sign are equal. ds_mla entries also hold
  // f32 scales and rope bits: exact bytes.
  EXPECT_TRUE(test::same_bits(in.cache_buffer, test::to_host(d_cache.device),
                              c.kv_dtype == KvCacheDType::kFp8E4m3));
}

constexpr DType kActDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};

TEST(CudaConcatAndCacheMla, AutoMatchesCpuAlignedAndUnaligned) {
  MLAKIT_SKIP_WITHOUT_GPU();
  uint64_t stream = 0;
  for (DType act : kActDtypes) {
    for (int64_t pad : {0, 1}) {  // pad 1: odd row strides, narrower raw units
      run_write_case({.extra_rows = kPaddingRows,
                      .act = act,
                      .kv_dtype = KvCacheDType::kAuto,
                      .sliced_inputs = true,
                      .input_pad = pad,
                      .stream = stream++});
    }
    run_write_case({.extra_rows = kPaddingRows,
                    .act = act,
                    .kv_dtype = KvCacheDType::kAuto,
                    .stream = stream++});
  }
}

TEST(CudaConcatAndCacheMla, Fp8E4m3MatchesCpu) {
  MLAKIT_SKIP_WITHOUT_GPU();
  uint64_t stream = 100;
  for (DType act : kActDtypes) {
    for (float k_scale : {0.1f, 1.0f, 3.0f, 7.0f}) {
      run_write_case({.extra_rows = kPaddingRows,
                      .act = act,
                      .kv_dtype = KvCacheDType::kFp8E4m3,
                      .k_scale = k_scale,
                      .sliced_inputs = stream % 2 == 0,
                      .input_pad = stream % 4 == 0 ? 1 : 0,  // vector and scalar packs
                      .stream = stream++});
    }
  }
}

TEST(CudaConcatAndCacheMla, Fp8E4m3OverBitPatternsIncludingInfAndNan) {
  MLAKIT_SKIP_WITHOUT_GPU();
  for (int64_t pad : {0, 1}) {
    run_write_case({.num_tokens = 256,
                    .extra_rows = kPaddingRows,
                    .latent = 120,
                    .rope = 24,
                    .num_blocks = 16,
                    .act = DType::kF32,
                    .kv_dtype = KvCacheDType::kFp8E4m3,
                    .sliced_inputs = true,
                    .input_pad = pad,
                    .bit_patterns = true,
                    .skip_fraction = 0.0,
                    .stream = 150 + static_cast<uint64_t>(pad)});
  }
}

TEST(CudaConcatAndCacheMla, DsMlaMatchesCpuAlignedAndUnaligned) {
  MLAKIT_SKIP_WITHOUT_GPU();
  uint64_t stream = 200;
  for (DType act : {DType::kBF16, DType::kF16}) {
    for (int64_t pad : {0, 1}) {
      run_write_case({.extra_rows = kPaddingRows,
                      .act = act,
                      .kv_dtype = KvCacheDType::kFp8DsMla,
                      .sliced_inputs = true,
                      .input_pad = pad,
                      .stream = stream++});
    }
    run_write_case({.extra_rows = kPaddingRows,
                    .act = act,
                    .kv_dtype = KvCacheDType::kFp8DsMla,
                    .stream = stream++});
  }
}

TEST(CudaConcatAndCacheMla, StridedCacheRandomSizesAndSkips) {
  MLAKIT_SKIP_WITHOUT_GPU();
  for (KvCacheDType kv : {KvCacheDType::kAuto, KvCacheDType::kFp8E4m3, KvCacheDType::kFp8DsMla}) {
    run_write_case({.num_tokens = 30,
                    .extra_rows = kPaddingRows,
                    .act = DType::kBF16,
                    .kv_dtype = kv,
                    .k_scale = 0.5f,
                    .sliced_inputs = true,
                    .strided_cache = true,
                    .stream = 300 + static_cast<uint64_t>(kv)});
  }
  auto rng = test::make_rng(400);
  for (uint64_t i = 0; i < 12; ++i) {
    WriteCase c = test::random_cache_write_case(rng, i);
    c.extra_rows = kPaddingRows;
    run_write_case(c);
  }
  run_write_case({.num_tokens = 10,
                  .extra_rows = kPaddingRows,
                  .kv_dtype = KvCacheDType::kFp8E4m3,
                  .skip_fraction = 1.0,
                  .stream = 600});
}

// A bad slot: the token is skipped, the others are written, nothing outside the cache changes,
// and check_device_errors reports it once.
TEST(CudaConcatAndCacheMlaErrors, SlotBeyondCacheIsSkippedAndReported) {
  MLAKIT_SKIP_WITHOUT_GPU();
  for (KvCacheDType kv : {KvCacheDType::kAuto, KvCacheDType::kFp8E4m3, KvCacheDType::kFp8DsMla}) {
    SCOPED_TRACE(kv_cache_dtype_name(kv));
    auto rng = test::make_rng(700);
    const int64_t width = kv == KvCacheDType::kFp8DsMla ? kDsMlaEntryBytes : 576;
    const DType storage = kv == KvCacheDType::kAuto ? DType::kBF16 : DType::kU8;
    // The cache is blocks [0, 2) of a 3-block buffer: slot 8 would land in the guard block 2.
    Tensor buffer = test::nan_tensor({3, 4, width}, storage);
    const TensorView cache = buffer.view().narrow(0, 0, 2);
    const Tensor kv_c = test::random_tensor(rng, {5, 512}, DType::kBF16);
    const Tensor k_pe = test::random_tensor(rng, {5, 64}, DType::kBF16);
    const Tensor bad = test::int_tensor({0, 3, 8, 5, -1}, {5}, DType::kI64);
    const Tensor good = test::int_tensor({0, 3, -1, 5, -1}, {5}, DType::kI64);
    const Mirrored d_buffer(buffer), d_kv_c(kv_c), d_k_pe(k_pe), d_bad(bad);

    ops::concat_and_cache_mla(kv_c, k_pe, cache, good, kv, 0.5f);  // expected: token 2 skipped
    ops::concat_and_cache_mla(d_kv_c.device, d_k_pe.device, d_buffer.on_device(cache), d_bad.device,
                              kv, 0.5f);
    try {
      ops::check_device_errors(Device::cuda(0));
      ADD_FAILURE() << "expected the bad slot to be reported";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
      EXPECT_NE(std::string(e.what()).find("concat_and_cache_mla: a slot_mapping value was >= "
                                           "num_blocks * block_size"),
                std::string::npos)
          << e.what();
    }
    EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0))) << "the error word was not cleared";
    EXPECT_TRUE(test::same_bits(buffer, test::to_host(d_buffer.device), false));
  }
}

}  // namespace
}  // namespace mlakit
