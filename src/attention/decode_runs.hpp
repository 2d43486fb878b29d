// Grouping of the decode requests into runs the decode kernel can take in one call.
//
// The decode kernel needs one query length per call (q is [B, s_q, N, L + R]). A uniform batch
// (every decode has the same q_len, CUDA-graph padding requests with q_len 0 and seq_len 0
// included, spec F-42) is one run. A varlen batch is cut into maximal runs of consecutive requests
// with equal q_len; requests with q_len 0 are skipped. Host-only, pure.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "mlakit/plan.hpp"

namespace mlakit::detail {

struct DecodeRun {
  int64_t first_request = 0;
  int64_t num_requests = 0;
  int64_t first_token = 0;
  int64_t query_len = 0;
  DecodeSchedule schedule;  // over seq_lens[first_request : first_request + num_requests]
};

struct DecodeRuns {
  std::vector<DecodeRun> runs;
  // Decode tokens [first_padding_token, num_decode_tokens) belong to no request (padding);
  // their latent output is zero.
  int64_t first_padding_token = 0;
};

// The split-KV schedule of one run: (its requests' seq_lens, its q_len) -> schedule. The backend
// decides (the CPU plans from the lengths; the GPU needs a shape-only, graph-safe schedule).
using DecodeScheduler = std::function<DecodeSchedule(std::span<const int32_t>, int64_t)>;

// query_start_loc: [R + 1]; seq_lens: [R].
DecodeRuns decode_runs(const Plan& plan, std::span<const int32_t> query_start_loc,
                       std::span<const int32_t> seq_lens, const DecodeScheduler& scheduler);

}  // namespace mlakit::detail
