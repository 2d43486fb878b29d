#include "cpu/token_to_seq.hpp"

#include <algorithm>

namespace mlakit::cpu {

void fill_token_to_seq(const TensorView& cu_seq_lens, const TensorView& token_to_seq,
                       int64_t num_tokens) {
  const auto* cu = cu_seq_lens.data_as<const int32_t>();
  auto* out = token_to_seq.data_as<int32_t>();
  const int64_t batch = cu_seq_lens.shape[0] - 1;
  const int64_t cs = cu_seq_lens.strides[0], ts = token_to_seq.strides[0];
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t end = std::min<int64_t>(cu[(b + 1) * cs], num_tokens);
    for (int64_t t = cu[b * cs]; t < end; ++t) out[t * ts] = static_cast<int32_t>(b);
  }
}

}  // namespace mlakit::cpu
