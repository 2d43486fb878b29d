#include "cpu/merge.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/float_rows.hpp"
#include "cpu/parallel.hpp"

namespace mlakit::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

// Tokens per parallel work item: a few hundred rows of H heads amortize the scheduling cost
// while still leaving many items for the threads (T is in the thousands for prefill).
constexpr int64_t kTokensPerItem = 16;
// Elements of one row converted to f32 at a time: 3 stack buffers of 1 KiB stay in L1, and a
// whole row of the usual head sizes (128, 512) is read in one or two chunks.
constexpr int64_t kChunk = 256;

// LSE as the merge reads it: FA2 reports an empty key set as +inf, and NaN carries no usable
// weight, so both count as an empty set (-inf) and can never turn finite outputs into NaN.
float canonical_lse(float lse) { return (std::isnan(lse) || lse == kPosInf) ? kNegInf : lse; }

struct MergeWeights {
  float prefix;  // exp(p - lse): share of the prefix output
  float suffix;  // exp(s - lse): share of the suffix output
  float lse;     // ln(exp(p) + exp(s)), natural log; -inf when both sets are empty
};

MergeWeights merge_weights(float prefix_lse, float suffix_lse) {
  const float p = canonical_lse(prefix_lse), s = canonical_lse(suffix_lse);
  const float m = std::max(p, s);
  if (m == kNegInf) return {0.0f, 0.0f, kNegInf};
  const float pe = std::exp(p - m), se = std::exp(s - m);  // the larger one is exactly 1
  const float sum = pe + se;
  return {pe / sum, se / sum, m + std::log(sum)};
}

// out_row = w.prefix * prefix_row + w.suffix * suffix_row, chunk by chunk; each chunk of both
// inputs is read before that chunk of the output is written (outputs may alias inputs).
// rows: [D] contiguous elements, each row in its own dtype (e.g. f32 partial results merged
// into a bf16 output)
void merge_row(const MergeWeights& w, const TensorView& prefix, const void* prefix_row,
               const TensorView& suffix, const void* suffix_row, const TensorView& output,
               void* out_row, int64_t d) {
  float prefix_f[kChunk], suffix_f[kChunk], out[kChunk];
  for (int64_t c0 = 0; c0 < d; c0 += kChunk) {
    const int64_t n = std::min(kChunk, d - c0);
    std::fill_n(out, n, 0.0f);
    if (w.prefix != 0.0f) {
      load_row(static_cast<const char*>(prefix_row) + c0 * prefix.element_size(), prefix.dtype, 1,
               n, prefix_f);
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) out[j] += w.prefix * prefix_f[j];
    }
    if (w.suffix != 0.0f) {
      load_row(static_cast<const char*>(suffix_row) + c0 * suffix.element_size(), suffix.dtype, 1,
               n, suffix_f);
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) out[j] += w.suffix * suffix_f[j];
    }
    store_row(out, n, static_cast<char*>(out_row) + c0 * output.element_size(), output.dtype, 1);
  }
}

}  // namespace

void merge_attn_states(const TensorView& output,
                       const std::optional<TensorView>& output_lse_heads_tokens,
                       const TensorView& prefix_output, const TensorView& prefix_lse_heads_tokens,
                       const TensorView& suffix_output, const TensorView& suffix_lse_heads_tokens) {
  const int64_t tokens = output.shape[0], heads = output.shape[1], d = output.shape[2];
  const float* prefix_lse = prefix_lse_heads_tokens.data_as<const float>();  // [H, T]
  const float* suffix_lse = suffix_lse_heads_tokens.data_as<const float>();  // [H, T]
  float* out_lse = output_lse_heads_tokens ? output_lse_heads_tokens->data_as<float>() : nullptr;
  const int64_t num_items = (tokens + kTokensPerItem - 1) / kTokensPerItem;

  parallel_for(0, num_items, [&](int64_t item) {
    const int64_t t_end = std::min(tokens, (item + 1) * kTokensPerItem);
    for (int64_t t = item * kTokensPerItem; t < t_end; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const MergeWeights w = merge_weights(prefix_lse[h * prefix_lse_heads_tokens.strides[0] +
                                                        t * prefix_lse_heads_tokens.strides[1]],
                                             suffix_lse[h * suffix_lse_heads_tokens.strides[0] +
                                                        t * suffix_lse_heads_tokens.strides[1]]);
        if (d > 0) {  // D = 0: the states are empty and may have no data pointer to offset
          merge_row(w, prefix_output,
                    prefix_output.element_ptr(t * prefix_output.strides[0] +
                                              h * prefix_output.strides[1]),
                    suffix_output,
                    suffix_output.element_ptr(t * suffix_output.strides[0] +
                                              h * suffix_output.strides[1]),
                    output, output.element_ptr(t * output.strides[0] + h * output.strides[1]), d);
        }
        if (out_lse) {
          out_lse[h * output_lse_heads_tokens->strides[0] +
                  t * output_lse_heads_tokens->strides[1]] = w.lse;
        }
      }
    }
  });
}

}  // namespace mlakit::cpu
