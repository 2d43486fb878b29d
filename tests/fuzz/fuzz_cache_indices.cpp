// libFuzzer target: the host-side index validation of the cache ops (concat_and_cache_mla,
// gather_and_maybe_dequant_cache, cp_gather_cache) through the C++ API. Shapes and dtypes are
// valid and small; the index contents (slot_mapping, block_table, cu_seq_lens, token_to_seq,
// seq_starts, num_tokens, batch_size) are random, mostly valid, sometimes just out of range,
// sometimes anything; index tensors may be strided.
//
// Invariants (a violation aborts; the sanitizers abort on their own):
//   - no crash, no sanitizer report (every tensor is exactly its memory);
//   - a call succeeds exactly when an independent reading of the spec (ops.hpp, spec A.3 / A.7)
//     says every index it uses is valid; a failure is an mlakit::Error with code out_of_range or
//     invalid_argument and leaves the output bytes unchanged;
//   - a success writes exactly what the spec says: every cache element carries a unique value, so
//     each gathered row is compared with the one entry it must come from, rows the call does not
//     own are unchanged, and each written cache slot holds one of the tokens mapped to it while
//     every other slot keeps its bytes.
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_support.hpp"
#include "mlakit/error.hpp"
#include "mlakit/ops.hpp"
#include "mlakit/types.hpp"

namespace mlakit::fuzz {
namespace {

// An index tensor, 1-D or 2-D, i32 or i64, whose innermost stride is 1 or 2 (a view of every
// other element of a wider buffer, whose padding is never read).
struct IndexTensor {
  std::vector<int64_t> values;  // logical row-major contents
  std::vector<int32_t> i32;     // the memory behind the view (one of the two)
  std::vector<int64_t> i64;
  TensorView view;

  int64_t at(int64_t i) const { return values[static_cast<size_t>(i)]; }
};

IndexTensor make_index(FuzzedDataProvider& in, std::vector<int64_t> values,
                       std::vector<int64_t> shape, DType dtype) {
  IndexTensor t;
  t.values = std::move(values);
  const int64_t step = in.ConsumeBool() ? 1 : 2;
  const size_t n = t.values.size();
  constexpr int64_t kPadding = -777;  // an index no check would accept anywhere
  std::vector<int64_t> wide(n * static_cast<size_t>(step), kPadding);
  for (size_t i = 0; i < n; ++i) wide[i * static_cast<size_t>(step)] = t.values[i];
  void* data = nullptr;
  if (dtype == DType::kI32) {
    t.i32.assign(wide.begin(), wide.end());
    data = t.i32.data();
  } else {
    t.i64 = std::move(wide);
    data = t.i64.data();
  }
  t.view.data = data;
  t.view.dtype = dtype;
  t.view.ndim = static_cast<int>(shape.size());
  int64_t stride = step;
  for (size_t d = shape.size(); d-- > 0;) {
    t.view.shape[d] = shape[d];
    t.view.strides[d] = stride;
    stride *= shape[d];
  }
  return t;
}

int64_t draw_index(FuzzedDataProvider& in, int64_t lo, int64_t hi) {
  switch (in.ConsumeIntegralInRange(0, 15)) {
    case 0:
      return lo - 1;
    case 1:
      return hi + 1;
    case 2:
      return in.ConsumeIntegral<int32_t>();
    default:
      return in.ConsumeIntegralInRange(lo, std::max(lo, hi));
  }
}

// A host f32 tensor whose element i holds base + i: every element is unique and exact.
Tensor unique_tensor(std::initializer_list<int64_t> shape, float base) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = base + static_cast<float>(i);
  return t;
}

std::vector<unsigned char> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.view().data);
  return {p, p + t.numel() * t.view().element_size()};
}

// Runs `call`; returns the error code it threw, or nullopt on success. Any other exception is a
// finding.
template <class Call>
std::optional<ErrorCode> outcome(const char* op, Call&& call) {
  try {
    call();
    return std::nullopt;
  } catch (const Error& e) {
    MLAKIT_FUZZ_EXPECT(
        e.code() == ErrorCode::kOutOfRange || e.code() == ErrorCode::kInvalidArgument,
        std::string(op) + " threw code " + std::to_string(int(e.code())) + ": " + e.what());
    MLAKIT_FUZZ_EXPECT(std::string(e.what()).rfind(std::string(op) + ": ", 0) == 0,
                       std::string("message does not name the op: ") + e.what());
    return e.code();
  }
}

