// Pieces of the sm90 decode kernels that do not depend on the MMA instructions
// (docs/kernels/decode_sm90.md): the work item of a CTA, causal visibility, the q tile, the paged
// copy of a key tile, and the placement of a finished output row. Used by kernel.cuh (mma.sync) and
// kernel_wgmma.cuh (wgmma); each configuration supplies its operand layout (operand_offset).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda/common/quad.cuh"
#include "cuda/decode/sm90/params.cuh"
#include "cuda/decode/sm90/ptx.cuh"
#include "cuda/decode/sm90/traits.cuh"
#include "cuda/decode/work_plan.hpp"

namespace mlakit::cuda::decode_sm90 {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// Keys query j (of s_q) may see: [0, visible_end) with bottom-right causal alignment.
__device__ __forceinline__ int visible_end(int seq_len, int s_q, int j) {
  return min(max(seq_len - s_q + j + 1, 0), seq_len);
}

// The segments of this CTA: blockIdx.x = part * row_tiles + row tile (the row tiles of one part
// run side by side, so the second read of each key tile hits L2); the part's segments are
// [segment_begin, segment_end) of the plan.
struct CtaWork {
  int row0;  // first query row of the CTA's row tile
  int segment_begin, segment_end;
};

template <class Cfg>
__device__ __forceinline__ CtaWork cta_work(const DecodeKernelParams& p) {
  const DivMod cta = fast_divmod(static_cast<int>(blockIdx.x), p.row_tiles_div);  // (part, tile)
  return {cta.remainder * Cfg::kBlockM, p.part_begin[cta.quotient], p.part_begin[cta.quotient + 1]};
}

// The keys one CTA works on in one segment and its place in the batch.
struct WorkItem {
  int batch_index, row0;
  int slot;       // partial slot of the segment; < 0: the request's only segment (out and lse)
  int key_begin;  // first key of the segment (a multiple of 64)
  int key_end;    // end of the segment (<= seq_len)
  int cta_end;    // min(key_end, keys the CTA's last row sees): keys past it are never loaded
  int num_tiles;
  int seq_len;
  bool bad_seq_len;
};

// True for a scale the float form accepts: finite and > 0 (NaN fails both comparisons).
__device__ __forceinline__ bool decode_scale_usable(float scale) {
  return scale > 0.0f && scale <= 3.402823466e38f;  // FLT_MAX: the largest finite f32
}

// A request's factors (DecodeKernelParams: the launch's, or from its scale tensors): scores are
// multiplied by score_log2, finished rows by value. A scale tensor value that is not finite and
// > 0 makes both NaN (bad), and so the request's rows. Not kept in WorkItem: a segment computes
// them when it needs them (registers are short in the tile loops; the M16 kernel spilled with
// them).
struct RequestScales {
  float score_log2;
  float value;
  bool bad;
};

// The factors of request `batch_index`: the launch's (host scales), or, with scale tensors,
// softmax scale * q_scale * k_scale (where they apply, in that order, as the host computes the
// launch's) * log2(e) and k_scale.
__device__ __forceinline__ RequestScales request_scales(const DecodeKernelParams& p,
                                                        int batch_index) {
  if (p.q_scales == nullptr && p.k_scales == nullptr) {
    return {p.score_scale_log2, p.value_scale, false};
  }
  const float q = p.q_scales != nullptr ? p.q_scales[batch_index * p.q_scales_stride] : p.q_scale;
  const float k = p.k_scales != nullptr ? p.k_scales[batch_index * p.k_scales_stride] : p.k_scale;
  if (!decode_scale_usable(q) || !decode_scale_usable(k)) return {NAN, NAN, true};
  const float score_scale =
      p.softmax_scale * (p.q_scale_applies ? q : 1.0f) * (p.k_scale_applies ? k : 1.0f);
  return {score_scale * kLog2e, p.k_scale_applies ? k : 1.0f, false};
}

// The factor of a segment's scores (log2 units), read before its tile loop. Over a native cache
// neither q_scale (an fp8 q needs an fp8 cache) nor k_scale (fp8_e4m3 only) applies, so the factor
// is the launch's, an operand from the constant bank that holds no register; a bad scale tensor
// value still makes the rows NaN, through the epilogue's request_scales.
template <class Cfg>
__device__ __forceinline__ float score_factor(const DecodeKernelParams& p, const WorkItem& w) {
  if constexpr (Cfg::kFormat == CacheFormat::kNative) {
    return p.score_scale_log2;
  } else {
    return request_scales(p, w.batch_index).score_log2;
  }
}

// The epilogue's factors of the segment's request; one thread records a bad value in the error
// word.
__device__ __forceinline__ RequestScales epilogue_scales(const DecodeKernelParams& p,
                                                         const WorkItem& w) {
  const RequestScales scales = request_scales(p, w.batch_index);
  if (scales.bad && threadIdx.x == 0) report_device_error(p.error_word, kDecodeBadScale);
  return scales;
}

// Segment `segment` of the plan for the CTA's row tile starting at row0.
template <class Cfg>
__device__ __forceinline__ WorkItem make_work_item(const DecodeKernelParams& p, int row0,
                                                   int segment) {
  // One 16-byte load of the record {request, key_begin, key_end, slot} (work_plan.hpp).
  const int4 record = *reinterpret_cast<const int4*>(p.segments + segment);
  WorkItem w;
  w.batch_index = record.x;
  w.row0 = row0;
  w.slot = record.w;
  const int raw_len = p.seq_lens[w.batch_index * p.seq_lens_stride];
  // seq_lens count the s_q new tokens too: 0 < seq_len < s_q is inconsistent metadata.
  w.bad_seq_len = !seq_len_is_valid(raw_len, p.max_seq_len) || (raw_len > 0 && raw_len < p.s_q);
  w.seq_len = w.bad_seq_len ? 0 : raw_len;
  w.key_begin = min(record.y, w.seq_len);
  w.key_end = min(record.z, w.seq_len);
  const int last_row = min(w.row0 + Cfg::kBlockM, p.rows) - 1;
  w.cta_end =
      min(w.key_end, visible_end(w.seq_len, p.s_q, fast_divmod(last_row, p.heads_div).quotient));
  w.num_tiles = w.cta_end > w.key_begin ? (w.cta_end - w.key_begin + kBlockN - 1) / kBlockN : 0;
  return w;
}

// ---- fp8 -> 16-bit conversion ------------------------------------------------------------------

// Eight e4m3 values (bytes of two words, lowest first) -> eight MMA elements (lowest in the low
// half of .x), each multiplied by `scale` unless kUnscaled (then exact: e4m3 is exact in f16 and
// bf16). The conversion pipe keeps NaN as NaN. fp8_ds_mla tiles of both kernels (kernel.cuh's
// convert_tile, kernel_wgmma.cuh's convert_segment) go through it: the same bits in E.
template <class Elem, bool kUnscaled>
__device__ __forceinline__ uint4 convert_e4m3x8(uint32_t lo, uint32_t hi, float scale) {
  const uint32_t words[2] = {lo, hi};
  uint32_t out[4];
#pragma unroll
  for (int pair = 0; pair < 4; ++pair) {
    const uint32_t word = words[pair / 2];
    const bool high = pair % 2 == 1;
    if constexpr (kUnscaled) {
      out[pair] = Elem::from_e4m3x2(word, high);
    } else {
      const float2 f = f16x2_to_float2(e4m3x2_to_f16x2(word, high));
      out[pair] = Elem::pack(f.x * scale, f.y * scale);
    }
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// ---- q
// -------------------------------------------------------------------------------------------

// Eight 16-bit q values (`bits`, lowest first) of dtype `dtype` (kBF16 or kF16) in the MMA element
// type: as stored when the types agree, else through f32, rounded to the element type.
template <class Elem>
__device__ __forceinline__ uint4 q16x8_as(uint4 bits, RuntimeDType dtype) {
  constexpr RuntimeDType kElemDType =
      std::is_same_v<Elem, Bf16Mma> ? RuntimeDType::kBF16 : RuntimeDType::kF16;
  if (dtype == kElemDType) return bits;
  uint32_t w[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const auto lo = static_cast<uint16_t>(w[i]), hi = static_cast<uint16_t>(w[i] >> 16);
    w[i] = dtype == RuntimeDType::kBF16
               ? Elem::pack(__bfloat162float(__ushort_as_bfloat16(lo)),
                            __bfloat162float(__ushort_as_bfloat16(hi)))
               : Elem::pack(__half2float(__ushort_as_half(lo)), __half2float(__ushort_as_half(hi)));
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Eight consecutive q values starting at element `offset`, converted to the MMA element type: the
// path for f32 and unaligned q (load_q_tile_slow).
template <class Elem>
__device__ __forceinline__ uint4 load_q8(const DecodeKernelParams& p, int64_t offset) {
  switch (p.q_dtype) {
    case RuntimeDType::kBF16:
    case RuntimeDType::kF16: {
      const uint16_t* src = static_cast<const uint16_t*>(p.q) + offset;
      uint16_t h[8];
      for (int i = 0; i < 8; ++i) h[i] = src[i];
      uint4 bits;
      memcpy(&bits, h, sizeof(bits));
      return q16x8_as<Elem>(bits, p.q_dtype);
    }
    case RuntimeDType::kF32: {
      const float* src = static_cast<const float*>(p.q) + offset;
      return make_uint4(Elem::pack(src[0], src[1]), Elem::pack(src[2], src[3]),
                        Elem::pack(src[4], src[5]), Elem::pack(src[6], src[7]));
    }
    default: {  // kFp8E4m3
      const uint8_t* src = static_cast<const uint8_t*>(p.q) + offset;
      uint32_t w[4];
      for (int i = 0; i < 4; ++i) {
        w[i] = Elem::from_e4m3x2(src[2 * i] | (src[2 * i + 1] << 8), false);
      }
      return make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

// A q tile, rows [row0, row0 + kBlockM) of request b, is kUnits units: a 16-byte unit of the
// operand layout (8 elements in the MMA element type), or, over raw e4m3 tiles, 16 e4m3 values
// that become two such units (16 dims in raw_e4m3_dim_order). Thread t handles units t + i *
// kThreads.
template <class Cfg>
struct QTile {
  // units per row: an fp8 q over raw e4m3 tiles fetches 16 e4m3 values per unit
  static constexpr bool kFp8Units = Cfg::kRawE4m3 && !Cfg::kRawQ16;
  static constexpr int kChunks = kFp8Units ? kDimQK / 16 : kRowChunks;
  static constexpr int kUnits = Cfg::kBlockM * kChunks;
  static constexpr int kPerThread = (kUnits + kThreads - 1) / kThreads;  // 5 / 18 (raw: 3 / 9)
  // Units fetched before any is stored: 6 x 16 bytes = 24 registers in flight per thread, so 16
  // rows take one round trip and 64 rows three.
  static constexpr int kBatch = kPerThread < 6 ? kPerThread : 6;
};

// Sixteen e4m3 q values (dims 16 m .. 16 m + 15, lowest first) as the two f16 units of their
// 16-dim group in the order the raw e4m3 scores use (kernel_e4m3.cuh): lane t's K fragment holds
// dims 4 t .. 4 t + 3 of a 16-byte chunk, so the q unit `lo` holds dims 0 1 4 5 8 9 12 13 and `hi`
// dims 2 3 6 7 10 11 14 15 (MMA k slots 2 t, 2 t + 1 and 2 t + 8, 2 t + 9). e4m3 -> f16 is exact.
__device__ __forceinline__ void raw_e4m3_dim_order(uint4 raw, uint4& lo, uint4& hi) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t l[4], h[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    l[i] = e4m3x2_to_f16x2(w[i], false);
    h[i] = e4m3x2_to_f16x2(w[i], true);
  }
  lo = make_uint4(l[0], l[1], l[2], l[3]);
  hi = make_uint4(h[0], h[1], h[2], h[3]);
}

// Whether q's units can be fetched raw (fetch_q_batch): 16-bit or fp8 rows on 16-byte boundaries.
// Otherwise (f32, unaligned) load_q_tile_slow converts unit by unit.
__device__ __forceinline__ bool q_fetchable(const DecodeKernelParams& p) {
  return p.q_rows_16b_aligned && p.q_dtype != RuntimeDType::kF32;
}

// Issues the loads of this thread's units [first, first + kBatch) of the q tile (q_fetchable):
// raw bytes, 16 per unit (8 for fp8 converted later, in .x and .y), zero past `rows`. Nothing waits
// for them here: a load-then-store loop through generic pointers would wait out one global-memory
// round trip per unit (the compiler cannot move a load above a store that may alias it).
template <class Cfg>
__device__ __forceinline__ void fetch_q_batch(const DecodeKernelParams& p, const WorkItem& w,
                                              int first, uint4 (&raw)[QTile<Cfg>::kBatch]) {
  using Q = QTile<Cfg>;
#pragma unroll
  for (int i = 0; i < Q::kBatch; ++i) {
    const int u = static_cast<int>(threadIdx.x) + (first + i) * kThreads;
    const int row = w.row0 + u / Q::kChunks;
    raw[i] = make_uint4(0, 0, 0, 0);
    if (first + i < Q::kPerThread && u < Q::kUnits && row < p.rows) {
      const DivMod jn = fast_divmod(row, p.heads_div);  // (query, head)
      const int64_t offset = w.batch_index * p.q_stride_batch + jn.quotient * p.q_stride_query +
                             jn.remainder * p.q_stride_head +
                             (u % Q::kChunks) * (Q::kFp8Units ? 16 : 8);
      if constexpr (Q::kFp8Units) {
        raw[i] = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(p.q) + offset));
      } else if (p.q_dtype == RuntimeDType::kFp8E4m3) {
        const uint2 v =
            __ldg(reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(p.q) + offset));
        raw[i] = make_uint4(v.x, v.y, 0, 0);
      } else {
        raw[i] = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.q) + offset));
      }
    }
  }
}

// Converts the units fetch_q_batch fetched to the MMA element type and stores them into `dst`
// ([kBlockM][576] in the configuration's operand layout).
template <class Cfg>
__device__ __forceinline__ void store_q_batch(const DecodeKernelParams& p, int first,
                                              const uint4 (&raw)[QTile<Cfg>::kBatch],
                                              uint8_t* dst) {
  using Q = QTile<Cfg>;
  using Elem = typename Cfg::Element;
#pragma unroll
  for (int i = 0; i < Q::kBatch; ++i) {
    const int u = static_cast<int>(threadIdx.x) + (first + i) * kThreads;
    if (first + i >= Q::kPerThread || u >= Q::kUnits) continue;
    if constexpr (Cfg::kRawQ16) {  // as fetched: prepare_raw_q converts in place
      *reinterpret_cast<uint4*>(dst + Cfg::operand_offset(u / Q::kChunks, u % Q::kChunks)) = raw[i];
      continue;
    }
    if constexpr (Cfg::kRawE4m3) {
      const int row = u / Q::kChunks, group = u % Q::kChunks;
      uint4 lo, hi;
      raw_e4m3_dim_order(raw[i], lo, hi);
      *reinterpret_cast<uint4*>(dst + Cfg::operand_offset(row, 2 * group)) = lo;
      *reinterpret_cast<uint4*>(dst + Cfg::operand_offset(row, 2 * group + 1)) = hi;
      continue;
    }
    uint4 value;
    if (p.q_dtype == RuntimeDType::kFp8E4m3) {
      value = make_uint4(Elem::from_e4m3x2(raw[i].x, false), Elem::from_e4m3x2(raw[i].x, true),
                         Elem::from_e4m3x2(raw[i].y, false), Elem::from_e4m3x2(raw[i].y, true));
    } else {
      value = q16x8_as<Elem>(raw[i], p.q_dtype);
    }
    *reinterpret_cast<uint4*>(dst + Cfg::operand_offset(u / Q::kChunks, u % Q::kChunks)) = value;
  }
}

// The q tile of f32 or unaligned q, unit by unit (a compact loop: these dtypes are rare, and
// unrolled code executed once per segment costs instruction fetches). Not for raw e4m3 tiles,
// which the launcher chooses only for fetchable q.
template <class Cfg>
__device__ __forceinline__ void load_q_tile_slow(const DecodeKernelParams& p, const WorkItem& w,
                                                 uint8_t* dst) {
  static_assert(!Cfg::kRawE4m3, "raw e4m3 tiles take q_fetchable q only");
#pragma unroll 1
  for (int u = threadIdx.x; u < QTile<Cfg>::kUnits; u += kThreads) {
    const int r = u / kRowChunks, c = u % kRowChunks;
    const int row = w.row0 + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row < p.rows) {
      const DivMod jn = fast_divmod(row, p.heads_div);  // (query, head)
      v = load_q8<typename Cfg::Element>(p, w.batch_index * p.q_stride_batch +
                                                jn.quotient * p.q_stride_query +
                                                jn.remainder * p.q_stride_head + c * 8);
    }
    *reinterpret_cast<uint4*>(dst + Cfg::operand_offset(r, c)) = v;
  }
}

