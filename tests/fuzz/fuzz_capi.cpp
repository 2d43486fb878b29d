// libFuzzer target: the C ABI's tensor description and argument validation (mlakit.h), on host
// tensors: every op entry point and an MlaAttention layer's creation, plan and forward step. Each
// input picks one entry point, builds a valid call for random small dimensions
// (cache format, dtypes, lengths, index contents), then applies up to a few defects: a wrong
// size or rank, another dtype (also ones DLPack has and mlakit does not), odd strides (zero,
// negative, huge), another device, a misaligned or NULL data pointer, a NULL tensor, bad scalars
// (scales, kv_cache_dtype, counts). The ops that take a scale also run in their tensor-scale form
// (and fp8 quantization as dynamic_scaled_fp8_quant), the scale a one-element f32 tensor that may
// get one such defect itself; the decode entries take q_scale and k_scale as NULL, one-element or
// per-request [B] tensors (any stride), which may get a defect or sit inside an output's memory.
//
// Invariants (a violation aborts; the sanitizers abort on their own):
//   - no crash, no AddressSanitizer or UndefinedBehaviorSanitizer report: nothing outside the
//     described elements is read or written (every tensor has exactly its extent as memory);
//   - the status is MLAKIT_OK or a caller's-fault status (invalid_argument, out_of_range,
//     unsupported), never backend or internal; a failure leaves a message that starts with the
//     op's name (or with the name of the piece the op hands the argument to: MlaDims, KvCacheSpec,
//     absorb_kv_b_proj, make_plan);
//   - a success with finite inputs, moderate scales (<= 100: larger ones overflow the f32 logits)
//     and dense outputs passes cheap checks: decode, prefill and merge rows are finite, their LSE
//     is finite or -inf (never NaN or +inf) and an -inf row is 0; fp8 quantization of finite values
//     gives no NaN code;
//   - a success through a scale tensor had a tensor the library must accept (present, backed, f32,
//     every dimension 1, 4-byte aligned, host memory, strides >= 0) holding a value the float form
//     accepts where it is used; the dynamic quantization of finite dense input wrote scale =
//     amax(|input|) / 448 exactly, and with it codes that are all 0 (scale 0) or include +-448 (the
//     amax element);
//   - decode scale tensors (mlakit.h): a success had each NULL or f32 of one element or [B], on the
//     host, apart from out, lse and split_workspace, holding values finite and > 0 (checked whether
//     or not they apply); a call valid but for its scales fails naming a bad one, and with valid
//     tensors the first bad value as "q_scale[b]" / "k_scale[b]" ("q_scale" where one element
//     serves every request).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "fuzz_support.hpp"
#include "mlakit/mlakit.h"

namespace mlakit::fuzz {
namespace {

// Dimensions of one call: small, so that one execution stays cheap.
struct Dims {
  int64_t batch, s_q, heads, rank, rope, block_size, num_blocks, width;
  int32_t kv_format;  // mlakit_kv_cache_dtype_t
  DLDataType act;

