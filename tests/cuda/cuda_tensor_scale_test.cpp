// Scales read on the device (ops.hpp, "Scales as tensors") through the CUDA backend: the tensor
// forms of concat_and_cache_mla, gather_and_maybe_dequant_cache and scaled_fp8_quant with a
// device f32 [1] scale must give the bytes of the CPU float forms (tests/cpu checks those against
// formula references) on NaN-poisoned outputs; dynamic_scaled_fp8_quant must give the CPU's scale
// bits and codes. A device scale that is not finite and > 0 must write NaN (never finite codes or
// rows), leave unused slots alone and be reported by check_device_errors. A CUDA graph captured
// with a device scale must, on replay, follow new inputs and a new value written into the scale
// tensor (no host read at capture).
//
// Skips without a GPU. To run on a GPU machine:
//   bash scripts/fetch_cutlass.sh && export PATH=/usr/local/cuda/bin:$PATH
//   cmake --preset cuda && cmake --build --preset cuda --target cuda_tensor_scale_test
//   ./build/cuda/tests/cuda_tensor_scale_test
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/cache_write_inputs.hpp"
#include "common/paged_cache.hpp"
#include "common/test_util.hpp"
#include "gpu_test_util.hpp"
#include "mlakit/error.hpp"
#include "mlakit/kv_cache.hpp"
#include "mlakit/ops.hpp"

namespace mlakit {
namespace {

using test::Mirrored;

// A host f32 [1] tensor holding `value`.
Tensor host_scale(float value) {
  Tensor t = Tensor::empty({1}, DType::kF32);
  std::memcpy(t.view().data, &value, sizeof(value));
  return t;
}

// Writes `value` into a device f32 [1] tensor (synchronously).
void set_device_scale(const Tensor& scale, float value) {
  ASSERT_EQ(cudaMemcpy(scale.view().data, &value, sizeof(value), cudaMemcpyHostToDevice),
            cudaSuccess);
}

float random_scale(std::mt19937_64& rng) {
  // 2^[-6, 4): the range of real k_scale / activation scales.
  return std::ldexp(std::uniform_real_distribution<float>(1.0f, 2.0f)(rng),
                    std::uniform_int_distribution<int>(-6, 3)(rng));
}

// Expects check_device_errors to report `text`, then a clean word.
void expect_reported(const std::string& text) {
  try {
    ops::check_device_errors(Device::cuda(0));
    ADD_FAILURE() << "expected a device error naming: " << text;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0)));
}

const float kBadScales[] = {std::nanf(""), 0.0f, -1.5f, std::numeric_limits<float>::infinity()};

// ---- concat_and_cache_mla -----------------------------------------------------------------------

// The CPU float form on the host cache and the CUDA tensor form on its device copy; returns
// (CPU cache, GPU cache) bytes.
std::pair<Tensor, Tensor> run_concat(const test::CacheWriteCase& c, float device_value) {
  auto rng = test::make_rng(c.stream);
  const test::CacheWriteInputs in = test::make_cache_write_inputs(rng, c);
  const Mirrored d_kv_c(in.kv_c_storage),
      d_k_pe = c.sliced_inputs ? d_kv_c : Mirrored(in.k_pe_storage), d_cache(in.cache_buffer),
      d_slots(in.slot_mapping), d_scale(host_scale(device_value));
  ops::concat_and_cache_mla(d_kv_c.on_device(in.kv_c), d_k_pe.on_device(in.k_pe),
                            d_cache.on_device(in.cache), d_slots.device, c.kv_dtype,
                            d_scale.device);
  ops::concat_and_cache_mla(in.kv_c, in.k_pe, in.cache, in.slot_mapping, c.kv_dtype, c.k_scale);
  return {in.cache_buffer, test::to_host(d_cache.device)};
}

