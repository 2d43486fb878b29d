// The C ABI's MLA layer pieces: the handles of a layer, a workspace and a step plan, and the
// conversions of the C config and batch structs that attention.cpp and step.cpp share.
#pragma once

#include <memory>
#include <optional>

#include "mlakit/attention.hpp"
#include "mlakit/mlakit.h"
#include "mlakit/step.hpp"
#include "mlakit/types.hpp"

struct mlakit_attention {
  // communicator: the DCP group's (mlakit_attention_create_dcp), borrowed; nullptr without DCP.
  mlakit_attention(const mlakit::MlaAttentionConfig& config, const mlakit::TensorView& weight,
                   const std::optional<mlakit::TensorView>& scale_inv,
                   mlakit::dist::Communicator* communicator = nullptr)
      : layer(config, weight, scale_inv, communicator) {}
  mlakit::MlaAttention layer;
};

// Shared: every plan made on a workspace holds it (a StepPlan reads its workspace's state), so
// mlakit_workspace_destroy before the plans' destruction cannot leave them dangling.
struct mlakit_workspace {
  std::shared_ptr<mlakit::Workspace> workspace;
};

struct mlakit_step_plan {
  mlakit::StepPlan plan;
  std::shared_ptr<mlakit::Workspace> workspace;  // the one `plan` was carved from
};

namespace mlakit::capi {

// The C config as the C++ one; `op` names the calling function in messages.
MlaAttentionConfig to_config(const char* op, const mlakit_mla_config_t& config);
// mlakit_mla_config_init's values: the C++ defaults.
void init_config(mlakit_mla_config_t& config);
// The host arrays and device tensors of a C batch; the spans borrow the caller's arrays.
ForwardBatch to_batch(const char* op, const mlakit_forward_batch_t& batch);

}  // namespace mlakit::capi
