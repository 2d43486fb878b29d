// Model presets of `mlakit run`: the MLA dimensions and softmax scale of real checkpoints.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mlakit/config.hpp"
#include "mlakit/dtype.hpp"

namespace mlakit::cli {

struct ModelPreset {
  std::string name;
  MlaDims dims;        // num_heads for TP 1
  float scale = 0.0f;  // softmax scale of the checkpoint (YaRN mscale included)
  DType dtype = DType::kBF16;
};

const std::vector<ModelPreset>& model_presets();
std::vector<std::string> model_preset_names();
// Throws mlakit::Error listing the known names.
const ModelPreset& find_preset(const std::string& name);

}  // namespace mlakit::cli
