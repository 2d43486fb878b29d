#include "dist/dcp_decode.hpp"

#include <initializer_list>

#include "core/check.hpp"
#include "mlakit/ops.hpp"

namespace mlakit::dist {

namespace {

using detail::require;

// A contiguous tensor of exactly `shape` (the layouts the collectives need).
void check_dense(const char* op, const char* name, const TensorView& t,
                 std::initializer_list<int64_t> shape) {
  detail::check_storage(op, name, t);
  detail::check_ndim(op, name, t, static_cast<int>(shape.size()));
  int dim = 0;
  for (int64_t size : shape) detail::check_size(op, name, t, dim++, size);
  detail::check_contiguous(op, name, t);
}

}  // namespace

DcpDecodeBuffers dcp_decode_buffers(const DcpDecodeShape& s, int64_t world_size) {
  DcpDecodeBuffers b;
  b.gathered_queries = world_size * s.num_tokens * s.num_heads * s.entry_dim;
  b.gathered_lse = world_size * s.num_tokens * world_size * s.num_heads;
  b.corrected = world_size * s.num_tokens * s.num_heads * s.kv_lora_rank;
  return b;
}

void dcp_gather_queries(Communicator& comm, const TensorView& q_local,
                        const TensorView& gathered_queries, const TensorView& q_all,
                        std::optional<float> fp8_q_scale, Stream stream) {
  constexpr const char* kOp = "dcp_gather_queries";
  detail::check_ndim(kOp, "q_local", q_local, 3);
  const int64_t w = comm.world_size();
  const int64_t t = q_local.shape[0], n = q_local.shape[1], e = q_local.shape[2];
  check_dense(kOp, "q_local", q_local, {t, n, e});
  check_dense(kOp, "gathered_queries", gathered_queries, {w, t, n, e});
  check_dense(kOp, "q_all", q_all, {t, w * n, e});
  const bool fp8 = q_all.dtype == DType::kFp8E4m3 || q_all.dtype == DType::kU8;
  require(fp8 == fp8_q_scale.has_value(), ErrorCode::kInvalidArgument, kOp,
          ": fp8_q_scale must be given exactly when q_all is fp8, got q_all ",
          dtype_name(q_all.dtype), fp8_q_scale ? " with" : " without", " a scale");

  comm.all_gather(q_local, gathered_queries, stream);
  // [W, T, N, E] -> [T, W, N, E]: head k N + n of token t is rank k's head n.
  const TensorView by_token = gathered_queries.transpose(0, 1);
  const TensorView dst = q_all.reshape({t, w, n, e});
  if (fp8) {
    ops::scaled_fp8_quant(by_token, dst, *fp8_q_scale, stream);
  } else {
    ops::copy(by_token, dst, stream);
  }
}

void dcp_combine_heads(Communicator& comm, const TensorView& partial_out,
                       const TensorView& partial_lse, const TensorView& gathered_lse,
                       const TensorView& corrected, const TensorView& out, Stream stream) {
  constexpr const char* kOp = "dcp_combine_heads";
  detail::check_ndim(kOp, "partial_out", partial_out, 3);
  const int64_t w = comm.world_size();
  const int64_t t = partial_out.shape[0], h = partial_out.shape[1], l = partial_out.shape[2];
  require(h % w == 0, ErrorCode::kInvalidArgument, kOp,
          ": partial_out.shape[1] (heads) must be a multiple of the world size ", w, ", got ", h);
  const int64_t n = h / w;
  check_dense(kOp, "partial_lse", partial_lse, {t, h});
  check_dense(kOp, "gathered_lse", gathered_lse, {w, t, h});
  check_dense(kOp, "corrected", corrected, {w, t, n, l});
  check_dense(kOp, "out", out, {t, n, l});

  comm.all_gather(partial_lse, gathered_lse, stream);
  // corrected[k, t, n, :] = this rank's weighted partial of head k N + n: block k goes to rank k.
  ops::dcp_lse_correct(partial_out, gathered_lse, comm.rank(), corrected.transpose(0, 1), stream);
  comm.reduce_scatter_sum(corrected, out, stream);
}

}  // namespace mlakit::dist
