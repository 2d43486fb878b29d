// Communicators for decode context parallelism (docs/dcp.md): the two collectives DCP needs,
// over the communication library the engine already uses. mlakit has no communication layer of
// its own: dist_mpi.hpp wraps an MPI_Comm (CPU tensors), dist_nccl.hpp an ncclComm_t (CUDA
// tensors of one GPU). This header names neither library.
#pragma once

#include <cstdint>

#include "mlakit/types.hpp"

namespace mlakit::dist {

// Rank r of a group of world_size ranks. Every rank must make the same sequence of calls with the
// same shapes (a collective blocks, or on a GPU stalls its stream, until all ranks join).
// Bad arguments throw mlakit::Error(kInvalidArgument) before anything is sent; a failure of the
// library throws mlakit::Error(kBackend) with its message.
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Where the tensors of this communicator live: the CPU (MPI) or one GPU (NCCL).
  virtual Device device() const = 0;
  virtual const char* backend_name() const = 0;  // "mpi" or "nccl"

  // recv = [send of rank 0 | send of rank 1 | ...] (each send.numel() elements).
  // send: contiguous; f32, f16, bf16, fp8 e4m3 or u8
  // recv: contiguous, send's dtype, world_size * send.numel() elements; either disjoint from
  //       send, or send is exactly recv's slice rank() (in place)
  // MPI returns when done; NCCL enqueues on `stream`.
  void all_gather(const TensorView& send, const TensorView& recv, Stream stream = {});

  // recv = sum over ranks k of slice rank() of send_k, where slice r is send's elements
  // [r * recv.numel(), (r + 1) * recv.numel()).
  // send: contiguous; f32, f16 or bf16; world_size * recv.numel() elements
  // recv: contiguous, send's dtype, disjoint from send
  // The MPI communicator sums in f32 in rank order and rounds once (results do not depend on the
  // MPI library's algorithm, and every rank sums alike); NCCL sums in its own order and, for
  // 16-bit types, its own precision.
  void reduce_scatter_sum(const TensorView& send, const TensorView& recv, Stream stream = {});

 protected:
  // Arguments checked; counts in elements of `dtype`, pointers on device().
  virtual void all_gather_impl(const void* send, void* recv, int64_t count, DType dtype,
                               Stream stream) = 0;
  virtual void reduce_scatter_sum_impl(const void* send, void* recv, int64_t recv_count,
                                       DType dtype, Stream stream) = 0;
};

// Which communicators this build of mlakit has (CMake options MLAKIT_WITH_MPI / _NCCL).
bool built_with_mpi();
bool built_with_nccl();

}  // namespace mlakit::dist
