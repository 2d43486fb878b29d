// Device-side index checks (docs/kernels/cache_cuda.md, "Bad indices on the GPU").
//
// The CPU backend checks the values of index tensors (slots, block tables, request ids) on the
// host before it writes anything. On the GPU those tensors live in device memory, and reading them
// back would synchronize the host and break CUDA-graph capture. So every CUDA kernel checks each
// index it reads; on a bad one it skips that access (nothing out of bounds is ever read or
// written) and sets a bit in a per-device error word. check_device_errors() reports and clears
// the word: call it where the host may synchronize (tests, after a graph replay, at a step end).
#pragma once

#include <cstdint>

#include "mlakit/types.hpp"

namespace mlakit::cuda {

// One bit per (op, kind of bad index). Kept in one place so the message table matches.
enum DeviceErrorBit : uint32_t {
  kConcatSlotOutOfRange = 1u << 0,      // slot_mapping[t] >= num_blocks * block_size
  kGatherRequestOutOfRange = 1u << 1,   // token_to_seq[t] not in [0, batch)
  kGatherTokenOutsideRows = 1u << 2,    // t not in [cu_seq_lens[b], cu_seq_lens[b + 1])
  kGatherNegativeStart = 1u << 3,       // seq_starts[b] < 0
  kGatherColumnOutOfRange = 1u << 4,    // position / block_size >= block_table width
  kGatherBlockOutOfRange = 1u << 5,     // block_table[b, col] not in [0, num_blocks)
  kCpGatherBadRows = 1u << 6,           // cu_seq_lens[b] < 0, decreasing, or beyond dst rows
  kCpGatherNegativeStart = 1u << 7,     // seq_starts[b] < 0
  kCpGatherColumnOutOfRange = 1u << 8,  // position / block_size >= block_table width
  kCpGatherBlockOutOfRange = 1u << 9,   // block_table[b, col] not in [0, num_blocks)
  kPrefillBadSeqlens = 1u << 10,        // cu_seqlens_q / _k not offsets within T / S, or too long
  kDecodeBadIndex = 1u << 11,           // seq_lens[b] not 0 or in [s_q, max_seq_len]; bad block id
  kDecodePlanOverflow = 1u << 12,       // the decode work plan outgrew its proven bounds (a bug)
  kGatherRowOutOfRange = 1u << 13,      // row_index[t] not in [0, rows of src)
  kDcpSlotBadIndex = 1u << 14,          // token_to_req, block column or block id of a token bad
  // A scale read on the device (cuda/common/scale_source.hpp) that is not finite and > 0.
  kConcatBadScale = 1u << 15,  // concat_and_cache_mla's scale tensor (fp8_e4m3)
  kGatherBadScale = 1u << 16,  // gather_and_maybe_dequant_cache's scale tensor (fp8_e4m3)
  kQuantBadScale = 1u << 17,   // scaled_fp8_quant's scale, or a dynamic scale of inf/NaN input
  kDecodeBadScale = 1u << 18,  // mla_decode's q_scale / k_scale tensor
};

// Device address of the error word of the current device (a __device__ variable; no allocation).
// Kernels receive it as a parameter and set bits with atomicOr.
uint32_t* device_error_word(const char* op);

// Waits for `stream`, then reads and clears the error word of `device`. Throws
// mlakit::Error(kOutOfRange) listing every kind of bad index seen since the last check, e.g.
// "cuda:0 device-side check failed: concat_and_cache_mla: a slot_mapping value was >=
// num_blocks * block_size (that token was skipped)". The word is per device: bits set by kernels
// on other streams are reported too once they have run. Synchronizes: not during graph capture.
void check_device_errors(Device device, Stream stream = {});

}  // namespace mlakit::cuda
