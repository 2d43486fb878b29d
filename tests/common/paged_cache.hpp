// Random paged batches for the cache-gather tests (CPU and GPU): request lengths and
// token-granular starts, block tables whose rows are random permutations of the cache's blocks,
// the index tensors of the gather ops, and random caches of every entry format.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "mlakit/kv_cache.hpp"
#include "mlakit/types.hpp"

namespace mlakit::test {

struct PagedBatch {
  std::vector<int64_t> lens = {};    // per request
  std::vector<int64_t> starts = {};  // per request; empty: seq_starts absent
  int64_t block_size = 16;
  int64_t num_blocks = 64;
};

// `requests` random lengths in [0, 70] (zero included, rarely multiples of block_size; request 1
// is always empty) and, with `starts`, token-granular starts in [0, 90]; enough blocks for a
// permutation row of the widest possible request.
PagedBatch random_paged_batch(std::mt19937_64& rng, int64_t requests, int64_t block_size,
                              bool starts);

// The host index arrays of a batch. They stay editable (the error tests corrupt them); the i32
// index tensors of the gather ops are made from them on demand.
struct PagedIndices {
  std::vector<int64_t> table;         // [batch, width]: block ids
  std::vector<int64_t> cu;            // [batch + 1]: cu_seq_lens
  std::vector<int64_t> seq_of_token;  // [num_tokens]: token_to_seq
  std::vector<int64_t> starts;        // [batch], or empty: seq_starts absent
  int64_t width = 0, num_tokens = 0, batch = 0, block_size = 0;

  Tensor block_table() const;                // i32 [batch, width]
  Tensor cu_seq_lens() const;                // i32 [batch + 1]
  Tensor token_to_seq() const;               // i32 [num_tokens + 3]: 3 junk entries past num_tokens
  std::optional<Tensor> seq_starts() const;  // i32 [batch], or nullopt

  int64_t start_of(int64_t request) const;  // its seq_starts value; 0 without starts
  // Cache entry (block, offset) holding position `pos` of `request`.
  std::pair<int64_t, int64_t> locate(int64_t request, int64_t pos) const;
};

// Each block-table row is a random permutation prefix of all blocks (rows may share blocks), one
// column wider than the widest request needs.
PagedIndices make_paged_indices(std::mt19937_64& rng, const PagedBatch& batch);

// A random [num_blocks, block_size, width] cache in format `kv`: N(0, 1) values of `cache_dtype`
// for auto; random finite e4m3 codes (u8) otherwise, and for fp8_ds_mla positive f32 tile scales
// in [2^-12, 2^2) and N(0, 1) rope values stored in `rope_dtype`.
Tensor random_paged_cache(std::mt19937_64& rng, const PagedBatch& batch, KvCacheDType kv,
                          DType cache_dtype, int64_t width, DType rope_dtype);

// The view of an optional tensor (seq_starts), as the gather ops take it.
std::optional<TensorView> optional_view(const std::optional<Tensor>& t);

}  // namespace mlakit::test
