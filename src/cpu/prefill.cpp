#include "cpu/prefill.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/float_rows.hpp"
#include "cpu/parallel.hpp"
#include "cpu/sgemm.hpp"

namespace mlakit::cpu {

namespace {

// Query rows of one GEMM tile: the score GEMM (64 x 256 x 192) and the PV GEMM (64 x 128 x 256)
// are large enough for sgemm to run near its peak, and along the causal diagonal only a 64 x 64
// triangle per tile is computed and masked (waste ~ 64 / L of the work).
constexpr int64_t kBlockQ = 64;
// Keys per inner step. The working set of an item at the DeepSeek sizes (Q 256x192, K 256x192,
// V 256x128, scores 256x256, O 256x128 floats ~ 1 MiB) stays in a core's L2 cache.
constexpr int64_t kBlockK = 256;
// Query rows of one work item: K/V rows are converted to f32 once per item, so 256 rows amortize
// their (strided, cache-missing) reads over 4 tiles; items of 64 rows are used instead when that
// leaves too few items to balance the threads.
constexpr int64_t kMaxItemRows = 256;
// Fewest work items per thread for dynamic scheduling to even out the causal imbalance.
constexpr int64_t kMinItemsPerThread = 8;
// Item cost = rows * (visible keys + this): the per-item work that does not grow with the keys
// (loading Q, writing out) is worth about 32 keys.
constexpr int64_t kItemOverheadKeys = 32;

constexpr float kLog2e = 1.44269504088896340736f;  // scores are kept in log2 units (exp2 is cheap)
constexpr float kLn2 = 0.69314718055994530942f;    // converts the log2 LSE back to natural log
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// 2^x for x <= 0 in plain arithmetic the compiler vectorizes: x = n + f with n = round(x),
// |f| <= 1/2, 2^f by its degree-7 Taylor polynomial in f*ln2 (truncation error < 1e-8; measured
// within 1e-7 relative including f32 rounding), 2^n built in the exponent bits. Inputs below -126
// give 2^-126 instead of smaller values: such a term is < 1e-38 of the row maximum's term (which is
// 1), so sums do not change. NaN stays NaN. Integer work is unsigned bit arithmetic only (no float
// -> int conversion).
inline float exp2_nonpositive(float x) {
  constexpr float kMinExponent = -126.0f;     // smallest normal f32 exponent
  constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: x + it holds round(x) in its low bits
  constexpr uint32_t kRoundMagicBits = 0x4b400000u;  // bit pattern of kRoundMagic
  constexpr uint32_t kExponentBias = 127;            // f32 exponent bias
  constexpr int kMantissaBits = 23;                  // f32 mantissa width
  constexpr float kC1 = 0.693147180559945309f;       // ln2^k / k!, k = 1..7
  constexpr float kC2 = 0.240226506959100712f;
  constexpr float kC3 = 0.0555041086648215800f;
  constexpr float kC4 = 0.00961812910762847717f;
  constexpr float kC5 = 0.00133335581464284434f;
  constexpr float kC6 = 0.000154035303933816099f;
  constexpr float kC7 = 0.0000152527338040598403f;
  x = std::max(x, kMinExponent);
  const float shifted = x + kRoundMagic;
  const float n = shifted - kRoundMagic;
  const float f = x - n;
  const float p =
      1.0f + f * (kC1 + f * (kC2 + f * (kC3 + f * (kC4 + f * (kC5 + f * (kC6 + f * kC7))))));
  uint32_t shifted_bits;
  std::memcpy(&shifted_bits, &shifted, sizeof(shifted_bits));
  // n + 127 modulo 2^32, moved into the exponent field: the bits of 2^n.
  const uint32_t bits = (shifted_bits - kRoundMagicBits + kExponentBias) << kMantissaBits;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  return p * two_n;
}

// Eight floats as one (GCC / Clang) vector: AVX2 and AVX-512 take its max in one instruction.
// The compiler does not vectorize a scalar running max (std::max's NaN ordering), so the max of
// a score row goes through this type explicitly.
using Floats8 = float __attribute__((vector_size(32)));

// max(x[0:n]), -inf for n = 0.
inline float max_of(const float* x, int64_t n) {
  constexpr int64_t kLanes = 8;  // floats in Floats8
  Floats8 lanes;
  for (int64_t l = 0; l < kLanes; ++l) lanes[l] = kNegInf;
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    Floats8 v;
    std::memcpy(&v, x + j, sizeof(v));
    lanes = v > lanes ? v : lanes;
  }
  float m = kNegInf;
  for (int64_t l = 0; l < kLanes; ++l) m = std::max(m, lanes[l]);
  for (; j < n; ++j) m = std::max(m, x[j]);
  return m;
}

// Keys [0, visible) that query row i of a request (sq queries, sk keys) attends to.
int64_t visible_keys(int64_t i, int64_t sq, int64_t sk, bool causal) {
  return causal ? std::clamp<int64_t>(sk - sq + i + 1, 0, sk) : sk;
}

struct WorkItem {
  int64_t request;
  int64_t head;
  int64_t row_begin;  // first query row of the item, counted within the request
  int64_t rows;       // <= kMaxItemRows
  int64_t cost;       // relative run time, for longest-first scheduling
};

std::vector<WorkItem> make_work_items(const PrefillArgs& a, int64_t heads, int64_t item_rows) {
  std::vector<WorkItem> items;
  const int64_t batch = static_cast<int64_t>(a.cu_seqlens_q.size()) - 1;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t sq = a.cu_seqlens_q[b + 1] - a.cu_seqlens_q[b];
    const int64_t sk = a.cu_seqlens_k[b + 1] - a.cu_seqlens_k[b];
    for (int64_t row = 0; row < sq; row += item_rows) {
      const int64_t rows = std::min(item_rows, sq - row);
      const int64_t keys = visible_keys(row + rows - 1, sq, sk, a.causal);
      for (int64_t n = 0; n < heads; ++n) {
        items.push_back({b, n, row, rows, rows * (keys + kItemOverheadKeys)});
      }
    }
  }
  // Longest first: with dynamic scheduling the short (early causal) items fill the gaps at the
  // end instead of one long item finishing alone.
  std::stable_sort(items.begin(), items.end(),
                   [](const WorkItem& x, const WorkItem& y) { return x.cost > y.cost; });
  return items;
}