// The q tile into `dst` ([kBlockM][576], operand layout), zero past `rows`: kBatch units per
// thread in flight at a time (docs/perf-notes.md, "the fixed cost of a segment").
template <class Cfg>
__device__ __forceinline__ void load_q_tile(const DecodeKernelParams& p, const WorkItem& w,
                                            uint8_t* dst) {
  using Q = QTile<Cfg>;
  if constexpr (!Cfg::kRawE4m3) {
    if (!q_fetchable(p)) {
      load_q_tile_slow<Cfg>(p, w, dst);
      return;
    }
  }
#pragma unroll 1
  for (int first = 0; first < Q::kPerThread; first += Q::kBatch) {
    uint4 raw[Q::kBatch];
    fetch_q_batch<Cfg>(p, w, first, raw);
    store_q_batch<Cfg>(p, first, raw, dst);
  }
}

// ---- output stores
// -------------------------------------------------------------------------------

// Runs fn(store) with store(base, offset, x, y) writing the pair (x, y) at element `offset` of
// `base` in `dtype`, so that an unrolled loop over a row's pairs has no per-pair dtype switch (a
// row's epilogue runs once per segment, and its executed instructions cost fetches).
template <class Fn>
__device__ __forceinline__ void with_pair_store(RuntimeDType dtype, Fn&& fn) {
  switch (dtype) {
    case RuntimeDType::kF32:
      fn([](void* base, int64_t offset, float x, float y) {
        *reinterpret_cast<float2*>(static_cast<float*>(base) + offset) = make_float2(x, y);
      });
      break;
    case RuntimeDType::kBF16:
      fn([](void* base, int64_t offset, float x, float y) {
        *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(base) + offset) =
            __floats2bfloat162_rn(x, y);
      });
      break;
    default:
      fn([](void* base, int64_t offset, float x, float y) {
        *reinterpret_cast<__half2*>(static_cast<__half*>(base) + offset) = __floats2half2_rn(x, y);
      });
      break;
  }
}

