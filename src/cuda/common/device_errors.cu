#include <mutex>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "cuda/common/device_errors.cuh"
#include "cuda/common/runtime.hpp"

namespace mlakit::cuda {

namespace {

// One instance per device (each device loads this module separately).
__device__ uint32_t g_error_word = 0;
__device__ uint32_t g_error_snapshot = 0;

// snapshot = word; word = 0, atomically, so bits set concurrently are never lost.
__global__ void take_error_word_kernel() { g_error_snapshot = atomicExch(&g_error_word, 0u); }

struct BitMessage {
  uint32_t bit;
  const char* text;
};
constexpr BitMessage kMessages[] = {
    {kConcatSlotOutOfRange,
     "concat_and_cache_mla: a slot_mapping value was >= num_blocks * block_size (that token was "
     "skipped)"},
    {kGatherRequestOutOfRange,
     "gather_and_maybe_dequant_cache: a token_to_seq value was not a request index in [0, batch) "
     "(that token was skipped)"},
    {kGatherTokenOutsideRows,
     "gather_and_maybe_dequant_cache: a token t was mapped to a request b whose rows "
     "[cu_seq_lens[b], cu_seq_lens[b + 1]) do not hold t (that token was skipped)"},
    {kGatherNegativeStart,
     "gather_and_maybe_dequant_cache: a seq_starts value was negative (that token was skipped)"},
    {kGatherColumnOutOfRange,
     "gather_and_maybe_dequant_cache: a token's position needed a block column >= the "
     "block_table width (that token was skipped)"},
    {kGatherBlockOutOfRange,
     "gather_and_maybe_dequant_cache: a block_table entry was not a block id in [0, num_blocks) "
     "(that token was skipped)"},
    {kCpGatherBadRows,
     "cp_gather_cache: cu_seq_lens was negative, decreasing or beyond the rows of dst (that "
     "request was skipped)"},
    {kCpGatherNegativeStart,
     "cp_gather_cache: a seq_starts value was negative (that request was skipped)"},
    {kCpGatherColumnOutOfRange,
     "cp_gather_cache: a position needed a block column >= the block_table width (that row was "
     "skipped)"},
    {kCpGatherBlockOutOfRange,
     "cp_gather_cache: a block_table entry was not a block id in [0, num_blocks) (that row was "
     "skipped)"},
    {kPrefillBadSeqlens,
     "mla_prefill: cu_seqlens_q / cu_seqlens_k were not non-decreasing offsets from 0 within "
     "q.shape[0] / k_nope.shape[0], or a request was longer than max_seqlen_q / max_seqlen_k "
     "(that request's rows were not written)"},
    {kDecodeBadIndex,
     "mla_decode: a seq_lens value was outside [0, block_table width * block_size] (or above the "
     "schedule's max_seq_len) or in (0, s_q) (seq_lens count the new tokens too), or a "
     "block_table entry it needed was not a block id in [0, num_blocks) (those rows are NaN)"},
    {kDecodePlanOverflow,
     "mla_decode: internal error: the work plan exceeded the bounds its workspace was sized for "
     "(some rows were not computed); please report this"},
    {kGatherRowOutOfRange,
     "gather_rows_and_maybe_dequant: a row_index value was not a row of src (that row was "
     "skipped)"},
    {kDcpSlotBadIndex,
     "dcp_slot_mapping: a token_to_req value was not a block_table row, or its local position "
     "needed a block column beyond the table, a negative block id or one whose slot overflows "
     "int64 (that token got slot -1)"},
    {kConcatBadScale,
     "concat_and_cache_mla: the scale tensor held a value that is not finite and > 0 (the "
     "fp8_e4m3 entries of that call were written as NaN codes)"},
    {kGatherBadScale,
     "gather_and_maybe_dequant_cache: the scale tensor held a value that is not finite and > 0 "
     "(the fp8_e4m3 rows of that call were written as NaN)"},
    {kQuantBadScale,
     "scaled_fp8_quant: the scale tensor held a value that is not finite and > 0 with a finite "
     "reciprocal, or dynamic_scaled_fp8_quant's scale amax(|input|) / 448 had none (input held "
     "inf or NaN, or only magnitudes below ~1.3e-36) (out of that call was written as NaN "
     "codes)"},
    {kDecodeBadScale,
     "mla_decode: a q_scale or k_scale tensor held a value that is not finite and > 0 (the rows "
     "of the requests it scales are NaN)"},
};

struct Symbols {
  uint32_t* word = nullptr;
  uint32_t* snapshot = nullptr;
};

// Addresses of the two variables on the current device, looked up once per device.
Symbols symbols(const char* op) {
  static std::mutex mutex;
  static std::vector<Symbols> by_device;
  const int device = current_device(op);
  std::lock_guard<std::mutex> lock(mutex);
  if (device >= static_cast<int>(by_device.size())) by_device.resize(device + 1);
  Symbols& s = by_device[device];
  if (s.word == nullptr) {
    void* word = nullptr;
    void* snapshot = nullptr;
    check_cuda(cudaGetSymbolAddress(&word, g_error_word), op, "cudaGetSymbolAddress(error word)");
    check_cuda(cudaGetSymbolAddress(&snapshot, g_error_snapshot), op,
               "cudaGetSymbolAddress(error snapshot)");
    s = {static_cast<uint32_t*>(word), static_cast<uint32_t*>(snapshot)};
  }
  return s;
}

}  // namespace

uint32_t* device_error_word(const char* op) { return symbols(op).word; }

void check_device_errors(Device device, Stream stream) {
  constexpr const char* kOp = "check_device_errors";
  static std::mutex mutex;  // one snapshot variable per device: one reader at a time
  std::lock_guard<std::mutex> lock(mutex);
  DeviceGuard guard(device, kOp);
  const cudaStream_t s = as_cuda_stream(stream);
  detail::require(!is_capturing(s, kOp), ErrorCode::kInvalidArgument, kOp,
                  ": the stream is being captured into a CUDA graph; check after the graph ran");
  const Symbols sym = symbols(kOp);
  take_error_word_kernel<<<1, 1, 0, s>>>();
  check_launch(kOp, "take_error_word_kernel");
  uint32_t bits = 0;
  check_cuda(cudaMemcpyAsync(&bits, sym.snapshot, sizeof(bits), cudaMemcpyDeviceToHost, s), kOp,
             "cudaMemcpyAsync(error snapshot)");
  check_cuda(cudaStreamSynchronize(s), kOp, "cudaStreamSynchronize");
  if (bits == 0) return;
  std::string message = detail::str_cat(device_name(device), " device-side check failed:");
  for (const BitMessage& m : kMessages) {
    if (bits & m.bit) message += detail::str_cat(" ", m.text, ";");
  }
  message.back() = '.';
  detail::fail(ErrorCode::kOutOfRange, message);
}

}  // namespace mlakit::cuda
