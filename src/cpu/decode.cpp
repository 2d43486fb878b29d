// CPU absorbed-MQA decode: split-KV over (request, split) work items, then an LSE combine.
//
// A work item owns keys [k0, k1) of one request and all of its s_q * N query rows. Because every
// head reads the same cache entry (MQA), each key tile is loaded and converted to f32 once and
// used by all rows: scores S = Q · K^T for a 64-key tile, an online softmax per row, then
// acc += P · V. Scores are kept in log2 units (Q is pre-multiplied by scale * log2(e)) so the
// softmax uses exp2. See docs/kernels/decode_cpu.md.
#include "cpu/decode.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/decode_dequant.hpp"
#include "cpu/decode_simd.hpp"
#include "cpu/parallel.hpp"
#include "mlakit/kv_cache.hpp"

namespace mlakit::cpu {
namespace {

using simd::kLanes;
using simd::VecF;
using simd::VecI;

// Keys per tile: the f32 tile (64 x 576 x 4 B = 144 KiB) stays in L2 while every row block reads
// it, and 64 keys amortize the per-tile softmax bookkeeping of each row.
constexpr int64_t kKeyTile = 64;
// Score microkernel: 4 rows x 4 keys = 16 vector accumulators (half the 32 AVX-512 registers),
// 8 loads per 16 FMAs, so it is bound by the FMA ports, not the load ports.
constexpr int64_t kQkRows = 4;
constexpr int64_t kQkKeys = 4;
// P · V microkernel: 8 rows x 2 vectors (32 columns) = 16 accumulators, per key 2 vector loads and
// 8 broadcasts for 16 FMAs.
constexpr int64_t kPvRows = 8;
constexpr int64_t kPvCols = 2 * kLanes;
// Rows are padded to a multiple of both microkernels' row counts.
constexpr int64_t kRowAlign = std::max(kQkRows, kPvRows);
// Float offset alignment of every scratch buffer: 16 floats = 64 bytes = one cache line.
constexpr int64_t kScratchAlign = kLanes;

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2 = 0.693147180559945309f;
// exp2 inputs are clamped here: below it the result (< 2^-126) is negligible next to the row's
// largest term, 2^0 = 1, and the exponent-field trick of simd::exp2 stays valid.
constexpr float kMinExp2Arg = -126.0f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t round_up(int64_t a, int64_t multiple) { return (a + multiple - 1) / multiple * multiple; }

// Sizes of one call, with the padding the microkernels need (padding is zero-filled).
struct Shape {
  int64_t s_q, heads, rows, rows_padded;
  int64_t dim, dim_padded;    // D = L + R; K rows are dim_padded floats apart
  int64_t rank, rank_padded;  // L; accumulator rows are rank_padded floats apart
  int64_t block_size;

  explicit Shape(const DecodeProblem& p)
      : s_q(p.q.size(1)),
        heads(p.q.size(2)),
        rows(s_q * heads),
        rows_padded(round_up(rows, kRowAlign)),
        dim(p.entry_dim),
        rank(p.kv_lora_rank),
        rank_padded(round_up(rank, kPvCols)),
        block_size(p.kv_cache.size(1)) {
    // V is read from the K tile rows, so a K row must hold rank_padded floats.
    dim_padded = std::max(round_up(dim, kLanes), rank_padded);
  }
};

// Per-thread buffers, grown on first use and kept for later calls (so a warm run allocates
// nothing). thread_local: each pool worker owns its own, and concurrent calls from different
// user threads never share one.
class Scratch {
 public:
  float* q = nullptr;        // [rows_padded, dim_padded]   pre-scaled query rows
  float* k = nullptr;        // [kKeyTile, dim_padded]      converted key tile (V = first L)
  float* s = nullptr;        // [rows_padded, kKeyTile]     scores, then probabilities
  float* acc = nullptr;      // [rows_padded, rank_padded]  un-normalized output
  float* row_max = nullptr;  // [rows_padded]               running max (log2 units)
  float* row_sum = nullptr;  // [rows_padded]               running sum of 2^(s - max)
  float* alpha = nullptr;    // [rows_padded]               rescale of acc for the current tile