// ---- copy of one key tile ----------------------------------------------------------------------

template <class Cfg>
__device__ __forceinline__ int key_of_pass(int pass) {
  return static_cast<int>(threadIdx.x) / Cfg::kThreadsPerKey + pass * Cfg::kKeysPerPass;
}

// Page ids of this thread's keys of tile `tile` (-1 past cta_end: the table is not read there).
template <class Cfg>
__device__ __forceinline__ void lookup_pages(const DecodeKernelParams& p, const WorkItem& w,
                                             int tile, int (&pages)[Cfg::kLoadPasses]) {
#pragma unroll
  for (int pass = 0; pass < Cfg::kLoadPasses; ++pass) {
    const int pos = w.key_begin + tile * kBlockN + key_of_pass<Cfg>(pass);
    pages[pass] =
        pos < w.cta_end
            ? p.block_table[w.batch_index * p.block_table_stride_batch +
                            fast_divmod(pos, p.block_size_div).quotient * p.block_table_stride_col]
            : -1;
  }
}

// This thread's key of copy pass `pass` of tile `tile` on page `page`: its position in the request
// and whether it is copied (inside the segment, on a page of the cache; a page outside it sets
// `bad`, and the key is zero-filled instead).
struct TileKey {
  int key, pos;
  bool valid;
};
template <class Cfg>
__device__ __forceinline__ TileKey tile_key(const DecodeKernelParams& p, const WorkItem& w,
                                            int tile, int pass, int page, bool& bad) {
  const int key = key_of_pass<Cfg>(pass);
  const int pos = w.key_begin + tile * kBlockN + key;
  bool valid = pos < w.cta_end;
  if (valid && (page < 0 || page >= p.num_blocks)) {
    bad = true;
    valid = false;
  }
  return {key, pos, valid};
}

