// The NCCL communicator (tensors of one CUDA device): include only in builds with
// MLAKIT_WITH_NCCL (the header includes <nccl.h>, which includes the CUDA runtime header).
// Scripts that run NCCL on the lent machines keep NCCL_NVLS_ENABLE=0 (docs/dcp.md).
#pragma once

#include <nccl.h>

#include <memory>

#include "mlakit/dist.hpp"

namespace mlakit::dist {

// Wraps `comm`, which the engine owns and destroys after the communicator. `cuda_device` is the
// device `comm` was created on.
std::unique_ptr<Communicator> make_nccl_communicator(ncclComm_t comm, int cuda_device);

// Creates (ncclCommInitRank on `cuda_device`; every rank calls it with the same id) and owns a
// communicator; ncclCommDestroy when it is destroyed. `id` comes from ncclGetUniqueId on one rank
// and reaches the others through the engine's own channel (e.g. MPI_Bcast, a file, a store).
std::unique_ptr<Communicator> make_nccl_communicator(const ncclUniqueId& id, int world_size,
                                                     int rank, int cuda_device);

}  // namespace mlakit::dist