  int64_t entry_dim() const { return rank + rope; }
  int64_t entry_width() const {
    return kv_format == MLAKIT_KV_CACHE_FP8_DS_MLA ? 656 : rank + rope;
  }
  DLDataType cache_dtype() const { return kv_format == MLAKIT_KV_CACHE_AUTO ? act : kDlU8; }
};

Dims draw_dims(FuzzedDataProvider& in) {
  Dims d;
  d.kv_format = in.ConsumeIntegralInRange<int32_t>(0, 2);
  const DLDataType acts[] = {kDlF32, kDlF16, kDlBF16};
  d.act = in.PickValueInArray(acts);
  d.batch = in.ConsumeIntegralInRange<int64_t>(1, 4);
  d.s_q = in.ConsumeIntegralInRange<int64_t>(1, 3);
  d.heads = in.ConsumeIntegralInRange<int64_t>(1, 4);
  d.rank = in.ConsumeIntegralInRange<int64_t>(1, 16);
  d.rope = in.ConsumeIntegralInRange<int64_t>(1, 8);
  d.block_size = in.ConsumeIntegralInRange<int64_t>(1, 8);
  d.num_blocks = in.ConsumeIntegralInRange<int64_t>(1, 8);
  d.width = in.ConsumeIntegralInRange<int64_t>(1, 4);
  if (d.kv_format == MLAKIT_KV_CACHE_FP8_DS_MLA) {  // the only dims of the 656-byte layout
    d.rank = 512;
    d.rope = 64;
    if (d.act.bits == 32) d.act = kDlBF16;
  }
  return d;
}

// The tensors of one call (stable addresses) plus the defects applied to them.
struct Call {
  std::deque<FuzzTensor> tensors;
  FuzzTensor& add(const char* name, std::vector<int64_t> shape, DLDataType dtype,
                  Fill fill = Fill::kFinite, std::vector<int64_t> values = {}) {
    FuzzTensor& t = tensors.emplace_back();
    t.name = name;
    t.shape = std::move(shape);
    t.dtype = dtype;
    t.fill = fill;
    t.values = std::move(values);
    return t;
  }
  // Half of the calls stay valid; the others get one to three defects (counted in `defects`).
  void break_some(FuzzedDataProvider& in) {
    if (in.ConsumeBool()) return;
    const int count = in.ConsumeIntegralInRange(1, 3);
    for (int i = 0; i < count && !tensors.empty(); ++i) {
      mutate(in, tensors[in.ConsumeIntegralInRange<size_t>(0, tensors.size() - 1)]);
      ++defects;
    }
  }
  int defects = 0;
  void materialize_all(Rng& rng) {
    call_description().clear();
    for (FuzzTensor& t : tensors) {
      materialize(t, rng);
      call_description() += describe(t) + "; ";
    }
  }
};

// A scale: usually valid, sometimes zero, negative, NaN, infinite or with an infinite reciprocal.
float draw_scale(FuzzedDataProvider& in) {
  const float odd[] = {0.0f, -1.0f, NAN, INFINITY, 1e-39f, 3e38f};
  if (in.ConsumeIntegralInRange(0, 7) == 0) return in.PickValueInArray(odd);
  return in.ConsumeFloatingPointInRange(0.01f, 4.0f);
}

// A scale under which finite inputs give finite logits (|q.k| <= 16 x 576 here): with a scale
// near FLT_MAX the logits overflow f32 and the attention of those rows is not defined, so the
// finiteness checks apply to scales up to 100 only.
bool moderate(float scale) { return scale <= 100.0f; }

// The scale argument of a tensor-scale entry: f32 of one element (rank 0 to 2, now and then on
// pinned host memory) holding `value`, given one defect a third of the time. Added to `c` after
// its other tensors were materialized, so that their contents do not depend on this draw.
const FuzzTensor& add_scale_tensor(FuzzedDataProvider& in, Rng& rng, Call& c, float value) {
  const std::vector<int64_t> shapes[] = {{}, {1}, {1, 1}};
  FuzzTensor& s = c.add("scale", in.PickValueInArray(shapes), kDlF32);
  if (in.ConsumeIntegralInRange(0, 7) == 0) s.device = DLDevice{kDLCUDAHost, 0};
  if (in.ConsumeIntegralInRange(0, 2) == 0) mutate(in, s);
  materialize(s, rng);
  if (s.backed && to_mlakit_dtype(s.dtype) == DType::kF32) {  // element 0 sits at byte_offset
    std::memcpy(s.bytes.data() + s.tensor.byte_offset, &value, sizeof(value));
  }
  call_description() += describe(s) + " value " + std::to_string(value) + "; ";
  return s;
}

// Whether the library must accept `s` as a scale tensor, its value aside: present, f32, host
// memory, at most 4 dimensions, sizes and strides >= 0 (every tensor's rule), one element (any
// shape) or, for a per-request scale of a `batch` >= 0, the shape [batch] (any stride), and memory
// 4-byte aligned behind its elements.
bool valid_scale_tensor(const FuzzTensor& s, int64_t batch = -1) {
  int32_t device_type = 0;  // any int (a defect): not read as the enum
  std::memcpy(&device_type, &s.device.device_type, sizeof(device_type));
  bool non_negative = s.shape.size() <= 4, one_element = true;
  for (int64_t size : s.shape) {
    non_negative &= size >= 0;
    one_element &= size == 1;
  }
  for (int64_t stride : s.strides) non_negative &= stride >= 0;
  const bool per_request = batch >= 0 && s.shape.size() == 1 && s.shape[0] == batch;
  // A [0] tensor (batch 0) has no element to back or align: its data pointer is not looked at.
  const bool empty = per_request && batch == 0;
  return !s.absent && non_negative && (one_element || per_request) &&
         (empty || (s.backed && s.misalign % 4 == 0)) && to_mlakit_dtype(s.dtype) == DType::kF32 &&
         (device_type == kDLCPU || device_type == kDLCUDAHost);
}

// A success through scale tensor `s` (holding `value`): the tensor was valid and, where the op
// uses the value (`value_used`), it is finite and > 0, with a finite reciprocal where the op
// multiplies by that (`reciprocal`).
void expect_scale_checked(const char* op, mlakit_status_t status, const FuzzTensor& s, float value,
                          bool value_used, bool reciprocal) {
  if (status != MLAKIT_OK) return;
  MLAKIT_FUZZ_EXPECT(valid_scale_tensor(s), std::string(op) + " accepted a bad scale tensor");
  if (!value_used) return;
  MLAKIT_FUZZ_EXPECT(
      std::isfinite(value) && value > 0.0f && (!reciprocal || std::isfinite(1.0f / value)),
      std::string(op) + " accepted scale value " + std::to_string(value));
}

int32_t draw_kv_format(FuzzedDataProvider& in, int32_t valid) {
  if (in.ConsumeIntegralInRange(0, 15) == 0) return in.ConsumeIntegral<int32_t>();
  return valid;
}

// An index value: usually valid (in [lo, hi]), sometimes just outside or anywhere.
int64_t draw_index(FuzzedDataProvider& in, Rng& rng, int64_t lo, int64_t hi) {
  const int wild = in.ConsumeIntegralInRange(0, 31);
  if (wild == 0) return lo - 1;
  if (wild == 1) return hi + 1;
  if (wild == 2) return static_cast<int32_t>(rng());
  return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
}

// Sequence lengths of a decode batch: 0 or in [s_q, limit] (a seq_len counts the new tokens).
std::vector<int64_t> draw_seq_lens(FuzzedDataProvider& in, Rng& rng, const Dims& d) {
  std::vector<int64_t> lens;
  const int64_t limit = d.width * d.block_size;
  for (int64_t b = 0; b < d.batch; ++b) {
    if (limit < d.s_q || rng() % 4 == 0) {
      lens.push_back(in.ConsumeIntegralInRange(0, 31) == 0 ? 1 : 0);
    } else {
      lens.push_back(draw_index(in, rng, d.s_q, limit));
    }
  }
  return lens;
}

// Cumulative lengths [B + 1] of `batch` requests of at most `longest` tokens each.
std::vector<int64_t> draw_cu_lens(FuzzedDataProvider& in, Rng& rng, int64_t batch,
                                  int64_t longest) {
  std::vector<int64_t> cu = {0};
  for (int64_t b = 0; b < batch; ++b) {
    cu.push_back(cu.back() + static_cast<int64_t>(rng() % static_cast<uint64_t>(longest + 1)));
  }
  if (in.ConsumeIntegralInRange(0, 15) == 0) {
    cu[in.ConsumeIntegralInRange<size_t>(0, cu.size() - 1)] = in.ConsumeIntegral<int32_t>();
  }
  return cu;
}

std::vector<int64_t> draw_block_table(FuzzedDataProvider& in, Rng& rng, const Dims& d) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < d.batch * d.width; ++i) {
    ids.push_back(draw_index(in, rng, 0, d.num_blocks - 1));
  }
  return ids;
}

// ---- invariants ---------------------------------------------------------------------------------

// `also`: message prefixes of the pieces an entry point hands its arguments to, whose messages
// name them too (e.g. "MlaDims: " for MlaAttention's dims).
void expect_status(const char* op, mlakit_status_t status,
                   std::initializer_list<const char*> also = {}) {
  const std::string message = mlakit_last_error();
  MLAKIT_FUZZ_EXPECT(status == MLAKIT_OK || status == MLAKIT_ERROR_INVALID_ARGUMENT ||
                         status == MLAKIT_ERROR_OUT_OF_RANGE || status == MLAKIT_ERROR_UNSUPPORTED,
                     std::string(op) + " returned " + mlakit_status_name(status) + ": " + message);
  if (status == MLAKIT_OK) return;
  bool named = message.rfind(std::string(op) + ": ", 0) == 0;
  for (const char* prefix : also) named |= message.rfind(prefix, 0) == 0;
  MLAKIT_FUZZ_EXPECT(named,
                     std::string(op) + " failed with a message that does not name it: " + message);
}

bool dense_and_backed(const FuzzTensor& t) {
  return t.backed && t.strides.empty() && !t.absent && to_mlakit_dtype(t.dtype).has_value();
}

// Element count (saturating: only dense, backed tensors are read, and they are small).
int64_t numel(const FuzzTensor& t) {
  for (int64_t s : t.shape)
    if (s == 0) return 0;
  int64_t n = 1;
  for (int64_t s : t.shape)
    if (__builtin_mul_overflow(n, s, &n)) return INT64_MAX;
  return n;
}

