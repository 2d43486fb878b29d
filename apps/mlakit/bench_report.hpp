// Output of `mlakit bench`: the table (with % of roofline), JSON and CSV (docs/cli.md).
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "bench_cases.hpp"
#include "ceilings.hpp"

namespace mlakit::cli {

struct BenchRun {
  std::string device;  // "cpu", "cuda:0"
  std::string model;   // preset name
  std::string dtype;
  int threads = 0;  // CPU threads of the library
  bool quick = false;
  Ceilings ceilings;
  std::vector<BenchResult> results;
};

// Roofline time of a result: max(bytes / bandwidth, flops / GEMM rate).
double roofline_seconds(const BenchResult& r, const Ceilings& c);

void print_bench_table(std::ostream& os, const BenchRun& run);
nlohmann::json bench_json(const BenchRun& run);
void write_bench_csv(std::ostream& os, const BenchRun& run);

}  // namespace mlakit::cli