// Issues (does not wait for) the copies of tile `tile` into `stage` (tile_key: which keys).
template <class Cfg>
__device__ __forceinline__ void copy_tile_by_chunks(const DecodeKernelParams& p, const WorkItem& w,
                                                    int tile, const int (&pages)[Cfg::kLoadPasses],
                                                    uint8_t* stage, bool& bad) {
  const uint32_t base = smem_addr(stage);
  const int lane_chunk = static_cast<int>(threadIdx.x) % Cfg::kThreadsPerKey;
#pragma unroll
  for (int pass = 0; pass < Cfg::kLoadPasses; ++pass) {
    const TileKey k = tile_key<Cfg>(p, w, tile, pass, pages[pass], bad);
    const int key = k.key;
    const bool valid = k.valid;
    const uint8_t* src =
        valid ? p.cache + pages[pass] * p.cache_stride_block_bytes +
                    fast_divmod(k.pos, p.block_size_div).remainder * p.cache_stride_slot_bytes
              : p.cache;
#pragma unroll
    for (int step = 0; step < Cfg::kChunkSteps; ++step) {
      const int c = lane_chunk + step * Cfg::kThreadsPerKey;
      if (Cfg::kRawChunks % Cfg::kThreadsPerKey == 0 || c < Cfg::kRawChunks) {
        cp_async_16(base + Cfg::raw_offset(key, c), valid ? src + c * 16 : src, valid);
      }
    }
  }
}

