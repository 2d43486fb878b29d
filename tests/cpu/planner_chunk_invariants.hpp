// Test-side checks of the chunked-context plan (spec B.6, D.12 chunk_planner) shared by the
// planner tests, and the random context lengths the property tests draw. Independent of the
// planner: they only read its output.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "mlakit/plan.hpp"

namespace mlakit::test {

// Random batches per property test: >= 10,000 in optimised builds; sanitizer builds run about
// ten times slower and CI runs both, so they check a fifth of that.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr int kRandomBatches = 2000;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr int kRandomBatches = 2000;
#else
inline constexpr int kRandomBatches = 10000;
#endif
#else
inline constexpr int kRandomBatches = 10000;
#endif

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Checks every chunk invariant: each context token in exactly one piece (pieces of a request in
// order, each starting where the previous ended), page-aligned starts, 0 < total <= workspace,
// cu_seq_lens / token_to_seq / max_seq_len consistent with seq_lens, empty pieces at start 0, and
// no piece reading a block-table column >= readable_blocks[r] (cdiv(seq_len, block_size)).
// context_lens, readable_blocks: [np].
inline ::testing::AssertionResult chunks_are_valid(std::span<const int32_t> context_lens,
                                                   std::span<const int64_t> readable_blocks,
                                                   int64_t block_size, int64_t workspace_tokens,
                                                   const std::vector<ContextChunk>& chunks) {
  const size_t np = context_lens.size();
  const bool any_context =
      std::any_of(context_lens.begin(), context_lens.end(), [](int32_t c) { return c > 0; });
  if (chunks.empty() != !any_context) {
    return ::testing::AssertionFailure()
           << chunks.size() << " chunks, but any_context = " << any_context;
  }
  std::vector<int64_t> covered(np, 0);  // context positions [0, covered[r]) already gathered
  for (size_t c = 0; c < chunks.size(); ++c) {
    const ContextChunk& chunk = chunks[c];
    auto fail = [&]() { return ::testing::AssertionFailure() << "chunk " << c << ": "; };
    if (chunk.starts.size() != np || chunk.seq_lens.size() != np ||
        chunk.cu_seq_lens.size() != np + 1 ||
        chunk.token_to_seq.size() != static_cast<size_t>(chunk.total_tokens)) {
      return fail() << "wrong array sizes";
    }
    if (chunk.total_tokens <= 0 || chunk.total_tokens > workspace_tokens) {
      return fail() << "total_tokens " << chunk.total_tokens << " outside (0, " << workspace_tokens
                    << "]";
    }
    if (chunk.cu_seq_lens[0] != 0) return fail() << "cu_seq_lens[0] != 0";
    int64_t max_len = 0;
    for (size_t r = 0; r < np; ++r) {
      const int64_t start = chunk.starts[r], len = chunk.seq_lens[r];
      if (len < 0) return fail() << "negative seq_len for request " << r;
      if (chunk.cu_seq_lens[r + 1] - chunk.cu_seq_lens[r] != len) {
        return fail() << "cu_seq_lens inconsistent at request " << r;
      }
      for (int32_t row = chunk.cu_seq_lens[r]; row < chunk.cu_seq_lens[r + 1]; ++row) {
        if (chunk.token_to_seq[row] != static_cast<int32_t>(r)) {
          return fail() << "token_to_seq[" << row << "] = " << chunk.token_to_seq[row]
                        << ", expected " << r;
        }
      }
      max_len = std::max(max_len, len);
      if (len == 0) {
        if (start != 0) return fail() << "empty piece of request " << r << " starts at " << start;
        continue;
      }
      if (start != covered[r]) {
        return fail() << "request " << r << " piece starts at " << start << ", expected "
                      << covered[r] << " (gap or overlap)";
      }
      if (start % block_size != 0) {
        return fail() << "request " << r << " piece start " << start << " not a multiple of "
                      << block_size;
      }
      if ((start + len - 1) / block_size >= readable_blocks[r]) {
        return fail() << "request " << r << " piece [" << start << ", " << start + len
                      << ") reads block-table column " << (start + len - 1) / block_size
                      << " >= " << readable_blocks[r];
      }
      covered[r] += len;
    }
    if (chunk.cu_seq_lens[np] != chunk.total_tokens) return fail() << "cu_seq_lens[np] != total";
    if (chunk.max_seq_len != max_len) {
      return fail() << "max_seq_len " << chunk.max_seq_len << ", expected " << max_len;
    }
  }
  for (size_t r = 0; r < np; ++r) {
    if (covered[r] != context_lens[r]) {
      return ::testing::AssertionFailure() << "request " << r << " covered " << covered[r] << " of "
                                           << context_lens[r] << " context tokens";
    }
  }
  return ::testing::AssertionSuccess();
}

// Log-uniform integer in [lo, hi]: small values as likely as large ones per decade.
inline int32_t log_uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  const double x = std::uniform_real_distribution<double>(std::log(lo), std::log(hi + 1.0))(rng);
  return static_cast<int32_t>(std::clamp<int64_t>(static_cast<int64_t>(std::exp(x)), lo, hi));
}

struct RandomChunkConfig {
  int64_t block_size;
  int64_t workspace_tokens;
  ChunkPolicy policy;
};

// Block sizes {1, 16, 64, 128}; workspaces from a few blocks to 65536 rows; either policy.
inline RandomChunkConfig random_chunk_config(std::mt19937_64& rng) {
  const int64_t block_sizes[] = {1, 16, 64, 128};
  const int64_t block_size = block_sizes[std::uniform_int_distribution<int>(0, 3)(rng)];
  int64_t workspace = 65536;  // the B.2 cap
  switch (std::uniform_int_distribution<int>(0, 3)(rng)) {
    case 0:  // a few blocks: many chunks, and fewer pages than requests
      workspace = block_size * std::uniform_int_distribution<int64_t>(1, 8)(rng);
      break;
    case 1:
      workspace = std::uniform_int_distribution<int64_t>(block_size, 4096)(rng);
      break;
    case 2:
      workspace = std::uniform_int_distribution<int64_t>(4096, 65536)(rng);
      break;
    default:
      break;
  }
  const ChunkPolicy policy =
      std::bernoulli_distribution(0.5)(rng) ? ChunkPolicy::kPacked : ChunkPolicy::kEqualShare;
  return {block_size, workspace, policy};
}

// [np] context lengths in [0, 200000], many of them 0. Most are short (< 4096) and one in twenty
// is long, so a batch stays cheap enough for 10,000 of them; contexts are capped at 64
// workspaces so that tiny workspaces give hundreds of chunks, not millions. One in ten sits at a
// page boundary +-1.
inline std::vector<int32_t> random_context_lens(std::mt19937_64& rng, int64_t np,
                                                const RandomChunkConfig& config) {
  const double zero_probabilities[] = {0.1, 0.5, 0.9};
  const double zero_probability = zero_probabilities[std::uniform_int_distribution<int>(0, 2)(rng)];
  // 200k tokens is a long DeepSeek context; 64 workspaces bounds the chunk count per request.
  const int64_t max_context = std::min<int64_t>(200000, 64 * config.workspace_tokens);
  // Contexts below 4096 tokens are the common case.
  const int64_t max_short = std::min<int64_t>(max_context, 4096);
  std::vector<int32_t> contexts(np, 0);
  for (int32_t& c : contexts) {
    if (std::bernoulli_distribution(zero_probability)(rng)) continue;
    c = log_uniform(rng, 1, std::bernoulli_distribution(0.05)(rng) ? max_context : max_short);
    if (std::bernoulli_distribution(0.1)(rng)) {
      const int64_t page_edge = std::max<int64_t>(c / config.block_size, 1) * config.block_size;
      c = static_cast<int32_t>(page_edge + std::uniform_int_distribution<int64_t>(-1, 1)(rng));
    }
  }
  return contexts;
}

}  // namespace mlakit::test