// ---- concat_and_cache_mla -----------------------------------------------------------------------

void fuzz_concat(FuzzedDataProvider& in) {
  const int64_t blocks = in.ConsumeIntegralInRange<int64_t>(1, 5);
  const int64_t block_size = in.ConsumeIntegralInRange<int64_t>(1, 5);
  const int64_t rank = in.ConsumeIntegralInRange<int64_t>(1, 6);
  const int64_t rope = in.ConsumeIntegralInRange<int64_t>(1, 3);
  const int64_t tokens = in.ConsumeIntegralInRange<int64_t>(0, 12);
  const int64_t slots = blocks * block_size;
  std::vector<int64_t> slot_values;
  for (int64_t t = 0; t < tokens; ++t) slot_values.push_back(draw_index(in, -2, slots - 1));
  const IndexTensor slot_mapping = make_index(in, slot_values, {tokens}, DType::kI64);
  const Tensor kv_c = unique_tensor({tokens, rank}, 1e6f);
  const Tensor k_pe = unique_tensor({tokens, rope}, 2e6f);
  Tensor cache = unique_tensor({blocks, block_size, rank + rope}, 0.0f);
  const std::vector<unsigned char> before = bytes_of(cache);

  bool valid = true;
  for (int64_t t = 0; t < tokens; ++t) valid &= slot_mapping.at(t) < slots;
  const std::optional<ErrorCode> error = outcome("concat_and_cache_mla", [&] {
    ops::concat_and_cache_mla(kv_c, k_pe, cache, slot_mapping.view, KvCacheDType::kAuto, 1.0f);
  });
  MLAKIT_FUZZ_EXPECT(valid == !error.has_value(),
                     valid ? "valid slots were rejected" : "a slot past the cache was accepted");
  if (error) {
    MLAKIT_FUZZ_EXPECT(bytes_of(cache) == before, "a rejected call wrote into kv_cache");
    return;
  }
  const int64_t width = rank + rope;
  const float* got = cache.data<float>();
  for (int64_t s = 0; s < slots; ++s) {
    bool mapped = false, matches_one = false;
    for (int64_t t = 0; t < tokens; ++t) {
      if (slot_mapping.at(t) != s) continue;
      mapped = true;
      bool same = true;
      for (int64_t i = 0; i < rank; ++i)
        same &= got[s * width + i] == kv_c.data<float>()[t * rank + i];
      for (int64_t i = 0; i < rope; ++i)
        same &= got[s * width + rank + i] == k_pe.data<float>()[t * rope + i];
      matches_one |= same;
    }
    if (!mapped) {
      MLAKIT_FUZZ_EXPECT(std::memcmp(got + s * width, before.data() + s * width * sizeof(float),
                                     static_cast<size_t>(width) * sizeof(float)) == 0,
                         "slot " + std::to_string(s) + " was written but no token maps to it");
    } else {
      MLAKIT_FUZZ_EXPECT(
          matches_one, "slot " + std::to_string(s) + " holds no entry of the tokens mapped to it");
    }
  }
}

// ---- the gathers --------------------------------------------------------------------------------

struct GatherBatch {
  int64_t blocks, block_size, width, batch, table_width;
  std::vector<int64_t> cu, starts, table;
  bool with_starts;
};

GatherBatch draw_batch(FuzzedDataProvider& in) {
  GatherBatch g;
  g.blocks = in.ConsumeIntegralInRange<int64_t>(1, 5);
  g.block_size = in.ConsumeIntegralInRange<int64_t>(1, 5);
  g.width = in.ConsumeIntegralInRange<int64_t>(1, 6);
  g.batch = in.ConsumeIntegralInRange<int64_t>(0, 4);
  g.table_width = in.ConsumeIntegralInRange<int64_t>(0, 4);
  g.cu = {in.ConsumeIntegralInRange(0, 15) == 0 ? in.ConsumeIntegralInRange<int64_t>(-2, 2) : 0};
  for (int64_t b = 0; b < g.batch; ++b) {
    const int64_t len = in.ConsumeIntegralInRange(0, 15) == 0
                            ? in.ConsumeIntegralInRange<int64_t>(-3, 3)
                            : in.ConsumeIntegralInRange<int64_t>(0, g.table_width * g.block_size);
    g.cu.push_back(g.cu.back() + len);
  }
  for (int64_t b = 0; b < g.batch; ++b) {
    g.starts.push_back(draw_index(in, 0, g.block_size * 2));
  }
  for (int64_t i = 0; i < g.batch * g.table_width; ++i) {
    g.table.push_back(draw_index(in, 0, g.blocks - 1));
  }
  g.with_starts = in.ConsumeBool();
  return g;
}

