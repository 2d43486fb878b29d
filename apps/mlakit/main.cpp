// The `mlakit` command: `run` (serving simulation of an MLA layer stack), `bench` (kernel and
// layer grids against the measured roofline) and `info`.
// Exit codes: 0 success, 1 `run --verify` found errors above tolerance, 2 bad flags or an error.
#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>
#include <string>

#include "bench.hpp"
#include "bench_options.hpp"
#include "device_io.hpp"
#include "info.hpp"
#include "mlakit/error.hpp"
#include "mlakit/threads.hpp"
#include "output_file.hpp"
#include "presets.hpp"
#include "report.hpp"
#include "run_memory.hpp"
#include "run_options.hpp"
#include "simulation.hpp"
#if defined(MLAKIT_WITH_MPI)
#include "dcp_group.hpp"
#endif

namespace {

using mlakit::cli::RunOptions;

constexpr int kExitVerifyFailed = 1;
constexpr int kExitError = 2;

// A CLI11 validator that accepts what sim::parse_len_range accepts.
CLI::Validator len_range_validator(const std::string& flag) {
  return CLI::Validator(
      [flag](std::string& text) -> std::string {
        try {
          mlakit::sim::parse_len_range(text, flag);
          return {};
        } catch (const mlakit::Error& e) {
          const std::string message = e.what();
          const std::string prefix = flag + ": ";  // CLI11 names the flag itself
          return message.rfind(prefix, 0) == 0 ? message.substr(prefix.size()) : message;
        }
      },
      "N|MIN:MAX");
}

// Integers >= minimum (at_least(1) would print the range up to DBL_MAX).
CLI::Validator at_least(int64_t minimum) {
  return CLI::Validator(
      [minimum](std::string& text) -> std::string {
        int64_t value = 0;
        if (!CLI::detail::lexical_cast(text, value)) return "expected an integer, got " + text;
        if (value < minimum) {
          return "must be >= " + std::to_string(minimum) + ", got " + text;
        }
        return {};
      },
      "INT>=" + std::to_string(minimum));
}

// A path to write: not empty (an empty --json '' would silently write nothing).
CLI::Validator non_empty_path() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        return text.empty() ? "must name a file, got an empty path" : std::string();
      },
      "PATH");
}

// A seed: decimal digits of a value in [0, 2^64 - 1] (CLI11 would wrap -1 and saturate larger
// values to 2^64 - 1).
CLI::Validator seed_validator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t value = 0;
        const char* last = text.data() + text.size();
        const auto [end, ec] = std::from_chars(text.data(), last, value);
        if (text.empty() || ec != std::errc() || end != last) {
          return "must be an integer in [0, 18446744073709551615], got " + text;
        }
        return {};
      },
      "UINT64");
}

// A --kv-cache-gb value: finite, > 0 and at most kMaxKvCacheGib (inf, 1e19 and 1e300 overflowed
// the block count into "holds no block").
CLI::Validator kv_cache_gib_validator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double value = 0.0;
        if (CLI::detail::lexical_cast(text, value) && std::isfinite(value) && value > 0.0 &&
            value <= mlakit::cli::kMaxKvCacheGib) {
          return {};
        }
        return "must be a finite number of GiB in (0, " +
               std::to_string(static_cast<int64_t>(mlakit::cli::kMaxKvCacheGib)) + "], got " + text;
      },
      "GIB>0");
}

