// DCP placement (spec A.3, B.7, F-7): configuration checks and local lengths.
#include <cstdint>
#include <span>
#include <vector>

#include "core/check.hpp"
#include "mlakit/dcp.hpp"

namespace mlakit {

using detail::require;

void DcpConfig::validate() const {
  constexpr const char* kOp = "DcpConfig";
  require(world_size >= 1, ErrorCode::kInvalidArgument, kOp, ": world_size must be >= 1, got ",
          world_size);
  require(rank >= 0 && rank < world_size, ErrorCode::kInvalidArgument, kOp,
          ": rank must be in [0, world_size = ", world_size, "), got ", rank);
  require(interleave >= 1, ErrorCode::kInvalidArgument, kOp, ": interleave must be >= 1, got ",
          interleave);
  int64_t turn = 0;  // positions of one turn of all ranks: every placement formula divides by it
  require(!__builtin_mul_overflow(world_size, interleave, &turn), ErrorCode::kInvalidArgument, kOp,
          ": world_size * interleave must fit in int64, got ", world_size, " * ", interleave);
}

std::vector<int32_t> dcp_local_seq_lens(std::span<const int32_t> seq_lens, const DcpConfig& dcp) {
  dcp.validate();
  std::vector<int32_t> local(seq_lens.size());
  for (size_t r = 0; r < seq_lens.size(); ++r) {
    require(seq_lens[r] >= 0, ErrorCode::kInvalidArgument, "dcp_local_seq_lens: seq_lens[", r,
            "] must be >= 0, got ", seq_lens[r]);
    local[r] = static_cast<int32_t>(
        dcp_local_seq_len(seq_lens[r], dcp.world_size, dcp.rank, dcp.interleave));
  }
  return local;
}

}  // namespace mlakit
