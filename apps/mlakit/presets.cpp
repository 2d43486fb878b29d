#include "presets.hpp"

#include "mlakit/error.hpp"

namespace mlakit::cli {

const std::vector<ModelPreset>& model_presets() {
  // Scales (DESIGN.md §1): 1/sqrt(P + R = 192) * mscale^2 with the YaRN factor 40 of both
  // checkpoints, mscale = 0.1 * mscale_all_dim * ln(40) + 1 (mscale_all_dim 0.707 for V2-Lite,
  // 1.0 for V3).
  static const std::vector<ModelPreset> presets = {
      {"deepseek-v2-lite", MlaDims{16, 512, 64, 128, 128}, 0.1147214f, DType::kBF16},
      {"deepseek-v3", MlaDims{128, 512, 64, 128, 128}, 0.1352338f, DType::kBF16},
  };
  return presets;
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const ModelPreset& p : model_presets()) names.push_back(p.name);
  return names;
}

const ModelPreset& find_preset(const std::string& name) {
  std::string known;
  for (const ModelPreset& p : model_presets()) {
    if (p.name == name) return p;
    known += (known.empty() ? "" : ", ") + p.name;
  }
  throw Error(ErrorCode::kInvalidArgument,
              "--model must be one of " + known + ", got \"" + name + "\"");
}

}  // namespace mlakit::cli
