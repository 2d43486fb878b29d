// libFuzzer target: the host planner (plan.hpp, planner/context_chunks.hpp, ops::plan_mla_decode
// for the CPU): random batches (query and sequence lengths, padding, reorder inputs), decode
// thresholds, query-length support, chunk policies, workspace sizes, block sizes, worker counts
// and block-table widths, valid or not.
//
// Invariants (a violation aborts; the sanitizers abort on their own):
//   - no crash, no sanitizer report;
//   - every function either returns or throws mlakit::Error with code invalid_argument or
//     out_of_range and a message that starts with its name;
//   - what it returns passes checks written from the spec, not from the planner:
//       split_decodes_and_prefills: decodes first, counts add up to the batch and its tokens,
//         every decode within the threshold;
//       reorder_decodes_first: a permutation that puts decodes, then extends, then prefills;
//       plan_decode_splits / plan_mla_decode: split_len a positive multiple of the block size,
//         ceil(seq_len / split_len) splits per request, offsets and totals consistent;
//       plan_context_chunks: every context token in exactly one piece, pieces in order and
//         page-aligned, 0 < chunk total <= workspace_tokens, cu_seq_lens / token_to_seq /
//         max_seq_len consistent;
//       make_plan: all of the above for its parts, and no chunk reads a block-table column at or
//         past the table width.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "fuzz_support.hpp"
#include "mlakit/error.hpp"
#include "mlakit/ops.hpp"
#include "mlakit/plan.hpp"
#include "planner/context_chunks.hpp"

namespace mlakit::fuzz {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

// Runs `call`: true if it returns, false if it throws an acceptable mlakit::Error, whose message
// must start with `op` (or `also`, a public function `op` hands its arguments to unchanged).
template <class Call>
bool returns(const char* op, Call&& call, const char* also = nullptr) {
  try {
    call();
    return true;
  } catch (const Error& e) {
    const std::string message = e.what();
    MLAKIT_FUZZ_EXPECT(
        e.code() == ErrorCode::kInvalidArgument || e.code() == ErrorCode::kOutOfRange,
        std::string(op) + " threw code " + str(int(e.code())) + ": " + message);
    const bool named = message.rfind(std::string(op) + ": ", 0) == 0 ||
                       (also && message.rfind(std::string(also) + ": ", 0) == 0);
    MLAKIT_FUZZ_EXPECT(named, std::string("message does not name ") + op + ": " + message);
    return false;
  }
}

// ceil(a / b) for a >= 0, b > 0, without the overflow of (a + b - 1) / b for huge b.
int64_t ceil_div(int64_t a, int64_t b) { return a == 0 ? 0 : (a - 1) / b + 1; }

// A block size: usually a real one, sometimes 0, negative or huge.
int64_t draw_block_size(FuzzedDataProvider& in) {
  const int64_t odd[] = {0, -1, 3, 7, int64_t{1} << 31, INT64_MAX};
  const int64_t common[] = {1, 2, 16, 64, 128};
  if (in.ConsumeIntegralInRange(0, 7) == 0) return in.PickValueInArray(odd);
  return in.PickValueInArray(common);
}

// Context tokens a batch may hold in total: at most 256 chunks of the workspace and 2^20 tokens,
// so that one execution stays small (the chunk plan's arrays grow with chunks x requests).
int64_t context_budget(int64_t workspace_tokens) {
  constexpr int64_t kMaxChunks = 256, kMaxTokens = int64_t{1} << 20;
  if (workspace_tokens >= kMaxTokens / kMaxChunks) return kMaxTokens;
  return std::max<int64_t>(workspace_tokens, 1) * kMaxChunks;
}

// ---- checks -------------------------------------------------------------------------------------

void expect_schedule(const DecodeSchedule& s, std::span<const int32_t> seq_lens,
                     int64_t block_size) {
  const int64_t batch = static_cast<int64_t>(seq_lens.size());
  MLAKIT_FUZZ_EXPECT(static_cast<int64_t>(s.split_offsets.size()) == batch + 1 &&
                         static_cast<int64_t>(s.split_len.size()) == batch,
                     "decode schedule sizes do not match the batch of " + str(batch));
  MLAKIT_FUZZ_EXPECT(s.split_offsets[0] == 0, "split_offsets[0] is " + str(s.split_offsets[0]));
  int64_t most = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = seq_lens[b], split_len = s.split_len[b];
    MLAKIT_FUZZ_EXPECT(
        split_len > 0 && split_len % block_size == 0,
        "split_len[" + str(b) + "] = " + str(split_len) + " with block_size " + str(block_size));
    MLAKIT_FUZZ_EXPECT(s.num_splits(b) == ceil_div(len, split_len),
                       "request " + str(b) + " of " + str(len) + " keys has " +
                           str(s.num_splits(b)) + " splits of " + str(split_len));
    most = std::max(most, s.num_splits(b));
  }
  MLAKIT_FUZZ_EXPECT(s.total_splits == s.split_offsets[batch] && s.max_splits == most,
                     "total_splits " + str(s.total_splits) + " / max_splits " + str(s.max_splits));
}