// Block id the spec reads for request b at `position`, or nullopt if the column or id is bad.
std::optional<int64_t> block_at(const GatherBatch& g, int64_t b, int64_t position) {
  if (position < 0) return std::nullopt;
  const int64_t column = position / g.block_size;
  if (column >= g.table_width) return std::nullopt;
  const int64_t id = g.table[static_cast<size_t>(b * g.table_width + column)];
  if (id < 0 || id >= g.blocks) return std::nullopt;
  return id;
}

bool requests_valid(const GatherBatch& g) {
  if (g.cu[0] < 0) return false;
  for (int64_t b = 0; b < g.batch; ++b) {
    if (g.cu[b + 1] < g.cu[b]) return false;
    if (g.with_starts && g.starts[b] < 0) return false;
  }
  return true;
}

int64_t start_of(const GatherBatch& g, int64_t b) { return g.with_starts ? g.starts[b] : 0; }

// Element of the unique-valued cache at (block, offset, i).
float cache_value(const GatherBatch& g, int64_t block, int64_t offset, int64_t i) {
  return static_cast<float>((block * g.block_size + offset) * g.width + i);
}

void fuzz_gather(FuzzedDataProvider& in) {
  GatherBatch g = draw_batch(in);
  const int64_t rows = in.ConsumeIntegralInRange<int64_t>(0, 14);
  std::vector<int64_t> token_to_seq;
  for (int64_t t = 0; t < rows; ++t) {
    int64_t owner = 0;
    for (int64_t b = 0; b < g.batch; ++b)
      if (g.cu[b] <= t) owner = b;
    token_to_seq.push_back(in.ConsumeIntegralInRange(0, 7) == 0 ? draw_index(in, 0, g.batch)
                                                                : owner);
  }
  const int64_t num_tokens = in.ConsumeIntegralInRange<int64_t>(0, rows);
  const Tensor cache = unique_tensor({g.blocks, g.block_size, g.width}, 0.0f);
  Tensor dst = unique_tensor({rows, g.width}, -1e6f);
  const std::vector<unsigned char> before = bytes_of(dst);
  const IndexTensor table = make_index(in, g.table, {g.batch, g.table_width}, DType::kI32);
  const IndexTensor cu = make_index(in, g.cu, {g.batch + 1}, DType::kI32);
  const IndexTensor owners = make_index(in, token_to_seq, {rows}, DType::kI32);
  const IndexTensor starts = make_index(in, g.starts, {g.batch}, DType::kI32);

  // The spec's reading: token t of request b = token_to_seq[t] (one of b's rows) comes from
  // position t - cu[b] + start[b].
  bool valid = requests_valid(g);
  std::vector<int64_t> source(static_cast<size_t>(num_tokens), -1);  // block * bs + offset
  for (int64_t t = 0; t < num_tokens && valid; ++t) {
    const int64_t b = token_to_seq[t];
    valid = b >= 0 && b < g.batch && g.cu[b] <= t && t < g.cu[b + 1];
    if (!valid) break;
    const int64_t position = t - g.cu[b] + start_of(g, b);
    const std::optional<int64_t> block = block_at(g, b, position);
    valid = block.has_value();
    if (valid) source[t] = *block * g.block_size + position % g.block_size;
  }
  const std::optional<ErrorCode> error = outcome("gather_and_maybe_dequant_cache", [&] {
    ops::gather_and_maybe_dequant_cache(
        cache, dst, table.view, cu.view, owners.view, num_tokens, KvCacheDType::kAuto, 1.0f,
        g.with_starts ? std::optional<TensorView>(starts.view) : std::nullopt);
  });
  MLAKIT_FUZZ_EXPECT(valid == !error.has_value(),
                     valid ? "valid indices were rejected" : "a bad index was accepted");
  if (error) {
    MLAKIT_FUZZ_EXPECT(bytes_of(dst) == before, "a rejected gather wrote into dst");
    return;
  }
  const float* got = dst.data<float>();
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t i = 0; i < g.width; ++i) {
      const float want = t < num_tokens
                             ? cache_value(g, source[t] / g.block_size, source[t] % g.block_size, i)
                             : -1e6f + static_cast<float>(t * g.width + i);
      MLAKIT_FUZZ_EXPECT(got[t * g.width + i] == want,
                         "dst[" + std::to_string(t) + ", " + std::to_string(i) + "] is " +
                             std::to_string(got[t * g.width + i]) + ", the spec says " +
                             std::to_string(want));
    }
  }
}