// Rows of `row_len` values with one LSE each (lse_stride apart, dense otherwise): a finite LSE
// goes with finite values, -inf with zeros; NaN and +inf never appear.
void expect_rows(const char* op, const FuzzTensor& out, const FuzzTensor* lse, int64_t rows,
                 int64_t row_len, int64_t lse_index_of_row_stride_t, int64_t lse_heads) {
  for (int64_t r = 0; r < rows; ++r) {
    float l = 0.0f;
    if (lse) {
      // Row r = (t, h) with t = r / lse_heads, h = r % lse_heads; LSE at h * stride_t + t or r.
      const int64_t offset = lse_index_of_row_stride_t > 0
                                 ? (r % lse_heads) * lse_index_of_row_stride_t + r / lse_heads
                                 : r;
      l = float_at(*lse, offset);
      MLAKIT_FUZZ_EXPECT(
          !std::isnan(l) && l != INFINITY,
          std::string(op) + ": LSE of row " + std::to_string(r) + " is " + std::to_string(l));
    }
    for (int64_t i = 0; i < row_len; ++i) {
      const float v = float_at(out, r * row_len + i);
      if (lse && l == -INFINITY) {
        MLAKIT_FUZZ_EXPECT(v == 0.0f, std::string(op) + ": row " + std::to_string(r) +
                                          " has LSE -inf but value " + std::to_string(v));
      } else {
        MLAKIT_FUZZ_EXPECT(std::isfinite(v), std::string(op) + ": row " + std::to_string(r) +
                                                 " has a non-finite value from finite inputs");
      }
    }
  }
}

// ---- the entry points ---------------------------------------------------------------------------

void fuzz_concat_and_cache_mla(FuzzedDataProvider& in, Rng& rng) {
  const Dims d = draw_dims(in);
  const int64_t tokens = in.ConsumeIntegralInRange<int64_t>(0, 6);
  const int64_t slots = d.num_blocks * d.block_size;
  std::vector<int64_t> slot_values;
  for (int64_t t = 0; t < tokens; ++t) slot_values.push_back(draw_index(in, rng, -1, slots - 1));
  Call c;
  c.add("kv_c", {tokens + in.ConsumeIntegralInRange<int64_t>(0, 1), d.rank}, d.act);
  c.add("k_pe", {tokens, d.rope}, d.act);
  c.add("kv_cache", {d.num_blocks, d.block_size, d.entry_width()}, d.cache_dtype(),
        Fill::kRawBytes);
  c.add("slot_mapping", {tokens}, kDlI64, Fill::kIndex, slot_values);
  c.break_some(in);
  c.materialize_all(rng);
  auto& t = c.tensors;
  const int32_t kv_format = draw_kv_format(in, d.kv_format);
  const float scale = draw_scale(in);
  // The form is drawn last, so that inputs from before the tensor form keep their meaning.
  if (!in.ConsumeBool()) {
    expect_status("concat_and_cache_mla",
                  mlakit_concat_and_cache_mla(t[0].ptr(), t[1].ptr(), t[2].ptr(), t[3].ptr(),
                                              kv_format, scale, nullptr));
    return;
  }
  const FuzzTensor& s = add_scale_tensor(in, rng, c, scale);
  const mlakit_status_t status = mlakit_concat_and_cache_mla_tensor_scale(
      t[0].ptr(), t[1].ptr(), t[2].ptr(), t[3].ptr(), kv_format, s.ptr(), nullptr);
  expect_status("concat_and_cache_mla", status);
  expect_scale_checked("concat_and_cache_mla", status, s, scale,
                       kv_format == MLAKIT_KV_CACHE_FP8_E4M3, /*reciprocal=*/false);
}

void fuzz_gather(FuzzedDataProvider& in, Rng& rng, bool dequant) {
  const Dims d = draw_dims(in);
  const std::vector<int64_t> cu = draw_cu_lens(in, rng, d.batch, d.width * d.block_size);
  // A corrupted cu_seq_lens may claim any row count; dst keeps a small one (at most 4 x 32).
  const int64_t rows = std::clamp<int64_t>(cu.back(), 0, 128);
  std::vector<int64_t> token_to_seq;
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t r = std::max<int64_t>(cu[b], 0); r < cu[b + 1] && r < rows; ++r) {
      token_to_seq.push_back(b);
    }
  }
  if (token_to_seq.empty()) token_to_seq.push_back(0);
  std::vector<int64_t> starts;
  for (int64_t b = 0; b < d.batch; ++b) starts.push_back(draw_index(in, rng, 0, d.block_size));
  Call c;
  const DLDataType dst_dtype = dequant ? d.act : d.cache_dtype();
  const int64_t dst_width = dequant && d.kv_format != MLAKIT_KV_CACHE_FP8_DS_MLA
                                ? d.entry_dim()
                                : (dequant ? 576 : d.entry_width());
  c.add("src_cache", {d.num_blocks, d.block_size, d.entry_width()}, d.cache_dtype(),
        Fill::kRawBytes);
  c.add("dst", {rows + in.ConsumeIntegralInRange<int64_t>(0, 1), dst_width}, dst_dtype);
  c.add("block_table", {d.batch, d.width}, kDlI32, Fill::kIndex, draw_block_table(in, rng, d));
  c.add("cu_seq_lens", {d.batch + 1}, kDlI32, Fill::kIndex, cu);
  if (dequant) {
    c.add("token_to_seq", {static_cast<int64_t>(token_to_seq.size())}, kDlI32, Fill::kIndex,
          token_to_seq);
  }
  FuzzTensor& seq_starts = c.add("seq_starts", {d.batch}, kDlI32, Fill::kIndex, starts);
  seq_starts.absent = in.ConsumeBool();
  c.break_some(in);
  c.materialize_all(rng);
  auto& t = c.tensors;
  if (dequant) {
    const int64_t num_tokens = in.ConsumeBool() ? rows : odd_size(in, rows);
    const int32_t kv_format = draw_kv_format(in, d.kv_format);
    const float scale = draw_scale(in);
    // The form is drawn last, so that inputs from before the tensor form keep their meaning.
    if (!in.ConsumeBool()) {
      expect_status("gather_and_maybe_dequant_cache",
                    mlakit_gather_and_maybe_dequant_cache(t[0].ptr(), t[1].ptr(), t[2].ptr(),
                                                          t[3].ptr(), t[4].ptr(), num_tokens,
                                                          kv_format, scale, t[5].ptr(), nullptr));
      return;
    }
    const FuzzTensor& s = add_scale_tensor(in, rng, c, scale);
    const mlakit_status_t status = mlakit_gather_and_maybe_dequant_cache_tensor_scale(
        t[0].ptr(), t[1].ptr(), t[2].ptr(), t[3].ptr(), t[4].ptr(), num_tokens, kv_format, s.ptr(),
        t[5].ptr(), nullptr);
    expect_status("gather_and_maybe_dequant_cache", status);
    expect_scale_checked("gather_and_maybe_dequant_cache", status, s, scale,
                         kv_format == MLAKIT_KV_CACHE_FP8_E4M3, /*reciprocal=*/false);
  } else {
    const int64_t batch_size = in.ConsumeBool() ? d.batch : odd_size(in, d.batch);
    expect_status("cp_gather_cache",
                  mlakit_cp_gather_cache(t[0].ptr(), t[1].ptr(), t[2].ptr(), t[3].ptr(), batch_size,
                                         t[4].ptr(), nullptr));
  }
}