// context_lens [np]; table_width: columns a piece may read (-1: unchecked).
void expect_chunks(const std::vector<ContextChunk>& chunks, std::span<const int32_t> context_lens,
                   int64_t block_size, int64_t workspace_tokens, int64_t table_width) {
  const size_t np = context_lens.size();
  std::vector<int64_t> covered(np, 0);
  bool any_context = false;
  for (int32_t len : context_lens) any_context |= len > 0;
  MLAKIT_FUZZ_EXPECT(any_context || chunks.empty(), "chunks although no request has context");
  for (size_t c = 0; c < chunks.size(); ++c) {
    const ContextChunk& k = chunks[c];
    MLAKIT_FUZZ_EXPECT(
        k.starts.size() == np && k.seq_lens.size() == np && k.cu_seq_lens.size() == np + 1,
        "chunk " + str(c) + " arrays do not have the batch's size");
    MLAKIT_FUZZ_EXPECT(k.total_tokens > 0 && k.total_tokens <= workspace_tokens,
                       "chunk " + str(c) + " has " + str(k.total_tokens) + " tokens, workspace " +
                           str(workspace_tokens));
    MLAKIT_FUZZ_EXPECT(k.cu_seq_lens[0] == 0, "chunk cu_seq_lens[0] is not 0");
    MLAKIT_FUZZ_EXPECT(
        static_cast<int64_t>(k.token_to_seq.size()) == k.total_tokens,
        "token_to_seq has " + str(k.token_to_seq.size()) + " rows, not " + str(k.total_tokens));
    int64_t longest = 0;
    for (size_t r = 0; r < np; ++r) {
      const int64_t start = k.starts[r], len = k.seq_lens[r];
      MLAKIT_FUZZ_EXPECT(len >= 0 && k.cu_seq_lens[r + 1] == k.cu_seq_lens[r] + len,
                         "chunk " + str(c) + " cu_seq_lens disagree with seq_lens");
      longest = std::max(longest, len);
      if (len == 0) {
        MLAKIT_FUZZ_EXPECT(start == 0, "an empty piece starts at " + str(start));
        continue;
      }
      MLAKIT_FUZZ_EXPECT(start == covered[r] && start % block_size == 0,
                         "request " + str(r) + " piece starts at " + str(start) + ", expected " +
                             str(covered[r]) + " (page-aligned)");
      covered[r] += len;
      MLAKIT_FUZZ_EXPECT(covered[r] <= context_lens[r], "request " + str(r) + " gathers past its " +
                                                            str(context_lens[r]) + " tokens");
      if (table_width >= 0) {
        MLAKIT_FUZZ_EXPECT(ceil_div(start + len, block_size) <= table_width,
                           "a piece reads block column " +
                               str(ceil_div(start + len, block_size) - 1) + " of a " +
                               str(table_width) + "-wide table");
      }
      for (int64_t row = k.cu_seq_lens[r]; row < k.cu_seq_lens[r + 1]; ++row) {
        MLAKIT_FUZZ_EXPECT(k.token_to_seq[static_cast<size_t>(row)] == static_cast<int32_t>(r),
                           "token_to_seq[" + str(row) + "] is not request " + str(r));
      }
    }
    MLAKIT_FUZZ_EXPECT(k.cu_seq_lens[np] == k.total_tokens && k.max_seq_len == longest,
                       "chunk " + str(c) + " totals disagree");
  }
  for (size_t r = 0; r < np; ++r) {
    MLAKIT_FUZZ_EXPECT(covered[r] == context_lens[r],
                       "request " + str(r) + " has " + str(context_lens[r]) + " context tokens, " +
                           str(covered[r]) + " gathered");
  }
}

