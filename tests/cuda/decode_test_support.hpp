// Inputs, oracle and tolerances shared by the CUDA decode tests (decode_cuda_test.cpp on the GPU,
// decode_emulated_test.cpp on the CPU emulation of the kernel source).
//
// Tolerances. The kernel multiplies in its MMA element type E (bf16, or f16 for fp8_e4m3 caches
// with an f16 or fp8 q) with f32 accumulation, and rounds the softmax weights P to E before P V:
// |out error| <= u_E * max|v| (u_bf16 = 2^-9, u_f16 = 2^-11). Against a reference computed on the
// values E holds (q rounded to E; fp8_ds_mla NoPE values fp8 * scale rounded to E), out must be
// within that bound and the LSE within f32 rounding. Against the exact dequantized values (and
// the CPU op, which computes in f32 on them) the cosine distance must stay below spec D.7's bars
// (1e-5 16-bit caches, 1e-4 fp8 caches) wherever E holds the inputs exactly, and below 5e-4 where
// it rounds them (fp8_ds_mla, an f32 q).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/test_util.hpp"
#include "mlakit/dtype.hpp"
#include "mlakit/kv_cache.hpp"
#include "mlakit/ops.hpp"
#include "reference/reference.hpp"

namespace mlakit::decode_test {

inline constexpr float kDeepSeekScale = 0.1352338f;  // DeepSeek-V3's softmax scale (DESIGN.md §1)
inline constexpr int64_t kRank = 512, kRope = 64, kDim = kRank + kRope;

// e4m3fn by definition (sign, 4 exponent bits with bias 7, 3 mantissa bits; 0x7f NaN), written
// independently of the library's table.
inline double e4m3_value(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return std::nan("");
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (b & 0x80) ? -mag : mag;
}

inline bool is_fp8(DType d) { return d == DType::kFp8E4m3 || d == DType::kU8; }

struct Case {
  std::vector<int32_t> seq_lens;
  int64_t s_q = 1;
  int64_t heads = 16;
  int64_t block_size = 64;
  KvCacheDType kv_dtype = KvCacheDType::kAuto;
  DType cache_dtype = DType::kBF16;  // kAuto: element dtype; fp8_ds_mla: the rope dtype
  DType q_dtype = DType::kBF16;
  DType out_dtype = DType::kF32;
  float q_scale = 1.0f;
  float k_scale = 1.0f;
  int64_t q_pad = 0;    // extra elements per q row (a strided view)
  int64_t out_pad = 0;  // extra elements per out row and per lse row
  // extra elements per cache slot (a strided cache view; 16-byte multiples keep slots aligned)
  int64_t cache_pad = 0;

