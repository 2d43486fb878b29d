// concat_and_cache_mla_with_q_rope on the CPU (src/ops/cache_write_with_q_rope.hpp): the cache
// equals what concat_and_cache_mla writes (tests/cpu/cache_write_test.cpp checks that op against
// its reference), the rope columns of the query buffer equal q's rope values bit for bit (copied
// by a plain loop here) and every other element of the buffer keeps its NaN poison; bad q_rope
// arguments are refused by name.
#include <gtest/gtest.h>

#include <cstring>

#include "common/cache_write_inputs.hpp"
#include "common/test_util.hpp"
#include "mlakit/dtype.hpp"
#include "mlakit/error.hpp"
#include "mlakit/ops.hpp"
#include "ops/cache_write_with_q_rope.hpp"

namespace mlakit {
namespace {

constexpr int64_t kHeads = 3;
constexpr int64_t kNope = 16;  // P of q = [q_nope (P) | q_pe (R)]
constexpr int64_t kDecodeTokens = 5;

TEST(ConcatAndCacheMlaWithQRope, WritesTheCacheAndCopiesTheRopeColumns) {
  for (KvCacheDType kv : {KvCacheDType::kAuto, KvCacheDType::kFp8E4m3, KvCacheDType::kFp8DsMla}) {
    SCOPED_TRACE(kv_cache_dtype_name(kv));
    const test::CacheWriteCase c{.num_tokens = 12,
                                 .act = DType::kBF16,
                                 .kv_dtype = kv,
                                 .k_scale = 0.5f,
                                 .sliced_inputs = true,
                                 .stream = 40 + static_cast<uint64_t>(kv)};
    auto rng = test::make_rng(c.stream);
    const test::CacheWriteInputs fused = test::make_cache_write_inputs(rng, c);
    rng = test::make_rng(c.stream);
    const test::CacheWriteInputs plain = test::make_cache_write_inputs(rng, c);
    const int64_t r = c.rope, l = c.latent;
    const Tensor q = test::random_tensor(rng, {kDecodeTokens, kHeads, kNope + r}, c.act);
    Tensor ql = test::nan_tensor({kDecodeTokens, kHeads, l + r}, c.act);
    const Tensor expected_ql = test::nan_tensor({kDecodeTokens, kHeads, l + r}, c.act);
    const TensorView q_rope = q.view().narrow(2, kNope, r);

    ops::concat_and_cache_mla_with_q_rope(fused.kv_c, fused.k_pe, fused.cache, fused.slot_mapping,
                                          kv, c.k_scale, q_rope, ql.view().narrow(2, l, r));
    ops::concat_and_cache_mla(plain.kv_c, plain.k_pe, plain.cache, plain.slot_mapping, kv,
                              c.k_scale);
    const int64_t elem = dtype_size(c.act);
    for (int64_t t = 0; t < kDecodeTokens; ++t) {
      for (int64_t h = 0; h < kHeads; ++h) {
        std::memcpy(
            static_cast<char*>(expected_ql.view().data) + ((t * kHeads + h) * (l + r) + l) * elem,
            static_cast<const char*>(q.view().data) +
                ((t * kHeads + h) * (kNope + r) + kNope) * elem,
            r * elem);
      }
    }
    EXPECT_EQ(
        0, std::memcmp(fused.cache_buffer.view().data, plain.cache_buffer.view().data,
                       fused.cache_buffer.numel() * dtype_size(fused.cache_buffer.view().dtype)));
    EXPECT_EQ(0, std::memcmp(ql.view().data, expected_ql.view().data, ql.numel() * elem));
  }
}

TEST(ConcatAndCacheMlaWithQRopeErrors, BadQRopeViewsAreNamed) {
  const Tensor kv_c = Tensor::empty({4, 512}, DType::kBF16);
  const Tensor k_pe = Tensor::empty({4, 64}, DType::kBF16);
  const Tensor cache = test::nan_tensor({2, 4, 576}, DType::kBF16);
  const Tensor slots = test::int_tensor({0, 3, -1, 5}, {4}, DType::kI64);
  const Tensor q = test::nan_tensor({4, kHeads, 192}, DType::kBF16);
  const Tensor ql = test::nan_tensor({4, kHeads, 576}, DType::kBF16);
  const TensorView src = q.view().narrow(2, 128, 64), dst = ql.view().narrow(2, 512, 64);
  auto call = [&](const TensorView& s, const TensorView& d) {
    ops::concat_and_cache_mla_with_q_rope(kv_c, k_pe, cache, slots, KvCacheDType::kAuto, 1.0f, s,
                                          d);
  };
  MLAKIT_EXPECT_THROW_MSG(call(src, dst.narrow(0, 0, 3)),
                          "concat_and_cache_mla_with_q_rope: q_rope_dst.shape[0] must equal 4");
  const Tensor ql_f16 = test::nan_tensor({4, kHeads, 576}, DType::kF16);
  MLAKIT_EXPECT_THROW_MSG(call(src, ql_f16.view().narrow(2, 512, 64)),
                          "q_rope_dst must have the dtype of q_rope_src (bf16), got f16");
  // Heads 32 elements apart cannot hold 64 each.
  const TensorView overlapping =
      TensorView::strided(ql.view().data, DType::kBF16, {4, kHeads, 64}, {576, 32, 1});
  MLAKIT_EXPECT_THROW_MSG(call(src, overlapping), "q_rope_dst elements must not overlap");
  // Tokens 64 elements apart cannot hold 3 heads 576 apart.
  const TensorView tokens_overlap =
      TensorView::strided(ql.view().data, DType::kBF16, {4, kHeads, 64}, {64, 576, 1});
  MLAKIT_EXPECT_THROW_MSG(call(src, tokens_overlap), "q_rope_dst elements must not overlap");
  const TensorView every_other =
      TensorView::strided(ql.view().data, DType::kBF16, {4, kHeads, 64}, {3 * 576, 576, 2});
  MLAKIT_EXPECT_THROW_MSG(call(src, every_other),
                          "q_rope_dst must be contiguous in its last dimension, got stride 2");
}

}  // namespace
}  // namespace mlakit
