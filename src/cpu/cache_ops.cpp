// CPU kernels of the paged-cache ops. Each op runs in two passes: a serial pass that checks every
// index value it will use (O(tokens), a few loads per token) and throws on the first bad one, then
// a parallel pass over chunks of tokens that moves the entries with memcpy or with per-element
// loops the compiler vectorizes. Because the first pass finishes before the second starts, bad
// input never leaves a partly written output and nothing throws inside a parallel loop.
#include "cpu/cache_ops.hpp"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/check.hpp"
#include "cpu/parallel.hpp"
#include "mlakit/dtype.hpp"
#include "mlakit/kv_cache.hpp"

namespace mlakit::cpu {
namespace {

using detail::require;

constexpr const char* kConcatOp = "concat_and_cache_mla";
constexpr const char* kGatherOp = "gather_and_maybe_dequant_cache";
constexpr const char* kCpGatherOp = "cp_gather_cache";
constexpr const char* kGatherRowsOp = "gather_rows_and_maybe_dequant";

// Tokens per parallel work item: 16 entries (18 KiB of bf16 576-wide entries) amortise the
// scheduling cost while a batch of a few hundred tokens still spreads over every core.
constexpr int64_t kTokensPerChunk = 16;

// Calls fn(i) for every i in [begin, end), in chunks of kTokensPerChunk spread over the threads.
template <class Fn>
void for_each_token(int64_t begin, int64_t end, const Fn& fn) {
  const int64_t chunks = (end - begin + kTokensPerChunk - 1) / kTokensPerChunk;
  parallel_for(0, chunks, [&](int64_t chunk) {
    const int64_t first = begin + chunk * kTokensPerChunk;
    const int64_t last = std::min(end, first + kTokensPerChunk);
    for (int64_t i = first; i < last; ++i) fn(i);
  });
}

// ---- element types ----------------------------------------------------------------------------

struct F32Elem {
  using Storage = float;
  static float load(float v) { return v; }
  static float store(float x) { return x; }
};
struct Bf16Elem {
  using Storage = uint16_t;
  static float load(uint16_t v) { return bf16_bits_to_float(v); }
  static uint16_t store(float x) { return float_to_bf16_bits(x); }
};
struct F16Elem {
  using Storage = uint16_t;
  static float load(uint16_t v) { return f16_bits_to_float(v); }
  static uint16_t store(float x) { return float_to_f16_bits(x); }
};

// Calls fn(Elem{}) for a 16-bit activation dtype (f16 or bf16).
template <class Fn>
void dispatch_float16(DType dtype, const Fn& fn) {
  if (dtype == DType::kBF16) return fn(Bf16Elem{});
  if (dtype == DType::kF16) return fn(F16Elem{});
  detail::fail(ErrorCode::kInternal,
               detail::str_cat("cache ops: unexpected 16-bit dtype ", dtype_name(dtype)));
}

// Calls fn(Elem{}) for an activation dtype (f32, f16 or bf16).
template <class Fn>
void dispatch_float(DType dtype, const Fn& fn) {
  if (dtype == DType::kF32) return fn(F32Elem{});
  dispatch_float16(dtype, fn);
}

// ---- index tensors and cache addressing ---------------------------------------------------------

// Element i of a 1-D i32 or i64 view, honouring its stride.
int64_t index_at(const TensorView& v, int64_t i) {
  const int64_t offset = i * v.strides[0];
  if (v.dtype == DType::kI64) return static_cast<const int64_t*>(v.data)[offset];
  return static_cast<const int32_t*>(v.data)[offset];
}

// block_table[row, col] of an i32 [B, max_blocks] view, honouring its strides.
int64_t table_at(const TensorView& table, int64_t row, int64_t col) {
  return static_cast<const int32_t*>(table.data)[row * table.strides[0] + col * table.strides[1]];
}

// First byte of entry (block, offset) of a [num_blocks, block_size, W] cache.
char* entry_ptr(const TensorView& cache, int64_t block, int64_t offset) {
  return static_cast<char*>(cache.data) +
         (block * cache.strides[0] + offset * cache.strides[1]) * cache.element_size();
}

// First byte of row `row` of a [rows, W] view.
char* row_ptr(const TensorView& t, int64_t row) {
  return static_cast<char*>(t.data) + row * t.strides[0] * t.element_size();
}

// The request layout shared by both gathers: cu_seq_lens starts at >= 0 and never decreases;
// seq_starts (when given) are >= 0.
void check_requests(const char* op, const TensorView& cu_seq_lens,
                    const std::optional<TensorView>& seq_starts, int64_t batch) {
  require(index_at(cu_seq_lens, 0) >= 0, ErrorCode::kInvalidArgument, op,
          ": cu_seq_lens[0] must be >= 0, got ", index_at(cu_seq_lens, 0));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t begin = index_at(cu_seq_lens, b), end = index_at(cu_seq_lens, b + 1);
    require(end >= begin, ErrorCode::kInvalidArgument, op,
            ": cu_seq_lens must be non-decreasing, got cu_seq_lens[", b, "] = ", begin,
            " > cu_seq_lens[", b + 1, "] = ", end);
    if (seq_starts) {
      require(index_at(*seq_starts, b) >= 0, ErrorCode::kInvalidArgument, op, ": seq_starts[", b,
              "] must be >= 0, got ", index_at(*seq_starts, b));
    }
  }
}

int64_t seq_start(const std::optional<TensorView>& seq_starts, int64_t request) {
  return seq_starts ? index_at(*seq_starts, request) : 0;
}

// Throws unless block_table[request, position / block_size] exists and holds a block id of the
// cache. `what` and `index` name the token or dst row that needs the block, for the message.
void check_block(const char* op, const TensorView& table, int64_t num_blocks, int64_t block_size,
                 int64_t request, int64_t position, const char* what, int64_t index) {
  const int64_t column = position / block_size;
  require(column < table.shape[1], ErrorCode::kOutOfRange, op, ": ", what, " ", index,
          " of request ", request, " reads position ", position, " (block column ", column,
          " with block_size ", block_size, ") but block_table has only ", table.shape[1],
          " columns");
  const int64_t block = table_at(table, request, column);
  require(block >= 0 && block < num_blocks, ErrorCode::kOutOfRange, op, ": block_table[", request,
          ", ", column, "] = ", block, " (needed by ", what, " ", index, ", position ", position,
          ") is not a block id in [0, ", num_blocks, ")");
}

// ---- concat_and_cache_mla -----------------------------------------------------------------------

void check_slots(const TensorView& slot_mapping, int64_t num_blocks, int64_t block_size) {
  int64_t num_slots = 0;  // an element-less cache (entry width 0) may claim any sizes: saturate
  if (__builtin_mul_overflow(num_blocks, block_size, &num_slots)) {
    num_slots = std::numeric_limits<int64_t>::max();
  }
  for (int64_t t = 0; t < slot_mapping.shape[0]; ++t) {
    const int64_t slot = index_at(slot_mapping, t);
    require(slot < num_slots, ErrorCode::kOutOfRange, kConcatOp, ": token ", t, " has slot ", slot,
            " (slot_mapping[", t, "]) but kv_cache has ", num_slots, " slots (", num_blocks,
            " blocks of ", block_size, "); a negative slot skips the token");
  }
}

// Entry of token t, or nullptr when its slot is negative (skip).
char* slot_entry(const TensorView& kv_cache, const TensorView& slot_mapping, int64_t t) {
  const int64_t slot = index_at(slot_mapping, t);
  if (slot < 0) return nullptr;
  const int64_t block_size = kv_cache.shape[1];
  return entry_ptr(kv_cache, slot / block_size, slot % block_size);
}

// mlakit::float_to_e4m3_bits (round to nearest even, saturating at 448, NaN kept) written
// without branches so the encode loops vectorize; it returns the same code for every f32 input.
inline uint8_t encode_e4m3(float x) {
  const uint32_t u = float_bits(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t abs = u & 0x7fffffffu;
  // Normal e4m3 (>= 2^-6): drop 20 mantissa bits with RNE; (exponent, 3 mantissa bits) then sit
  // in bits 20 and up, and subtracting (127 - 7) << 3 rebiases the exponent.
  const uint32_t rounded = abs + 0x7ffffu + ((abs >> 20) & 1u);
  const uint32_t normal = (rounded >> 20) - (120u << 3);
  // Subnormal e4m3 (< 2^-6, unit 2^-9): 2^14 has an f32 ulp of 2^-9, so adding it rounds |x| to
  // whole units (RNE) and the sum's low bits count them.
  const uint32_t subnormal = float_bits(bits_float(abs) + 16384.0f) - float_bits(16384.0f);
  uint32_t code = abs < 0x3c800000u ? subnormal : normal;  // 0x3c800000 = 2^-6
  code = abs >= 0x43e00000u ? 0x7eu : code;                // 0x43e00000 = 448 -> code 0x7e
  code = abs > 0x7f800000u ? 0x7fu : code;                 // NaN -> 0x7f
  return static_cast<uint8_t>(code | sign);
}

// out[i] = e4m3(x[i] / k_scale), saturating, the quotient rounded to f32 first.
template <class E>
void quantize_e4m3(const typename E::Storage* x /*[n]*/, int64_t n, float k_scale,
                   uint8_t* out /*[n]*/) {
  for (int64_t i = 0; i < n; ++i) out[i] = encode_e4m3(E::load(x[i]) / k_scale);
}

// One 656-byte fp8_ds_mla entry from a 512-wide latent and a 64-wide rope row.
template <class E>
void write_ds_mla_entry(const uint16_t* kv_c_row /*[512]*/, const uint16_t* k_pe_row /*[64]*/,
                        uint8_t* entry /*[656]*/) {
  for (int64_t tile = 0; tile < kDsMlaNumTiles; ++tile) {
    const uint16_t* x = kv_c_row + tile * kDsMlaTileSize;
    float amax = 0.0f;
#pragma omp simd reduction(max : amax)
    for (int64_t i = 0; i < kDsMlaTileSize; ++i) {
      const float a = std::fabs(E::load(x[i]));
      amax = a > amax ? a : amax;
    }
    // FLT_MIN keeps an all-zero tile's scale positive, so x / scale stays 0 instead of NaN.
    const float tile_scale = std::max(amax / kFp8E4m3Max, FLT_MIN);
    std::memcpy(entry + kDsMlaScaleOffset + tile * sizeof(float), &tile_scale, sizeof(float));
    uint8_t* q = entry + tile * kDsMlaTileSize;
    for (int64_t i = 0; i < kDsMlaTileSize; ++i) q[i] = encode_e4m3(E::load(x[i]) / tile_scale);
  }
  std::memcpy(entry + kDsMlaRopeOffset, k_pe_row, kDsMlaRopeDim * sizeof(uint16_t));
}

}  // namespace

void concat_and_cache_mla(const TensorView& kv_c, const TensorView& k_pe,
                          const TensorView& kv_cache, const TensorView& slot_mapping,
                          KvCacheDType kv_dtype, float k_scale) {
  check_slots(slot_mapping, kv_cache.shape[0], kv_cache.shape[1]);
  const int64_t num_tokens = slot_mapping.shape[0];
  const int64_t latent = kv_c.shape[1], rope = k_pe.shape[1];
  const int64_t act_bytes = kv_c.element_size();

  switch (kv_dtype) {
    case KvCacheDType::kAuto:
      for_each_token(0, num_tokens, [&](int64_t t) {
        char* entry = slot_entry(kv_cache, slot_mapping, t);
        if (!entry) return;
        std::memcpy(entry, row_ptr(kv_c, t), latent * act_bytes);
        std::memcpy(entry + latent * act_bytes, row_ptr(k_pe, t), rope * act_bytes);
      });
      break;
    case KvCacheDType::kFp8E4m3:
      dispatch_float(kv_c.dtype, [&](auto elem) {
        using E = decltype(elem);
        using S = typename E::Storage;
        for_each_token(0, num_tokens, [&](int64_t t) {
          auto* entry = reinterpret_cast<uint8_t*>(slot_entry(kv_cache, slot_mapping, t));
          if (!entry) return;
          quantize_e4m3<E>(reinterpret_cast<const S*>(row_ptr(kv_c, t)), latent, k_scale, entry);
          quantize_e4m3<E>(reinterpret_cast<const S*>(row_ptr(k_pe, t)), rope, k_scale,
                           entry + latent);
        });
      });
      break;
    case KvCacheDType::kFp8DsMla:
      dispatch_float16(kv_c.dtype, [&](auto elem) {
        using E = decltype(elem);
        for_each_token(0, num_tokens, [&](int64_t t) {
          auto* entry = reinterpret_cast<uint8_t*>(slot_entry(kv_cache, slot_mapping, t));
          if (!entry) return;
          write_ds_mla_entry<E>(reinterpret_cast<const uint16_t*>(row_ptr(kv_c, t)),
                                reinterpret_cast<const uint16_t*>(row_ptr(k_pe, t)), entry);
        });
      });
      break;
  }
}

// ---- gather_and_maybe_dequant_cache -------------------------------------------------------------

namespace {

// Checks token t's request, row range, block column and block id (spec A.7 addressing).
void check_gather_token(const TensorView& src_cache, const TensorView& block_table,
                        const TensorView& cu_seq_lens, const TensorView& token_to_seq,
                        const std::optional<TensorView>& seq_starts, int64_t batch, int64_t t) {
  const int64_t b = index_at(token_to_seq, t);
  require(b >= 0 && b < batch, ErrorCode::kOutOfRange, kGatherOp, ": token_to_seq[", t, "] = ", b,
          " is not a request index in [0, ", batch, ")");
  const int64_t begin = index_at(cu_seq_lens, b), end = index_at(cu_seq_lens, b + 1);
  require(t >= begin && t < end, ErrorCode::kOutOfRange, kGatherOp, ": token ", t,
          " belongs to request ", b, " (token_to_seq[", t, "]) but request ", b, " owns rows [",
          begin, ", ", end, ") of cu_seq_lens");
  const int64_t position = t - begin + seq_start(seq_starts, b);
  check_block(kGatherOp, block_table, src_cache.shape[0], src_cache.shape[1], b, position, "token",
              t);
}

// Source entry of token t (indices already checked).
const char* gather_source(const TensorView& src_cache, const TensorView& block_table,
                          const TensorView& cu_seq_lens, const TensorView& token_to_seq,
                          const std::optional<TensorView>& seq_starts, int64_t t) {
  const int64_t b = index_at(token_to_seq, t);
  const int64_t position = t - index_at(cu_seq_lens, b) + seq_start(seq_starts, b);
  const int64_t block_size = src_cache.shape[1];
  return entry_ptr(src_cache, table_at(block_table, b, position / block_size),
                   position % block_size);
}

// dst[i] = D(S(src[i])): a cast between activation dtypes.
template <class S, class D>
void cast_row(const typename S::Storage* src /*[n]*/, int64_t n, typename D::Storage* dst /*[n]*/) {
  for (int64_t i = 0; i < n; ++i) dst[i] = D::store(S::load(src[i]));
}

// dst[i] = D(table[q[i]]) where table holds the 256 dequantized fp8 values.
template <class D>
void dequant_row(const uint8_t* q /*[n]*/, int64_t n, const std::array<float, 256>& table,
                 typename D::Storage* dst /*[n]*/) {
  for (int64_t i = 0; i < n; ++i) dst[i] = D::store(table[q[i]]);
}

// The 256 e4m3 codes decoded and multiplied by `scale` in f32.
std::array<float, 256> e4m3_table(float scale) {
  std::array<float, 256> table;
  for (int code = 0; code < 256; ++code)
    table[code] = e4m3_bits_to_float(static_cast<uint8_t>(code)) * scale;
  return table;
}

// NoPE: e4m3 * tile scale; rope: the 16-bit values copied bit for bit.
template <class D>
void dequant_ds_mla_entry(const uint8_t* entry /*[656]*/, const std::array<float, 256>& e4m3,
                          uint16_t* dst /*[576]*/) {
  for (int64_t tile = 0; tile < kDsMlaNumTiles; ++tile) {
    float tile_scale;
    std::memcpy(&tile_scale, entry + kDsMlaScaleOffset + tile * sizeof(float), sizeof(float));
    const uint8_t* q = entry + tile * kDsMlaTileSize;
    uint16_t* out = dst + tile * kDsMlaTileSize;
    for (int64_t i = 0; i < kDsMlaTileSize; ++i) out[i] = D::store(e4m3[q[i]] * tile_scale);
  }
  std::memcpy(dst + kDsMlaKvLoraRank, entry + kDsMlaRopeOffset, kDsMlaRopeDim * sizeof(uint16_t));
}

// dst row t = the entry at source(t) for t < num_tokens, dequantized to dst's dtype: a cast for
// kAuto (a copy when src_dtype is dst's), fp8 * scale for kFp8E4m3, tile scales for kFp8DsMla.
// Every source entry has been checked by the caller.
// dst: [>= num_tokens, W]  f32/f16/bf16, last dim contiguous
template <class Source>
void dequant_entries(DType src_dtype, const TensorView& dst, int64_t num_tokens,
                     KvCacheDType kv_dtype, float scale, const Source& source) {
  const int64_t width = dst.shape[1];
  switch (kv_dtype) {
    case KvCacheDType::kAuto:
      if (src_dtype == dst.dtype) {
        for_each_token(0, num_tokens, [&](int64_t t) {
          std::memcpy(row_ptr(dst, t), source(t), width * dst.element_size());
        });
        break;
      }
      dispatch_float(src_dtype, [&](auto src_elem) {
        using S = decltype(src_elem);
        dispatch_float(dst.dtype, [&](auto dst_elem) {
          using D = decltype(dst_elem);
          for_each_token(0, num_tokens, [&](int64_t t) {
            cast_row<S, D>(reinterpret_cast<const typename S::Storage*>(source(t)), width,
                           reinterpret_cast<typename D::Storage*>(row_ptr(dst, t)));
          });
        });
      });
      break;
    case KvCacheDType::kFp8E4m3: {
      const std::array<float, 256> table = e4m3_table(scale);
      dispatch_float(dst.dtype, [&](auto dst_elem) {
        using D = decltype(dst_elem);
        for_each_token(0, num_tokens, [&](int64_t t) {
          dequant_row<D>(reinterpret_cast<const uint8_t*>(source(t)), width, table,
                         reinterpret_cast<typename D::Storage*>(row_ptr(dst, t)));
        });
      });
      break;
    }
    case KvCacheDType::kFp8DsMla: {
      const std::array<float, 256> table = e4m3_table(1.0f);  // 1: the tile scales apply instead
      dispatch_float16(dst.dtype, [&](auto dst_elem) {
        using D = decltype(dst_elem);
        for_each_token(0, num_tokens, [&](int64_t t) {
          dequant_ds_mla_entry<D>(reinterpret_cast<const uint8_t*>(source(t)), table,
                                  reinterpret_cast<uint16_t*>(row_ptr(dst, t)));
        });
      });
      break;
    }
  }
}

}  // namespace

void gather_and_maybe_dequant_cache(const TensorView& src_cache, const TensorView& dst,
                                    const TensorView& block_table, const TensorView& cu_seq_lens,
                                    const TensorView& token_to_seq, int64_t num_tokens,
                                    KvCacheDType kv_dtype, float scale,
                                    const std::optional<TensorView>& seq_starts) {
  const int64_t batch = cu_seq_lens.shape[0] - 1;
  check_requests(kGatherOp, cu_seq_lens, seq_starts, batch);
  for (int64_t t = 0; t < num_tokens; ++t)
    check_gather_token(src_cache, block_table, cu_seq_lens, token_to_seq, seq_starts, batch, t);
  dequant_entries(src_cache.dtype, dst, num_tokens, kv_dtype, scale, [&](int64_t t) {
    return gather_source(src_cache, block_table, cu_seq_lens, token_to_seq, seq_starts, t);
  });
}

void gather_rows_and_maybe_dequant(const TensorView& src, const TensorView& dst,
                                   const TensorView& row_index, KvCacheDType kv_dtype,
                                   float scale) {
  const int64_t num_tokens = row_index.shape[0], rows = src.shape[0];
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t row = index_at(row_index, t);
    require(row >= 0 && row < rows, ErrorCode::kOutOfRange, kGatherRowsOp, ": row_index[", t,
            "] = ", row, " is not a row of src in [0, ", rows, ")");
  }
  dequant_entries(src.dtype, dst, num_tokens, kv_dtype, scale,
                  [&](int64_t t) -> const char* { return row_ptr(src, index_at(row_index, t)); });
}

