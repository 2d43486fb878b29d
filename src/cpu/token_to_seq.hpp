// CPU kernel of ops::fill_token_to_seq (the row -> request map of a context chunk).
#pragma once

#include <cstdint>

#include "mlakit/types.hpp"

namespace mlakit::cpu {

// cu_seq_lens:  i32 [B + 1] host, validated: cu_seq_lens[0] == 0, non-decreasing,
//               cu_seq_lens[B] >= num_tokens
// token_to_seq: i32 [>= num_tokens] host
void fill_token_to_seq(const TensorView& cu_seq_lens, const TensorView& token_to_seq,
                       int64_t num_tokens);

}  // namespace mlakit::cpu