  void reserve(const Shape& sh) {
    const int64_t sizes[] = {sh.rows_padded * sh.dim_padded,
                             kKeyTile * sh.dim_padded,
                             sh.rows_padded * kKeyTile,
                             sh.rows_padded * sh.rank_padded,
                             sh.rows_padded,
                             sh.rows_padded,
                             sh.rows_padded};
    int64_t total = kScratchAlign;
    for (int64_t n : sizes) total += round_up(n, kScratchAlign);
    if (static_cast<int64_t>(storage_.size()) < total) storage_.resize(total);
    const auto base = reinterpret_cast<uintptr_t>(storage_.data());
    const uintptr_t align_bytes = kScratchAlign * sizeof(float);
    float* p = reinterpret_cast<float*>((base + align_bytes - 1) / align_bytes * align_bytes);
    float** slots[] = {&q, &k, &s, &acc, &row_max, &row_sum, &alpha};
    for (int i = 0; i < 7; ++i) {
      *slots[i] = p;
      p += round_up(sizes[i], kScratchAlign);
    }
  }

 private:
  std::vector<float> storage_;
};

Scratch& thread_scratch() {
  thread_local Scratch scratch;
  return scratch;
}

// Keys query j of a request may see: [0, visible) (bottom-right causal, clamped).
int64_t visible_keys(int64_t seq_len, int64_t s_q, int64_t j) {
  return std::clamp<int64_t>(seq_len - s_q + j + 1, 0, seq_len);
}

const uint8_t* entry_ptr(const DecodeProblem& p, int64_t b, int64_t key, int64_t block_size) {
  const TensorView& bt = p.block_table;
  const int32_t block =
      p.block_table
          .data_as<const int32_t>()[b * bt.strides[0] + (key / block_size) * bt.strides[1]];
  const TensorView& c = p.kv_cache;
  const int64_t offset = block * c.strides[0] + (key % block_size) * c.strides[1];
  return static_cast<const uint8_t*>(c.data) + offset * c.element_size();
}

// Converts keys [t0, t0 + count) of request b into rows of `k` ([kKeyTile, dim_padded]); pads each
// row past D and the rows up to the score microkernel's key block with zeros.
void load_key_tile(const DecodeProblem& p, const Shape& sh, int64_t b, int64_t t0, int64_t count,
                   float* k) {
  for (int64_t i = 0; i < count; ++i) {
    const uint8_t* e = entry_ptr(p, b, t0 + i, sh.block_size);
    float* row = k + i * sh.dim_padded;
    switch (p.kv_dtype) {
      case KvCacheDType::kAuto:
        dequant::any_row(e, p.kv_cache.dtype, sh.dim, row);
        break;
      case KvCacheDType::kFp8E4m3:
        dequant::e4m3_row(e, sh.dim, row, 1.0f);
        break;
      case KvCacheDType::kFp8DsMla:
        dequant::ds_mla_entry(e, p.rope_dtype, row);
        break;
    }
    std::fill(row + sh.dim, row + sh.dim_padded, 0.0f);
  }
  const int64_t padded = round_up(count, kQkKeys);
  std::fill(k + count * sh.dim_padded, k + padded * sh.dim_padded, 0.0f);
}

// Software prefetch (into L2) of the next tile's cache entries, a few cache lines per microkernel
// call of the current tile, so that reading the cache overlaps with arithmetic instead of
// alternating with it (a burst of prefetches would stall on the core's few line-fill buffers).
class NextTilePrefetch {
 public:
  NextTilePrefetch(const DecodeProblem& p, const Shape& sh, int64_t b, int64_t t0, int64_t count,
                   int64_t steps)
      : p_(p),
        sh_(sh),
        b_(b),
        t0_(t0),
        count_(std::max<int64_t>(count, 0)),
        entry_lines_((p.kv_cache.size(2) * p.kv_cache.element_size() + kCacheLine - 1) /
                     kCacheLine),
        per_step_(steps > 0 ? (count_ * entry_lines_ + steps - 1) / steps : 0) {}

  void step() {
    for (int64_t n = 0; n < per_step_ && key_ < count_; ++n) {
      if (line_ == 0) entry_ = entry_ptr(p_, b_, t0_ + key_, sh_.block_size);
      __builtin_prefetch(entry_ + line_ * kCacheLine, /*rw=*/0,
                         /*locality=*/2);  // 2: into L2, not L1
      if (++line_ == entry_lines_) line_ = 0, ++key_;
    }
  }

