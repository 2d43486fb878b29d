// Where a CUDA kernel takes a per-tensor scale from: a value fixed at launch, or one f32 in device
// memory that the kernel reads when it runs (vLLM's one-element scale tensors), so that a launch
// captured in a CUDA graph follows the values later written into that tensor. The device side is
// resolve_scale (scale_source.cuh).
#pragma once

namespace mlakit::cuda {

struct ScaleSource {
  float value = 1.0f;             // used when device is nullptr (checked on the host by the op)
  const float* device = nullptr;  // [1] f32 on the kernel's device, or nullptr
};

}  // namespace mlakit::cuda
