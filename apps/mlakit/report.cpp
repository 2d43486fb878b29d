#include "report.hpp"

#include <algorithm>
#include <cstdio>
#include <string>

namespace mlakit::cli {

namespace {

double rate(double amount, double seconds) { return seconds > 0.0 ? amount / seconds : 0.0; }
double per_second(int64_t count, double seconds) {
  return rate(static_cast<double>(count), seconds);
}

std::string range_string(const sim::LenRange& r) {
  return r.min == r.max ? std::to_string(r.min)
                        : std::to_string(r.min) + ":" + std::to_string(r.max);
}

// Host time of one layer's forward() call (a graph launch shared by its layers), in us.
double per_layer_us(const PhaseStats& p) {
  return p.layer_calls > 0 ? 1e6 * p.host_s / static_cast<double>(p.layer_calls) : 0.0;
}

nlohmann::json phase_json(const PhaseStats& p) {
  return {{"steps", p.steps},
          {"prompt_tokens", p.prompt_tokens},
          {"decode_tokens", p.decode_tokens},
          {"wall_s", p.wall_s},
          {"forward_s", p.forward_s},
          {"host_s", p.host_s},
          {"layer_calls", p.layer_calls},
          {"host_us_per_layer", per_layer_us(p)},
          {"prefill_gflop", p.prefill_flops * 1e-9},
          {"decode_gflop", p.decode_flops * 1e-9},
          {"decode_gbytes", p.decode_bytes * 1e-9}};
}

nlohmann::json error_json(const PhaseError& e) {
  return {{"checks", e.checks},           {"rows", e.rows},         {"max_abs_err", e.max_abs_err},
          {"max_abs_ref", e.max_abs_ref}, {"rel_err", e.rel_err()}, {"tolerance", e.tolerance},
          {"allowed", e.allowed()},       {"pass", e.passed()}};
}

// printf into a std::string (the summary lines are fixed-format tables).
template <class... Args>
std::string format(const char* fmt, Args... args) {
  std::string line(static_cast<size_t>(std::snprintf(nullptr, 0, fmt, args...)), '\0');
  std::snprintf(line.data(), line.size() + 1, fmt, args...);
  return line;
}

std::string error_line(const char* name, const PhaseError& e) {
  if (e.checks == 0) return format("  %-8s no request of this kind was sampled\n", name);
  return format(
      "  %-8s %lld requests, %lld rows: max abs err %.3g (allowed %.3g), max |ref| "
      "%.3g, rel %.3g  %s\n",
      name, static_cast<long long>(e.checks), static_cast<long long>(e.rows), e.max_abs_err,
      e.allowed(), e.max_abs_ref, e.rel_err(), e.passed() ? "ok" : "FAIL");
}

}  // namespace

nlohmann::json summary_json(const RunConfig& c, const RunResult& r) {
  const sim::SchedulerStats& s = r.scheduler;
  nlohmann::json j;
  j["config"] = {{"model", c.model},
                 {"tp", c.tp},
                 {"num_heads", c.dims.num_heads},
                 {"scale", c.scale},
                 {"num_layers", c.num_layers},
                 {"dtype", dtype_name(c.dtype)},
                 {"kv_cache_dtype", kv_cache_dtype_name(c.kv_cache_dtype)},
                 {"device", device_name(c.device)},
                 {"num_requests", c.workload.num_requests},
                 {"prompt_len", range_string(c.workload.prompt_len)},
                 {"output_len", range_string(c.workload.output_len)},
                 {"shared_prefix_len", c.workload.shared_prefix_len},
                 {"shared_prefix_fraction", c.workload.shared_prefix_fraction},
                 {"seed", c.workload.seed},
                 {"block_size", c.scheduler.block_size},
                 {"num_blocks", c.scheduler.num_blocks},
                 {"max_num_seqs", c.scheduler.max_num_seqs},
                 {"max_num_batched_tokens", c.scheduler.max_num_batched_tokens},
                 {"workspace_tokens", c.workspace_tokens},
                 {"dcp", c.dcp.world_size},
                 {"dcp_interleave", c.dcp.interleave}};
  j["requests"] = {{"total", r.num_requests}, {"finished", s.finished}};
  j["steps"] = {{"total", s.steps}, {"prefill", r.prefill.steps}, {"decode_only", r.decode.steps}};
  j["tokens"] = {{"prefill", s.prompt_tokens},
                 {"decode", s.decode_tokens},
                 {"decode_in_decode_only_steps", r.decode.decode_tokens},
                 {"prefix_cache_hit", s.prefix_hit_tokens}};
  j["time_s"] = {{"setup", r.setup_s},
                 {"total", r.loop_s},
                 {"forward", r.forward_s()},
                 {"verify", r.verify_s},
                 {"prefill_steps", phase_json(r.prefill)},
                 {"decode_steps", phase_json(r.decode)}};
  j["throughput_tok_s"] = {
      {"prefill", per_second(r.prefill.prompt_tokens, r.prefill.forward_s)},
      {"decode", per_second(r.decode.decode_tokens, r.decode.forward_s)},
      {"overall", per_second(s.prompt_tokens + s.decode_tokens, r.forward_s())}};
  // Work rates of the forward calls (work_model.hpp): prefill steps are compute-bound, decode-only
  // steps memory-bound.
  j["work_rate"] = {{"prefill_gflop_s", rate(r.prefill.prefill_flops, r.prefill.forward_s) * 1e-9},
                    {"decode_gb_s", rate(r.decode.decode_bytes, r.decode.forward_s) * 1e-9}};
  j["step_plan"] = {{"plan_step_us", r.plan_s > 0 ? 1e6 * r.plan_s / s.steps : 0.0},
                    {"workspace_bytes", r.workspace_bytes},
                    {"workspace_peak_bytes", r.workspace_peak_bytes},
                    {"cuda_graphs", c.cuda_graphs},
                    {"graph_captures", r.graph_captures},
                    {"graph_replays", r.graph_replays}};
  j["kv_cache"] = {
      {"block_size", c.scheduler.block_size},     {"capacity_blocks", c.scheduler.num_blocks},
      {"peak_blocks", s.peak_blocks_used},        {"bytes_per_layer", r.cache_bytes_per_layer},
      {"prefix_hit_tokens", s.prefix_hit_tokens}, {"evictions", r.evictions}};
  nlohmann::json v = {{"enabled", c.verify.enabled}};
  if (c.verify.enabled) {
    v["every"] = c.verify.every;
    v["heads"] = c.verify.heads;
    v["decode"] = error_json(r.verify.decode);
    v["prefill"] = error_json(r.verify.prefill);
    v["pass"] = r.verify.passed();
  }
  j["verify"] = v;
  if (c.dcp.enabled()) {
    nlohmann::json ranks = nlohmann::json::array();
    for (const RunResult::RankStats& k : r.ranks) {
      ranks.push_back({{"kv_blocks", k.kv_blocks},
                       {"peak_blocks", k.peak_blocks_used},
                       {"comm_s", k.comm_s},
                       {"verify_pass", k.verify_passed}});
    }
    j["dcp"] = {{"world_size", c.dcp.world_size},
                {"interleave", c.dcp.interleave},
                {"comm_s", r.comm_s},
                {"comm_bytes", r.comm_bytes},
                {"ranks", ranks}};
  }
  return j;
}

void print_summary(std::ostream& os, const RunConfig& c, const RunResult& r) {
  const sim::SchedulerStats& s = r.scheduler;
  const double mib = 1024.0 * 1024.0;  // bytes per MiB
  os << format(
      "mlakit run: %s (tp %lld: %lld heads/rank, scale %.7g), %lld layers, %s, "
      "kv cache %s, %s\n",
      c.model.c_str(), static_cast<long long>(c.tp), static_cast<long long>(c.dims.num_heads),
      c.scale, static_cast<long long>(c.num_layers), dtype_name(c.dtype),
      kv_cache_dtype_name(c.kv_cache_dtype), device_name(c.device).c_str());
  os << format(
      "workload:  %lld requests, prompt %s, output %s, shared prefix %lld tokens "
      "(fraction %.2f), seed %llu\n",
      static_cast<long long>(r.num_requests), range_string(c.workload.prompt_len).c_str(),
      range_string(c.workload.output_len).c_str(),
      static_cast<long long>(c.workload.shared_prefix_len), c.workload.shared_prefix_fraction,
      static_cast<unsigned long long>(c.workload.seed));
  os << format("scheduler: max %lld seqs, %lld-token budget, %lld blocks of %lld tokens\n",
               static_cast<long long>(c.scheduler.max_num_seqs),
               static_cast<long long>(c.scheduler.max_num_batched_tokens),
               static_cast<long long>(c.scheduler.num_blocks),
               static_cast<long long>(c.scheduler.block_size));
  os << format(
      "steps      %lld (%lld with prefill, %lld decode-only); requests finished %lld/%lld\n",
      static_cast<long long>(s.steps), static_cast<long long>(r.prefill.steps),
      static_cast<long long>(r.decode.steps), static_cast<long long>(s.finished),
      static_cast<long long>(r.num_requests));
  os << format(
      "prefill    %lld tokens: forward %.3f s in prefill steps -> %.0f tok/s, %.1f "
      "GFLOP/s (steps' wall %.3f s)\n",
      static_cast<long long>(s.prompt_tokens), r.prefill.forward_s,
      per_second(r.prefill.prompt_tokens, r.prefill.forward_s),
      rate(r.prefill.prefill_flops, r.prefill.forward_s) * 1e-9, r.prefill.wall_s);
  os << format(
      "decode     %lld tokens (%lld in decode-only steps): forward %.3f s -> %.0f tok/s, "
      "%.2f GB/s (steps' wall %.3f s)\n",
      static_cast<long long>(s.decode_tokens), static_cast<long long>(r.decode.decode_tokens),
      r.decode.forward_s, per_second(r.decode.decode_tokens, r.decode.forward_s),
      rate(r.decode.decode_bytes, r.decode.forward_s) * 1e-9, r.decode.wall_s);
  const double forward_share = r.loop_s > 0.0 ? 100.0 * r.forward_s() / r.loop_s : 0.0;
  const std::string verify_time = c.verify.enabled ? format(", verify %.3f s", r.verify_s) : "";
  os << format("time       total %.3f s, forward %.3f s (%.0f%%), setup %.3f s%s\n", r.loop_s,
               r.forward_s(), forward_share, r.setup_s, verify_time.c_str());
  os << format(
      "host       plan_step %.1f us per step; forward() %.2f us per layer call in prefill steps, "
      "%.2f us in decode-only steps%s\n",
      s.steps > 0 ? 1e6 * r.plan_s / static_cast<double>(s.steps) : 0.0, per_layer_us(r.prefill),
      per_layer_us(r.decode), c.cuda_graphs ? " (graph launch / layers)" : "");
  os << format("workspace  %.1f MiB shared by %lld layers, peak step use %.1f MiB%s\n",
               static_cast<double>(r.workspace_bytes) / mib, static_cast<long long>(c.num_layers),
               static_cast<double>(r.workspace_peak_bytes) / mib,
               c.cuda_graphs ? format("; CUDA graphs: %lld captured, %lld replays",
                                      static_cast<long long>(r.graph_captures),
                                      static_cast<long long>(r.graph_replays))
                                   .c_str()
                             : "");
  os << format(
      "kv cache   peak %lld / %lld blocks (%.0f%%), %.1f MiB per layer; prefix-cache hits "
      "%lld tokens, %lld evictions\n",
      static_cast<long long>(s.peak_blocks_used), static_cast<long long>(c.scheduler.num_blocks),
      100.0 * static_cast<double>(s.peak_blocks_used) / c.scheduler.num_blocks,
      static_cast<double>(r.cache_bytes_per_layer) / mib,
      static_cast<long long>(s.prefix_hit_tokens), static_cast<long long>(r.evictions));
  if (c.dcp.enabled()) {
    os << format(
        "dcp        %lld ranks, interleave %lld: rank 0 spent %.3f s in collectives (%.1f%% of "
        "forward), sent %.1f MiB\n",
        static_cast<long long>(c.dcp.world_size), static_cast<long long>(c.dcp.interleave),
        r.comm_s, r.forward_s() > 0.0 ? 100.0 * r.comm_s / r.forward_s() : 0.0,
        static_cast<double>(r.comm_bytes) / mib);
    for (size_t k = 0; k < r.ranks.size(); ++k) {
      const RunResult::RankStats& rank = r.ranks[k];
      os << format(
          "  rank %zu   KV blocks %lld per layer, peak used %lld; collectives %.3f s%s\n", k,
          static_cast<long long>(rank.kv_blocks), static_cast<long long>(rank.peak_blocks_used),
          rank.comm_s,
          c.verify.enabled ? (rank.verify_passed ? "; verify PASS" : "; verify FAIL") : "");
    }
  }
  if (c.verify.enabled) {
    os << format(
        "verify     fp64 oracle on %lld heads, every %lld decode-only / %lld prefill "
        "steps: %s\n",
        static_cast<long long>(c.verify.heads), static_cast<long long>(c.verify.every),
        static_cast<long long>(std::max<int64_t>(1, c.verify.every / 4)),
        r.verify.passed() ? "PASS" : "FAIL");
    os << error_line("decode", r.verify.decode);
    os << error_line("prefill", r.verify.prefill);
  }
}

}  // namespace mlakit::cli
