// `mlakit run --dcp W` (MPI builds): the job's MPI ranks as one DCP group. MPI is initialized for
// the life of the object; the group's communicator is the library's MPI communicator wrapped so
// that the time and bytes of its collectives are counted (the summary's communication time).
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

#include "mlakit/dist.hpp"
#include "simulation.hpp"

namespace mlakit::cli {

class DcpGroup {
 public:
  // Initializes MPI; throws mlakit::Error unless the job has exactly world_size ranks.
  explicit DcpGroup(int64_t world_size);
  ~DcpGroup();  // finalizes MPI
  DcpGroup(const DcpGroup&) = delete;
  DcpGroup& operator=(const DcpGroup&) = delete;

  int rank() const;
  dist::Communicator& communicator();
  double comm_seconds() const;  // inside the collectives so far
  int64_t comm_bytes() const;   // sent by this rank so far

  // Collects every rank's KV blocks, peak blocks used, communication time and verification
  // outcome into rank 0's result.ranks; returns whether every rank's verification passed (the
  // same answer on every rank).
  bool gather_rank_stats(RunResult& result, int64_t kv_blocks, bool verify_passed);
  // Prints the error of this rank and ends the whole job (the other ranks may be waiting for
  // this one in a collective) with exit status `status`.
  [[noreturn]] void abort(const std::exception& error, int status);

 private:
  class Timed;
  std::unique_ptr<Timed> comm_;
};

}  // namespace mlakit::cli