// The same with bulk copies (Cfg::kBulkCopies: the stage's rows are the entries as stored). The
// first thread of a key that starts a run copies the run in one bulk copy onto the stage's
// mbarrier `mbar`: a run is the tile's consecutive keys on one page (one key when the cache's slots
// are not contiguous). Each warp then arrives once with its copies' bytes (the mbarrier counts
// kWarps arrivals). Keys past cta_end or on a bad page are zeroed by their own threads (values and
// scales must be finite: P x V and the tile's value-scale bound read them), with a proxy fence
// because later bulk copies write the same bytes.
template <class Cfg>
__device__ __forceinline__ void copy_tile_in_bulk(const DecodeKernelParams& p, const WorkItem& w,
                                                  int tile, const int (&pages)[Cfg::kLoadPasses],
                                                  uint8_t* stage, uint32_t mbar, bool& bad) {
  const int lane_chunk = static_cast<int>(threadIdx.x) % Cfg::kThreadsPerKey;
  const bool contiguous = p.cache_stride_slot_bytes == Cfg::kRawEntry;
  uint32_t bytes = 0;  // this thread's bulk copies
  bool zeroed = false;
#pragma unroll
  for (int pass = 0; pass < Cfg::kLoadPasses; ++pass) {
    const TileKey k = tile_key<Cfg>(p, w, tile, pass, pages[pass], bad);
    const int key = k.key, pos = k.pos, page = pages[pass];
    if (k.valid) {
      const int slot = fast_divmod(pos, p.block_size_div).remainder;
      if (lane_chunk == 0 && (key == 0 || slot == 0 || !contiguous)) {
        const int run =
            contiguous ? min(min(p.block_size - slot, kBlockN - key), w.cta_end - pos) : 1;
        const uint32_t run_bytes = static_cast<uint32_t>(run * Cfg::kRawEntry);
        bulk_load(smem_addr(stage) + Cfg::raw_offset(key, 0),
                  p.cache + page * p.cache_stride_block_bytes + slot * p.cache_stride_slot_bytes,
                  run_bytes, mbar);
        bytes += run_bytes;
      }
    } else {
#pragma unroll
      for (int step = 0; step < Cfg::kChunkSteps; ++step) {
        const int c = lane_chunk + step * Cfg::kThreadsPerKey;
        if (Cfg::kRawChunks % Cfg::kThreadsPerKey == 0 || c < Cfg::kRawChunks) {
          *reinterpret_cast<uint4*>(stage + Cfg::raw_offset(key, c)) = make_uint4(0, 0, 0, 0);
        }
      }
      zeroed = true;
    }
  }
  if (zeroed) fence_stores_before_bulk_copies();
  const uint32_t warp_bytes = __reduce_add_sync(0xffffffffu, bytes);
  if ((threadIdx.x & 31) == 0) mbarrier_arrive_expect_tx(mbar, warp_bytes);
}

