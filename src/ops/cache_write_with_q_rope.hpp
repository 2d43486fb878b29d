// The decode layer's cache write with the queries' rope part riding along (docs/attention.md,
// "Launches of a decode step"): an ops-level entry the orchestrator uses, not part of the public
// ops API. One launch on CUDA where concat_and_cache_mla and a copy took two.
#pragma once

#include "mlakit/config.hpp"
#include "mlakit/types.hpp"

namespace mlakit::ops {

// concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale), and
// q_rope_dst = q_rope_src bit for bit:
// q_rope_src: [Td, N, R]  activation dtype, last dim contiguous (q[:Td, :, P:P+R])
// q_rope_dst: [Td, N, R]  q_rope_src's dtype, last dim contiguous, no two elements share storage
//                         (the absorbed query buffer's columns L:L+R)
// Throws as concat_and_cache_mla does, or naming q_rope_src / q_rope_dst; on the GPU both run in
// the cache write's launch.
void concat_and_cache_mla_with_q_rope(const TensorView& kv_c, const TensorView& k_pe,
                                      const TensorView& kv_cache, const TensorView& slot_mapping,
                                      KvCacheDType kv_cache_dtype, float scale,
                                      const TensorView& q_rope_src, const TensorView& q_rope_dst,
                                      Stream stream = {});

}  // namespace mlakit::ops