void add_run_options(CLI::App& run, RunOptions& o) {
  run.add_option("--preset,--model", o.model,
                 "model preset (dims, heads, softmax scale); default deepseek-v2-lite on the "
                 "CPU, deepseek-v3 with --device cuda")
      ->check(CLI::IsMember(mlakit::cli::model_preset_names()));
  run.add_option("--tp", o.tp, "tensor-parallel size: this rank serves num_heads / tp heads")
      ->check(at_least(1))
      ->capture_default_str();
  run.add_option("--num-layers", o.num_layers, "MLA layers in the stack")
      ->check(at_least(1))
      ->capture_default_str();
  run.add_option("--num-requests", o.num_requests, "requests in the workload")
      ->check(at_least(1))
      ->capture_default_str();
  run.add_option("--prompt-len", o.prompt_len, "prompt tokens per request, uniform in MIN:MAX")
      ->check(len_range_validator("--prompt-len"))
      ->capture_default_str();
  run.add_option("--output-len", o.output_len, "generated tokens per request, uniform in MIN:MAX")
      ->check(len_range_validator("--output-len"))
      ->capture_default_str();
  run.add_option("--shared-prefix-len", o.shared_prefix_len,
                 "tokens of a prompt prefix shared by some requests (prefix cache); 0: none")
      ->check(at_least(0))
      ->capture_default_str();
  run.add_option("--shared-prefix-fraction", o.shared_prefix_fraction,
                 "fraction of requests whose prompt starts with the shared prefix")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  run.add_option("--seed", o.seed, "seed of the workload, weights and activations")
      ->check(seed_validator())
      ->capture_default_str();
  run.add_option("--block-size", o.block_size, "tokens per KV-cache block")
      ->check(at_least(1))
      ->capture_default_str();
  auto* num_blocks =
      run.add_option("--num-blocks", o.num_blocks,
                     "KV-cache blocks per layer (default: min(max-num-seqs, num-requests) x "
                     "the largest request's blocks)")
          ->check(at_least(1));
  run.add_option("--kv-cache-gb", o.kv_cache_gb,
                 "KV-cache memory over all layers in GiB (instead of --num-blocks)")
      ->check(kv_cache_gib_validator())
      ->excludes(num_blocks);
  run.add_option("--max-num-seqs", o.max_num_seqs, "requests running at once")
      ->check(at_least(1))
      ->capture_default_str();
  run.add_option("--max-num-batched-tokens", o.max_num_batched_tokens,
                 "token budget of one step (chunked prefill)")
      ->check(at_least(1))
      ->capture_default_str();
  run.add_option("--kv-cache-dtype", o.kv_cache_dtype, "KV-cache format")
      ->check(CLI::IsMember({"auto", "fp8", "fp8_e4m3", "fp8_ds_mla"}))
      ->capture_default_str();
  run.add_option("--dtype", o.dtype, "activation dtype (default: the preset's, bf16)")
      ->check(CLI::IsMember({"bf16", "f16", "f32"}));
  run.add_option("--workspace-tokens", o.workspace_tokens,
                 "rows of the chunked-context gather workspace; 0: the library default")
      ->check(at_least(0))
      ->capture_default_str();
  run.add_option("--device", o.device, "cpu, cuda or cuda:N")->capture_default_str();
  run.add_flag("--verify", o.verify,
               "compare sampled steps with the fp64 oracle (exit 1 on error)");
  run.add_option("--verify-every", o.verify_every,
                 "with --verify: check every k-th decode-only step and every max(1, k/4)-th step "
                 "with prefill")
      ->check(at_least(1))
      ->capture_default_str();
  run.add_option("--verify-heads", o.verify_heads, "with --verify: heads checked per request")
      ->check(at_least(1))
      ->capture_default_str();
  run.add_option("--json", o.json_path, "also write the summary as JSON to PATH")
      ->check(non_empty_path());
  run.add_flag("--no-progress", o.no_progress, "no progress output on stderr");
  run.add_flag("--cuda-graphs", o.cuda_graphs,
               "replay decode-only steps as CUDA graphs, one per batch bucket (--device cuda)");
  run.add_option("--dcp", o.dcp,
                 "decode context parallelism over W ranks (start under mpirun -np W): each rank "
                 "serves num_heads / (tp W) heads and holds 1/W of every request's tokens")
      ->check(at_least(1))
      ->capture_default_str();
  run.add_option("--dcp-interleave", o.dcp_interleave,
                 "with --dcp: consecutive positions a rank takes per turn")
      ->check(at_least(1))
      ->capture_default_str();
}

void add_bench_options(CLI::App& bench, mlakit::cli::BenchOptions& o) {
  bench.add_option("--device", o.device, "cpu, cuda or cuda:N")->capture_default_str();
  bench
      .add_option("--preset,--model", o.model,
                  "model preset; default deepseek-v2-lite on the CPU, deepseek-v3 with cuda")
      ->check(CLI::IsMember(mlakit::cli::model_preset_names()));
  bench.add_flag("--quick", o.quick, "the small grid (under a minute on a 2-core CPU)");
  bench.add_option("--reps", o.reps, "timed runs per case, median (default 3 quick, 7 full)")
      ->check(at_least(1));
  bench.add_option("--json", o.json_path, "write the results as JSON to PATH")
      ->check(non_empty_path());
  bench.add_option("--csv", o.csv_path, "write the results as CSV to PATH")
      ->check(non_empty_path());
  bench
      .add_option("--plot", o.plot_path,
                  "draw the roofline and time chart to PATH.png (python -m mlakit.plot)")
      ->check(non_empty_path());
}