void fuzz_cp_gather(FuzzedDataProvider& in) {
  const GatherBatch g = draw_batch(in);
  const int64_t rows = in.ConsumeIntegralInRange<int64_t>(0, 14);
  const int64_t batch_size = in.ConsumeIntegralInRange(0, 7) == 0
                                 ? in.ConsumeIntegralInRange<int64_t>(-1, g.batch)
                                 : g.batch;
  const Tensor cache = unique_tensor({g.blocks, g.block_size, g.width}, 0.0f);
  Tensor dst = unique_tensor({rows, g.width}, -1e6f);
  const std::vector<unsigned char> before = bytes_of(dst);
  const IndexTensor table = make_index(in, g.table, {g.batch, g.table_width}, DType::kI32);
  const IndexTensor cu = make_index(in, g.cu, {g.batch + 1}, DType::kI32);
  const IndexTensor starts = make_index(in, g.starts, {g.batch}, DType::kI32);

  // The spec's reading: request b < batch_size copies positions [start, start + len) to rows
  // [cu[b], cu[b + 1]); every row must exist and every position must have a block.
  bool valid = batch_size >= 0;
  GatherBatch used = g;
  used.batch = std::max<int64_t>(batch_size, 0);
  valid = valid && requests_valid(used) && g.cu[used.batch] <= rows;
  std::vector<int64_t> source(static_cast<size_t>(rows), -1);
  for (int64_t b = 0; b < used.batch && valid; ++b) {
    for (int64_t row = g.cu[b]; row < g.cu[b + 1] && valid; ++row) {
      const int64_t position = start_of(g, b) + row - g.cu[b];
      const std::optional<int64_t> block = block_at(g, b, position);
      valid = block.has_value();
      if (valid) source[row] = *block * g.block_size + position % g.block_size;
    }
  }
  const std::optional<ErrorCode> error = outcome("cp_gather_cache", [&] {
    ops::cp_gather_cache(cache, dst, table.view, cu.view, batch_size,
                         g.with_starts ? std::optional<TensorView>(starts.view) : std::nullopt);
  });
  MLAKIT_FUZZ_EXPECT(valid == !error.has_value(),
                     valid ? "valid indices were rejected" : "a bad index was accepted");
  if (error) {
    MLAKIT_FUZZ_EXPECT(bytes_of(dst) == before, "a rejected cp_gather wrote into dst");
    return;
  }
  const float* got = dst.data<float>();
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t i = 0; i < g.width; ++i) {
      const int64_t s = source[row];
      const float want = s >= 0 ? cache_value(g, s / g.block_size, s % g.block_size, i)
                                : -1e6f + static_cast<float>(row * g.width + i);
      MLAKIT_FUZZ_EXPECT(got[row * g.width + i] == want,
                         "dst[" + std::to_string(row) + ", " + std::to_string(i) + "] is " +
                             std::to_string(got[row * g.width + i]) + ", the spec says " +
                             std::to_string(want));
    }
  }
}

}  // namespace
}  // namespace mlakit::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mlakit::fuzz;
  FuzzedDataProvider in(data, size);
  switch (in.ConsumeIntegralInRange(0, 2)) {
    case 0:
      fuzz_concat(in);
      break;
    case 1:
      fuzz_gather(in);
      break;
    default:
      fuzz_cp_gather(in);
      break;
  }
  return 0;
}