template <class Cfg>
__device__ __forceinline__ void copy_tile(const DecodeKernelParams& p, const WorkItem& w, int tile,
                                          const int (&pages)[Cfg::kLoadPasses], uint8_t* smem,
                                          bool& bad) {
  uint8_t* stage = smem + Cfg::raw_stage_offset(tile);
  if constexpr (Cfg::kBulkCopies) {
    copy_tile_in_bulk<Cfg>(p, w, tile, pages, stage,
                           smem_addr(smem + Cfg::stage_barrier_offset(tile)), bad);
  } else {
    copy_tile_by_chunks<Cfg>(p, w, tile, pages, stage, bad);
  }
}

// Closes this thread's copies of one tile (a cp.async group; bulk copies need none).
template <class Cfg>
__device__ __forceinline__ void commit_tile_copies() {
  if constexpr (!Cfg::kBulkCopies) cp_async_commit();
}

// Waits until every copy of tile t (the oldest of kTilesAhead tiles in flight) has landed, for
// this thread (cp.async) or for the whole CTA (bulk copies: the stage's mbarrier phase, whose
// parity `ring_phases` tracks per stage, as each use of a stage is waited for once, in order).
template <class Cfg>
__device__ __forceinline__ void wait_tile_copies(uint8_t* smem, int t, uint32_t& ring_phases) {
  if constexpr (Cfg::kBulkCopies) {
    const int stage = t % Cfg::kStages;
    mbarrier_wait(smem_addr(smem + Cfg::stage_barrier_offset(t)), (ring_phases >> stage) & 1u);
    ring_phases ^= 1u << stage;
  } else {
    cp_async_wait<Cfg::kTilesAhead - 1>();
  }
}