void fuzz_merge_attn_states(FuzzedDataProvider& in, Rng& rng) {
  const int64_t tokens = in.ConsumeIntegralInRange<int64_t>(0, 5);
  const int64_t heads = in.ConsumeIntegralInRange<int64_t>(1, 4);
  const int64_t dim = in.ConsumeIntegralInRange<int64_t>(1, 20);
  const DLDataType acts[] = {kDlF32, kDlF16, kDlBF16};
  Call c;
  c.add("output", {tokens, heads, dim}, in.PickValueInArray(acts));
  c.add("prefix_output", {tokens, heads, dim}, in.PickValueInArray(acts));
  c.add("prefix_lse", {heads, tokens}, kDlF32, Fill::kLse);
  c.add("suffix_output", {tokens, heads, dim}, in.PickValueInArray(acts));
  c.add("suffix_lse", {heads, tokens}, kDlF32, Fill::kLse);
  FuzzTensor& output_lse = c.add("output_lse", {heads, tokens}, kDlF32);
  output_lse.absent = in.ConsumeBool();
  c.break_some(in);
  c.materialize_all(rng);
  auto& t = c.tensors;
  const mlakit_status_t status = mlakit_merge_attn_states(
      t[0].ptr(), t[1].ptr(), t[2].ptr(), t[3].ptr(), t[4].ptr(), t[5].ptr(), nullptr);
  expect_status("merge_attn_states", status);
  const bool inputs_as_built = dense_and_backed(t[1]) && dense_and_backed(t[3]);
  if (status == MLAKIT_OK && inputs_as_built && dense_and_backed(t[0])) {
    for (int64_t i = 0; i < numel(t[0]); ++i) {
      MLAKIT_FUZZ_EXPECT(std::isfinite(float_at(t[0], i)),
                         "merge_attn_states: non-finite output from finite states");
    }
    if (dense_and_backed(t[5])) {
      for (int64_t i = 0; i < numel(t[5]); ++i) {
        const float l = float_at(t[5], i);
        MLAKIT_FUZZ_EXPECT(!std::isnan(l) && l != INFINITY,
                           "merge_attn_states: output_lse " + std::to_string(l));
      }
    }
  }
}

void fuzz_scaled_fp8_quant(FuzzedDataProvider& in, Rng& rng) {
  std::vector<int64_t> shape(in.ConsumeIntegralInRange<size_t>(0, 4));
  for (int64_t& s : shape) s = in.ConsumeIntegralInRange<int64_t>(0, 9);
  const DLDataType acts[] = {kDlF32, kDlF16, kDlBF16};
  const DLDataType codes[] = {kDlFp8, kDlU8};
  Call c;
  c.add("input", shape, in.PickValueInArray(acts));
  c.add("out", shape, in.PickValueInArray(codes));
  c.break_some(in);
  c.materialize_all(rng);
  auto& t = c.tensors;
  const float scale = draw_scale(in);
  // 0: the float form, 1: the scale as a tensor, 2: dynamic_scaled_fp8_quant (its scale is
  // written). Drawn last, so that inputs from before the other forms keep their meaning.
  const int form = in.ConsumeIntegralInRange(0, 2);
  const char* op = form == 2 ? "dynamic_scaled_fp8_quant" : "scaled_fp8_quant";
  const FuzzTensor* s = form == 0 ? nullptr : &add_scale_tensor(in, rng, c, scale);
  mlakit_status_t status;
  if (form == 0) {
    status = mlakit_scaled_fp8_quant(t[0].ptr(), t[1].ptr(), scale, nullptr);
  } else if (form == 1) {
    status = mlakit_scaled_fp8_quant_tensor_scale(t[0].ptr(), t[1].ptr(), s->ptr(), nullptr);
  } else {
    status = mlakit_dynamic_scaled_fp8_quant(t[0].ptr(), t[1].ptr(), s->ptr(), nullptr);
  }
  expect_status(op, status);
  if (s) expect_scale_checked(op, status, *s, scale, form == 1, /*reciprocal=*/true);
  if (status != MLAKIT_OK || !dense_and_backed(t[0]) || !dense_and_backed(t[1])) return;
  bool has_448 = false;
  for (int64_t i = 0; i < numel(t[1]); ++i) {
    const uint8_t code = t[1].bytes[t[1].tensor.byte_offset + static_cast<size_t>(i)];
    MLAKIT_FUZZ_EXPECT((code & 0x7f) != 0x7f, std::string(op) + ": NaN code from finite input");
    has_448 |= (code & 0x7f) == 0x7e;  // 0x7e: 448, the largest finite e4m3 value
  }
  if (form != 2) return;
  float amax = 0.0f;
  for (int64_t i = 0; i < numel(t[0]); ++i) amax = std::max(amax, std::fabs(float_at(t[0], i)));
  float written = 0.0f;
  std::memcpy(&written, s->bytes.data() + s->tensor.byte_offset, sizeof(written));
  MLAKIT_FUZZ_EXPECT(written == amax / 448.0f,  // 448: the largest finite e4m3 value
                     "dynamic_scaled_fp8_quant: scale " + std::to_string(written) + " for amax " +
                         std::to_string(amax));
  if (written == 0.0f) {
    for (int64_t i = 0; i < numel(t[1]); ++i) {
      MLAKIT_FUZZ_EXPECT(t[1].bytes[t[1].tensor.byte_offset + static_cast<size_t>(i)] == 0,
                         "dynamic_scaled_fp8_quant: a non-zero code under scale 0");
    }
  } else {
    MLAKIT_FUZZ_EXPECT(has_448, "dynamic_scaled_fp8_quant: no code is +-448 (the amax element)");
  }
}

// A per-request scale of the decode entries (q_scale, k_scale as tensors) and what it holds.
struct RequestScale {
  const FuzzTensor* tensor = nullptr;
  std::vector<float> values;  // the value request b reads ([batch]); 1 for NULL; empty: unreadable
  const char* inside = nullptr;  // the output whose memory it was placed in (nullptr: its own)
};

// What request b reads from a scale tensor as its memory holds it now: element 0 of a one-element
// tensor, element b of a [batch] one; empty when unreadable (not backed, not f32, another shape).
std::vector<float> request_values(const FuzzTensor& s, int64_t batch) {
  if (s.absent) return std::vector<float>(static_cast<size_t>(batch), 1.0f);
  const bool one = numel(s) == 1, per_request = s.shape.size() == 1 && s.shape[0] == batch;
  if (!s.backed || to_mlakit_dtype(s.dtype) != DType::kF32 || !(one || per_request)) return {};
  const std::vector<int64_t> offsets = logical_offsets(s.shape, effective_strides(s));
  const unsigned char* base =
      static_cast<const unsigned char*>(s.tensor.data) + s.tensor.byte_offset;
  std::vector<float> values;
  for (int64_t b = 0; b < batch; ++b) {
    float v = 0.0f;
    std::memcpy(&v, base + 4 * (one ? 0 : offsets[static_cast<size_t>(b)]), sizeof(v));
    values.push_back(v);
  }
  return values;
}