// Rows per item: kMaxItemRows unless that gives fewer than kMinItemsPerThread items per thread.
int64_t choose_item_rows(const PrefillArgs& a, int64_t heads) {
  const int64_t batch = static_cast<int64_t>(a.cu_seqlens_q.size()) - 1;
  int64_t large_items = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t sq = a.cu_seqlens_q[b + 1] - a.cu_seqlens_q[b];
    large_items += (sq + kMaxItemRows - 1) / kMaxItemRows * heads;
  }
  return large_items >= kMinItemsPerThread * num_threads() ? kMaxItemRows : kBlockQ;
}

// f32 working set of one thread, grown on demand and reused across items and calls.
struct Scratch {
  std::vector<float> q;        // [kMaxItemRows, P + R]
  std::vector<float> k;        // [kBlockK, P + R]
  std::vector<float> v;        // [kBlockK, V]
  std::vector<float> s;        // [kMaxItemRows, kBlockK] scores, then probabilities
  std::vector<float> o;        // [kMaxItemRows, V] unnormalized output
  std::vector<float> row_max;  // [kMaxItemRows] running max score (log2 units)
  std::vector<float> row_sum;  // [kMaxItemRows] running sum of 2^(score - row_max)

  void reserve(int64_t dqk, int64_t dv) {
    q.resize(kMaxItemRows * dqk);
    k.resize(kBlockK * dqk);
    v.resize(kBlockK * dv);
    s.resize(kMaxItemRows * kBlockK);
    o.resize(kMaxItemRows * dv);
    row_max.resize(kMaxItemRows);
    row_sum.resize(kMaxItemRows);
  }
};

class PrefillKernel {
 public:
  explicit PrefillKernel(const PrefillArgs& a)
      : a_(a),
        nope_(a.k_nope.shape[2]),
        rope_(a.k_pe.shape[1]),
        dqk_(nope_ + rope_),
        dv_(a.v.shape[2]),
        dtype_(a.q.dtype),
        lse_(a.lse_heads_tokens ? a.lse_heads_tokens->data_as<float>() : nullptr) {}

  void run(const WorkItem& item, Scratch& sc) const;
  // Rows of queries outside every request: out 0, lse -inf.
  void write_empty_rows(int64_t token_begin, int64_t token_end, int64_t heads) const;

 private:
  // Keys of the current item's request visible to its query row r (counted within the item).
  struct ItemGeometry {
    int64_t sq, sk, row_begin;
    bool causal;
    int64_t visible(int64_t r) const { return visible_keys(row_begin + r, sq, sk, causal); }
  };

