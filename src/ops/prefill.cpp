// ops::mla_prefill: argument validation (backend independent) and device dispatch.
#include "cpu/prefill.hpp"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "mlakit/ops.hpp"

#ifdef MLAKIT_WITH_CUDA
#include "cuda/prefill/launch.hpp"
#endif

namespace mlakit::ops {

namespace {

constexpr const char* kOp = "mla_prefill";

// Shapes, dtypes and storage of every argument; reads no tensor data (usable for any device).
void check_prefill_layout(const TensorView& q, const TensorView& k_nope, const TensorView& k_pe,
                          const TensorView& v, const TensorView& cu_seqlens_q,
                          const TensorView& cu_seqlens_k, float scale, const TensorView& out,
                          const std::optional<TensorView>& lse) {
  using namespace detail;
  check_storage(kOp, "q", q);
  check_storage(kOp, "k_nope", k_nope);
  check_storage(kOp, "k_pe", k_pe);
  check_storage(kOp, "v", v);
  check_storage(kOp, "cu_seqlens_q", cu_seqlens_q);
  check_storage(kOp, "cu_seqlens_k", cu_seqlens_k);
  check_storage(kOp, "out", out);
  check_ndim(kOp, "q", q, 3);            // [T, N, P + R]
  check_ndim(kOp, "k_nope", k_nope, 3);  // [S, N, P]
  check_ndim(kOp, "k_pe", k_pe, 2);      // [S, R]
  check_ndim(kOp, "v", v, 3);            // [S, N, V]
  check_ndim(kOp, "cu_seqlens_q", cu_seqlens_q, 1);
  check_ndim(kOp, "cu_seqlens_k", cu_seqlens_k, 1);
  check_ndim(kOp, "out", out, 3);  // [T, N, V]

  check_float_activation(kOp, "q", q);
  check_dtype(kOp, "k_nope", k_nope, {q.dtype});
  check_dtype(kOp, "k_pe", k_pe, {q.dtype});
  check_dtype(kOp, "v", v, {q.dtype});
  check_float_activation(kOp, "out", out);  // any float dtype: partial results may stay f32
  check_dtype(kOp, "cu_seqlens_q", cu_seqlens_q, {DType::kI32});
  check_dtype(kOp, "cu_seqlens_k", cu_seqlens_k, {DType::kI32});

  const int64_t nope = k_nope.shape[2], rope = k_pe.shape[1];
  check_size_matches(kOp, "k_nope", k_nope, 1, "q", q, 1, "heads N");
  check_size_matches(kOp, "k_pe", k_pe, 0, "k_nope", k_nope, 0, "keys S");
  check_size_matches(kOp, "v", v, 0, "k_nope", k_nope, 0, "keys S");
  check_size_matches(kOp, "v", v, 1, "q", q, 1, "heads N");
  int64_t head_dim = 0;  // empty keys may claim any widths: the sum may overflow
  const bool overflow = __builtin_add_overflow(nope, rope, &head_dim);
  if (overflow || q.shape[2] != head_dim) {  // the message costs a stream: built on failure only
    detail::fail(
        ErrorCode::kInvalidArgument,
        str_cat(kOp, ": q.shape[2] must equal k_nope.shape[2] + k_pe.shape[1] (", nope, " + ", rope,
                overflow ? std::string(", which overflows int64") : str_cat(" = ", head_dim),
                "), got ", q.shape[2]));
  }
  require(nope + rope >= 1, ErrorCode::kInvalidArgument, kOp,
          ": the query/key head size k_nope.shape[2] + k_pe.shape[1] must be at least 1, got 0");
  check_min_size(kOp, "v", v, 2, 1);
  check_size_matches(kOp, "out", out, 0, "q", q, 0, "tokens T");
  check_size_matches(kOp, "out", out, 1, "q", q, 1, "heads N");
  check_size_matches(kOp, "out", out, 2, "v", v, 2, "value width V");
  check_min_size(kOp, "cu_seqlens_q", cu_seqlens_q, 0, 1);
  check_size_matches(kOp, "cu_seqlens_k", cu_seqlens_k, 0, "cu_seqlens_q", cu_seqlens_q, 0,
                     "batch B + 1");
  if (lse) {
    check_storage(kOp, "lse", *lse);
    check_ndim(kOp, "lse", *lse, 2);
    check_dtype(kOp, "lse", *lse, {DType::kF32});
    check_size_matches(kOp, "lse", *lse, 0, "q", q, 1, "heads N");
    check_size_matches(kOp, "lse", *lse, 1, "q", q, 0, "tokens T");
  }
  check_positive_finite(kOp, "scale", scale);
  check_outputs_apart(kOp, {{"out", &out}, {"lse", lse ? &*lse : nullptr}},
                      {{"q", &q},
                       {"k_nope", &k_nope},
                       {"k_pe", &k_pe},
                       {"v", &v},
                       {"cu_seqlens_q", &cu_seqlens_q},
                       {"cu_seqlens_k", &cu_seqlens_k}});
}

// Host copy of a cu_seqlens tensor, checked: starts at 0, non-decreasing, last entry <= limit,
// longest request <= max_seqlen.
// cu_seqlens: i32 [B + 1] on the host
std::vector<int64_t> read_cu_seqlens(const char* name, const TensorView& cu_seqlens,
                                     const char* limit_name, int64_t limit, const char* max_name,
                                     int64_t max_seqlen) {
  const int32_t* data = cu_seqlens.data_as<const int32_t>();
  const int64_t entries = cu_seqlens.shape[0];
  std::vector<int64_t> values(entries);
  int64_t longest = 0;
  for (int64_t i = 0; i < entries; ++i) {
    values[i] = data[i * cu_seqlens.strides[0]];
    if (i == 0) {
      detail::require(values[0] == 0, ErrorCode::kInvalidArgument, kOp, ": ", name,
                      "[0] must be 0, got ", values[0]);
      continue;
    }
    detail::require(values[i] >= values[i - 1], ErrorCode::kInvalidArgument, kOp, ": ", name,
                    " must be non-decreasing, got ", name, "[", i, "] = ", values[i], " after ",
                    values[i - 1]);
    longest = std::max(longest, values[i] - values[i - 1]);
  }
  detail::require(values.back() <= limit, ErrorCode::kInvalidArgument, kOp, ": ", name, "[",
                  entries - 1, "] must be at most ", limit_name, " (", limit, "), got ",
                  values.back());
  detail::require(max_seqlen >= longest, ErrorCode::kInvalidArgument, kOp, ": ", max_name,
                  " must be at least the longest request in ", name, " (", longest, "), got ",
                  max_seqlen);
  return values;
}

}  // namespace

void mla_prefill(const TensorView& q, const TensorView& k_nope, const TensorView& k_pe,
                 const TensorView& v, const TensorView& cu_seqlens_q,
                 const TensorView& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                 float scale, bool causal, const TensorView& out,
                 const std::optional<TensorView>& lse, [[maybe_unused]] Stream stream) {
  check_prefill_layout(q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, scale, out, lse);
  Device device = detail::common_device(kOp, {{"q", &q},
                                              {"k_nope", &k_nope},
                                              {"k_pe", &k_pe},
                                              {"v", &v},
                                              {"cu_seqlens_q", &cu_seqlens_q},
                                              {"cu_seqlens_k", &cu_seqlens_k},
                                              {"out", &out}});
  if (lse) {
    device = detail::common_device(kOp, {{"q", &q}, {"lse", &*lse}});
  }
  if (device.is_cuda()) {
#ifdef MLAKIT_WITH_CUDA
    // cu_seqlens stay on the device: the kernel checks their values (cuda/prefill/launch.hpp).
    return cuda::mla_prefill(q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                             max_seqlen_k, scale, causal, out, lse, stream);
#endif
  }
  if (!device.is_cpu()) detail::unsupported_device(kOp, device);
  detail::require(q.shape[2] <= cpu::kPrefillMaxHeadDim && v.shape[2] <= cpu::kPrefillMaxHeadDim,
                  ErrorCode::kUnsupported, kOp, ": the CPU kernel takes head sizes up to ",
                  cpu::kPrefillMaxHeadDim, ", got q.shape[2] = ", q.shape[2],
                  " and v.shape[2] = ", v.shape[2]);

  cpu::PrefillArgs args;
  args.q = q;
  args.k_nope = k_nope;
  args.k_pe = k_pe;
  args.v = v;
  args.out = out;
  args.lse_heads_tokens = lse;
  const std::vector<int64_t> cu_q = read_cu_seqlens("cu_seqlens_q", cu_seqlens_q, "q.shape[0]",
                                                    q.shape[0], "max_seqlen_q", max_seqlen_q);
  const std::vector<int64_t> cu_k = read_cu_seqlens("cu_seqlens_k", cu_seqlens_k, "k_nope.shape[0]",
                                                    k_nope.shape[0], "max_seqlen_k", max_seqlen_k);
  args.cu_seqlens_q = cu_q;
  args.cu_seqlens_k = cu_k;
  args.scale = scale;
  args.causal = causal;
  cpu::mla_prefill(args);
}

}  // namespace mlakit::ops