TEST(CudaTensorScale, ConcatAndCacheMlaMatchesCpuFloatForm) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(21000);
  uint64_t stream = 21000;
  for (DType act : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t pad : {0, 1}) {  // vector and scalar packs
      const float scale = random_scale(rng);
      const test::CacheWriteCase c{.extra_rows = 3,
                                   .act = act,
                                   .kv_dtype = KvCacheDType::kFp8E4m3,
                                   .k_scale = scale,
                                   .sliced_inputs = true,
                                   .input_pad = pad,
                                   .stream = stream++};
      SCOPED_TRACE(test::describe(c));
      const auto [cpu, gpu] = run_concat(c, scale);
      EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0)));
      EXPECT_TRUE(test::same_bits(cpu, gpu, /*nan_equal=*/true));
    }
  }
}

TEST(CudaTensorScale, ConcatAndCacheMlaBadDeviceScaleWritesNanCodesAndIsReported) {
  MLAKIT_SKIP_WITHOUT_GPU();
  uint64_t stream = 21100;
  for (float bad : kBadScales) {
    const test::CacheWriteCase c{.num_tokens = 20,
                                 .act = DType::kBF16,
                                 .kv_dtype = KvCacheDType::kFp8E4m3,
                                 .k_scale = 1.0f,
                                 .stream = stream++};
    SCOPED_TRACE(bad);
    auto rng = test::make_rng(c.stream);
    const test::CacheWriteInputs in = test::make_cache_write_inputs(rng, c);
    // Unused slots hold a finite code (0x11), so NaN there would be seen as a stray write.
    std::memset(in.cache_buffer.view().data, 0x11, in.cache_buffer.numel());
    const Mirrored d_kv_c(in.kv_c_storage), d_k_pe(in.k_pe_storage), d_cache(in.cache_buffer),
        d_slots(in.slot_mapping), d_scale(host_scale(bad));
    ops::concat_and_cache_mla(d_kv_c.on_device(in.kv_c), d_k_pe.on_device(in.k_pe),
                              d_cache.on_device(in.cache), d_slots.device, c.kv_dtype,
                              d_scale.device);
    const Tensor got = test::to_host(d_cache.device);
    const int64_t width = c.latent + c.rope;
    std::vector<bool> used(c.num_blocks * c.block_size, false);
    for (int64_t t = 0; t < c.num_tokens; ++t) {
      if (in.slots[t] >= 0) used[in.slots[t]] = true;
    }
    int64_t bad_bytes = 0;
    for (int64_t slot = 0; slot < c.num_blocks * c.block_size; ++slot) {
      const uint8_t* entry = got.data<uint8_t>() + slot * width;
      for (int64_t j = 0; j < width; ++j) {
        const bool ok = used[slot] ? (entry[j] & 0x7f) == 0x7f : entry[j] == 0x11;
        if (!ok && bad_bytes++ < 3) {
          ADD_FAILURE() << "slot " << slot << (used[slot] ? " (written)" : " (unused)") << " byte "
                        << j << " = " << int(entry[j]);
        }
      }
    }
    EXPECT_EQ(bad_bytes, 0);
    expect_reported("concat_and_cache_mla: the scale tensor held a value that is not finite");
  }
}

// ---- gather_and_maybe_dequant_cache -------------------------------------------------------------

