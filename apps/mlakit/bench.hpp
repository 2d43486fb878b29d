// `mlakit bench`: ceilings, the grid, the table and the files (docs/cli.md).
#pragma once

#include "bench_options.hpp"

namespace mlakit::cli {

// Returns the exit code: 0, or 2 when a file cannot be written or the plot fails.
int run_bench(const BenchOptions& options);

}  // namespace mlakit::cli
