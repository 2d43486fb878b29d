#include "common/paged_cache.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "common/test_util.hpp"
#include "mlakit/dtype.hpp"

namespace mlakit::test {
namespace {

// A random finite e4m3 code (0x7f and 0xff are NaN).
uint8_t random_fp8_code(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> code(0, 253);
  const int c = code(rng);
  return static_cast<uint8_t>(c < 0x7f ? c : c + 1);  // skip 0x7f; 253 + 1 = 0xfe < 0xff
}

}  // namespace

PagedBatch random_paged_batch(std::mt19937_64& rng, int64_t requests, int64_t block_size,
                              bool starts) {
  constexpr int64_t kMaxLen = 70, kMaxStart = 90;  // several blocks per request at bs 16
  std::uniform_int_distribution<int64_t> len(0, kMaxLen), start(0, kMaxStart);
  // Enough blocks for a permutation row of the widest possible request (plus the spare column).
  const int64_t blocks = std::max<int64_t>(64, (kMaxLen + kMaxStart) / block_size + 2);
  PagedBatch b{.block_size = block_size, .num_blocks = blocks};
  for (int64_t r = 0; r < requests; ++r) {
    b.lens.push_back(r == 1 ? 0 : len(rng));  // request 1 is always empty
    if (starts) b.starts.push_back(start(rng));
  }
  return b;
}

Tensor PagedIndices::block_table() const { return int_tensor(table, {batch, width}, DType::kI32); }

Tensor PagedIndices::cu_seq_lens() const { return int_tensor(cu, {batch + 1}, DType::kI32); }

Tensor PagedIndices::token_to_seq() const {
  std::vector<int64_t> padded = seq_of_token;
  padded.insert(padded.end(), {1 << 30, -7, 1 << 30});  // never read: past num_tokens
  return int_tensor(padded, {static_cast<int64_t>(padded.size())}, DType::kI32);
}

std::optional<Tensor> PagedIndices::seq_starts() const {
  if (starts.empty()) return std::nullopt;
  return int_tensor(starts, {batch}, DType::kI32);
}

int64_t PagedIndices::start_of(int64_t request) const {
  return starts.empty() ? 0 : starts[request];
}

std::pair<int64_t, int64_t> PagedIndices::locate(int64_t request, int64_t pos) const {
  return {table[request * width + pos / block_size], pos % block_size};
}

PagedIndices make_paged_indices(std::mt19937_64& rng, const PagedBatch& batch) {
  PagedIndices ix;
  ix.batch = static_cast<int64_t>(batch.lens.size());
  ix.block_size = batch.block_size;
  ix.starts = batch.starts;
  ix.cu.push_back(0);
  for (int64_t r = 0; r < ix.batch; ++r) {
    ix.cu.push_back(ix.cu.back() + batch.lens[r]);
    const int64_t end = ix.start_of(r) + batch.lens[r];
    ix.width = std::max(ix.width, (end + batch.block_size - 1) / batch.block_size);
    ix.seq_of_token.insert(ix.seq_of_token.end(), batch.lens[r], r);
  }
  ix.width += 1;  // a spare column: the table may be wider than any request needs
  EXPECT_LE(ix.width, batch.num_blocks) << "test setup: too few blocks for a permutation row";
  std::vector<int64_t> blocks(batch.num_blocks);
  std::iota(blocks.begin(), blocks.end(), 0);
  for (int64_t r = 0; r < ix.batch; ++r) {
    std::shuffle(blocks.begin(), blocks.end(), rng);
    ix.table.insert(ix.table.end(), blocks.begin(), blocks.begin() + ix.width);
  }
  ix.num_tokens = ix.cu.back();
  return ix;
}

Tensor random_paged_cache(std::mt19937_64& rng, const PagedBatch& batch, KvCacheDType kv,
                          DType cache_dtype, int64_t width, DType rope_dtype) {
  if (kv == KvCacheDType::kAuto)
    return random_tensor(rng, {batch.num_blocks, batch.block_size, width}, cache_dtype);
  Tensor cache = Tensor::empty({batch.num_blocks, batch.block_size, width}, DType::kU8);
  auto* bytes = cache.data<uint8_t>();
  for (int64_t i = 0; i < cache.numel(); ++i) bytes[i] = random_fp8_code(rng);
  if (kv == KvCacheDType::kFp8DsMla) {
    std::uniform_real_distribution<double> log_scale(-12, 2);
    std::normal_distribution<double> value(0, 1);
    for (int64_t e = 0; e < batch.num_blocks * batch.block_size; ++e) {
      uint8_t* entry = bytes + e * width;
      for (int64_t tile = 0; tile < kDsMlaNumTiles; ++tile) {
        const float s = static_cast<float>(std::exp2(log_scale(rng)));
        std::memcpy(entry + kDsMlaScaleOffset + 4 * tile, &s, 4);
      }
      for (int64_t i = 0; i < kDsMlaRopeDim; ++i)
        store_float(entry + kDsMlaRopeOffset, rope_dtype, i, static_cast<float>(value(rng)));
    }
  }
  return cache;
}

std::optional<TensorView> optional_view(const std::optional<Tensor>& t) {
  if (!t) return std::nullopt;
  return t->view();
}

}  // namespace mlakit::test