TEST(CudaTensorScale, GatherAndMaybeDequantCacheMatchesCpuFloatFormAndBadScaleGivesNan) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(22000);
  constexpr int64_t kWidth = 576;  // L + R
  for (DType dst_dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t pad : {24, 1}) {  // aligned rows (vector packs) and odd strides (scalar)
      const float scale = random_scale(rng);
      const test::PagedBatch batch = test::random_paged_batch(rng, 6, 16, true);
      const Tensor cache = test::random_paged_cache(rng, batch, KvCacheDType::kFp8E4m3, DType::kU8,
                                                    kWidth, dst_dtype);
      const test::PagedIndices ix = test::make_paged_indices(rng, batch);
      const std::optional<Tensor> starts = ix.seq_starts();
      const int64_t rows = ix.num_tokens + 2;
      Tensor cpu = test::nan_tensor({rows, kWidth + pad}, dst_dtype);
      const TensorView dst = cpu.view().narrow(1, 0, kWidth);
      const Mirrored d_cache(cache), d_dst(cpu), d_table(ix.block_table()), d_cu(ix.cu_seq_lens()),
          d_tts(ix.token_to_seq()), d_scale(host_scale(scale));
      const std::optional<Mirrored> d_starts =
          starts ? std::optional<Mirrored>(Mirrored(*starts)) : std::nullopt;
      const std::optional<TensorView> d_starts_view =
          d_starts ? std::optional<TensorView>(d_starts->device.view()) : std::nullopt;
      auto gather_on_device = [&] {
        ops::gather_and_maybe_dequant_cache(d_cache.device, d_dst.on_device(dst), d_table.device,
                                            d_cu.device, d_tts.device, ix.num_tokens,
                                            KvCacheDType::kFp8E4m3, d_scale.device, d_starts_view);
      };
      gather_on_device();
      ops::gather_and_maybe_dequant_cache(cache, dst, ix.block_table(), ix.cu_seq_lens(),
                                          ix.token_to_seq(), ix.num_tokens, KvCacheDType::kFp8E4m3,
                                          scale, test::optional_view(starts));
      EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0)));
      EXPECT_TRUE(test::same_bits(cpu, test::to_host(d_dst.device))) << dtype_name(dst_dtype);

      // A bad value: rows [0, num_tokens) NaN, the padding columns and rows still as written.
      set_device_scale(d_scale.device, kBadScales[pad % 4]);
      gather_on_device();
      const Tensor got = test::to_host(d_dst.device);
      const std::vector<double> all = test::to_doubles(got);
      const std::vector<double> before = test::to_doubles(cpu);
      int64_t wrong = 0;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < kWidth + pad; ++i) {
          const int64_t k = r * (kWidth + pad) + i;
          const bool written = r < ix.num_tokens && i < kWidth;
          const bool ok = written ? std::isnan(all[k])
                                  : (std::isnan(all[k]) == std::isnan(before[k]) &&
                                     (std::isnan(all[k]) || all[k] == before[k]));
          if (!ok && wrong++ < 3) ADD_FAILURE() << "row " << r << " column " << i;
        }
      }
      EXPECT_EQ(wrong, 0);
      expect_reported("gather_and_maybe_dequant_cache: the scale tensor held a value that is not");
    }
  }
}

// ---- scaled_fp8_quant and dynamic_scaled_fp8_quant ---------------------------------------------

TEST(CudaTensorScale, ScaledFp8QuantMatchesCpuFloatForm) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(23000);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t cols : {1024, 1025}) {  // vector and scalar packs
      const float scale = random_scale(rng);
      const Tensor x = test::random_tensor(rng, {7, cols}, dtype, 60.0);
      const Tensor cpu = test::nan_tensor({7, cols}, DType::kFp8E4m3);
      const Mirrored d_x(x), d_out(cpu), d_scale(host_scale(scale));
      ops::scaled_fp8_quant(d_x.device, d_out.device, d_scale.device);
      ops::scaled_fp8_quant(x, cpu, scale);
      EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0)));
      EXPECT_TRUE(test::same_bits(cpu, test::to_host(d_out.device), /*nan_equal=*/true))
          << dtype_name(dtype) << " cols " << cols;
    }
  }
}

TEST(CudaTensorScale, ScaledFp8QuantBadDeviceScaleWritesNanCodesAndIsReported) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(23100);
  const Tensor x = test::random_tensor(rng, {5, 64}, DType::kBF16, 4.0);
  // 1e-40: finite and > 0, but its reciprocal is not finite (the host form rejects it too).
  std::vector<float> bad(std::begin(kBadScales), std::end(kBadScales));
  bad.push_back(1e-40f);
  for (float value : bad) {
    const Mirrored d_x(x), d_out(Tensor::zeros({5, 64}, DType::kFp8E4m3)),
        d_scale(host_scale(value));
    ops::scaled_fp8_quant(d_x.device, d_out.device, d_scale.device);
    const Tensor got = test::to_host(d_out.device);
    for (int64_t i = 0; i < got.numel(); ++i) {
      ASSERT_EQ(got.data<uint8_t>()[i] & 0x7f, 0x7f) << "scale " << value << " element " << i;
    }
    expect_reported("scaled_fp8_quant: the scale tensor held a value that is not finite");
  }
}