 private:
  static constexpr int64_t kCacheLine = 64;
  const DecodeProblem& p_;
  const Shape& sh_;
  int64_t b_, t0_, count_, entry_lines_, per_step_;
  int64_t key_ = 0, line_ = 0;
  const uint8_t* entry_ = nullptr;
};

// s[r][t] = q[r] · k[t] for a 4 x 4 block; `dim` is a multiple of kLanes. The 16 accumulators are
// named variables so that they stay in registers through the final reduction.
void score_block(const float* q, const float* k, int64_t dim, float* s) {
  static_assert(kQkRows == 4 && kQkKeys == 4, "score_block is written out for 4 x 4");
  const VecF z = {};
  VecF a00 = z, a01 = z, a02 = z, a03 = z, a10 = z, a11 = z, a12 = z, a13 = z;
  VecF a20 = z, a21 = z, a22 = z, a23 = z, a30 = z, a31 = z, a32 = z, a33 = z;
  for (int64_t d = 0; d < dim; d += kLanes) {
    const VecF k0 = simd::load(k + d), k1 = simd::load(k + dim + d);
    const VecF k2 = simd::load(k + 2 * dim + d), k3 = simd::load(k + 3 * dim + d);
    VecF qv = simd::load(q + d);
    a00 += qv * k0, a01 += qv * k1, a02 += qv * k2, a03 += qv * k3;
    qv = simd::load(q + dim + d);
    a10 += qv * k0, a11 += qv * k1, a12 += qv * k2, a13 += qv * k3;
    qv = simd::load(q + 2 * dim + d);
    a20 += qv * k0, a21 += qv * k1, a22 += qv * k2, a23 += qv * k3;
    qv = simd::load(q + 3 * dim + d);
    a30 += qv * k0, a31 += qv * k1, a32 += qv * k2, a33 += qv * k3;
  }
  using simd::sums4;
  const VecF sums = simd::sums4x4(sums4(a00, a01, a02, a03), sums4(a10, a11, a12, a13),
                                  sums4(a20, a21, a22, a23), sums4(a30, a31, a32, a33));
  for (int64_t i = 0; i < kQkRows; ++i) {
    for (int64_t j = 0; j < kQkKeys; ++j) s[i * kKeyTile + j] = sums[i * kQkKeys + j];
  }
}

// acc[r][c] = acc[r][c] * alpha[r] + sum_t p[r][t] * v[t][c] for 8 rows x 32 columns.
void value_block(const float* p, const float* v, int64_t v_stride, int64_t keys, const float* alpha,
                 float* acc, int64_t acc_stride) {
  constexpr int64_t kVecs = kPvCols / kLanes;
  VecF a[kPvRows][kVecs];
  for (int64_t i = 0; i < kPvRows; ++i) {
    for (int64_t c = 0; c < kVecs; ++c)
      a[i][c] = simd::load(acc + i * acc_stride + c * kLanes) * alpha[i];
  }
  for (int64_t t = 0; t < keys; ++t) {
    VecF vv[kVecs];
    for (int64_t c = 0; c < kVecs; ++c) vv[c] = simd::load(v + t * v_stride + c * kLanes);
    for (int64_t i = 0; i < kPvRows; ++i) {
      const VecF pi = simd::splat(p[i * kKeyTile + t]);
      for (int64_t c = 0; c < kVecs; ++c) a[i][c] += pi * vv[c];
    }
  }
  for (int64_t i = 0; i < kPvRows; ++i) {
    for (int64_t c = 0; c < kVecs; ++c) simd::store(acc + i * acc_stride + c * kLanes, a[i][c]);
  }
}

// Online softmax of one row's scores s[0, keys): keys [0, visible) count, the rest get p = 0.
// Updates the running max and sum and returns the factor that rescales the row's accumulator.
float softmax_row(float* s, int64_t keys, int64_t visible, float& row_max, float& row_sum) {
  if (visible <= 0) {
    std::fill(s, s + keys, 0.0f);
    return 1.0f;
  }
  const int64_t vec_keys = round_up(keys, kLanes);  // s rows are kKeyTile (a multiple) long
  VecI lane;
  for (int i = 0; i < kLanes; ++i) lane[i] = i;
  VecF mx = simd::splat(kNegInf);
  for (int64_t t = 0; t < vec_keys; t += kLanes) {
    const auto live = (lane + static_cast<int32_t>(t)) < static_cast<int32_t>(visible);
    mx = simd::max(mx, live ? simd::load(s + t) : simd::splat(kNegInf));
  }
  const float new_max = std::max(row_max, simd::reduce_max(mx));
  const float alpha = std::exp2(row_max - new_max);  // 0 on the first visible tile
  VecF sum = {};
  for (int64_t t = 0; t < vec_keys; t += kLanes) {
    const auto live = (lane + static_cast<int32_t>(t)) < static_cast<int32_t>(visible);
    const VecF e = simd::exp2(simd::max(simd::load(s + t) - new_max, simd::splat(kMinExp2Arg)));
    const VecF pr = live ? e : VecF{};
    sum += pr;
    simd::store(s + t, pr);
  }
  row_sum = row_sum * alpha + simd::reduce_add(sum);
  row_max = new_max;
  return alpha;
}

void store_row(const float* src, int64_t n, float scale, DType dtype, void* dst) {
  if (dtype == DType::kF32) {
    float* d = static_cast<float*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = src[i] * scale;
  } else {
    for (int64_t i = 0; i < n; ++i) store_float(dst, dtype, i, src[i] * scale);
  }
}

void* out_row(const DecodeProblem& p, int64_t b, int64_t j, int64_t n) {
  const TensorView& o = p.out;
  return o.element_ptr(b * o.strides[0] + j * o.strides[1] + n * o.strides[2]);
}
float& lse_at(const DecodeProblem& p, int64_t b, int64_t j, int64_t n) {
  const TensorView& l = p.lse;
  return *static_cast<float*>(
      l.element_ptr(b * l.strides[0] + j * l.strides[1] + n * l.strides[2]));
}

// One work item: keys [k0, k1) of request b. Writes normalized partial results either to out/lse
// (the request's only split) or to the workspace slot of global split `split`.
void run_split(const DecodeProblem& p, const Shape& sh, int64_t b, int64_t k0, int64_t k1,
               bool only_split, int64_t split) {
  Scratch& sc = thread_scratch();
  sc.reserve(sh);
  const int64_t seq_len = p.seq_lens.data_as<const int32_t>()[b * p.seq_lens.strides[0]];
  const RequestScales scales = request_scales(p, b);
  const float q_factor = scales.score_scale * kLog2e;

  for (int64_t m = 0; m < sh.rows_padded; ++m) {
    float* qrow = sc.q + m * sh.dim_padded;
    if (m < sh.rows) {
      const int64_t j = m / sh.heads, n = m % sh.heads;
      const TensorView& q = p.q;
      dequant::any_row(q.element_ptr(b * q.strides[0] + j * q.strides[1] + n * q.strides[2]),
                       q.dtype, sh.dim, qrow);
      for (int64_t d = 0; d < sh.dim; ++d) qrow[d] *= q_factor;
      std::fill(qrow + sh.dim, qrow + sh.dim_padded, 0.0f);
    } else {
      std::fill(qrow, qrow + sh.dim_padded, 0.0f);
    }
    sc.row_max[m] = kNegInf;
    sc.row_sum[m] = 0.0f;
  }
  std::fill(sc.acc, sc.acc + sh.rows_padded * sh.rank_padded, 0.0f);

  for (int64_t t0 = k0; t0 < k1; t0 += kKeyTile) {
    const int64_t keys = std::min(kKeyTile, k1 - t0);
    // Rows are query-major and later queries see more keys, so the rows that see any key of this
    // tile are a suffix; skip whole row blocks before it.
    int64_t first_row = sh.rows;
    for (int64_t j = 0; j < sh.s_q; ++j) {
      if (visible_keys(seq_len, sh.s_q, j) > t0) {
        first_row = j * sh.heads;
        break;
      }
    }
    if (first_row == sh.rows) break;  // no later tile is visible either
    first_row = first_row / kRowAlign * kRowAlign;

    load_key_tile(p, sh, b, t0, keys, sc.k);
    const int64_t key_blocks = round_up(keys, kQkKeys);
    const int64_t row_span = sh.rows_padded - first_row;
    NextTilePrefetch prefetch(p, sh, b, t0 + kKeyTile, std::min(kKeyTile, k1 - t0 - kKeyTile),
                              row_span / kQkRows * (key_blocks / kQkKeys) +
                                  row_span / kPvRows * (sh.rank_padded / kPvCols));
    for (int64_t r = first_row; r < sh.rows_padded; r += kQkRows) {
      for (int64_t t = 0; t < key_blocks; t += kQkKeys) {
        prefetch.step();
        score_block(sc.q + r * sh.dim_padded, sc.k + t * sh.dim_padded, sh.dim_padded,
                    sc.s + r * kKeyTile + t);
      }
    }
    for (int64_t m = first_row; m < sh.rows_padded; ++m) {
      const int64_t visible =
          m < sh.rows ? visible_keys(seq_len, sh.s_q, m / sh.heads) - t0 : int64_t{0};
      sc.alpha[m] = softmax_row(sc.s + m * kKeyTile, keys, std::min(visible, keys), sc.row_max[m],
                                sc.row_sum[m]);
    }
    for (int64_t r = first_row; r < sh.rows_padded; r += kPvRows) {
      for (int64_t c = 0; c < sh.rank_padded; c += kPvCols) {
        prefetch.step();
        value_block(sc.s + r * kKeyTile, sc.k + c, sh.dim_padded, keys, sc.alpha + r,
                    sc.acc + r * sh.rank_padded + c, sh.rank_padded);
      }
    }
  }

  for (int64_t m = 0; m < sh.rows; ++m) {
    const int64_t j = m / sh.heads, n = m % sh.heads;
    const float sum = sc.row_sum[m];
    // sum > 0 iff the row saw a key (its largest term is 2^0 = 1).
    const float scale = sum > 0.0f ? scales.value_scale / sum : 0.0f;
    const float lse = sum > 0.0f ? (sc.row_max[m] + std::log2(sum)) * kLn2 : kNegInf;
    const float* acc = sc.acc + m * sh.rank_padded;
    if (only_split) {
      store_row(acc, sh.rank, scale, p.out.dtype, out_row(p, b, j, n));
      lse_at(p, b, j, n) = lse;
    } else {
      float* part = p.workspace + (split * sh.rows + m) * (sh.rank + 1);
      store_row(acc, sh.rank, scale, DType::kF32, part);
      part[sh.rank] = lse;
    }
  }
}

// out = sum_s exp(lse_s - M) o_s / sum_s exp(lse_s - M), lse = M + ln sum_s exp(lse_s - M) over
// the splits of request b (spec C.6/C.7); splits whose lse is -inf (no visible key) are skipped,
// and a row no split saw gets out 0, lse -inf.
void combine_row(const DecodeProblem& p, const Shape& sh, const DecodeSchedule& schedule, int64_t b,
                 int64_t m, std::vector<float>& acc) {
  const int64_t first = schedule.split_offsets[b], last = schedule.split_offsets[b + 1];
  const int64_t width = sh.rank + 1;
  auto part = [&](int64_t g) { return p.workspace + (g * sh.rows + m) * width; };
  float mx = kNegInf;
  for (int64_t g = first; g < last; ++g) mx = std::max(mx, part(g)[sh.rank]);
  acc.assign(sh.rank, 0.0f);
  float total = 0.0f;
  if (mx != kNegInf) {
    for (int64_t g = first; g < last; ++g) {
      const float* o = part(g);
      if (o[sh.rank] == kNegInf) continue;
      const float w = std::exp(o[sh.rank] - mx);
      total += w;
      for (int64_t l = 0; l < sh.rank; ++l) acc[l] += w * o[l];
    }
  }
  const int64_t j = m / sh.heads, n = m % sh.heads;
  store_row(acc.data(), sh.rank, total > 0.0f ? 1.0f / total : 0.0f, p.out.dtype,
            out_row(p, b, j, n));
  lse_at(p, b, j, n) = total > 0.0f ? mx + std::log(total) : kNegInf;
}

}  // namespace

void mla_decode(const DecodeProblem& problem, const DecodeSchedule& schedule) {
  const Shape sh(problem);
  const int64_t batch = problem.q.size(0);
  const int32_t* seq_lens = problem.seq_lens.data_as<const int32_t>();
  const int64_t seq_stride = problem.seq_lens.strides[0];

  // Requests without keys have no split; their rows are empty.
  for (int64_t b = 0; b < batch; ++b) {
    if (schedule.num_splits(b) > 0) continue;
    for (int64_t m = 0; m < sh.rows; ++m) {
      const int64_t j = m / sh.heads, n = m % sh.heads;
      void* o = out_row(problem, b, j, n);
      for (int64_t l = 0; l < sh.rank; ++l) store_float(o, problem.out.dtype, l, 0.0f);
      lse_at(problem, b, j, n) = kNegInf;
    }
  }

  const auto& offsets = schedule.split_offsets;
  parallel_for(0, schedule.total_splits, [&](int64_t g) {
    const int64_t b = std::upper_bound(offsets.begin(), offsets.end(), g) - offsets.begin() - 1;
    const int64_t k = g - offsets[b];
    const int64_t seq_len = seq_lens[b * seq_stride];
    const int64_t k0 = k * schedule.split_len[b];
    const int64_t k1 = std::min(seq_len, k0 + schedule.split_len[b]);
    run_split(problem, sh, b, k0, k1, schedule.num_splits(b) == 1, g);
  });

  parallel_for(0, batch * sh.rows, [&](int64_t i) {
    const int64_t b = i / sh.rows;
    if (schedule.num_splits(b) < 2) return;
    thread_local std::vector<float> acc;
    combine_row(problem, sh, schedule, b, i % sh.rows, acc);
  });
}

}  // namespace mlakit::cpu