// ---- cp_gather_cache ----------------------------------------------------------------------------

namespace {

// The request b < batch whose rows [cu[b], cu[b + 1]) hold `row`, for cu[0] <= row < cu[batch]
// (binary search over the non-decreasing cu_seq_lens; empty requests are never returned).
int64_t request_of_row(const TensorView& cu_seq_lens, int64_t batch, int64_t row) {
  int64_t lo = 0, hi = batch;  // invariant: cu[lo] <= row < cu[hi]
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (index_at(cu_seq_lens, mid) <= row) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

}  // namespace

void cp_gather_cache(const TensorView& src_cache, const TensorView& dst,
                     const TensorView& block_table, const TensorView& cu_seq_lens,
                     int64_t batch_size, const std::optional<TensorView>& seq_starts) {
  check_requests(kCpGatherOp, cu_seq_lens, seq_starts, batch_size);
  const int64_t first_row = index_at(cu_seq_lens, 0);
  const int64_t end_row = index_at(cu_seq_lens, batch_size);
  require(end_row <= dst.shape[0], ErrorCode::kOutOfRange, kCpGatherOp, ": cu_seq_lens[",
          batch_size, "] = ", end_row, " exceeds the ", dst.shape[0], " rows of dst");
  const int64_t num_blocks = src_cache.shape[0], block_size = src_cache.shape[1];
  for (int64_t b = 0; b < batch_size; ++b) {
    const int64_t row0 = index_at(cu_seq_lens, b);
    const int64_t len = index_at(cu_seq_lens, b + 1) - row0;
    const int64_t start = seq_start(seq_starts, b);
    // One check per block the request touches: p steps from one block boundary to the next.
    for (int64_t p = 0; p < len; p = ((start + p) / block_size + 1) * block_size - start) {
      check_block(kCpGatherOp, block_table, num_blocks, block_size, b, start + p, "dst row",
                  row0 + p);
    }
  }

  const int64_t entry_bytes = dst.shape[1] * dst.element_size();
  for_each_token(first_row, end_row, [&](int64_t row) {
    const int64_t b = request_of_row(cu_seq_lens, batch_size, row);
    const int64_t position = row - index_at(cu_seq_lens, b) + seq_start(seq_starts, b);
    const int64_t block = table_at(block_table, b, position / block_size);
    std::memcpy(row_ptr(dst, row), entry_ptr(src_cache, block, position % block_size), entry_bytes);
  });
}

}  // namespace mlakit::cpu