TEST(CudaTensorScale, DynamicQuantMatchesCpuScaleBitsAndCodes) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(24000);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const Tensor x = test::random_tensor(rng, {33, 1031}, dtype, 7.0);
    const TensorView strided = x.view().narrow(1, 3, 1000);  // not dense
    const Tensor cpu_out = test::nan_tensor({33, 1000}, DType::kFp8E4m3);
    const Tensor cpu_scale = host_scale(std::nanf(""));
    const Mirrored d_x(x), d_out(cpu_out), d_scale(cpu_scale);
    ops::dynamic_scaled_fp8_quant(d_x.on_device(strided), d_out.device, d_scale.device);
    ops::dynamic_scaled_fp8_quant(strided, cpu_out, cpu_scale);
    EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0)));
    EXPECT_TRUE(test::same_bits(cpu_scale, test::to_host(d_scale.device), false))
        << dtype_name(dtype);
    EXPECT_TRUE(test::same_bits(cpu_out, test::to_host(d_out.device), false)) << dtype_name(dtype);
  }
}

TEST(CudaTensorScale, DynamicQuantOfZerosAndOfInfInput) {
  MLAKIT_SKIP_WITHOUT_GPU();
  const Mirrored zeros(test::tensor_from({0.0, -0.0, 0.0, -0.0, 0.0, 0.0}, {2, 3}, DType::kF16));
  const Mirrored out(test::nan_tensor({2, 3}, DType::kFp8E4m3)), scale(host_scale(5.0f));
  ops::dynamic_scaled_fp8_quant(zeros.device, out.device, scale.device);
  EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0)));
  EXPECT_EQ(test::to_host(scale.device).data<float>()[0], 0.0f);
  const Tensor codes = test::to_host(out.device);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(codes.data<uint8_t>()[i], 0) << i;

  const float inf = std::numeric_limits<float>::infinity();
  const Mirrored with_inf(test::tensor_from({1.0, -inf, 2.0, 0.5, 0.0, 3.0}, {2, 3}, DType::kF32));
  ops::dynamic_scaled_fp8_quant(with_inf.device, out.device, scale.device);
  EXPECT_EQ(test::to_host(scale.device).data<float>()[0], inf);
  const Tensor nan_codes = test::to_host(out.device);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(nan_codes.data<uint8_t>()[i] & 0x7f, 0x7f) << i;
  expect_reported("dynamic_scaled_fp8_quant's scale amax(|input|) / 448 had none");
}

// ---- CUDA graphs --------------------------------------------------------------------------------

