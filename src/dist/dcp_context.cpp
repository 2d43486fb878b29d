#include "dist/dcp_context.hpp"

#include "core/check.hpp"
#include "mlakit/ops.hpp"

namespace mlakit::dist {

void dcp_gather_context_chunk(Communicator& comm, const TensorView& kv_cache,
                              const TensorView& block_table, const DcpChunkIndex& chunk,
                              const TensorView& exchange, const TensorView& dst,
                              KvCacheDType kv_dtype, float k_scale, Stream stream) {
  constexpr const char* kOp = "dcp_gather_context_chunk";
  const int64_t w = comm.world_size(), rows = chunk.rows_per_rank;
  detail::check_storage(kOp, "exchange", exchange);
  detail::check_ndim(kOp, "exchange", exchange, 2);
  detail::check_contiguous(kOp, "exchange", exchange);
  detail::require(rows >= 0, ErrorCode::kInvalidArgument, kOp,
                  ": chunk.rows_per_rank must be >= 0, got ", rows);
  detail::check_min_size(kOp, "exchange", exchange, 0, w * rows);
  detail::check_ndim(kOp, "chunk.local_cu_seq_lens", chunk.local_cu_seq_lens, 1);
  detail::check_min_size(kOp, "chunk.local_cu_seq_lens", chunk.local_cu_seq_lens, 0, 1);

  const TensorView all_rows = exchange.narrow(0, 0, w * rows);
  const TensorView my_rows = exchange.narrow(0, comm.rank() * rows, rows);
  ops::cp_gather_cache(kv_cache, my_rows, block_table, chunk.local_cu_seq_lens,
                       chunk.local_cu_seq_lens.shape[0] - 1, chunk.local_starts, stream);
  comm.all_gather(my_rows, all_rows, stream);
  ops::gather_rows_and_maybe_dequant(all_rows, dst, chunk.gathered_row, kv_dtype, k_scale, stream);
}

}  // namespace mlakit::dist
