// The summary of `mlakit run`: human-readable text (stdout) and JSON (--json PATH).
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>

#include "simulation.hpp"

namespace mlakit::cli {

nlohmann::json summary_json(const RunConfig& config, const RunResult& result);
void print_summary(std::ostream& os, const RunConfig& config, const RunResult& result);

}  // namespace mlakit::cli
