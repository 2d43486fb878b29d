// Flags of `mlakit bench` (docs/cli.md).
#pragma once

#include <string>

namespace mlakit::cli {

struct BenchOptions {
  std::string device = "cpu";  // cpu, cuda or cuda:N
  std::string model;           // empty: deepseek-v2-lite on the CPU, deepseek-v3 on a GPU
  bool quick = false;          // the small grid (CPU: under a minute on 2 cores)
  int reps = 0;                // timed runs per case (median); 0: 3 with --quick, else 7
  std::string json_path;       // write the results as JSON
  std::string csv_path;        // write one CSV row per case
  std::string plot_path;       // draw the roofline / time chart (python -m mlakit.plot)
};

}  // namespace mlakit::cli
