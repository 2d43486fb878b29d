// The plan kernel of the sm90 decode (plan.cuh): device code, launched by plan.cu and run by the
// emulation test. One CTA of kPlanThreads threads builds the work plan of work_plan.hpp:
//   1. the cost line's length: every request's cost, summed over the CTA; share = ceil(total / P);
//      the longest request's cost, which decides whether requests stay whole (whole_requests);
//   2. requests in chunks of kPlanThreads: an exclusive scan of the costs gives each request its
//      start unit, hence its segments; a second scan of (segments, partial slots, split requests)
//      gives where its records go; each thread writes the records of its request;
//   3. part ranges: part p starts at the first segment whose part is >= p (binary search; the parts
//      of the segments never decrease).
// A seq_len outside [0, max_seq_len] is planned as an empty request (its one segment lets the
// decode write its NaN rows). Everything is O(B / 256 + P / 256) steps of a few barriers each.
#pragma once

#include <cstdint>

#include "cuda/common/device_errors.hpp"
#include "cuda/common/grid_dependency.cuh"
#include "cuda/decode/sm90/params.cuh"
#include "cuda/decode/sm90/plan.cuh"
#include "cuda/decode/sm90/ptx.cuh"
#include "cuda/decode/work_plan.hpp"

namespace mlakit::cuda::decode_sm90 {

// Per-request counts scanned over the batch: where its segment records, partial slots and split
// record go.
struct PlanCounts {
  int64_t segments, partials, splits;
};
__device__ __forceinline__ PlanCounts operator+(const PlanCounts& a, const PlanCounts& b) {
  return {a.segments + b.segments, a.partials + b.partials, a.splits + b.splits};
}

// Maximum of one value per thread over the CTA (a tree in `scratch`, [kPlanThreads] in shared
// memory); every thread gets it. Every thread of the CTA must call it.
__device__ __forceinline__ int64_t cta_max(int64_t value, int64_t* scratch) {
  const int t = static_cast<int>(threadIdx.x);
  scratch[t] = value;
  __syncthreads();
  for (int half = kPlanThreads / 2; half > 0; half /= 2) {
    if (t < half) scratch[t] = max_i64(scratch[t], scratch[t + half]);
    __syncthreads();
  }
  const int64_t result = scratch[0];
  __syncthreads();  // scratch is free for the next use
  return result;
}

// Exclusive prefix sum of one value per thread over the CTA (Hillis-Steele over kPlanThreads
// values in `scratch`, [kPlanThreads] in shared memory); `total` gets the sum of all values. Every
// thread of the CTA must call it.
template <class T>
__device__ __forceinline__ T cta_exclusive_sum(const T& value, T& total, T* scratch) {
  const int t = static_cast<int>(threadIdx.x);
  scratch[t] = value;
  __syncthreads();
  for (int offset = 1; offset < kPlanThreads; offset *= 2) {
    const T before = t >= offset ? scratch[t - offset] : T{};
    __syncthreads();
    scratch[t] = scratch[t] + before;
    __syncthreads();
  }
  const T exclusive = t > 0 ? scratch[t - 1] : T{};
  total = scratch[kPlanThreads - 1];
  __syncthreads();  // scratch is free for the next scan
  return exclusive;
}

// The seq_len the plan uses for request b: a bad value counts as empty.
__device__ __forceinline__ int64_t planned_seq_len(const PlanParams& p, int b) {
  const int64_t raw = p.seq_lens[b * p.seq_lens_stride];
  return seq_len_is_valid(raw, p.max_seq_len) ? raw : 0;
}

// Writes the segment records of request b (n segments, the first at unit `start`) and, when it
// has several, its split record. Returns false if a record would leave the plan's bounds (then it
// is not written).
__device__ __forceinline__ bool write_request(const PlanParams& p, int b, int64_t seq_len,
                                              int64_t start, int64_t share, bool whole, int64_t n,
                                              const PlanCounts& at) {
  const int64_t tiles = key_tiles(seq_len);
  // A balanced request with tiles: its segments follow from one division (a request cut into 64
  // segments, B = 1, took ~21 µs with a 64-bit division per segment).
  const bool balanced = !whole && !p.batch_invariant && tiles > 0;
  const int64_t first_part = balanced ? first_tile_part(start, share) : 0;
  bool fits = true;
  for (int64_t k = 0; k < n; ++k) {
    const SegmentRange r = whole
                               ? SegmentRange{whole_request_part(b, p.batch, p.num_parts), 0, tiles}
                           : balanced ? balanced_segment(start, tiles, share, first_part, k)
                                      : request_segment(p.batch_invariant, start, tiles, share, k);
    const int64_t index = at.segments + k, slot = n > 1 ? at.partials + k : -1;
    if (index >= p.bounds.max_segments || slot >= p.bounds.max_partials || r.part >= p.num_parts) {
      fits = false;
      continue;
    }
    p.segments[index] = {b, static_cast<int32_t>(min_i64(r.tile_begin * kDecodeKeyTile, seq_len)),
                         static_cast<int32_t>(min_i64(r.tile_end * kDecodeKeyTile, seq_len)),
                         static_cast<int32_t>(slot)};
    p.segment_part[index] = static_cast<int32_t>(r.part);
  }
  if (n > 1) {
    if (at.splits >= p.bounds.max_split_requests) return false;
    p.splits[at.splits] = {b, static_cast<int32_t>(at.partials), static_cast<int32_t>(n), 0};
  }
  return fits;
}

__global__ void __launch_bounds__(kPlanThreads)
    mla_decode_plan_kernel(const __grid_constant__ PlanParams p) {
  __shared__ int64_t cost_scratch[kPlanThreads];
  __shared__ PlanCounts count_scratch[kPlanThreads];
  wait_for_prior_grids();
  allow_next_grid_launch();
  const int t = static_cast<int>(threadIdx.x);
  const bool invariant = p.batch_invariant;

  // 1. Length of the cost line, the share of each part, and whether requests stay whole.
  int64_t own_cost = 0, own_max = 0;
  for (int b = t; b < p.batch; b += kPlanThreads) {
    const int64_t cost = request_cost(invariant, key_tiles(planned_seq_len(p, b)));
    own_cost += cost;
    own_max = max_i64(own_max, cost);
  }
  int64_t total_cost = 0;
  cta_exclusive_sum(own_cost, total_cost, cost_scratch);
  const int64_t max_cost = cta_max(own_max, cost_scratch);
  const int64_t share = part_share(total_cost, p.num_parts);
  const bool whole = whole_requests(invariant, p.batch, p.num_parts, total_cost, max_cost, p.rows);

  // 2. The records, kPlanThreads requests at a time.
  int64_t cost_before = 0;
  PlanCounts before{0, 0, 0};
  bool fits = true;
  for (int first = 0; first < p.batch; first += kPlanThreads) {
    const int b = first + t;
    const bool real = b < p.batch;
    const int64_t seq_len = real ? planned_seq_len(p, b) : 0;
    const int64_t tiles = key_tiles(seq_len);
    int64_t chunk_cost = 0;
    const int64_t start =
        cost_before + cta_exclusive_sum(real ? request_cost(invariant, tiles) : int64_t{0},
                                        chunk_cost, cost_scratch);
    const int64_t n = !real ? 0 : whole ? 1 : request_segment_count(invariant, start, tiles, share);
    const PlanCounts own{n, n > 1 ? n : 0, n > 1 ? 1 : 0};
    PlanCounts chunk_counts{0, 0, 0};
    const PlanCounts at = before + cta_exclusive_sum(own, chunk_counts, count_scratch);
    if (real) fits = write_request(p, b, seq_len, start, share, whole, n, at) && fits;
    cost_before += chunk_cost;
    before = before + chunk_counts;
  }
  // The barrier also publishes every record to the whole CTA. A plan that does not fit (which the
  // bounds of work_plan.hpp exclude) is reported and replaced by an empty one.
  const bool overflow = __syncthreads_or(!fits) != 0;
  const int64_t segments = overflow ? 0 : before.segments;
  if (t == 0) {
    if (overflow) report_device_error(p.error_word, kDecodePlanOverflow);
    p.header[kHeaderSegments] = static_cast<int32_t>(segments);
    p.header[kHeaderSplitRequests] = overflow ? 0 : static_cast<int32_t>(before.splits);
    p.header[kHeaderPartials] = overflow ? 0 : static_cast<int32_t>(before.partials);
  }

  // 3. Part ranges.
  for (int part = t; part <= p.num_parts; part += kPlanThreads) {
    int64_t lo = 0, hi = segments;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (p.segment_part[mid] < part) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    p.part_begin[part] = static_cast<int32_t>(lo);
  }
}

}  // namespace mlakit::cuda::decode_sm90
