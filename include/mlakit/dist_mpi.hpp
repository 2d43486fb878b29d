// The MPI communicator (CPU tensors): include only in builds with MLAKIT_WITH_MPI (the header
// includes <mpi.h>; link with mlakit and the MPI C library).
#pragma once

#include <mpi.h>

#include <memory>

#include "mlakit/dist.hpp"

namespace mlakit::dist {

// Wraps `comm` (not owned: it must outlive the communicator; MPI must stay initialized). Rank and
// size are those of `comm`. Collectives are blocking MPI calls on the calling thread.
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm);

}  // namespace mlakit::dist