  int64_t batch() const { return static_cast<int64_t>(seq_lens.size()); }
  ops::DecodeParams params() const { return {kDeepSeekScale, kv_dtype, q_scale, k_scale, kRank}; }
  // The kernel's MMA element type, by the rule documented in cuda/decode/decode.hpp.
  DType mma_dtype() const {
    switch (kv_dtype) {
      case KvCacheDType::kAuto:
        return cache_dtype;
      case KvCacheDType::kFp8E4m3:
        return q_dtype == DType::kF16 || is_fp8(q_dtype) ? DType::kF16 : DType::kBF16;
      default:
        return cache_dtype;  // fp8_ds_mla: the rope dtype
    }
  }
  // fp8_ds_mla: the rope dtype the op reads the entries with (ops' ds_mla_rope_dtype): a 16-bit
  // q's dtype, else out's. The cache does not record it, so cache_dtype must be this one (an f16 q
  // over a bf16 rope would be read as an f16 rope, by every backend).
  DType ds_mla_rope_dtype() const { return is_float16(q_dtype) ? q_dtype : out_dtype; }
  // The CUDA decode reads this case's fp8_ds_mla tiles raw (kernel_ds_mla.cuh; launch.cu's
  // raw_ds_mla: 16 rows, a 16-bit q in 16-byte rows): the NoPE keys enter the math as the exact
  // e4m3 x scale (the scales multiply f32 sums), not rounded to E.
  bool raw_ds_mla() const {
    return kv_dtype == KvCacheDType::kFp8DsMla && s_q * heads <= 16 && is_float16(q_dtype) &&
           (kDim + q_pad) % 8 == 0;
  }
  // E holds q and the keys exactly (no rounding on the way into the MMAs): q already in E (or
  // fp8, converted to f16 exactly), and no per-block scale.
  bool exact_inputs() const {
    return kv_dtype != KvCacheDType::kFp8DsMla && (q_dtype == mma_dtype() || is_fp8(q_dtype));
  }
  std::string name() const {
    return testing::PrintToString(seq_lens) + " s_q " + std::to_string(s_q) + " N " +
           std::to_string(heads) + " bs " + std::to_string(block_size) + " q " +
           dtype_name(q_dtype) + " cache " + dtype_name(cache_dtype) + " fmt " +
           std::to_string(static_cast<int>(kv_dtype)) + " out " + dtype_name(out_dtype) +
           " scales " + std::to_string(q_scale) + "/" + std::to_string(k_scale) +
           (cache_pad > 0 ? " cache_pad " + std::to_string(cache_pad) : "");
  }
};

// Host inputs plus the values the math sees, exactly and as E holds them.
struct HostInputs {
  Tensor q_storage;      // [B, s_q, N, 576 + q_pad]
  TensorView q;          // [B, s_q, N, 576]
  Tensor cache_storage;  // [num_blocks, block_size, entry + cache_pad], NaN if never written
  TensorView cache;      // [num_blocks, block_size, entry]
  Tensor block_table;    // i32 [B, W]; unused columns -1
  Tensor seq_lens;       // i32 [B]
  std::vector<double> q_exact, q_kernel;      // [B, s_q, N, 576]
  std::vector<std::vector<double>> k_exact;   // per request [seq_len, 576]
  std::vector<std::vector<double>> k_kernel;  // same, as E holds it
};

// Writes one token's entry from x [576]; appends the exact and the E-held values.
inline void write_entry(const Case& c, uint8_t* entry, const std::vector<float>& x,
                        std::vector<double>& exact, std::vector<double>& kernel) {
  const DType e = c.mma_dtype();
  switch (c.kv_dtype) {
    case KvCacheDType::kAuto:
      for (int64_t i = 0; i < kDim; ++i) {
        store_float(entry, c.cache_dtype, i, x[i]);
        exact.push_back(load_float(entry, c.cache_dtype, i));
        kernel.push_back(exact.back());
      }
      break;
    case KvCacheDType::kFp8E4m3:
      for (int64_t i = 0; i < kDim; ++i) {
        entry[i] = float_to_e4m3_bits(x[i] / c.k_scale);
        exact.push_back(e4m3_value(entry[i]) * c.k_scale);
        kernel.push_back(exact.back());  // e4m3 is exact in E; k_scale applies in f32
      }
      break;
    case KvCacheDType::kFp8DsMla: {
      for (int64_t t = 0; t < kDsMlaNumTiles; ++t) {
        float amax = 0;
        for (int64_t i = 0; i < kDsMlaTileSize; ++i) {
          amax = std::max(amax, std::fabs(x[t * kDsMlaTileSize + i]));
        }
        const float tile_scale = std::max(amax / 448.0f, FLT_MIN);
        std::memcpy(entry + kDsMlaScaleOffset + 4 * t, &tile_scale, 4);
        for (int64_t i = 0; i < kDsMlaTileSize; ++i) {
          const int64_t k = t * kDsMlaTileSize + i;
          entry[k] = float_to_e4m3_bits(x[k] / tile_scale);
          exact.push_back(e4m3_value(entry[k]) * tile_scale);
          // The kernel: f32 product, rounded to E (raw tiles: the exact product).
          kernel.push_back(
              c.raw_ds_mla()
                  ? exact.back()
                  : round_to_dtype(static_cast<float>(e4m3_value(entry[k])) * tile_scale, e));
        }
      }
      uint8_t* rope = entry + kDsMlaRopeOffset;
      for (int64_t i = 0; i < kDsMlaRopeDim; ++i) {
        store_float(rope, c.cache_dtype, i, x[kDsMlaKvLoraRank + i]);
        exact.push_back(load_float(rope, c.cache_dtype, i));
        kernel.push_back(exact.back());
      }
      break;
    }
  }
}

// The four 16-row fp8 paths (docs/kernels/decode_sm90.md): raw fp8_ds_mla tiles (a 16-bit q; f16
// for odd page sizes, bf16 otherwise, the rope in q's dtype; bulk copies), raw e4m3 tiles under
// an fp8 q (both scales set) and under a 16-bit q (q's dtype as for fp8_ds_mla), and converted
// ones (an f32 q over fp8_e4m3), over pages of `block_size` slots with `cache_pad` extra elements
// (bytes: fp8 caches are u8) per slot.
inline std::vector<Case> fp8_page_shape_cases(std::vector<int32_t> seq_lens, int64_t block_size,
                                              int64_t cache_pad) {
  Case ds_mla;
  ds_mla.seq_lens = std::move(seq_lens);
  ds_mla.kv_dtype = KvCacheDType::kFp8DsMla;
  ds_mla.block_size = block_size;
  ds_mla.cache_pad = cache_pad;
  ds_mla.q_dtype = ds_mla.cache_dtype = block_size % 2 == 1 ? DType::kF16 : DType::kBF16;
  EXPECT_TRUE(ds_mla.raw_ds_mla());
  Case raw_e4m3 = ds_mla;
  raw_e4m3.kv_dtype = KvCacheDType::kFp8E4m3;
  raw_e4m3.q_dtype = DType::kFp8E4m3;
  raw_e4m3.cache_dtype = DType::kBF16;
  raw_e4m3.q_scale = 2.0f;
  raw_e4m3.k_scale = 0.5f;
  Case raw_e4m3_q16 = raw_e4m3;
  raw_e4m3_q16.q_dtype = ds_mla.q_dtype;
  Case converted = raw_e4m3;
  converted.q_dtype = DType::kF32;
  return {ds_mla, raw_e4m3, raw_e4m3_q16, converted};
}

// seq_lens count the s_q new tokens too, so a request has 0 or at least s_q keys: a drawn length
// in (0, s_q) becomes s_q.
inline int32_t valid_seq_len(int32_t len, int64_t s_q) {
  return len > 0 && len < s_q ? static_cast<int32_t>(s_q) : len;
}

// One request's own values, fixed while the batch around it changes (batch-invariance tests).
struct RequestValues {
  int32_t seq_len = 0;
  std::vector<float> q;     // [s_q, N, 576], before rounding to q's dtype
  std::vector<float> keys;  // [seq_len, 576], before quantization into the cache
};

inline RequestValues random_request(const Case& c, int32_t seq_len, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  RequestValues r;
  r.seq_len = seq_len;
  r.keys.resize(static_cast<size_t>(seq_len) * kDim);
  for (float& v : r.keys) v = normal(rng);
  r.q.resize(static_cast<size_t>(c.s_q * c.heads * kDim));
  for (float& v : r.q) v = normal(rng);
  return r;
}

// The inputs of a batch of `requests` (c.seq_lens must be their lengths): their blocks shuffled
// over a pool with spare blocks nothing is written to (rng draws the shuffle only). Without
// `oracle_values` the q_* and k_* vectors stay empty (large batches that no oracle checks).
inline HostInputs batch_inputs(const Case& c, const std::vector<RequestValues>& requests,
                               std::mt19937_64& rng, bool oracle_values = true) {
  HostInputs in;
  if (c.kv_dtype == KvCacheDType::kFp8DsMla && c.cache_dtype != c.ds_mla_rope_dtype()) {
    ADD_FAILURE() << "fp8_ds_mla case with a " << dtype_name(c.cache_dtype) << " rope, but q "
                  << dtype_name(c.q_dtype) << " and out " << dtype_name(c.out_dtype)
                  << " make the op read a " << dtype_name(c.ds_mla_rope_dtype()) << " rope";
  }
  const int64_t batch = c.batch(), bs = c.block_size;
  int64_t width = 1, used_blocks = 0;
  for (int32_t len : c.seq_lens) {
    width = std::max<int64_t>(width, (len + bs - 1) / bs + 1);  // +1: an unused column
    used_blocks += (len + bs - 1) / bs;
  }
  const int64_t num_blocks = used_blocks + 3;
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const DType storage = c.kv_dtype == KvCacheDType::kAuto ? c.cache_dtype : DType::kU8;
  const int64_t entry = c.kv_dtype == KvCacheDType::kFp8DsMla ? kDsMlaEntryBytes : kDim;
  in.cache_storage = test::nan_tensor({num_blocks, bs, entry + c.cache_pad}, storage);
  in.cache = in.cache_storage.view().narrow(2, 0, entry);
  std::vector<int64_t> table(batch * width, -1);
  in.k_exact.resize(batch);
  in.k_kernel.resize(batch);
  int64_t next = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = c.seq_lens[b];
    for (int64_t col = 0; col < (len + bs - 1) / bs; ++col) table[b * width + col] = ids[next++];
    for (int64_t s = 0; s < len; ++s) {
      const std::vector<float> x(requests[b].keys.begin() + s * kDim,
                                 requests[b].keys.begin() + (s + 1) * kDim);
      const int64_t slot = table[b * width + s / bs] * bs + s % bs;
      uint8_t* e =
          static_cast<uint8_t*>(in.cache.data) + slot * in.cache.strides[1] * dtype_size(storage);
      std::vector<double> exact, kernel;
      write_entry(c, e, x, oracle_values ? in.k_exact[b] : exact,
                  oracle_values ? in.k_kernel[b] : kernel);
    }
  }
  in.block_table = test::int_tensor(table, {batch, width}, DType::kI32);
  in.seq_lens = test::int_tensor(std::vector<int64_t>(c.seq_lens.begin(), c.seq_lens.end()),
                                 {batch}, DType::kI32);