void expect_split(const SplitCounts& s, std::span<const int32_t> qsl, int64_t tokens,
                  int64_t threshold) {
  const int64_t reqs = static_cast<int64_t>(qsl.size()) - 1;
  MLAKIT_FUZZ_EXPECT(
      s.num_decodes >= 0 && s.num_prefills >= 0 && s.num_decodes + s.num_prefills == reqs,
      "split counts " + str(s.num_decodes) + " + " + str(s.num_prefills) + " for " + str(reqs) +
          " requests");
  MLAKIT_FUZZ_EXPECT(s.num_decode_tokens + s.num_prefill_tokens == tokens,
                     "split tokens do not add up to num_actual_tokens");
  if (s.num_prefills > 0) {
    MLAKIT_FUZZ_EXPECT(s.num_decode_tokens == qsl[s.num_decodes],
                       "decode tokens are not the decodes' queries");
  }
  for (int64_t i = 0; i < s.num_decodes; ++i) {
    MLAKIT_FUZZ_EXPECT(qsl[i + 1] - qsl[i] <= threshold,
                       "decode " + str(i) + " has a query longer than the threshold");
  }
}

// ---- entry points -------------------------------------------------------------------------------

void fuzz_split(FuzzedDataProvider& in) {
  const int64_t reqs = in.ConsumeIntegralInRange<int64_t>(0, 24);
  std::vector<int32_t> qsl = {in.ConsumeIntegralInRange(0, 15) == 0 ? 1 : 0};
  for (int64_t i = 0; i < reqs; ++i) {
    qsl.push_back(qsl.back() + in.ConsumeIntegralInRange<int32_t>(
                                   in.ConsumeIntegralInRange(0, 31) == 0 ? -2 : 0, 5));
  }
  const int64_t tokens = qsl.back() + in.ConsumeIntegralInRange<int64_t>(-1, 4);
  const int64_t threshold = in.ConsumeIntegralInRange<int64_t>(0, 4);
  const bool uniform = in.ConsumeBool();
  SplitCounts s;
  if (returns("split_decodes_and_prefills",
              [&] { s = split_decodes_and_prefills(qsl, tokens, threshold, uniform); })) {
    expect_split(s, qsl, tokens, threshold);
  }
}

void fuzz_reorder(FuzzedDataProvider& in) {
  const size_t reqs = in.ConsumeIntegralInRange<size_t>(0, 24);
  std::vector<int32_t> scheduled, computed;
  for (size_t i = 0; i < reqs; ++i) {
    scheduled.push_back(
        in.ConsumeIntegralInRange<int32_t>(in.ConsumeIntegralInRange(0, 31) == 0 ? -1 : 0, 6));
    computed.push_back(
        in.ConsumeIntegralInRange(0, 2) == 0 ? 0 : in.ConsumeIntegralInRange<int32_t>(-1, 9));
  }
  if (in.ConsumeIntegralInRange(0, 31) == 0) computed.push_back(1);
  const int64_t threshold = in.ConsumeIntegralInRange<int64_t>(0, 4);
  std::vector<int32_t> order;
  if (!returns("reorder_decodes_first",
               [&] { order = reorder_decodes_first(scheduled, computed, threshold); })) {
    return;
  }
  std::vector<int32_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int32_t> identity(reqs);
  std::iota(identity.begin(), identity.end(), 0);
  MLAKIT_FUZZ_EXPECT(sorted == identity, "the order is not a permutation of the requests");
  int previous = 0;
  for (int32_t source : order) {
    // decode 0, extend 1, prefill 2 (spec B.5: a request without computed tokens is a prefill)
    const int region = computed[source] == 0 ? 2 : (scheduled[source] <= threshold ? 0 : 1);
    MLAKIT_FUZZ_EXPECT(region >= previous, "a decode or extend comes after a later region");
    previous = region;
  }
}

