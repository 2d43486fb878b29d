// CPU kernel of ops::mla_decode (absorbed MQA over the paged latent cache, split-KV + combine).
// Takes arguments that the op has already validated, index contents included.
#pragma once

#include <cstdint>

#include "core/decode_problem.hpp"
#include "mlakit/plan.hpp"

namespace mlakit::cpu {

// Runs every (request, split) of `schedule` in parallel, then combines requests with more than
// one split. Uses per-thread scratch buffers that grow on first use (no allocation afterwards).
void mla_decode(const DecodeProblem& problem, const DecodeSchedule& schedule);

}  // namespace mlakit::cpu