  // Queries: fp8 q as scaled_fp8_quant writes it (x * (1 / q_scale)).
  const int64_t row_len = kDim + c.q_pad, rows = c.s_q * c.heads;
  in.q_storage = test::nan_tensor({batch, c.s_q, c.heads, row_len}, c.q_dtype);
  in.q = in.q_storage.view().narrow(3, 0, kDim);
  const DType e = c.mma_dtype();
  for (int64_t row = 0; row < batch * rows; ++row) {
    for (int64_t i = 0; i < kDim; ++i) {
      const int64_t at = row * row_len + i;
      const float x = requests[row / rows].q[(row % rows) * kDim + i];
      if (is_fp8(c.q_dtype)) {
        const uint8_t byte = float_to_e4m3_bits(x * (1.0f / c.q_scale));
        static_cast<uint8_t*>(in.q_storage.view().data)[at] = byte;
        if (!oracle_values) continue;
        in.q_exact.push_back(e4m3_value(byte) * c.q_scale);
        in.q_kernel.push_back(in.q_exact.back());  // e4m3 is exact in E; q_scale applies in f32
      } else {
        store_float(in.q_storage.view().data, c.q_dtype, at, x);
        if (!oracle_values) continue;
        in.q_exact.push_back(load_float(in.q_storage.view().data, c.q_dtype, at));
        in.q_kernel.push_back(round_to_dtype(static_cast<float>(in.q_exact.back()), e));
      }
    }
  }
  return in;
}