// Issues the copies of tiles [0, kTilesAhead) (one commit group each, empty past num_tiles) and
// looks up the page ids of tile kTilesAhead. The page ids of all those tiles are looked up first,
// so their block-table reads share one round trip.
template <class Cfg>
__device__ __forceinline__ void start_copies(const DecodeKernelParams& p, const WorkItem& w,
                                             uint8_t* smem, int (&next_pages)[Cfg::kLoadPasses],
                                             bool& bad) {
  int pages[Cfg::kTilesAhead + 1][Cfg::kLoadPasses];  // -1 past cta_end (no read)
#pragma unroll
  for (int t = 0; t <= Cfg::kTilesAhead; ++t) lookup_pages<Cfg>(p, w, t, pages[t]);
#pragma unroll
  for (int t = 0; t < Cfg::kTilesAhead; ++t) {
    if (t < w.num_tiles) copy_tile<Cfg>(p, w, t, pages[t], smem, bad);
    commit_tile_copies<Cfg>();
  }
#pragma unroll
  for (int pass = 0; pass < Cfg::kLoadPasses; ++pass)
    next_pages[pass] = pages[Cfg::kTilesAhead][pass];
}

// In iteration t, once the stage of tile t + kTilesAhead is free: copies that tile (one commit
// group, empty past num_tiles) and looks up the page ids of the tile after it.
template <class Cfg>
__device__ __forceinline__ void continue_copies(const DecodeKernelParams& p, const WorkItem& w,
                                                int t, uint8_t* smem,
                                                int (&next_pages)[Cfg::kLoadPasses], bool& bad) {
  const int ahead = t + Cfg::kTilesAhead;
  if (ahead < w.num_tiles) copy_tile<Cfg>(p, w, ahead, next_pages, smem, bad);
  commit_tile_copies<Cfg>();
  if (ahead + 1 < w.num_tiles) lookup_pages<Cfg>(p, w, ahead + 1, next_pages);
}

// ---- P fragments -------------------------------------------------------------------------------

// The A fragments of P's k16 step `ks` (keys 16 ks .. 16 ks + 15) for each m16 row tile, from the
// [kBlockM][64] 16-bit P tile at p_base (swizzled<kPRowBytes>).
template <class Cfg>
__device__ __forceinline__ void load_p_fragments(uint32_t p_base, int ks,
                                                 uint32_t (&a)[Cfg::kRowTiles][4]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int mt = 0; mt < Cfg::kRowTiles; ++mt) {
    ldmatrix_x4(a[mt], p_base + swizzled<kPRowBytes>(mt * 16 + (lane & 15), 2 * ks + (lane >> 4)));
  }
}

// ---- online softmax
// ------------------------------------------------------------------------------

// Folds one tile into the running state of row `row`: the tile max is the max of the kParts
// partial maxima parts[k * kRows + row] (log2 units, -inf for no visible key). Updates m_run and
// rescales l_run; returns alpha = 2^(m_old - m_new), the factor for O, and sets m_use to the
// reference the tile's probabilities subtract (0 while the row has seen no key: 2^-inf = 0).
template <int kParts, int kRows>
__device__ __forceinline__ float fold_tile_max(const float* parts, int row, float& m_run,
                                               float& l_run, float& m_use) {
  float m_tile = -INFINITY;
#pragma unroll
  for (int k = 0; k < kParts; ++k) m_tile = fmaxf(m_tile, parts[k * kRows + row]);
  const float m_new = fmaxf(m_run, m_tile);
  m_use = m_new == -INFINITY ? 0.0f : m_new;
  const float alpha = fast_exp2(m_run - m_use);
  m_run = m_new;
  l_run *= alpha;
  return alpha;
}