void fuzz_decode_splits(FuzzedDataProvider& in) {
  const size_t batch = in.ConsumeIntegralInRange<size_t>(0, 24);
  std::vector<int32_t> lens;
  for (size_t b = 0; b < batch; ++b) {
    lens.push_back(in.ConsumeIntegralInRange(0, 15) == 0 ? in.ConsumeIntegral<int32_t>()
                                                         : in.ConsumeIntegralInRange(0, 5000));
  }
  const int64_t block_size = draw_block_size(in);
  const int64_t workers = in.ConsumeIntegralInRange<int64_t>(-1, 300);
  if (in.ConsumeBool()) {
    const bool invariant = in.ConsumeBool();
    DecodeSchedule s;
    if (returns("plan_decode_splits",
                [&] { s = plan_decode_splits(lens, block_size, workers, invariant); })) {
      expect_schedule(s, lens, block_size);
    }
    return;
  }
  ops::DecodePlanShape shape;
  shape.batch = static_cast<int64_t>(lens.size()) + (in.ConsumeIntegralInRange(0, 15) == 0 ? 1 : 0);
  shape.s_q = in.ConsumeIntegralInRange<int64_t>(0, 4);
  shape.num_heads = in.ConsumeIntegralInRange<int64_t>(0, 128);
  shape.block_size = block_size;
  shape.max_seq_len = in.ConsumeIntegralInRange<int64_t>(-1, 6000);
  shape.batch_invariant = in.ConsumeBool();
  DecodeSchedule s;
  // The CPU plan is plan_decode_splits of the same lengths and block size: its messages apply.
  if (returns(
          "plan_mla_decode", [&] { s = ops::plan_mla_decode(shape, lens); },
          "plan_decode_splits")) {
    expect_schedule(s, lens, block_size);
  }
}

void fuzz_context_chunks(FuzzedDataProvider& in) {
  const int64_t block_size = draw_block_size(in);
  const int64_t workspace = in.ConsumeIntegralInRange(0, 15) == 0
                                ? in.ConsumeIntegral<int64_t>()
                                : in.ConsumeIntegralInRange<int64_t>(0, 4096);
  const int64_t budget = context_budget(workspace);
  const size_t np = in.ConsumeIntegralInRange<size_t>(0, 16);
  std::vector<int32_t> context;
  int64_t total = 0;
  for (size_t r = 0; r < np; ++r) {
    int32_t len = in.ConsumeIntegralInRange(0, 31) == 0 ? -1 : in.ConsumeIntegralInRange(0, 3000);
    if (total + len > budget) len = 0;
    total += std::max(len, 0);
    context.push_back(len);
  }
  const ChunkPolicy policy = in.ConsumeBool() ? ChunkPolicy::kPacked : ChunkPolicy::kEqualShare;
  std::vector<ContextChunk> chunks;
  if (returns("plan_context_chunks", [&] {
        chunks = detail::plan_context_chunks(context, block_size, workspace, policy);
      })) {
    expect_chunks(chunks, context, block_size, workspace, -1);
  }
}

