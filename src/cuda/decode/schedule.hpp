// Split-KV schedule of the CUDA decode (ops::mla_decode on CUDA tensors).
//
// Contract: for CUDA tensors the schedule is *uniform*: every request has the same number of splits
// S = schedule.max_splits (split_offsets[b] = b * S, total_splits = B * S); split_len is ignored.
// The kernel cuts request b's keys [0, seq_lens[b]) on the device into S chunks of
// round_up(ceil(seq_lens[b] / S), 64) keys, so the schedule depends on shapes only and one CUDA
// graph serves any seq_lens and block tables up to the bound it was planned for. Chunks past the
// end of a short request are empty (their partial LSE is -inf and the combine skips them).
#pragma once

#include <cstdint>

#include "mlakit/plan.hpp"
#include "mlakit/types.hpp"

namespace mlakit::cuda {

// Most splits per request: bounds the combine's work per row and the workspace, and is more than
// enough to spread one request over 132 SMs (S = 132 gives one CTA per SM for B = 1, h_q <= 16).
inline constexpr int64_t kMaxDecodeSplits = 256;

// Splits per request for B requests of `rows_per_request` = s_q * N query rows whose lengths are at
// most `max_seq_len` (e.g. block-table width x block size), on a GPU with `num_sms` SMs. Picks the
// S that minimizes a modelled run time, in units of one 64-key bf16 tile's streaming time per SM:
// waves of one CTA per SM, each CTA streaming ceil(tiles / S) tiles plus one tile of fixed cost
// plus (S > 1) writing its partial rows; then (S > 1) one tile for the combine launch plus reading
// all partials back over the whole GPU. Ties go to the smaller S.
int64_t decode_num_splits(int64_t batch, int64_t rows_per_request, int64_t max_seq_len,
                          int64_t num_sms);

// The uniform schedule with `num_splits` splits per request (see the contract above); split_len
// records the chunk length a request of max_seq_len keys gets.
DecodeSchedule uniform_decode_schedule(int64_t batch, int64_t num_splits, int64_t max_seq_len);

// Both steps for `device`: reads its SM count. Host-only; safe to call while a stream captures.
DecodeSchedule plan_decode_splits_cuda(int64_t batch, int64_t s_q, int64_t num_heads,
                                       int64_t max_seq_len, Device device);

}  // namespace mlakit::cuda