// ---- output rows
// ----------------------------------------------------------------------------------

// `any`: whether any thread of the CTA met a bad seq_len or block id (the or of a CTA barrier);
// one thread then records it in the device error word. Returns `any`.
__device__ __forceinline__ bool report_bad_index(const DecodeKernelParams& p, bool any) {
  if (any && threadIdx.x == 0) report_device_error(p.error_word, kDecodeBadIndex);
  return any;
}

// True for every thread of the CTA when any of them met a bad seq_len or block id (a barrier).
__device__ __forceinline__ bool cta_saw_bad_index(const DecodeKernelParams& p, bool bad) {
  return report_bad_index(p, __syncthreads_or(bad) != 0);
}

// Where the values of one finished row go and the factor that normalizes them; base == nullptr:
// the row's values are not written (a -inf partial, which the combine skips without reading).
struct RowSink {
  void* base;
  int64_t offset;  // element offset of column 0 in base
  RuntimeDType dtype;
  float inv;  // value_scale / row sum (0 for a row without keys, NaN for a bad CTA or scale)
};

// Whether a finished row with row sum `l` has values to write: a row without keys (l = 0) of a
// partial is not written (its LSE is -inf, which the combine skips without reading the values).
__device__ __forceinline__ bool row_has_values(float l, bool bad) {
  return bad || l > 0.0f || isnan(l);
}

// Where the values of row `row` (< p.rows) of the segment go: `out` for the request's only
// segment, else the segment's partial row (in partial_dtype).
struct RowDestination {
  void* base;
  int64_t offset;  // element offset of column 0 in base
  RuntimeDType dtype;
};
__device__ __forceinline__ RowDestination row_destination(const DecodeKernelParams& p,
                                                          const WorkItem& w, int row) {
  if (w.slot >= 0) {
    return {p.partial_out, (static_cast<int64_t>(w.slot) * p.rows + row) * kDimV, p.partial_dtype};
  }
  const DivMod jn = fast_divmod(row, p.heads_div);  // (query, head)
  return {p.out,
          w.batch_index * p.out_stride_batch + jn.quotient * p.out_stride_query +
              jn.remainder * p.out_stride_head,
          p.out_dtype};
}

// Finishes row `row` (< p.rows) of the CTA from its row sum `l` and max `m` (log2 units), `bad`
// (a bad index or scale: NaN rows) and the request's value factor: writes its LSE when `write_lse`
// (one thread per row), returns where its values go.
__device__ __forceinline__ RowSink finish_row(const DecodeKernelParams& p, const WorkItem& w,
                                              int row, float l, float m, bool bad,
                                              float value_scale, bool write_lse) {
  float inv, lse;
  if (bad) {
    inv = lse = NAN;
  } else if (row_has_values(l, bad)) {  // a NaN cache value makes l NaN: out and lse NaN
    inv = value_scale / l;
    lse = (m + __log2f(l)) * kLn2;
  } else {
    inv = 0.0f;  // no visible key: out 0, lse -inf
    lse = -INFINITY;
  }
  const bool direct = w.slot < 0;
  const DivMod jn = fast_divmod(row, p.heads_div);  // (query, head)
  const int j = jn.quotient, n = jn.remainder;
  const int64_t partial_row = static_cast<int64_t>(w.slot) * p.rows + row;
  if (write_lse) {
    if (direct) {
      p.lse[w.batch_index * p.lse_stride_batch + j * p.lse_stride_query + n * p.lse_stride_head] =
          lse;
    } else {
      p.partial_lse[partial_row] = lse;
    }
  }
  RowSink sink{nullptr, 0, RuntimeDType::kF32, inv};
  if (direct || lse != -INFINITY) {
    const RowDestination d = row_destination(p, w, row);
    sink.base = d.base;
    sink.offset = d.offset;
    sink.dtype = d.dtype;
  }
  return sink;
}

}  // namespace mlakit::cuda::decode_sm90