// A scale argument of the decode entries: NULL (1), an f32 tensor of one element (rank 0 to 2) or
// of shape [batch] (dense or with stride 0, 2 or 3), now and then on pinned host memory, holding
// one drawn value per request. A third of the tensors get one defect; an eighth of the others are
// placed inside the memory of one of `outputs` (if big enough), which the library must refuse.
// Added to `c` after its other tensors were materialized, so that their contents do not depend on
// this draw.
RequestScale add_request_scale(FuzzedDataProvider& in, Rng& rng, Call& c, const char* name,
                               int64_t batch, const std::vector<const FuzzTensor*>& outputs) {
  FuzzTensor& s = c.add(name, {}, kDlF32);
  RequestScale r;
  r.tensor = &s;
  const int form = in.ConsumeIntegralInRange(0, 4);
  s.absent = form == 0;
  const std::vector<int64_t> one_element[] = {{}, {1}, {1, 1}};
  const int64_t strides[] = {0, 2, 3};
  if (!s.absent) {
    s.shape = form == 1 ? in.PickValueInArray(one_element) : std::vector<int64_t>{batch};
    if (form == 4) s.strides = {in.PickValueInArray(strides)};
    if (in.ConsumeIntegralInRange(0, 7) == 0) s.device = DLDevice{kDLCUDAHost, 0};
  }
  const bool defect = !s.absent && in.ConsumeIntegralInRange(0, 2) == 0;
  if (defect) mutate(in, s);  // which may make it NULL
  if (s.absent) {
    r.values = request_values(s, batch);
    call_description() += describe(s) + "; ";
    return r;
  }
  materialize(s, rng);
  std::vector<float> drawn;
  for (int64_t b = 0; b < std::max<int64_t>(batch, 1); ++b) drawn.push_back(draw_scale(in));
  const bool placed_inside = !defect && in.ConsumeIntegralInRange(0, 7) == 0;
  // Element offsets of a backed tensor (an unbacked one may claim any number of elements).
  const std::vector<int64_t> offsets =
      s.backed ? logical_offsets(s.shape, effective_strides(s)) : std::vector<int64_t>{};
  if (placed_inside && !outputs.empty()) {
    const FuzzTensor& target = *outputs[in.ConsumeIntegralInRange<size_t>(0, outputs.size() - 1)];
    const int64_t extent =
        offsets.empty() ? 0 : (*std::max_element(offsets.begin(), offsets.end()) + 1) * 4;
    const int64_t room = dense_and_backed(target) ? numel(target) * element_bytes(target.dtype) : 0;
    if (extent > 0 && extent <= room && target.tensor.byte_offset % 4 == 0) {
      s.tensor.data = target.tensor.data;
      s.tensor.byte_offset =
          target.tensor.byte_offset +
          4 * in.ConsumeIntegralInRange<uint64_t>(0, static_cast<uint64_t>(room - extent) / 4);
      r.inside = target.name;
    }
  }
  const bool readable = s.backed && to_mlakit_dtype(s.dtype) == DType::kF32;
  if (readable) {  // (an unbacked tensor's data may be NULL with an offset: no address to form)
    unsigned char* base = static_cast<unsigned char*>(s.tensor.data) + s.tensor.byte_offset;
    for (size_t i = 0; i < offsets.size(); ++i) {
      std::memcpy(base + 4 * offsets[i], &drawn[i % drawn.size()], sizeof(float));
    }
  }
  r.values = request_values(s, batch);
  call_description() +=
      describe(s) + (r.inside ? std::string(" inside ") + r.inside : "") + " values";
  for (float v : r.values) call_description() += " " + std::to_string(v);
  call_description() += "; ";
  return r;
}

// Whether the library must accept `r` as a decode scale (its values aside); `early`: only the
// problems it checks before the schedule (all but an overlap with split_workspace).
bool valid_request_scale(const RequestScale& r, int64_t batch, bool early = false) {
  if (r.tensor->absent) return true;
  const bool apart = r.inside == nullptr || (early && std::string(r.inside) == "split_workspace");
  return apart && valid_scale_tensor(*r.tensor, batch);
}

// The first request whose value is not finite and > 0 (-1: none).
int64_t first_bad_value(const RequestScale& r) {
  for (size_t b = 0; b < r.values.size(); ++b) {
    if (!std::isfinite(r.values[b]) || !(r.values[b] > 0.0f)) return static_cast<int64_t>(b);
  }
  return -1;
}

float largest_value(const RequestScale& r) {
  float largest = 0.0f;
  for (float v : r.values) largest = std::max(largest, v);
  return largest;
}

// The decode scales' invariants. A success had valid tensors, apart from the outputs, holding
// values that are finite and > 0 (checked whether or not they apply). A failure of a call whose
// other arguments are valid (`clean`) names a scale that is bad: with a bad tensor, one that is bad
// (tensor or values); with valid tensors, the first bad value, "q_scale[b]" (q_scale before
// k_scale) or "q_scale" where one element serves every request; otherwise neither scale.
void expect_decode_scales(mlakit_status_t status, const RequestScale& q_scale,
                          const RequestScale& k_scale, int64_t batch, bool clean) {
  const RequestScale* scales[] = {&q_scale, &k_scale};
  if (status == MLAKIT_OK) {
    for (const RequestScale* r : scales) {
      MLAKIT_FUZZ_EXPECT(valid_request_scale(*r, batch),
                         std::string("mla_decode accepted a bad ") + r->tensor->name + " tensor");
      const int64_t b = first_bad_value(*r);
      MLAKIT_FUZZ_EXPECT(b < 0, std::string("mla_decode accepted ") + r->tensor->name + "[" +
                                    std::to_string(b) + "] = " + std::to_string(r->values[b]));
    }
    return;
  }
  if (!clean) return;
  const std::string message = mlakit_last_error();
  auto names = [&](const RequestScale& r) {
    return message.rfind(std::string("mla_decode: ") + r.tensor->name, 0) == 0;
  };
  if (!valid_request_scale(q_scale, batch, true) || !valid_request_scale(k_scale, batch, true)) {
    bool named_bad = false;
    for (const RequestScale* r : scales) {
      named_bad |= names(*r) && (!valid_request_scale(*r, batch, true) || first_bad_value(*r) >= 0);
    }
    MLAKIT_FUZZ_EXPECT(named_bad, "mla_decode: a bad scale tensor, but the message is: " + message);
    return;
  }
  for (const RequestScale* r : scales) {
    const int64_t b = first_bad_value(*r);
    if (b < 0) continue;
    const FuzzTensor& t = *r->tensor;
    const bool shared = numel(t) == 1 || effective_strides(t)[0] == 0;
    const std::string rule = " must be finite and > 0";
    const std::string indexed =
        "mla_decode: " + std::string(t.name) + "[" + std::to_string(b) + "]";
    const bool named =
        message.rfind(indexed + rule, 0) == 0 ||
        (shared && message.rfind("mla_decode: " + std::string(t.name) + rule, 0) == 0);
    MLAKIT_FUZZ_EXPECT(named, "mla_decode: bad value " + std::to_string(r->values[b]) + " of " +
                                  indexed + ", but the message is: " + message);
    return;
  }
  for (const RequestScale* r : scales) {
    MLAKIT_FUZZ_EXPECT(!names(*r) || !valid_request_scale(*r, batch),
                       "mla_decode: a valid scale is blamed: " + message);
  }
}