inline HostInputs make_inputs(const Case& c, std::mt19937_64& rng) {
  std::vector<RequestValues> requests;
  for (int32_t len : c.seq_lens) requests.push_back(random_request(c, len, rng));
  return batch_inputs(c, requests, rng);
}

struct Expected {
  std::vector<double> out;  // [B, s_q, N, 512]
  std::vector<double> lse;  // [B, s_q, N]
};

inline Expected reference(const Case& c, const std::vector<double>& q,
                          const std::vector<std::vector<double>>& keys) {
  Expected e;
  const int64_t rows = c.s_q * c.heads;
  for (int64_t b = 0; b < c.batch(); ++b) {
    const int64_t len = c.seq_lens[b];
    std::vector<double> v(len * kRank);
    for (int64_t s = 0; s < len; ++s) {
      std::copy_n(keys[b].begin() + s * kDim, kRank, v.begin() + s * kRank);
    }
    const std::span<const double> qb(q.data() + b * rows * kDim, rows * kDim);
    const ref::AttentionResult r = ref::attention(qb, keys[b], v, c.s_q, len, c.heads, 1, kDim,
                                                  kRank, kDeepSeekScale, /*causal=*/true);
    e.out.insert(e.out.end(), r.out.begin(), r.out.end());
    e.lse.insert(e.lse.end(), r.lse.begin(), r.lse.end());
  }
  return e;
}

// 1 - cos(a, b) over all elements, as spec D.7 measures it: 1 - 2 sum(ab) / (sum(a^2) + sum(b^2)).
inline double cos_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) ab += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
  return aa + bb == 0 ? 0.0 : 1.0 - 2.0 * ab / (aa + bb);
}

inline test::Tolerance out_tolerance(const Case& c) {
  const test::Tolerance mma =
      c.mma_dtype() == DType::kBF16 ? test::Tolerance{1e-2, 1.6e-2} : test::Tolerance{3e-3, 3e-3};
  const test::Tolerance stored = test::tolerance_for(c.out_dtype);
  return {std::max(mma.atol, stored.atol), std::max(mma.rtol, stored.rtol)};
}
inline constexpr test::Tolerance kLseTolerance{1e-4, 1e-4};  // f32 scores, SFU exp2 / log2

inline double cos_bar(const Case& c) {
  if (!c.exact_inputs()) return 5e-4;
  return c.kv_dtype == KvCacheDType::kAuto ? 1e-5 : 1e-4;
}

// ---- NaN cache values
// ----------------------------------------------------------------------------

