// Launch of the wgmma decode configuration (kernel_wgmma.cuh), like launch_kernel.cuh's; only the
// instantiation files of 16-bit MMA elements include it (CuTe headers stay out of the raw e4m3
// one).
#pragma once

#include <cuda_runtime.h>

#include <optional>
#include <type_traits>

#include "cuda/decode/sm90/cache_tensor_map.hpp"
#include "cuda/decode/sm90/instantiations.cuh"
#include "cuda/decode/sm90/kernel_wgmma.cuh"
#include "cuda/decode/sm90/launch_kernel.cuh"

namespace mlakit::cuda::decode_sm90 {

// The cache's TMA maps for Cfg's format (host, driver calls).
template <class Cfg>
typename Cfg::CacheMaps make_cache_maps(const DecodeKernelParams& params) {
  if constexpr (Cfg::kScaledTiles) {
    return make_ds_mla_tensor_maps(params);
  } else {
    return make_cache_tensor_map(params, Cfg::kFormat);
  }
}

template <class Cfg>
void launch_decode_wgmma_kernel(const DecodeKernelParams& params, dim3 grid, cudaStream_t stream) {
  const typename Cfg::CacheMaps cache_maps = make_cache_maps<Cfg>(params);
  constexpr RuntimeDType kElement =
      std::is_same_v<typename Cfg::Element, Bf16Mma> ? RuntimeDType::kBF16 : RuntimeDType::kF16;
  const std::optional<CUtensorMap> q_map = make_q_tensor_map(params, kElement);
  DecodeKernelParams p = params;
  p.q_by_tma = q_map.has_value();
  const auto kernel = &mla_decode_sm90_wgmma_kernel<Cfg>;
  set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes, "mla_decode");
  launch_kernel_overlapped("mla_decode", "mla_decode_sm90_wgmma_kernel", kernel, grid,
                           dim3(Cfg::kLaunchThreads), Cfg::kSmemBytes, stream, p, cache_maps,
                           q_map.value_or(CUtensorMap{}));
}

}  // namespace mlakit::cuda::decode_sm90
