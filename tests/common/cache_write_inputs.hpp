// One concat_and_cache_mla case of the cache-write tests (CPU and GPU): its parameters, and its
// host inputs: kv_c / k_pe (dense, or column slices of one kv_lora tensor), special values where
// the case asks for them, a NaN-poisoned cache (dense or strided) and distinct random slots with
// some tokens skipped.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "mlakit/kv_cache.hpp"
#include "mlakit/types.hpp"

namespace mlakit::test {

struct CacheWriteCase {
  int64_t num_tokens = 42;  // slot_mapping length
  int64_t extra_rows = 0;   // kv_c / k_pe rows beyond num_tokens (CUDA-graph padding)
  int64_t latent = 512;     // L
  int64_t rope = 64;        // R
  int64_t block_size = 16;
  int64_t num_blocks = 8;
  DType act = DType::kBF16;
  KvCacheDType kv_dtype = KvCacheDType::kAuto;
  float k_scale = 1.0f;
  bool sliced_inputs = false;  // kv_c and k_pe are column slices of one kv_lora tensor
  int64_t input_pad = 0;       // kv_lora is [T', L + R + input_pad]; odd pads: unaligned rows
  bool strided_cache = false;  // the cache is a transposed view of a padded [bs, nb, W + 8] buffer
  bool bit_patterns = false;   // f32 inputs with raw bit patterns around e4m3's range, inf, NaN
  double skip_fraction = 0.2;  // share of tokens with slot -1
  uint64_t stream = 0;         // rng stream
};

std::string describe(const CacheWriteCase& c);

// Case i of a sweep of small random shapes: auto or fp8_e4m3 (k_scale 2 or 0.25) and the act
// dtype by i, L in [1, 96], R in [1, 40], 1 to 12 blocks of 1, 5, 16 or 64 slots with up to every
// slot written; sliced, padded and strided layouts by i. Rng stream 500 + i; no extra rows.
CacheWriteCase random_cache_write_case(std::mt19937_64& rng, uint64_t i);

int64_t cache_entry_width(const CacheWriteCase& c);  // W: L + R, or 656 bytes for fp8_ds_mla
DType cache_storage_dtype(const CacheWriteCase& c);  // act for auto, else u8

struct CacheWriteInputs {
  Tensor kv_c_storage;  // kv_lora [T', L + R + pad] when sliced_inputs, else [T', L]
  Tensor k_pe_storage;  // the same kv_lora tensor when sliced_inputs, else [T', R]
  TensorView kv_c;      // [T', L], T' = num_tokens + extra_rows
  TensorView k_pe;      // [T', R]
  Tensor cache_buffer;  // the cache's storage, every element NaN
  TensorView cache;     // [nb, bs, W]: the whole buffer, or a transposed view of [bs, nb, W + 8]
  std::vector<int64_t> slots;  // [T]: distinct slots; -1 for skipped tokens
  Tensor slot_mapping;         // i64 [T]: slots
};

// Random N(0, 1) inputs of c.act, then, in row-major order from the first row:
// - bit_patterns (f32 only): random bit patterns with exponents 2^-22 .. 2^10 (e4m3's subnormals,
//   normals and saturation), every 16th fully random (f32 subnormals, inf, NaN of either sign),
//   in kv_c and k_pe, each starting with 12 special values (+-inf, +-NaN, FLT_MAX, 448, 464,
//   -480, FLT_MIN, an f32 subnormal, +-0);
// - else for fp8_e4m3: kv_c starts with values far past 448 * k_scale (saturation) and midpoints
//   between two e4m3 values times k_scale (ties to the even code);
// - for fp8_ds_mla: kv_c's first 128 values (one tile) are zero.
CacheWriteInputs make_cache_write_inputs(std::mt19937_64& rng, const CacheWriteCase& c);

}  // namespace mlakit::test