void fuzz_mla_decode(FuzzedDataProvider& in, Rng& rng, bool scheduled) {
  const Dims d = draw_dims(in);
  const std::vector<int64_t> lens = draw_seq_lens(in, rng, d);
  const bool fp8_q = d.kv_format != MLAKIT_KV_CACHE_AUTO && in.ConsumeIntegralInRange(0, 3) == 0;
  Call c;
  c.add("q", {d.batch, d.s_q, d.heads, d.entry_dim()}, fp8_q ? kDlFp8 : d.act);
  c.add("kv_cache", {d.num_blocks, d.block_size, d.entry_width()}, d.cache_dtype(),
        d.kv_format == MLAKIT_KV_CACHE_FP8_DS_MLA ? Fill::kRawBytes : Fill::kFinite);
  c.add("block_table", {d.batch, d.width}, kDlI32, Fill::kIndex, draw_block_table(in, rng, d));
  c.add("seq_lens", {d.batch}, kDlI32, Fill::kIndex, lens);
  c.add("out", {d.batch, d.s_q, d.heads, d.rank}, fp8_q ? d.act : d.act);
  c.add("lse", {d.batch, d.s_q, d.heads}, kDlF32);
  mlakit_decode_schedule_t* schedule = nullptr;
  if (scheduled) {
    std::vector<int32_t> plan_lens;
    for (int64_t v : lens) plan_lens.push_back(static_cast<int32_t>(v));
    if (in.ConsumeIntegralInRange(0, 7) == 0 && !plan_lens.empty()) plan_lens.pop_back();
    const mlakit_status_t planned =
        mlakit_plan_decode_splits(plan_lens.data(), static_cast<int64_t>(plan_lens.size()),
                                  in.ConsumeBool() ? d.block_size : odd_size(in, d.block_size),
                                  in.ConsumeIntegralInRange<int64_t>(-1, 64), &schedule);
    expect_status("plan_decode_splits", planned);
    int64_t elems = 0;
    if (planned == MLAKIT_OK) {
      expect_status("decode_workspace_elems",
                    mlakit_decode_workspace_elems(schedule, d.s_q, d.heads, d.rank, &elems));
    }
    c.add("split_workspace", {std::max<int64_t>(elems - in.ConsumeIntegralInRange(0, 1), 0)},
          kDlF32);
  }
  c.break_some(in);
  c.materialize_all(rng);
  auto& t = c.tensors;
  const int64_t rank = in.ConsumeBool() ? d.rank : odd_size(in, d.rank);
  const float scale = draw_scale(in);
  float q_scale = draw_scale(in), k_scale = draw_scale(in);
  const int32_t kv_format = draw_kv_format(in, d.kv_format);
  mlakit_status_t status;
  // The form is drawn last, so that inputs from before the tensor form keep their meaning.
  if (!in.ConsumeBool()) {
    status = scheduled
                 ? mlakit_mla_decode_scheduled(t[0].ptr(), t[1].ptr(), t[2].ptr(), t[3].ptr(),
                                               t[4].ptr(), t[5].ptr(), rank, scale, kv_format,
                                               q_scale, k_scale, schedule, t[6].ptr(), nullptr)
                 : mlakit_mla_decode(t[0].ptr(), t[1].ptr(), t[2].ptr(), t[3].ptr(), t[4].ptr(),
                                     t[5].ptr(), rank, scale, kv_format, q_scale, k_scale);
    expect_status("mla_decode", status);
  } else {
    // The scale tensors' batch is q's as the call describes it (a defect may have changed it).
    const int64_t batch = t[0].shape.empty() ? 0 : std::clamp<int64_t>(t[0].shape[0], 0, 64);
    std::vector<const FuzzTensor*> outputs = {&t[4], &t[5]};
    if (scheduled) outputs.push_back(&t[6]);
    RequestScale qs = add_request_scale(in, rng, c, "q_scale", batch, outputs);
    const RequestScale ks = add_request_scale(in, rng, c, "k_scale", batch, outputs);
    // k_scale placed inside the same output as q_scale may have overwritten q_scale's values.
    qs.values = request_values(*qs.tensor, batch);
    status = scheduled ? mlakit_mla_decode_scheduled_tensor_scale(
                             t[0].ptr(), t[1].ptr(), t[2].ptr(), t[3].ptr(), t[4].ptr(), t[5].ptr(),
                             rank, scale, kv_format, qs.tensor->ptr(), ks.tensor->ptr(), schedule,
                             t[6].ptr(), nullptr)
                       : mlakit_mla_decode_tensor_scale(
                             t[0].ptr(), t[1].ptr(), t[2].ptr(), t[3].ptr(), t[4].ptr(), t[5].ptr(),
                             rank, scale, kv_format, qs.tensor->ptr(), ks.tensor->ptr());
    expect_status("mla_decode", status);
    // Valid but for the scales: no tensor defect, the cache format, rank and scale as built and a
    // schedule (the scales are checked before the schedule and the index contents).
    const bool clean = c.defects == 0 && kv_format == d.kv_format && rank == d.rank &&
                       std::isfinite(scale) && scale > 0.0f && (!scheduled || schedule);
    expect_decode_scales(status, qs, ks, batch, clean);
    q_scale = largest_value(qs);
    k_scale = largest_value(ks);
  }
  mlakit_decode_schedule_destroy(schedule);
  const bool finite_inputs = d.kv_format != MLAKIT_KV_CACHE_FP8_DS_MLA && moderate(scale) &&
                             moderate(q_scale) && moderate(k_scale) && dense_and_backed(t[0]) &&
                             dense_and_backed(t[1]);
  if (status == MLAKIT_OK && finite_inputs && dense_and_backed(t[4]) && dense_and_backed(t[5])) {
    expect_rows("mla_decode", t[4], &t[5], numel(t[5]), t[4].shape.back(), 0, 1);
  }
}