  void load_q(int64_t token, int64_t head, int64_t rows, float* dst) const;
  void load_kv(int64_t key, int64_t head, int64_t count, float* k, float* v) const;
  // Attention of item rows [r0, r0 + rows) to the packed key block's first `width` keys (the
  // block starts at key kb of the request): scores, online softmax, O += P V.
  void attend_tile(const ItemGeometry& g, int64_t kb, int64_t r0, int64_t rows, int64_t width,
                   Scratch& sc) const;
  // Online softmax step for one row: folds scores[0:cols] into (row_max, row_sum), rescales the
  // row's output accumulator and turns scores[0:width] into probabilities (0 beyond cols).
  void softmax_row(float* scores, int64_t cols, int64_t width, float& row_max, float& row_sum,
                   float* out_row) const;
  // out_row: [V] f32, already normalized
  void store_row_result(int64_t token, int64_t head, const float* out_row, float lse) const;

  const PrefillArgs& a_;
  const int64_t nope_, rope_, dqk_, dv_;
  const DType dtype_;
  float* lse_;  // [N, T] or null
};

// Q rows [token, token + rows) of `head`.
// dst: [rows, P + R] f32
void PrefillKernel::load_q(int64_t token, int64_t head, int64_t rows, float* dst) const {
  const TensorView& q = a_.q;  // [T, N, P + R]
  for (int64_t r = 0; r < rows; ++r) {
    load_row(q.element_ptr((token + r) * q.strides[0] + head * q.strides[1]), dtype_, q.strides[2],
             dqk_, dst + r * dqk_);
  }
}

// K rows [key, key + count) of `head` as [k_nope | k_pe], and the matching V rows.
// k: [count, P + R] f32; v: [count, V] f32
void PrefillKernel::load_kv(int64_t key, int64_t head, int64_t count, float* k, float* v) const {
  const TensorView& kn = a_.k_nope;  // [S, N, P]
  const TensorView& kp = a_.k_pe;    // [S, R]
  const TensorView& vv = a_.v;       // [S, N, V]
  for (int64_t j = 0; j < count; ++j) {
    const int64_t s = key + j;
    float* krow = k + j * dqk_;
    // P or R may be 0: that tensor is then empty and may have no data pointer to offset.
    if (nope_ > 0) {
      load_row(kn.element_ptr(s * kn.strides[0] + head * kn.strides[1]), dtype_, kn.strides[2],
               nope_, krow);
    }
    if (rope_ > 0) {
      load_row(kp.element_ptr(s * kp.strides[0]), dtype_, kp.strides[1], rope_, krow + nope_);
    }
    load_row(vv.element_ptr(s * vv.strides[0] + head * vv.strides[1]), dtype_, vv.strides[2], dv_,
             v + j * dv_);
  }
}

void PrefillKernel::softmax_row(float* scores, int64_t cols, int64_t width, float& row_max,
                                float& row_sum, float* out_row) const {
  if (cols == 0) {
    std::fill_n(scores, width, 0.0f);
    return;
  }
  const float block_max = max_of(scores, cols);
  const float new_max = std::max(row_max, block_max);
  // The first block sees row_max = -inf: the factor is tiny and multiplies zeros.
  const float rescale = exp2_nonpositive(row_max - new_max);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < cols; ++i) {
    const float p = exp2_nonpositive(scores[i] - new_max);
    scores[i] = p;
    sum += p;
  }
  std::fill(scores + cols, scores + width, 0.0f);
  row_sum = row_sum * rescale + sum;
  row_max = new_max;
  if (rescale != 1.0f) {
#pragma omp simd
    for (int64_t i = 0; i < dv_; ++i) out_row[i] *= rescale;
  }
}

void PrefillKernel::attend_tile(const ItemGeometry& g, int64_t kb, int64_t r0, int64_t rows,
                                int64_t width, Scratch& sc) const {
  float* scores = sc.s.data() + r0 * kBlockK;  // [rows, kBlockK]
  float* o = sc.o.data() + r0 * dv_;           // [rows, V]
  // scores = (scale * log2 e) * Q K^T
  sgemm(MatrixLayout::kRowMajor, false, true, rows, width, dqk_, a_.scale * kLog2e,
        sc.q.data() + r0 * dqk_, dqk_, sc.k.data(), dqk_, 0.0f, scores, kBlockK);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t cols = std::clamp<int64_t>(g.visible(r0 + r) - kb, 0, width);
    softmax_row(scores + r * kBlockK, cols, width, sc.row_max[r0 + r], sc.row_sum[r0 + r],
                o + r * dv_);
  }
  // O += P V
  sgemm(MatrixLayout::kRowMajor, false, false, rows, dv_, width, 1.0f, scores, kBlockK, sc.v.data(),
        dv_, 1.0f, o, dv_);
}