int run_command(const RunOptions& options) {
  mlakit::cli::RunConfig config = mlakit::cli::resolve_run_options(options);
  // Everything the run allocates, against what the machine has, before any of it is allocated.
  mlakit::cli::check_run_memory(
      mlakit::cli::estimate_run_memory(config, mlakit::cli::num_blocks_source(options)),
      mlakit::cli::host_memory_bytes(), mlakit::cli::device_free_bytes(config.device));
#if defined(MLAKIT_WITH_MPI)
  std::unique_ptr<mlakit::cli::DcpGroup> group;
  if (config.dcp.enabled()) {
    group = std::make_unique<mlakit::cli::DcpGroup>(config.dcp.world_size);
    config.dcp.rank = group->rank();
    config.dcp_communicator = &group->communicator();
    config.progress = config.progress && group->rank() == 0;
  }
#else
  if (config.dcp.enabled()) {
    throw mlakit::Error(mlakit::ErrorCode::kUnsupported,
                        "--dcp needs a build with MPI (MLAKIT_WITH_MPI); this one has none");
  }
#endif
  // Opened before the run (an unwritable path fails now, not after it); rank 0 writes it.
  mlakit::cli::OutputFile json;
  if (!options.json_path.empty() && config.dcp.rank == 0) {
    json = mlakit::cli::OutputFile("--json", options.json_path);
  }
  mlakit::cli::RunResult result;
  try {
    result = mlakit::cli::run_simulation(config);
  } catch (const std::exception& e) {
#if defined(MLAKIT_WITH_MPI)
    // The other ranks may wait in a collective for this one: end the whole job.
    if (group) group->abort(e, kExitError);
#endif
    throw;
  }
  bool verify_passed = !config.verify.enabled || result.verify.passed();
#if defined(MLAKIT_WITH_MPI)
  if (group) {
    result.comm_s = group->comm_seconds();
    result.comm_bytes = group->comm_bytes();
    verify_passed = group->gather_rank_stats(result, config.scheduler.num_blocks, verify_passed);
    if (group->rank() != 0) return verify_passed ? 0 : kExitVerifyFailed;  // rank 0 reports
  }
#endif
  mlakit::cli::print_summary(std::cout, config, result);
  if (json.is_open()) {
    json.stream() << mlakit::cli::summary_json(config, result).dump(2) << "\n";
    json.close();
  }
  return verify_passed ? 0 : kExitVerifyFailed;
}

// The library ignores a MLAKIT_NUM_THREADS that sets no thread count (thread_count_setting; it
// falls back to OMP_NUM_THREADS, then the affinity mask): the command says so on stderr.
void warn_about_thread_count() {
  const char* text = std::getenv("MLAKIT_NUM_THREADS");
  if (text == nullptr || mlakit::thread_count_setting(text) > 0) return;
  std::cerr << "mlakit: warning: MLAKIT_NUM_THREADS=\"" << text
            << "\" is not a thread count in [1, 65535]; ignored, using "
            << mlakit::cpu_num_threads() << " threads (OMP_NUM_THREADS, else the affinity mask)\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mlakit: Multi-head Latent Attention (MLA) for LLM inference", "mlakit"};
  app.require_subcommand(1);
  RunOptions options;
  CLI::App* run = app.add_subcommand("run", "simulate serving a stack of MLA layers");
  add_run_options(*run, options);
  mlakit::cli::BenchOptions bench_options;
  CLI::App* bench =
      app.add_subcommand("bench", "time decode, prefill and layer steps against the roofline");
  add_bench_options(*bench, bench_options);
  CLI::App* info = app.add_subcommand("info", "version, build options, backends, CPU and GPU");
  // CLI11 reports a word that is no subcommand as "A subcommand is required": name it instead.
  const std::string first = argc > 1 ? argv[1] : "";
  const bool known =
      !app.get_subcommands([&](CLI::App* sub) { return sub->check_name(first); }).empty();
  if (!first.empty() && first[0] != '-' && !known) {
    std::cerr << "mlakit: error: unknown subcommand \"" << argv[1]
              << "\" (expected run, bench or info; see mlakit --help)\n";
    return kExitError;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitError;
  }
  try {
    warn_about_thread_count();
    int status = 0;
    if (info->parsed()) {
      mlakit::cli::print_info(std::cout);
    } else if (bench->parsed()) {
      status = mlakit::cli::run_bench(bench_options);
    } else {
      status = run_command(options);
    }
    mlakit::cli::flush_stdout();  // a failed write of the summary fails the command
    return status;
  } catch (const std::exception& e) {
    std::cerr << "mlakit: error: " << e.what() << "\n";
    return kExitError;
  }
}