void fuzz_mla_prefill(FuzzedDataProvider& in, Rng& rng) {
  const int64_t batch = in.ConsumeIntegralInRange<int64_t>(1, 3);
  const int64_t heads = in.ConsumeIntegralInRange<int64_t>(1, 3);
  const int64_t nope = in.ConsumeIntegralInRange<int64_t>(0, 12);
  const int64_t rope = in.ConsumeIntegralInRange<int64_t>(0, 6);
  const int64_t dv = in.ConsumeIntegralInRange<int64_t>(1, 12);
  const std::vector<int64_t> cu_q = draw_cu_lens(in, rng, batch, 4);
  const std::vector<int64_t> cu_k = draw_cu_lens(in, rng, batch, 6);
  const int64_t tokens = std::clamp<int64_t>(cu_q.back(), 0, 16);
  const int64_t keys = std::clamp<int64_t>(cu_k.back(), 0, 24);
  int64_t longest_q = 0, longest_k = 0;
  for (int64_t b = 0; b < batch; ++b) {
    longest_q = std::max(longest_q, cu_q[b + 1] - cu_q[b]);
    longest_k = std::max(longest_k, cu_k[b + 1] - cu_k[b]);
  }
  const DLDataType acts[] = {kDlF32, kDlF16, kDlBF16};
  const DLDataType act = in.PickValueInArray(acts);
  Call c;
  c.add("q", {tokens, heads, nope + rope}, act);
  c.add("k_nope", {keys, heads, nope}, act);
  c.add("k_pe", {keys, rope}, act);
  c.add("v", {keys, heads, dv}, act);
  c.add("cu_seqlens_q", {batch + 1}, kDlI32, Fill::kIndex, cu_q);
  c.add("cu_seqlens_k", {batch + 1}, kDlI32, Fill::kIndex, cu_k);
  c.add("out", {tokens, heads, dv}, in.PickValueInArray(acts));
  FuzzTensor& lse = c.add("lse", {heads, tokens}, kDlF32);
  lse.absent = in.ConsumeBool();
  c.break_some(in);
  c.materialize_all(rng);
  auto& t = c.tensors;
  const int64_t max_q = in.ConsumeBool() ? longest_q : odd_size(in, longest_q);
  const int64_t max_k = in.ConsumeBool() ? longest_k : odd_size(in, longest_k);
  const float scale = draw_scale(in);
  const int32_t causal = in.ConsumeIntegralInRange<int32_t>(0, 2);
  call_description() += "cu_q " + std::to_string(cu_q.size()) + " cu_k; max " +
                        std::to_string(max_q) + " " + std::to_string(max_k) + " scale " +
                        std::to_string(scale) + " causal " + std::to_string(causal);
  for (int64_t v : cu_q) call_description() += " q" + std::to_string(v);
  for (int64_t v : cu_k) call_description() += " k" + std::to_string(v);
  const mlakit_status_t status =
      mlakit_mla_prefill(t[0].ptr(), t[1].ptr(), t[2].ptr(), t[3].ptr(), t[4].ptr(), t[5].ptr(),
                         max_q, max_k, scale, causal, t[6].ptr(), t[7].ptr(), nullptr);
  expect_status("mla_prefill", status);
  bool finite_inputs = moderate(scale);
  for (int i = 0; i < 4; ++i) finite_inputs &= dense_and_backed(t[i]) || numel(t[i]) == 0;
  if (status == MLAKIT_OK && finite_inputs && dense_and_backed(t[6])) {
    const bool with_lse = dense_and_backed(t[7]);
    // out [T, N, V]: row (t, n); lse [N, T]: element n * T + t.
    expect_rows("mla_prefill", t[6], with_lse ? &t[7] : nullptr, t[6].shape[0] * t[6].shape[1],
                t[6].shape[2], t[6].shape[0], t[6].shape[1]);
  }
}

