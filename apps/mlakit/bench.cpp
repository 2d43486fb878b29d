#include "bench.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>

#include "bench_report.hpp"
#include "mlakit/dtype.hpp"
#include "mlakit/error.hpp"
#include "mlakit/threads.hpp"
#include "output_file.hpp"
#include "presets.hpp"
#include "run_options.hpp"

namespace mlakit::cli {
namespace {

constexpr int kExitError = 2;

// Single-quoted for /bin/sh.
std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (char ch : text) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return quoted + "'";
}

// Draws `json_path` into `png_path` with the Python package's plotter ($MLAKIT_PYTHON, else
// python3). Returns false, having said why on stderr, when it fails.
bool plot(const std::string& json_path, const std::string& png_path) {
  const char* python = std::getenv("MLAKIT_PYTHON");
  const std::string command = shell_quote(python != nullptr ? python : "python3") +
                              " -m mlakit.plot " + shell_quote(json_path) + " " +
                              shell_quote(png_path);
  if (std::system(command.c_str()) != 0) {
    std::cerr << "mlakit: error: --plot: `" << command << "` failed; it needs the Python package "
              << "with matplotlib (pip install './python[plot]')\n";
    return false;
  }
  return true;
}

// --csv and --json naming one file: the JSON, written last, silently replaced the CSV.
void check_outputs_distinct(const BenchOptions& o) {
  if (o.csv_path.empty() || o.json_path.empty()) return;
  std::error_code csv_error, json_error;  // a path that cannot be resolved: compared as given
  const std::filesystem::path csv = std::filesystem::weakly_canonical(o.csv_path, csv_error);
  const std::filesystem::path json = std::filesystem::weakly_canonical(o.json_path, json_error);
  const bool same = csv_error || json_error ? o.csv_path == o.json_path : csv == json;
  if (same) {
    throw Error(ErrorCode::kInvalidArgument, "--csv " + o.csv_path + " and --json " + o.json_path +
                                                 " name the same file; give each its own path");
  }
}

}  // namespace

int run_bench(const BenchOptions& o) {
  check_outputs_distinct(o);
  const Device device = parse_device(o.device);
  const std::string model =
      !o.model.empty() ? o.model : (device.is_cuda() ? "deepseek-v3" : "deepseek-v2-lite");
  const ModelPreset& preset = find_preset(model);
  // The result files are opened before the grid runs: an unwritable path fails now.
  OutputFile csv, json;
  if (!o.csv_path.empty()) csv = OutputFile("--csv", o.csv_path);
  if (!o.json_path.empty()) json = OutputFile("--json", o.json_path);
  BenchSetup setup{device, preset.dims, preset.scale, preset.dtype,
                   o.reps > 0 ? o.reps : (o.quick ? 3 : 7)};
  BenchRun run;
  run.device = device_name(device);
  run.model = preset.name;
  run.dtype = dtype_name(preset.dtype);
  run.threads = cpu_num_threads();
  run.quick = o.quick;
  run.ceilings = measure_ceilings(device, o.quick);
  for (const BenchCase& c : bench_grid(device, o.quick)) {
    std::cerr << "bench: " << bench_kind_name(c.kind) << " " << c.label() << "\n";
    run.results.push_back(run_bench_case(setup, c));
  }
  print_bench_table(std::cout, run);

  if (csv.is_open()) {
    write_bench_csv(csv.stream(), run);
    csv.close();  // throws when a write failed (a full disk): exit 2
  }
  // --plot draws from the JSON: --json's file, or a temporary one.
  std::string json_path = o.json_path;
  if (json_path.empty() && !o.plot_path.empty()) {
    json_path = (std::filesystem::temp_directory_path() /
                 ("mlakit-bench-" + std::to_string(::getpid()) + ".json"))
                    .string();
    json = OutputFile("the --plot data file", json_path);
  }
  if (json.is_open()) {
    json.stream() << bench_json(run).dump(2) << "\n";
    json.close();
  }
  if (!o.plot_path.empty()) {
    const bool plotted = plot(json_path, o.plot_path);
    if (o.json_path.empty()) std::filesystem::remove(json_path);
    if (!plotted) return kExitError;
  }
  return 0;
}

}  // namespace mlakit::cli