// Writes an e4m3 NaN (0xff) over NoPE value `dim` (< 512) of key `key` of request b in the host
// cache of an fp8 case (both fp8 formats store NoPE value d at byte d of the entry).
inline void poison_fp8_value(const Case& c, HostInputs& in, int64_t b, int64_t key, int64_t dim) {
  const int64_t width = in.block_table.size(1), slot_bytes = in.cache.strides[1];
  const auto* table = static_cast<const int32_t*>(in.block_table.view().data);  // [B, width]
  const int64_t block = table[b * width + key / c.block_size];
  ASSERT_GE(block, 0) << "key " << key << " of request " << b << " has no block";
  uint8_t* cache = static_cast<uint8_t*>(in.cache.data);  // u8 storage: strides are bytes
  cache[(block * c.block_size + key % c.block_size) * slot_bytes + dim] = 0xff;
}

// Writes an f32 NaN (0xffffffff) over tile scale `tile` (< 4: NoPE values 128 tile .. + 127) of
// key `key` of request b in the host cache of an fp8_ds_mla case.
inline void poison_ds_mla_scale(const Case& c, HostInputs& in, int64_t b, int64_t key,
                                int64_t tile) {
  const int64_t width = in.block_table.size(1), slot_bytes = in.cache.strides[1];
  const auto* table = static_cast<const int32_t*>(in.block_table.view().data);  // [B, width]
  const int64_t block = table[b * width + key / c.block_size];
  ASSERT_GE(block, 0) << "key " << key << " of request " << b << " has no block";
  uint8_t* cache = static_cast<uint8_t*>(in.cache.data);  // [num_blocks, bs, 656] bytes
  std::memset(cache + (block * c.block_size + key % c.block_size) * slot_bytes + kDsMlaScaleOffset +
                  static_cast<int64_t>(sizeof(float)) * tile,
              0xff, sizeof(float));
}

// Every row of request `nan_request` is NaN (out and lse: all its queries see the poisoned key);
// the other requests match the oracle `ref`, computed before the poisoning.
inline void expect_nan_request_only(const Case& c, const TensorView& out, const TensorView& lse,
                                    const Expected& ref, int64_t nan_request) {
  const int64_t rows = c.s_q * c.heads;
  for (int64_t b = 0; b < c.batch(); ++b) {
    const TensorView out_b = out.narrow(0, b, 1), lse_b = lse.narrow(0, b, 1);
    if (b == nan_request) {
      for (double v : test::to_doubles(out_b)) ASSERT_TRUE(std::isnan(v)) << "out of request " << b;
      for (double v : test::to_doubles(lse_b)) ASSERT_TRUE(std::isnan(v)) << "lse of request " << b;
      continue;
    }
    const std::span<const double> want_out(ref.out.data() + b * rows * kRank, rows * kRank);
    const std::span<const double> want_lse(ref.lse.data() + b * rows, rows);
    EXPECT_TRUE(test::all_close(out_b, want_out, out_tolerance(c))) << "out of request " << b;
    EXPECT_TRUE(test::all_close(lse_b, want_lse, kLseTolerance)) << "lse of request " << b;
  }
}

// The NaN-cache cases: `base` over both fp8 formats x bf16 / f16 MMA elements (fp8_e4m3 follows
// q's dtype, fp8_ds_mla the rope dtype, which is q's) x `head_counts`, with an e4m3 NaN written
// over NoPE value `dim` of key `key` of request 1. `run_and_check(c, in, ref)` runs the kernel on
// the poisoned inputs; `ref` is the oracle of the clean ones.
template <class RunAndCheck>
void for_each_nan_cache_case(const Case& base, std::initializer_list<int64_t> head_counts,
                             int64_t key, int64_t dim, uint64_t stream, RunAndCheck run_and_check) {
  for (KvCacheDType format : {KvCacheDType::kFp8E4m3, KvCacheDType::kFp8DsMla}) {
    for (DType element : {DType::kBF16, DType::kF16}) {
      for (int64_t heads : head_counts) {
        Case c = base;
        c.kv_dtype = format;
        c.heads = heads;
        c.q_dtype = element;
        if (format == KvCacheDType::kFp8DsMla) c.cache_dtype = element;
        SCOPED_TRACE(c.name());
        auto rng = test::make_rng(stream++);
        HostInputs in = make_inputs(c, rng);
        const Expected ref = reference(c, in.q_kernel, in.k_kernel);
        poison_fp8_value(c, in, 1, key, dim);
        run_and_check(c, in, ref);
      }
    }
  }
}

}  // namespace mlakit::decode_test