// One captured graph of the four ops with device scales; after each replay with new inputs and
// new scale values, every output must equal the CPU float forms run on those values.
TEST(CudaTensorScale, CapturedGraphFollowsNewScaleValuesAndInputs) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(25000);
  constexpr int64_t kTokens = 16, kBlocks = 4, kBlockSize = 8, kWidth = 96;
  // Slots 0..15 of a [4, 8, 96] cache; request 0 gathers positions 2..13 of blocks (2, 0).
  std::vector<int64_t> slots(kTokens);
  for (int64_t t = 0; t < kTokens; ++t) slots[t] = (t * 5) % (kBlocks * kBlockSize);
  const Mirrored kv_c(test::random_tensor(rng, {kTokens, 80}, DType::kBF16)),
      k_pe(test::random_tensor(rng, {kTokens, 16}, DType::kBF16)),
      slot_mapping(test::int_tensor(slots, {kTokens}, DType::kI64)),
      cache(test::nan_tensor({kBlocks, kBlockSize, kWidth}, DType::kU8)),
      table(test::int_tensor({2, 0}, {1, 2}, DType::kI32)),
      cu(test::int_tensor({0, 12}, {2}, DType::kI32)),
      tts(test::int_tensor(std::vector<int64_t>(12, 0), {12}, DType::kI32)),
      starts(test::int_tensor({2}, {1}, DType::kI32)),
      gathered(test::nan_tensor({12, kWidth}, DType::kF32)),
      x(test::random_tensor(rng, {8, 256}, DType::kF16, 30.0)),
      q_static(test::nan_tensor({8, 256}, DType::kFp8E4m3)),
      q_dynamic(test::nan_tensor({8, 256}, DType::kFp8E4m3)), k_scale(host_scale(1.0f)),
      q_scale(host_scale(1.0f)), dyn_scale(host_scale(1.0f));

  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const Stream s{stream};
  auto run = [&] {
    ops::concat_and_cache_mla(kv_c.device, k_pe.device, cache.device, slot_mapping.device,
                              KvCacheDType::kFp8E4m3, k_scale.device, s);
    ops::gather_and_maybe_dequant_cache(cache.device, gathered.device, table.device, cu.device,
                                        tts.device, 12, KvCacheDType::kFp8E4m3, k_scale.device,
                                        starts.device.view(), s);
    ops::scaled_fp8_quant(x.device, q_static.device, q_scale.device, s);
    ops::dynamic_scaled_fp8_quant(x.device, q_dynamic.device, dyn_scale.device, s);
  };
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  run();
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess)
      << "an op synchronized or allocated during capture";
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE(replay);
    // New inputs and scales, written into the captured buffers.
    const Tensor new_kv_c = test::random_tensor(rng, {kTokens, 80}, DType::kBF16);
    const Tensor new_k_pe = test::random_tensor(rng, {kTokens, 16}, DType::kBF16);
    const Tensor new_x = test::random_tensor(rng, {8, 256}, DType::kF16, 30.0);
    const float k_value = random_scale(rng), q_value = random_scale(rng);
    for (const auto& [host, device] :
         {std::pair{&new_kv_c, &kv_c.device}, std::pair{&new_k_pe, &k_pe.device},
          std::pair{&new_x, &x.device}}) {
      ASSERT_EQ(cudaMemcpy(device->view().data, host->view().data, test::storage_bytes(*host),
                           cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    set_device_scale(k_scale.device, k_value);
    set_device_scale(q_scale.device, q_value);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0), s));

    // The CPU float forms on the same values (the cache from its poisoned state: every slot the
    // replay writes is rewritten; the others stay NaN in both).
    const Tensor cpu_cache = test::nan_tensor({kBlocks, kBlockSize, kWidth}, DType::kU8);
    ops::concat_and_cache_mla(new_kv_c, new_k_pe, cpu_cache, slot_mapping.host,
                              KvCacheDType::kFp8E4m3, k_value);
    const Tensor cpu_gathered = test::nan_tensor({12, kWidth}, DType::kF32);
    ops::gather_and_maybe_dequant_cache(cpu_cache, cpu_gathered, table.host, cu.host, tts.host, 12,
                                        KvCacheDType::kFp8E4m3, k_value, starts.host.view());
    const Tensor cpu_static = test::nan_tensor({8, 256}, DType::kFp8E4m3);
    ops::scaled_fp8_quant(new_x, cpu_static, q_value);
    const Tensor cpu_dynamic = test::nan_tensor({8, 256}, DType::kFp8E4m3);
    const Tensor cpu_dyn_scale = host_scale(0.0f);
    ops::dynamic_scaled_fp8_quant(new_x, cpu_dynamic, cpu_dyn_scale);

    EXPECT_TRUE(test::same_bits(cpu_cache, test::to_host(cache.device), true)) << "cache";
    EXPECT_TRUE(test::same_bits(cpu_gathered, test::to_host(gathered.device))) << "gathered";
    EXPECT_TRUE(test::same_bits(cpu_static, test::to_host(q_static.device), true)) << "static";
    EXPECT_TRUE(test::same_bits(cpu_dynamic, test::to_host(q_dynamic.device), true)) << "dynamic";
    EXPECT_TRUE(test::same_bits(cpu_dyn_scale, test::to_host(dyn_scale.device), false))
        << "dynamic scale";
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace mlakit