void fuzz_make_plan(FuzzedDataProvider& in) {
  PlannerConfig config;
  config.block_size = draw_block_size(in);
  config.decode_threshold = in.ConsumeIntegralInRange<int64_t>(0, 4);
  const QueryLenSupport supports[] = {QueryLenSupport::kSingleOnly, QueryLenSupport::kUniform,
                                      QueryLenSupport::kVarlen};
  config.query_len_support = in.PickValueInArray(supports);
  config.workspace_tokens = in.ConsumeIntegralInRange(0, 15) == 0
                                ? in.ConsumeIntegral<int64_t>()
                                : in.ConsumeIntegralInRange<int64_t>(0, 4096);
  config.chunk_policy = in.ConsumeBool() ? ChunkPolicy::kPacked : ChunkPolicy::kEqualShare;
  config.num_workers = in.ConsumeIntegralInRange<int64_t>(0, 64);
  const int64_t budget = context_budget(config.workspace_tokens);

  const int64_t reqs = in.ConsumeIntegralInRange<int64_t>(0, 16);
  std::vector<int32_t> qsl = {0}, seq_lens;
  int64_t total_context = 0;
  for (int64_t i = 0; i < reqs; ++i) {
    const int32_t q = in.ConsumeIntegralInRange<int32_t>(0, in.ConsumeBool() ? 1 : 40);
    int32_t context = in.ConsumeIntegralInRange(0, 15) == 0 ? in.ConsumeIntegralInRange(-2, 0)
                                                            : in.ConsumeIntegralInRange(0, 3000);
    if (total_context + context > budget) context = 0;
    total_context += std::max(context, 0);
    qsl.push_back(qsl.back() + q);
    seq_lens.push_back(q + context);
  }
  BatchDesc batch;
  batch.query_start_loc = qsl;
  batch.seq_lens = seq_lens;
  batch.num_actual_tokens = qsl.back() + in.ConsumeIntegralInRange<int64_t>(-1, 3);
  batch.block_table_width = in.ConsumeIntegralInRange<int64_t>(-1, 64);
  Plan plan;
  // make_plan hands the batch to split_decodes_and_prefills, whose messages name its arguments.
  if (!returns(
          "make_plan", [&] { plan = make_plan(batch, config); }, "split_decodes_and_prefills")) {
    return;
  }

  expect_split(plan.split, qsl, batch.num_actual_tokens, config.decode_threshold);
  const int64_t nd = plan.split.num_decodes, np = plan.split.num_prefills;
  expect_schedule(plan.decode_schedule, std::span<const int32_t>(seq_lens).first(nd),
                  config.block_size);
  MLAKIT_FUZZ_EXPECT(static_cast<int64_t>(plan.prefill_query_start_loc.size()) == np + 1 &&
                         static_cast<int64_t>(plan.prefill_context_lens.size()) == np,
                     "prefill arrays do not have the prefills' size");
  for (int64_t r = 0; r < np; ++r) {
    const int64_t q = qsl[nd + r + 1] - qsl[nd + r];
    MLAKIT_FUZZ_EXPECT(plan.prefill_query_start_loc[r + 1] - plan.prefill_query_start_loc[r] == q &&
                           plan.prefill_context_lens[r] == seq_lens[nd + r] - q,
                       "prefill " + str(r) + " query or context length is wrong");
  }
  expect_chunks(plan.context_chunks, plan.prefill_context_lens, config.block_size,
                config.workspace_tokens, batch.block_table_width);
}

}  // namespace
}  // namespace mlakit::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mlakit::fuzz;
  FuzzedDataProvider in(data, size);
  switch (in.ConsumeIntegralInRange(0, 5)) {
    case 0:
      fuzz_split(in);
      break;
    case 1:
      fuzz_reorder(in);
      break;
    case 2:
      fuzz_decode_splits(in);
      break;
    case 3:
      fuzz_context_chunks(in);
      break;
    case 4: {
      const int64_t len = in.ConsumeIntegral<int64_t>(), seqs = in.ConsumeIntegral<int64_t>();
      const int64_t block = draw_block_size(in);
      int64_t tokens = 0;
      if (returns("chunked_prefill_workspace_tokens",
                  [&] { tokens = mlakit::chunked_prefill_workspace_tokens(len, seqs, block); })) {
        MLAKIT_FUZZ_EXPECT(tokens > 0, "workspace of " + str(tokens) + " tokens");
      }
      break;
    }
    default:
      fuzz_make_plan(in);
      break;
  }
  return 0;
}
