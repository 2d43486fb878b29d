// concat_and_cache_mla_with_q_rope on the GPU: the decode layer's cache write with the queries'
// rope part copied by the same launch (src/ops/cache_write_with_q_rope.hpp). The cache must equal,
// byte for byte, what the CPU concat_and_cache_mla writes from the same inputs (tests/cpu checks
// that op against its reference); the query buffer must hold q's rope values bit for bit in its
// rope columns (expected values copied by a plain host loop) and its NaN poison everywhere else.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "common/cache_write_inputs.hpp"
#include "common/test_util.hpp"
#include "gpu_test_util.hpp"
#include "mlakit/dtype.hpp"
#include "mlakit/ops.hpp"
#include "ops/cache_write_with_q_rope.hpp"

namespace mlakit {
namespace {

using test::Mirrored;

constexpr int64_t kHeads = 5;  // odd: head runs do not line up with warps
constexpr int64_t kNope = 24;  // P of q = [q_nope (P) | q_pe (R)]

struct QRopeLayout {
  int64_t decode_tokens;  // Td
  int64_t pad;            // extra columns of q and of ql: odd pads make 2-byte (1-element) units
};

// q [Td + 1, N, P + R + pad] (a padding row past Td) and ql [Td, N, L + R + pad] NaN; the rope
// part q[:Td, :, P:P+R] goes to ql[:, :, L:L+R].
void run_case(const test::CacheWriteCase& c, const QRopeLayout& layout) {
  SCOPED_TRACE(::testing::Message()
               << test::describe(c) << " Td " << layout.decode_tokens << " pad " << layout.pad);
  auto rng = test::make_rng(9000 + c.stream);
  const test::CacheWriteInputs in = test::make_cache_write_inputs(rng, c);
  const int64_t td = layout.decode_tokens, r = c.rope, l = c.latent;
  const Tensor q = test::random_tensor(rng, {td + 1, kHeads, kNope + r + layout.pad}, c.act);
  Tensor ql = test::nan_tensor({td, kHeads, l + r + layout.pad}, c.act);
  const TensorView q_rope = q.view().narrow(0, 0, td).narrow(2, kNope, r);
  const TensorView ql_rope = ql.view().narrow(2, l, r);

  const Mirrored d_kv_c(in.kv_c_storage),
      d_k_pe = c.sliced_inputs ? d_kv_c : Mirrored(in.k_pe_storage), d_cache(in.cache_buffer),
      d_slots(in.slot_mapping), d_q(q), d_ql(ql);
  ops::concat_and_cache_mla_with_q_rope(d_kv_c.on_device(in.kv_c), d_k_pe.on_device(in.k_pe),
                                        d_cache.on_device(in.cache), d_slots.device, c.kv_dtype,
                                        c.k_scale, d_q.on_device(q_rope), d_ql.on_device(ql_rope));
  EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0)));

  // Expected: the CPU cache write, and the rope values moved element by element on the host.
  ops::concat_and_cache_mla(in.kv_c, in.k_pe, in.cache, in.slot_mapping, c.kv_dtype, c.k_scale);
  const int64_t elem = dtype_size(c.act);
  for (int64_t t = 0; t < td; ++t) {
    for (int64_t h = 0; h < kHeads; ++h) {
      for (int64_t i = 0; i < r; ++i) {
        const int64_t src = t * q_rope.strides[0] + h * q_rope.strides[1] + i;
        const int64_t dst = t * ql_rope.strides[0] + h * ql_rope.strides[1] + i;
        std::memcpy(static_cast<char*>(ql_rope.data) + dst * elem,
                    static_cast<const char*>(q_rope.data) + src * elem, elem);
      }
    }
  }
  EXPECT_TRUE(test::same_bits(in.cache_buffer, test::to_host(d_cache.device),
                              c.kv_dtype == KvCacheDType::kFp8E4m3));
  EXPECT_TRUE(test::same_bits(ql, test::to_host(d_ql.device), /*nan_equal=*/false));
}

TEST(CudaConcatAndCacheMlaWithQRope, EveryCacheFormatAlignedAndUnaligned) {
  MLAKIT_SKIP_WITHOUT_GPU();
  uint64_t stream = 0;
  for (KvCacheDType kv : {KvCacheDType::kAuto, KvCacheDType::kFp8E4m3, KvCacheDType::kFp8DsMla}) {
    for (DType act : {DType::kF32, DType::kBF16, DType::kF16}) {
      if (kv == KvCacheDType::kFp8DsMla && act == DType::kF32) continue;  // 16-bit rope only
      for (const QRopeLayout layout : {QRopeLayout{7, 0}, QRopeLayout{30, 1}}) {
        test::CacheWriteCase c{.num_tokens = 30,
                               .extra_rows = 2,
                               .act = act,
                               .kv_dtype = kv,
                               .k_scale = 0.5f,
                               .sliced_inputs = true,
                               .input_pad = layout.pad,
                               .stream = stream++};
        run_case(c, layout);
      }
    }
  }
}

// The copy does not depend on the cache write: more decode rows than cache tokens (a grid sized
// by the copy), and no cache token at all.
TEST(CudaConcatAndCacheMlaWithQRope, CopyLargerThanTheCacheWrite) {
  MLAKIT_SKIP_WITHOUT_GPU();
  for (int64_t tokens : {3, 0}) {
    test::CacheWriteCase c{.num_tokens = tokens,
                           .latent = 96,
                           .rope = 40,
                           .act = DType::kBF16,
                           .stream = 100 + static_cast<uint64_t>(tokens)};
    run_case(c, {300, 0});
  }
}

}  // namespace
}  // namespace mlakit
