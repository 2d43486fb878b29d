#include "bench_report.hpp"

#include <algorithm>
#include <cstdio>

namespace mlakit::cli {
namespace {

bool memory_bound(const BenchResult& r, const Ceilings& c) {
  return r.bytes / (c.memory_gbs * 1e9) >= r.flops / (c.gemm_gflops * 1e9);
}

// The printf-formatted text (the table's rows are fixed-width).
template <class... Args>
std::string format(const char* fmt, Args... args) {
  char line[256];  // wider than any row
  std::snprintf(line, sizeof(line), fmt, args...);
  return line;
}

}  // namespace

double roofline_seconds(const BenchResult& r, const Ceilings& c) {
  return std::max(r.bytes / (c.memory_gbs * 1e9), r.flops / (c.gemm_gflops * 1e9));
}

void print_bench_table(std::ostream& os, const BenchRun& run) {
  os << "mlakit bench: " << run.device << " (" << run.threads << " CPU threads), " << run.model
     << ", " << run.dtype << (run.quick ? ", quick grid" : "") << "\n";
  os << format("ceilings: memory %.1f GB/s (%s); GEMM %.1f GFLOP/s (%s)\n\n",
               run.ceilings.memory_gbs, run.ceilings.memory_method.c_str(),
               run.ceilings.gemm_gflops, run.ceilings.gemm_method.c_str());
  os << format("%-8s %-30s %11s %9s %8s %12s %8s  %s\n", "kind", "case", "time us", "GFLOP/s",
               "GB/s", "roofline us", "% roof", "bound");
  for (const BenchResult& r : run.results) {
    const double roof = roofline_seconds(r, run.ceilings);
    os << format("%-8s %-30s %11.1f %9.1f %8.1f %12.1f %7.0f%%  %s\n",
                 bench_kind_name(r.bench_case.kind), r.bench_case.label().c_str(), r.seconds * 1e6,
                 r.flops / r.seconds / 1e9, r.bytes / r.seconds / 1e9, roof * 1e6,
                 100.0 * roof / r.seconds, memory_bound(r, run.ceilings) ? "memory" : "compute");
  }
}

nlohmann::json bench_json(const BenchRun& run) {
  nlohmann::json j;
  j["mlakit_version"] = MLAKIT_VERSION;
  j["device"] = run.device;
  j["model"] = run.model;
  j["dtype"] = run.dtype;
  j["cpu_threads"] = run.threads;
  j["quick"] = run.quick;
  j["ceilings"] = {{"memory_gbs", run.ceilings.memory_gbs},
                   {"memory_method", run.ceilings.memory_method},
                   {"gemm_gflops", run.ceilings.gemm_gflops},
                   {"gemm_method", run.ceilings.gemm_method}};
  nlohmann::json results = nlohmann::json::array();
  for (const BenchResult& r : run.results) {
    const double roof = roofline_seconds(r, run.ceilings);
    results.push_back({{"kind", bench_kind_name(r.bench_case.kind)},
                       {"case", r.bench_case.label()},
                       {"batch", r.bench_case.batch},
                       {"tokens", r.bench_case.tokens},
                       {"time_s", r.seconds},
                       {"flops", r.flops},
                       {"bytes", r.bytes},
                       {"gflops", r.flops / r.seconds / 1e9},
                       {"gbs", r.bytes / r.seconds / 1e9},
                       {"roofline_s", roof},
                       {"roofline_fraction", roof / r.seconds},
                       {"bound", memory_bound(r, run.ceilings) ? "memory" : "compute"}});
  }
  j["results"] = results;
  return j;
}

void write_bench_csv(std::ostream& os, const BenchRun& run) {
  os << "device,model,dtype,kind,case,batch,tokens,time_s,flops,bytes,gflops,gbs,roofline_s,"
        "roofline_fraction,bound\n";
  for (const BenchResult& r : run.results) {
    const double roof = roofline_seconds(r, run.ceilings);
    os << run.device << "," << run.model << "," << run.dtype << ","
       << bench_kind_name(r.bench_case.kind) << "," << r.bench_case.label() << ","
       << r.bench_case.batch << "," << r.bench_case.tokens << ","
       << format("%.9g,%.9g,%.9g,%.6g,%.6g,%.9g,%.4f", r.seconds, r.flops, r.bytes,
                 r.flops / r.seconds / 1e9, r.bytes / r.seconds / 1e9, roof, roof / r.seconds)
       << "," << (memory_bound(r, run.ceilings) ? "memory" : "compute") << "\n";
  }
}

}  // namespace mlakit::cli