// One MLA layer: creation from a random configuration and kv_b_proj weight, its plan and a
// forward step (or a profile run) over a random batch of decodes and prefills.
void fuzz_attention(FuzzedDataProvider& in, Rng& rng) {
  mlakit_mla_config_t config;
  mlakit_mla_config_init(&config);
  const Dims d = draw_dims(in);
  config.num_heads = in.ConsumeBool() ? d.heads : odd_size(in, d.heads);
  config.kv_lora_rank = d.rank;
  config.qk_rope_head_dim = d.rope;
  config.qk_nope_head_dim = in.ConsumeIntegralInRange<int64_t>(1, 8);
  config.v_head_dim = in.ConsumeIntegralInRange<int64_t>(1, 8);
  config.scale = in.ConsumeIntegralInRange(0, 7) == 0 ? draw_scale(in) : 0.2f;
  config.act_dtype = d.act;
  config.kv_cache_dtype = draw_kv_format(in, d.kv_format);
  config.block_size = in.ConsumeBool() ? d.block_size : odd_size(in, d.block_size);
  config.decode_threshold = in.ConsumeIntegralInRange<int64_t>(0, 3);
  config.query_len_support = in.ConsumeIntegralInRange<int32_t>(0, 3);
  config.chunk_policy = in.ConsumeIntegralInRange<int32_t>(0, 2);
  config.workspace_tokens = in.ConsumeIntegralInRange<int64_t>(-1, 64);
  config.max_model_len = in.ConsumeIntegralInRange<int64_t>(0, 64);
  config.max_num_seqs = in.ConsumeIntegralInRange<int64_t>(0, 8);
  if (in.ConsumeIntegralInRange(0, 15) == 0) config.device = DLDevice{kDLCUDA, 0};
  const bool fp8_weight = in.ConsumeIntegralInRange(0, 3) == 0;
  const int64_t heads = std::clamp<int64_t>(config.num_heads, 0, 8);
  const int64_t rows = heads * (config.qk_nope_head_dim + config.v_head_dim);
  Call weights;
  weights.add("kv_b_proj_weight", {rows, d.rank}, fp8_weight ? kDlFp8 : d.act);
  FuzzTensor& scales = weights.add(
      "kv_b_proj_scale_inv", {(rows + 127) / 128, (d.rank + 127) / 128}, kDlF32, Fill::kScales);
  scales.absent = !fp8_weight;
  weights.break_some(in);
  weights.materialize_all(rng);
  mlakit_attention_t* layer = nullptr;
  const mlakit_status_t created =
      mlakit_attention_create(&config, weights.tensors[0].ptr(), weights.tensors[1].ptr(), &layer);
  // The configuration is checked by MlaDims and KvCacheSpec, the weight by absorb_kv_b_proj; a
  // CUDA layer in a CPU-only build fails allocating ("cannot allocate 208 bytes on cuda:0: ...").
  expect_status("MlaAttention", created,
                {"MlaDims: ", "KvCacheSpec: ", "absorb_kv_b_proj: ", "cannot allocate "});
  if (created != MLAKIT_OK) return;
  int64_t workspace_tokens = 0;
  expect_status("MlaAttention::workspace_tokens",
                mlakit_attention_workspace_tokens(layer, &workspace_tokens));

  // A batch: decodes (q_len <= threshold, with context), then prefills.
  const int64_t reqs = in.ConsumeIntegralInRange<int64_t>(0, 4);
  // Block size as configured if sane (a layer with an absurd one was rejected above, or a defect
  // made it so for the batch only).
  const int64_t bs = std::clamp<int64_t>(config.block_size, 1, 64), width = d.width;
  std::vector<int32_t> qsl = {0}, lens;
  std::vector<int64_t> table, slots;
  for (int64_t r = 0; r < reqs; ++r) {
    const int64_t q = in.ConsumeIntegralInRange<int64_t>(0, 3);
    const int64_t len = std::min(q + in.ConsumeIntegralInRange<int64_t>(0, 8), width * bs);
    qsl.push_back(static_cast<int32_t>(qsl.back() + std::min(q, len)));
    lens.push_back(static_cast<int32_t>(len));
    for (int64_t c = 0; c < width; ++c) table.push_back(draw_index(in, rng, 0, d.num_blocks - 1));
  }
  const int64_t tokens = qsl.back();
  for (int64_t r = 0; r < reqs; ++r) {
    for (int64_t j = qsl[r]; j < qsl[r + 1]; ++j) {
      const int64_t pos = lens[r] - (qsl[r + 1] - j);
      slots.push_back(table[r * width + pos / bs] * bs + pos % bs);
    }
  }
  Call step;
  step.add("q", {tokens, heads, config.qk_nope_head_dim + d.rope}, d.act);
  step.add("kv_c_normed", {tokens, d.rank}, d.act);
  step.add("k_pe", {tokens, d.rope}, d.act);
  step.add("kv_cache", {d.num_blocks, bs, d.entry_width()}, d.cache_dtype(),
           d.kv_format == MLAKIT_KV_CACHE_FP8_DS_MLA ? Fill::kRawBytes : Fill::kFinite);
  step.add("output", {tokens, heads * config.v_head_dim}, d.act);
  step.add("block_table", {reqs, width}, kDlI32, Fill::kIndex, table);
  step.add("slot_mapping", {tokens}, kDlI64, Fill::kIndex, slots);
  step.break_some(in);
  step.materialize_all(rng);
  auto& t = step.tensors;
  mlakit_forward_batch_t batch{qsl.data(), lens.data(),
                               reqs,       tokens + in.ConsumeIntegralInRange<int64_t>(0, 1),
                               t[5].ptr(), t[6].ptr()};
  mlakit_plan_t* plan = nullptr;
  // The plan is make_plan's, whose batch checks split_decodes_and_prefills shares.
  const std::initializer_list<const char*> planner = {"make_plan: ",
                                                      "split_decodes_and_prefills: "};
  expect_status("MlaAttention::plan", mlakit_attention_plan(layer, &batch, &plan), planner);
  mlakit_plan_destroy(plan);
  const bool profile = in.ConsumeIntegralInRange(0, 7) == 0;
  const float q_scale = draw_scale(in), k_scale = draw_scale(in);
  const mlakit_status_t status =
      mlakit_attention_forward(layer, t[0].ptr(), t[1].ptr(), t[2].ptr(), t[3].ptr(),
                               profile ? nullptr : &batch, t[4].ptr(), q_scale, k_scale, nullptr);
  mlakit_attention_destroy(layer);
  // Some defects surface from the op that meets them inside the step: bad index contents (block
  // ids, slots) and output layouts that forward itself does not check (see docs/hardening.md).
  expect_status(
      "MlaAttention::forward", status,
      {"make_plan: ", "split_decodes_and_prefills: ", "concat_and_cache_mla: ",
       "gather_and_maybe_dequant_cache: ", "mla_decode: ", "mla_prefill: ", "merge_attn_states: ",
       "batched_matmul: ", "scaled_fp8_quant: ", "copy: ", "fill_zero: "});
  bool finite_inputs = d.kv_format != MLAKIT_KV_CACHE_FP8_DS_MLA && moderate(config.scale) &&
                       moderate(q_scale) && moderate(k_scale) && !fp8_weight;
  for (int i = 0; i < 4; ++i) finite_inputs &= dense_and_backed(t[i]) || numel(t[i]) == 0;
  if (status == MLAKIT_OK && finite_inputs && dense_and_backed(t[4])) {
    for (int64_t i = 0; i < numel(t[4]); ++i) {
      MLAKIT_FUZZ_EXPECT(std::isfinite(float_at(t[4], i)),
                         "MlaAttention::forward: output element " + std::to_string(i) +
                             " is not finite although every input is");
    }
  }
}

void fuzz_parse_kv_cache_dtype(FuzzedDataProvider& in) {
  const std::string name = in.ConsumeRandomLengthString(24);
  int32_t value = -1;
  const mlakit_status_t status = mlakit_parse_kv_cache_dtype(name.c_str(), &value);
  MLAKIT_FUZZ_EXPECT(status == MLAKIT_OK || status == MLAKIT_ERROR_INVALID_ARGUMENT,
                     "parse_kv_cache_dtype returned " + std::string(mlakit_status_name(status)));
  if (status == MLAKIT_OK) {
    MLAKIT_FUZZ_EXPECT(value >= MLAKIT_KV_CACHE_AUTO && value <= MLAKIT_KV_CACHE_FP8_DS_MLA,
                       "parse_kv_cache_dtype gave " + std::to_string(value));
  }
}

}  // namespace
}  // namespace mlakit::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mlakit::fuzz;
  FuzzedDataProvider in(data, size);
  call_description().clear();
  Rng rng(in.ConsumeIntegral<uint32_t>());
  switch (in.ConsumeIntegralInRange(0, 9)) {
    case 0:
      fuzz_concat_and_cache_mla(in, rng);
      break;
    case 1:
      fuzz_gather(in, rng, /*dequant=*/true);
      break;
    case 2:
      fuzz_gather(in, rng, /*dequant=*/false);
      break;
    case 3:
      fuzz_merge_attn_states(in, rng);
      break;
    case 4:
      fuzz_scaled_fp8_quant(in, rng);
      break;
    case 5:
      fuzz_mla_decode(in, rng, /*scheduled=*/false);
      break;
    case 6:
      fuzz_mla_decode(in, rng, /*scheduled=*/true);
      break;
    case 7:
      fuzz_mla_prefill(in, rng);
      break;
    case 8:
      fuzz_attention(in, rng);
      break;
    default:
      fuzz_parse_kv_cache_dtype(in);
      break;
  }
  // Replaying inputs (fuzz_capi FILE...) with MLAKIT_FUZZ_PRINT_CALL set prints each call's
  // tensors and the last error message (which a success may leave from an earlier call): how to
  // pick corpus seeds that reach a given entry point.
  if (std::getenv("MLAKIT_FUZZ_PRINT_CALL") != nullptr) {
    std::fprintf(stderr, "call: %s\n  last error: %s\n", call_description().c_str(),
                 mlakit_last_error());
  }
  return 0;
}