void PrefillKernel::store_row_result(int64_t token, int64_t head, const float* out_row,
                                     float lse) const {
  const TensorView& out = a_.out;  // [T, N, V]
  store_row(out_row, dv_, out.element_ptr(token * out.strides[0] + head * out.strides[1]),
            out.dtype, out.strides[2]);
  if (lse_) {
    const TensorView& l = *a_.lse_heads_tokens;  // [N, T]
    lse_[head * l.strides[0] + token * l.strides[1]] = lse;
  }
}

void PrefillKernel::run(const WorkItem& item, Scratch& sc) const {
  const int64_t b = item.request, n = item.head, rows = item.rows;
  const ItemGeometry g{a_.cu_seqlens_q[b + 1] - a_.cu_seqlens_q[b],
                       a_.cu_seqlens_k[b + 1] - a_.cu_seqlens_k[b], item.row_begin, a_.causal};
  const int64_t token0 = a_.cu_seqlens_q[b] + item.row_begin;
  const int64_t key0 = a_.cu_seqlens_k[b];

  std::fill_n(sc.row_max.data(), rows, kNegInf);
  std::fill_n(sc.row_sum.data(), rows, 0.0f);
  std::fill_n(sc.o.data(), rows * dv_, 0.0f);
  const int64_t key_end = g.visible(rows - 1);  // the last row sees the most keys
  if (key_end > 0) load_q(token0, n, rows, sc.q.data());

  for (int64_t kb = 0; kb < key_end; kb += kBlockK) {
    const int64_t width = std::min(kBlockK, key_end - kb);
    load_kv(key0 + kb, n, width, sc.k.data(), sc.v.data());
    // Tiles of kBlockQ rows, each computing only the keys its last row sees. Visibility grows
    // with the row, so once a tile sees the whole block, so do all later rows: one GEMM covers
    // them (fewer, larger BLAS calls).
    for (int64_t r0 = 0; r0 < rows; r0 += kBlockQ) {
      const int64_t tile_rows = std::min(kBlockQ, rows - r0);
      const int64_t tile_width = std::clamp<int64_t>(g.visible(r0 + tile_rows - 1) - kb, 0, width);
      if (tile_width == width) {
        attend_tile(g, kb, r0, rows - r0, width, sc);
        break;
      }
      if (tile_width > 0) attend_tile(g, kb, r0, tile_rows, tile_width, sc);
    }
  }

  for (int64_t r = 0; r < rows; ++r) {
    const float sum = sc.row_sum[r];
    float* o = sc.o.data() + r * dv_;
    float lse = kNegInf;
    if (sum > 0.0f) {
      const float inv = 1.0f / sum;
#pragma omp simd
      for (int64_t j = 0; j < dv_; ++j) o[j] *= inv;
      lse = (sc.row_max[r] + std::log2(sum)) * kLn2;
    }
    store_row_result(token0 + r, n, o, lse);
  }
}

void PrefillKernel::write_empty_rows(int64_t token_begin, int64_t token_end, int64_t heads) const {
  const std::vector<float> zeros(dv_, 0.0f);
  for (int64_t t = token_begin; t < token_end; ++t) {
    for (int64_t n = 0; n < heads; ++n) store_row_result(t, n, zeros.data(), kNegInf);
  }
}

}  // namespace

void mla_prefill(const PrefillArgs& args) {
  require_per_thread_blas("mla_prefill");
  const int64_t heads = args.q.shape[1];
  const PrefillKernel kernel(args);
  const std::vector<WorkItem> items = make_work_items(args, heads, choose_item_rows(args, heads));
  parallel_for(0, static_cast<int64_t>(items.size()), [&](int64_t i) {
    thread_local Scratch scratch;  // per thread, reused: no allocation per item
    scratch.reserve(args.q.shape[2], args.v.shape[2]);
    kernel.run(items[i], scratch);
  });
  kernel.write_empty_rows(args.cu_seqlens_q.back(), args.q.shape[0], heads);
}

}  // namespace mlakit::cpu
