// concat_and_cache_mla on the GPU (spec A.3): the CUDA op and the CPU op (tests/cpu checks it
// against an independent reference) write copies of one NaN-poisoned cache from the same inputs;
// the two caches must be equal byte for byte, unused slots and padding included. Bad slots must be
// skipped and reported through cuda::check_device_errors, never written out of bounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <numeric>
#include <random>
#include <sstream>
#include <vector>

#include "common/test_util.hpp"
#include "cuda/common/device_errors.hpp"
#include "gpu_test_util.hpp"
#include "mlakit/error.hpp"
#include "mlakit/kv_cache.hpp"
#include "mlakit/ops.hpp"

namespace mlakit {
namespace {

using test::Mirrored;

struct WriteCase {
  int64_t num_tokens = 42;  // slot_mapping length
  int64_t extra_rows = 3;   // kv_c / k_pe rows beyond num_tokens (CUDA-graph padding)
  int64_t latent = 512;     // L
  int64_t rope = 64;        // R
  int64_t block_size = 16;
  int64_t num_blocks = 8;
  DType act = DType::kBF16;
  KvCacheDType kv_dtype = KvCacheDType::kAuto;
  float k_scale = 1.0f;
  bool sliced_inputs = false;  // kv_c and k_pe are column slices of one [T', L + R + pad] tensor
  int64_t input_pad = 0;       // odd pads make rows unaligned: the kernels' scalar paths
  bool strided_cache = false;  // [nb, bs, W] as a transposed view of a [bs, nb, W + 8] buffer
  bool bit_patterns = false;   // f32 inputs: random bit patterns, inf, NaN, subnormals
  double skip_fraction = 0.2;  // tokens with slot -1
  uint64_t stream = 0;
};

std::string describe(const WriteCase& c) {
  std::ostringstream os;
  os << "T=" << c.num_tokens << " L=" << c.latent << " R=" << c.rope << " bs=" << c.block_size
     << " nb=" << c.num_blocks << " act=" << dtype_name(c.act)
     << " kv=" << kv_cache_dtype_name(c.kv_dtype) << " k_scale=" << c.k_scale
     << " sliced=" << c.sliced_inputs << "+" << c.input_pad << " strided_cache=" << c.strided_cache;
  return os.str();
}

// Random bit patterns around e4m3's range (exponents 2^-22 .. 2^10), every 16th fully random
// (f32 subnormals, inf, NaN of either sign), and a row of special values.
void fill_bit_patterns(std::mt19937_64& rng, const TensorView& v) {
  std::uniform_int_distribution<uint32_t> bits, exponent(127 - 22, 127 + 10);
  for (int64_t r = 0; r < v.shape[0]; ++r) {
    auto* row = static_cast<uint32_t*>(v.data) + r * v.strides[0];
    for (int64_t i = 0; i < v.shape[1]; ++i) {
      const uint32_t u = bits(rng);
      row[i] = (r * v.shape[1] + i) % 16 == 0 ? u : (u & 0x807fffffu) | (exponent(rng) << 23);
    }
  }
  const float special[] = {INFINITY, -INFINITY, NAN,     -NAN,   FLT_MAX, 448.0f,
                           464.0f,   -480.0f,   FLT_MIN, 1e-40f, 0.0f,    -0.0f};
  for (int i = 0; i < 12 && i < v.shape[1]; ++i) static_cast<float*>(v.data)[i] = special[i];
}

void run_write_case(const WriteCase& c) {
  SCOPED_TRACE(describe(c));
  auto rng = test::make_rng(7000 + c.stream);
  const int64_t rows = c.num_tokens + c.extra_rows;
  const int64_t width =
      c.kv_dtype == KvCacheDType::kFp8DsMla ? kDsMlaEntryBytes : c.latent + c.rope;
  const DType storage = c.kv_dtype == KvCacheDType::kAuto ? c.act : DType::kU8;

  // Inputs: one [T', L + R + pad] tensor sliced, or two dense ones.
  Tensor kv_lora = test::random_tensor(rng, {rows, c.latent + c.rope + c.input_pad}, c.act);
  Tensor kv_c_dense = test::random_tensor(rng, {rows, c.latent}, c.act);
  Tensor k_pe_dense = test::random_tensor(rng, {rows, c.rope}, c.act);
  TensorView kv_c = c.sliced_inputs ? kv_lora.view().narrow(1, 0, c.latent) : kv_c_dense.view();
  TensorView k_pe =
      c.sliced_inputs ? kv_lora.view().narrow(1, c.latent, c.rope) : k_pe_dense.view();
  if (c.bit_patterns) {
    fill_bit_patterns(rng, kv_c);
    fill_bit_patterns(rng, k_pe);
  } else if (c.kv_dtype == KvCacheDType::kFp8E4m3 && rows > 0) {
    // Saturation, and ties of x / k_scale between two e4m3 values (even code wins).
    const float special[] = {1000.0f, -1000.0f, 1.0625f, -1.8125f, 0.0048828125f, 200.0f};
    for (int i = 0; i < 6 && i < c.latent; ++i)
      store_float(kv_c.data, c.act, i, special[i] * c.k_scale);
  }
  if (c.kv_dtype == KvCacheDType::kFp8DsMla && rows > 0) {
    for (int64_t i = 0; i < 128; ++i) store_float(kv_c.data, c.act, i, 0.0f);  // all-zero tile
  }

  Tensor buffer = c.strided_cache
                      ? test::nan_tensor({c.block_size, c.num_blocks, width + 8}, storage)
                      : test::nan_tensor({c.num_blocks, c.block_size, width}, storage);
  const TensorView cache =
      c.strided_cache ? buffer.view().transpose(0, 1).narrow(2, 0, width) : buffer.view();

  std::vector<int64_t> all_slots(c.num_blocks * c.block_size);
  std::iota(all_slots.begin(), all_slots.end(), 0);
  std::shuffle(all_slots.begin(), all_slots.end(), rng);
  std::bernoulli_distribution skip(c.skip_fraction);
  std::vector<int64_t> slots(all_slots.begin(), all_slots.begin() + c.num_tokens);
  for (int64_t& s : slots) s = skip(rng) ? -1 : s;
  const Tensor slot_mapping = test::int_tensor(slots, {c.num_tokens}, DType::kI64);

  // Device copies before the CPU op writes the host cache.
  const Mirrored d_kv_lora(kv_lora), d_kv_c(kv_c_dense), d_k_pe(k_pe_dense), d_cache(buffer),
      d_slots(slot_mapping);
  const TensorView gpu_kv_c = c.sliced_inputs ? d_kv_lora.on_device(kv_c) : d_kv_c.on_device(kv_c);
  const TensorView gpu_k_pe = c.sliced_inputs ? d_kv_lora.on_device(k_pe) : d_k_pe.on_device(k_pe);

  ops::concat_and_cache_mla(kv_c, k_pe, cache, slot_mapping, c.kv_dtype, c.k_scale);
  ops::concat_and_cache_mla(gpu_kv_c, gpu_k_pe, d_cache.on_device(cache), d_slots.device,
                            c.kv_dtype, c.k_scale);
  EXPECT_NO_THROW(cuda::check_device_errors(Device::cuda(0)));
  // fp8_e4m3 caches hold only codes: NaN codes of either sign are equal. ds_mla entries also hold
  // f32 scales and rope bits: exact bytes.
  EXPECT_TRUE(
      test::same_bits(buffer, test::to_host(d_cache.device), c.kv_dtype == KvCacheDType::kFp8E4m3));
}

constexpr DType kActDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};

TEST(CudaConcatAndCacheMla, AutoMatchesCpuAlignedAndUnaligned) {
  MLAKIT_SKIP_WITHOUT_GPU();
  uint64_t stream = 0;
  for (DType act : kActDtypes) {
    for (int64_t pad : {0, 1}) {  // pad 1: odd row strides, narrower raw units
      run_write_case({.act = act,
                      .kv_dtype = KvCacheDType::kAuto,
                      .sliced_inputs = true,
                      .input_pad = pad,
                      .stream = stream++});
    }
    run_write_case({.act = act, .kv_dtype = KvCacheDType::kAuto, .stream = stream++});
  }
}

TEST(CudaConcatAndCacheMla, Fp8E4m3MatchesCpu) {
  MLAKIT_SKIP_WITHOUT_GPU();
  uint64_t stream = 100;
  for (DType act : kActDtypes) {
    for (float k_scale : {0.1f, 1.0f, 3.0f, 7.0f}) {
      run_write_case({.act = act,
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
      run_write_case({.act = act,
                      .kv_dtype = KvCacheDType::kFp8DsMla,
                      .sliced_inputs = true,
                      .input_pad = pad,
                      .stream = stream++});
    }
    run_write_case({.act = act, .kv_dtype = KvCacheDType::kFp8DsMla, .stream = stream++});
  }
}

TEST(CudaConcatAndCacheMla, StridedCacheRandomSizesAndSkips) {
  MLAKIT_SKIP_WITHOUT_GPU();
  for (KvCacheDType kv : {KvCacheDType::kAuto, KvCacheDType::kFp8E4m3, KvCacheDType::kFp8DsMla}) {
    run_write_case({.num_tokens = 30,
                    .act = DType::kBF16,
                    .kv_dtype = kv,
                    .k_scale = 0.5f,
                    .sliced_inputs = true,
                    .strided_cache = true,
                    .stream = 300 + static_cast<uint64_t>(kv)});
  }
  auto rng = test::make_rng(400);
  std::uniform_int_distribution<int64_t> latent(1, 96), rope(1, 40), blocks(1, 12);
  const int64_t block_sizes[] = {1, 5, 16, 64};
  for (uint64_t i = 0; i < 12; ++i) {
    WriteCase c;
    c.kv_dtype = i % 3 == 0 ? KvCacheDType::kAuto : KvCacheDType::kFp8E4m3;
    c.act = kActDtypes[i % 3];
    c.latent = latent(rng);
    c.rope = rope(rng);
    c.block_size = block_sizes[i % 4];
    c.num_blocks = blocks(rng);
    c.num_tokens = std::uniform_int_distribution<int64_t>(0, c.num_blocks * c.block_size)(rng);
    c.k_scale = i % 2 ? 0.25f : 2.0f;
    c.sliced_inputs = i % 2 == 0;
    c.input_pad = i % 4 == 0 ? 3 : 0;
    c.strided_cache = i % 4 == 1;
    c.stream = 500 + i;
    run_write_case(c);
  }
  run_write_case(
      {.num_tokens = 10, .kv_dtype = KvCacheDType::kFp8E4m3, .skip_fraction = 1.0, .stream = 600});
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
      cuda::check_device_errors(Device::cuda(0));
      ADD_FAILURE() << "expected the bad slot to be reported";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
      EXPECT_NE(std::string(e.what()).find("concat_and_cache_mla: a slot_mapping value was >= "
                                           "num_blocks * block_size"),
                std::string::npos)
          << e.what();
    }
    EXPECT_NO_THROW(cuda::check_device_errors(Device::cuda(0))) << "the error word was not cleared";
    EXPECT_TRUE(test::same_bits(buffer, test::to_host(d_buffer.device), false));
  }
}

}  // namespace
}  // namespace mlakit
