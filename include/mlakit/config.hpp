// MLA dimensions and KV-cache formats.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "mlakit/dtype.hpp"

namespace mlakit {

// Dimensions of one MLA layer on one rank (names as in DESIGN.md §1).
struct MlaDims {
  int64_t num_heads = 16;          // N: query heads on this rank
  int64_t kv_lora_rank = 512;      // L: latent width
  int64_t qk_rope_head_dim = 64;   // R: rotary part of q/k
  int64_t qk_nope_head_dim = 128;  // P: non-rotary q/k part per head
  int64_t v_head_dim = 128;        // V: value width per head

  int64_t entry_dim() const { return kv_lora_rank + qk_rope_head_dim; }        // L + R (576)
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }  // P + R (192)
  int64_t kv_b_out_dim() const { return qk_nope_head_dim + v_head_dim; }       // P + V (256)

  // Throws mlakit::Error unless every dimension is in [1, 2^31 - 1].
  void validate() const;
};

// Storage format of the paged latent cache (spec A.2).
enum class KvCacheDType : uint8_t {
  kAuto,      // the activation dtype, entry = [kv_c (L) | k_pe (R)]
  kFp8E4m3,   // e4m3 of x / k_scale for the whole entry, one scale per tensor
  kFp8DsMla,  // DeepSeek 656-byte layout: 512 fp8 + 4 f32 tile scales + 64 16-bit rope
};
const char* kv_cache_dtype_name(KvCacheDType dtype);
// Accepts "auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_ds_mla"; throws on anything else.
KvCacheDType parse_kv_cache_dtype(std::string_view name);
bool is_fp8(KvCacheDType dtype);

// Decode context parallelism (DCP; mlakit/dcp.hpp, docs/dcp.md): the KV cache of every request is
// spread over the W ranks of a DCP group. With interleave I, global position p of a request belongs
// to rank (p / I) % W. W = 1 (the default) is no DCP.
struct DcpConfig {
  int64_t world_size = 1;  // W: ranks sharing every request's tokens
  int64_t rank = 0;        // this rank, in [0, W)
  int64_t interleave = 1;  // I: consecutive positions a rank takes per turn (>= 1)

  bool enabled() const { return world_size > 1; }
  // Throws mlakit::Error unless W >= 1, 0 <= rank < W and I >= 1.
  void validate() const;
  bool operator==(const DcpConfig&) const = default;
};

// How the decode kernel accepts query lengths (spec A.4).
enum class QueryLenSupport : uint8_t {
  kSingleOnly,  // every decode has q_len 1
  kUniform,     // all decodes of a batch share one q_len (may be > 1)
  kVarlen,      // decodes may have different q_len
};

}  // namespace mlakit
