// ops::dcp_slot_mapping, ops::dcp_lse_combine, ops::dcp_lse_correct, ops::dcp_gathered_rows:
// argument validation (backend independent) and device dispatch.
#include "cpu/dcp.hpp"

#include <limits>
#include <optional>
#include <tuple>

#include "core/check.hpp"
#include "mlakit/ops.hpp"

#ifdef MLAKIT_WITH_CUDA
#include "cuda/dcp/launch.hpp"
#endif

namespace mlakit::ops {

namespace {

using detail::require;
using detail::views_overlap;

constexpr const char* kSlotOp = "dcp_slot_mapping";
constexpr const char* kCombineOp = "dcp_lse_combine";
constexpr const char* kCorrectOp = "dcp_lse_correct";
constexpr const char* kRowsOp = "dcp_gathered_rows";

// A float tensor of partial or combined attention rows: `ndim` dims, D contiguous.
void check_rows(const char* op, const char* name, const TensorView& t, int ndim) {
  detail::check_storage(op, name, t);
  detail::check_ndim(op, name, t, ndim);
  detail::check_float_activation(op, name, t);
  detail::check_inner_contiguous(op, name, t);
}

void check_lse(const char* op, const char* name, const TensorView& t, int ndim) {
  detail::check_storage(op, name, t);
  detail::check_ndim(op, name, t, ndim);
  detail::check_dtype(op, name, t, {DType::kF32});
}

}  // namespace

void dcp_slot_mapping(const TensorView& positions, const TensorView& token_to_req,
                      const TensorView& block_table, int64_t block_size, const DcpConfig& dcp,
                      const TensorView& slot_mapping, [[maybe_unused]] Stream stream) {
  dcp.validate();
  require(block_size > 0, ErrorCode::kInvalidArgument, kSlotOp, ": block_size must be > 0, got ",
          block_size);
  const Device device = detail::common_device(kSlotOp, {{"positions", &positions},
                                                        {"token_to_req", &token_to_req},
                                                        {"block_table", &block_table},
                                                        {"slot_mapping", &slot_mapping}});
  for (auto [name, t, dtype] : {std::tuple{"positions", &positions, DType::kI64},
                                std::tuple{"token_to_req", &token_to_req, DType::kI32},
                                std::tuple{"slot_mapping", &slot_mapping, DType::kI64}}) {
    detail::check_storage(kSlotOp, name, *t);
    detail::check_ndim(kSlotOp, name, *t, 1);
    detail::check_dtype(kSlotOp, name, *t, {dtype});
    detail::check_size(kSlotOp, name, *t, 0, positions.size(0));
  }
  detail::check_storage(kSlotOp, "block_table", block_table);
  detail::check_ndim(kSlotOp, "block_table", block_table, 2);
  detail::check_dtype(kSlotOp, "block_table", block_table, {DType::kI32});
  detail::check_outputs_apart(
      kSlotOp, {{"slot_mapping", &slot_mapping}},
      {{"positions", &positions}, {"token_to_req", &token_to_req}, {"block_table", &block_table}});
  if (device.is_cuda()) {
#ifdef MLAKIT_WITH_CUDA
    return cuda::dcp_slot_mapping(positions, token_to_req, block_table, block_size, dcp,
                                  slot_mapping, stream);
#else
    detail::unsupported_device(kSlotOp, device);
#endif
  }
  cpu::dcp_slot_mapping(positions, token_to_req, block_table, block_size, dcp, slot_mapping);
}

void dcp_lse_combine(const TensorView& partial_out, const TensorView& partial_lse_tokens_heads,
                     const TensorView& out, const std::optional<TensorView>& out_lse_tokens_heads,
                     [[maybe_unused]] Stream stream) {
  check_rows(kCombineOp, "partial_out", partial_out, 4);
  check_rows(kCombineOp, "out", out, 3);
  const int64_t w = partial_out.shape[0];
  require(w >= 1, ErrorCode::kInvalidArgument, kCombineOp,
          ": partial_out.shape[0] (the ranks) must be >= 1, got ", w);
  for (int d = 0; d < 3; ++d)
    detail::check_size(kCombineOp, "partial_out", partial_out, d + 1, out.shape[d]);
  check_lse(kCombineOp, "partial_lse_tokens_heads", partial_lse_tokens_heads, 3);
  detail::check_size(kCombineOp, "partial_lse_tokens_heads", partial_lse_tokens_heads, 0, w);
  detail::check_size(kCombineOp, "partial_lse_tokens_heads", partial_lse_tokens_heads, 1,
                     out.shape[0]);
  detail::check_size(kCombineOp, "partial_lse_tokens_heads", partial_lse_tokens_heads, 2,
                     out.shape[1]);
  detail::check_no_self_overlap(kCombineOp, "out", out);
  require(!views_overlap(out, partial_out), ErrorCode::kInvalidArgument, kCombineOp,
          ": out must not overlap partial_out");
  require(!views_overlap(out, partial_lse_tokens_heads), ErrorCode::kInvalidArgument, kCombineOp,
          ": out must not overlap partial_lse_tokens_heads");
  Device device =
      detail::common_device(kCombineOp, {{"partial_out", &partial_out},
                                         {"partial_lse_tokens_heads", &partial_lse_tokens_heads},
                                         {"out", &out}});
  if (out_lse_tokens_heads) {
    const TensorView& lse = *out_lse_tokens_heads;
    check_lse(kCombineOp, "out_lse_tokens_heads", lse, 2);
    detail::check_size(kCombineOp, "out_lse_tokens_heads", lse, 0, out.shape[0]);
    detail::check_size(kCombineOp, "out_lse_tokens_heads", lse, 1, out.shape[1]);
    detail::check_no_self_overlap(kCombineOp, "out_lse_tokens_heads", lse);
    require(!views_overlap(lse, partial_lse_tokens_heads) && !views_overlap(lse, out) &&
                !views_overlap(lse, partial_out),
            ErrorCode::kInvalidArgument, kCombineOp,
            ": out_lse_tokens_heads must not overlap the other arguments");
    device = detail::common_device(kCombineOp, {{"out", &out}, {"out_lse_tokens_heads", &lse}});
  }
  if (device.is_cuda()) {
#ifdef MLAKIT_WITH_CUDA
    return cuda::dcp_lse_combine(partial_out, partial_lse_tokens_heads, out, out_lse_tokens_heads,
                                 stream);
#else
    detail::unsupported_device(kCombineOp, device);
#endif
  }
  cpu::dcp_lse_combine(partial_out, partial_lse_tokens_heads, out, out_lse_tokens_heads);
}

void dcp_lse_correct(const TensorView& partial_out, const TensorView& all_lse_tokens_heads,
                     int64_t rank, const TensorView& corrected, [[maybe_unused]] Stream stream) {
  check_rows(kCorrectOp, "partial_out", partial_out, 3);
  check_rows(kCorrectOp, "corrected", corrected, 4);
  check_lse(kCorrectOp, "all_lse_tokens_heads", all_lse_tokens_heads, 3);
  const int64_t w = all_lse_tokens_heads.shape[0];
  const int64_t tokens = partial_out.shape[0], heads = partial_out.shape[1];
  require(w >= 1, ErrorCode::kInvalidArgument, kCorrectOp,
          ": all_lse_tokens_heads.shape[0] (the ranks) must be >= 1, got ", w);
  require(rank >= 0 && rank < w, ErrorCode::kInvalidArgument, kCorrectOp, ": rank must be in [0, ",
          w, ") (all_lse_tokens_heads.shape[0]), got ", rank);
  require(heads % w == 0, ErrorCode::kInvalidArgument, kCorrectOp,
          ": partial_out.shape[1] (heads) must be a multiple of the ranks ", w, ", got ", heads);
  detail::check_size(kCorrectOp, "all_lse_tokens_heads", all_lse_tokens_heads, 1, tokens);
  detail::check_size(kCorrectOp, "all_lse_tokens_heads", all_lse_tokens_heads, 2, heads);
  detail::check_size(kCorrectOp, "corrected", corrected, 0, tokens);
  detail::check_size(kCorrectOp, "corrected", corrected, 1, w);
  detail::check_size(kCorrectOp, "corrected", corrected, 2, heads / w);
  detail::check_size(kCorrectOp, "corrected", corrected, 3, partial_out.shape[2]);
  detail::check_no_self_overlap(kCorrectOp, "corrected", corrected);
  require(!views_overlap(corrected, partial_out) && !views_overlap(corrected, all_lse_tokens_heads),
          ErrorCode::kInvalidArgument, kCorrectOp,
          ": corrected must not overlap partial_out or all_lse_tokens_heads");
  const Device device =
      detail::common_device(kCorrectOp, {{"partial_out", &partial_out},
                                         {"all_lse_tokens_heads", &all_lse_tokens_heads},
                                         {"corrected", &corrected}});
  if (device.is_cuda()) {
#ifdef MLAKIT_WITH_CUDA
    return cuda::dcp_lse_correct(partial_out, all_lse_tokens_heads, rank, corrected, stream);
#else
    detail::unsupported_device(kCorrectOp, device);
#endif
  }
  cpu::dcp_lse_correct(partial_out, all_lse_tokens_heads, rank, corrected);
}

void dcp_gathered_rows(const TensorView& cu_seq_lens, const TensorView& seq_starts,
                       const TensorView& rank_cu_seq_lens, int64_t rows_per_rank,
                       int64_t interleave, const TensorView& row_index, int64_t num_tokens,
                       [[maybe_unused]] Stream stream) {
  const Device device = detail::common_device(kRowsOp, {{"cu_seq_lens", &cu_seq_lens},
                                                        {"seq_starts", &seq_starts},
                                                        {"rank_cu_seq_lens", &rank_cu_seq_lens},
                                                        {"row_index", &row_index}});
  for (auto [name, t, ndim] :
       {std::tuple{"cu_seq_lens", &cu_seq_lens, 1}, std::tuple{"seq_starts", &seq_starts, 1},
        std::tuple{"rank_cu_seq_lens", &rank_cu_seq_lens, 2},
        std::tuple{"row_index", &row_index, 1}}) {
    detail::check_storage(kRowsOp, name, *t);
    detail::check_ndim(kRowsOp, name, *t, ndim);
    detail::check_dtype(kRowsOp, name, *t, {DType::kI32});
  }
  require(cu_seq_lens.shape[0] >= 1, ErrorCode::kInvalidArgument, kRowsOp,
          ": cu_seq_lens must have np + 1 >= 1 entries, got 0");
  const int64_t requests = cu_seq_lens.shape[0] - 1;
  detail::check_size(kRowsOp, "seq_starts", seq_starts, 0, requests);
  require(rank_cu_seq_lens.shape[0] >= 1, ErrorCode::kInvalidArgument, kRowsOp,
          ": rank_cu_seq_lens.shape[0] (the ranks) must be >= 1, got ", rank_cu_seq_lens.shape[0]);
  detail::check_size(kRowsOp, "rank_cu_seq_lens", rank_cu_seq_lens, 1, requests + 1);
  require(rows_per_rank >= 0, ErrorCode::kInvalidArgument, kRowsOp,
          ": rows_per_rank must be >= 0, got ", rows_per_rank);
  require(interleave >= 1, ErrorCode::kInvalidArgument, kRowsOp, ": interleave must be >= 1, got ",
          interleave);
  int64_t turn = 0;  // positions of one turn of all ranks, W * I
  require(
      !__builtin_mul_overflow(rank_cu_seq_lens.shape[0], interleave, &turn),
      ErrorCode::kInvalidArgument, kRowsOp,
      ": world_size * interleave (rank_cu_seq_lens.shape[0] * interleave) overflows int64, got ",
      rank_cu_seq_lens.shape[0], " * ", interleave);
  int64_t gathered = 0;  // rows of the all-gathered buffer
  require(!__builtin_mul_overflow(rank_cu_seq_lens.shape[0], rows_per_rank, &gathered) &&
              gathered <= std::numeric_limits<int32_t>::max(),
          ErrorCode::kInvalidArgument, kRowsOp,
          ": the all-gathered rows (rank_cu_seq_lens.shape[0] * rows_per_rank) must fit in int32, "
          "got ",
          rank_cu_seq_lens.shape[0], " * ", rows_per_rank);
  require(num_tokens >= 0, ErrorCode::kInvalidArgument, kRowsOp, ": num_tokens must be >= 0, got ",
          num_tokens);
  detail::check_min_size(kRowsOp, "row_index", row_index, 0, num_tokens);
  detail::check_outputs_apart(kRowsOp, {{"row_index", &row_index}},
                              {{"cu_seq_lens", &cu_seq_lens},
                               {"seq_starts", &seq_starts},
                               {"rank_cu_seq_lens", &rank_cu_seq_lens}});
  if (device.is_cuda()) {
#ifdef MLAKIT_WITH_CUDA
    return cuda::dcp_gathered_rows(cu_seq_lens, seq_starts, rank_cu_seq_lens, rows_per_rank,
                                   interleave, row_index, num_tokens, stream);
#else
    detail::unsupported_device(kRowsOp, device);
#endif
  }
  const auto* cu = cu_seq_lens.data_as<const int32_t>();
  const int64_t stride = cu_seq_lens.strides[0];
  require(cu[0] == 0, ErrorCode::kInvalidArgument, kRowsOp, ": cu_seq_lens[0] must be 0, got ",
          cu[0]);
  for (int64_t b = 0; b < requests; ++b) {
    require(cu[(b + 1) * stride] >= cu[b * stride], ErrorCode::kInvalidArgument, kRowsOp,
            ": cu_seq_lens must be non-decreasing, got cu_seq_lens[", b + 1,
            "] = ", cu[(b + 1) * stride], " < cu_seq_lens[", b, "] = ", cu[b * stride]);
  }
  require(cu[requests * stride] >= num_tokens, ErrorCode::kInvalidArgument, kRowsOp,
          ": cu_seq_lens[np] (", cu[requests * stride], ") must cover num_tokens (", num_tokens,
          ")");
  cpu::dcp_gathered_rows(cu_seq_lens, seq_starts, rank_cu_seq_lens, rows_per_rank, interleave,
                         row_index, num_tokens);
}

}  // namespace mlakit::ops
