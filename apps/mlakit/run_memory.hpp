// The memory `mlakit run` will allocate, computed from its resolved flags before anything is
// allocated, so that a run too large for the machine is refused at once with the flags to lower
// (instead of a bare std::bad_alloc, or memory growing without bound, long after the start).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "simulation.hpp"

namespace mlakit::cli {

// One allocation of the run (all layers together) and the flags that size it.
struct MemoryPart {
  std::string what;  // "KV caches (--num-layers 2 x --num-blocks 72 x --block-size 64 x 1152 B)"
  double bytes = 0;  // double: the products of absurd flags overflow no integer type
};

struct RunMemory {
  std::vector<MemoryPart> host;    // host memory (everything, on the CPU)
  std::vector<MemoryPart> device;  // GPU memory (empty for a CPU run)
  double host_bytes() const;
  double device_bytes() const;
};

// The run's allocations, upper bounds where they depend on the workload (the verifier's mirror
// is counted as if every block were touched). `num_blocks_flag` names what set num_blocks
// (num_blocks_source: "--num-blocks", "--kv-cache-gb" or "automatic").
RunMemory estimate_run_memory(const RunConfig& config, const std::string& num_blocks_flag);

// Throws mlakit::Error(kInvalidArgument), one line naming the largest parts and their flags,
// when the host part exceeds host_limit or the device part exceeds device_limit (nullopt: not
// checked).
void check_run_memory(const RunMemory& memory, double host_limit,
                      std::optional<double> device_limit);

// Physical memory of this machine in bytes (sysconf).
double host_memory_bytes();

// "1.5 GiB" (B, KiB, MiB, GiB, TiB, PiB, then powers of ten of PiB).
std::string format_bytes(double bytes);

}  // namespace mlakit::cli
