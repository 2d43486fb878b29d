// Communicators behind the C ABI (docs/dcp.md): a dist::Communicator whose two collectives call
// the caller's callbacks, so that bindings run DCP's collectives on their own library (Python:
// a torch.distributed ProcessGroup), and the DCP layer that takes one.
#include <memory>
#include <optional>

#include "capi/boundary.hpp"
#include "capi/layer.hpp"
#include "mlakit/dist.hpp"

using mlakit::capi::guarded;
using mlakit::capi::require_pointer;

namespace mlakit::capi {

namespace {

// Rank, world size and device are fixed at creation; the checks of dist::Communicator run before
// a callback is called, so the callbacks see only valid, non-empty, contiguous buffers.
class CallbackCommunicator final : public dist::Communicator {
 public:
  explicit CallbackCommunicator(const mlakit_communicator_callbacks_t& callbacks, Device device)
      : callbacks_(callbacks), device_(device) {}

  int rank() const override { return callbacks_.rank; }
  int world_size() const override { return callbacks_.world_size; }
  Device device() const override { return device_; }
  const char* backend_name() const override { return "callback"; }

 protected:
  void all_gather_impl(const void* send, void* recv, int64_t count, DType dtype,
                       Stream stream) override {
    const int32_t status = callbacks_.all_gather(callbacks_.user_data, send, recv, count,
                                                 to_dl_dtype(dtype), stream.handle);
    check_status("Communicator::all_gather", "all_gather", status);
  }

  void reduce_scatter_sum_impl(const void* send, void* recv, int64_t recv_count, DType dtype,
                               Stream stream) override {
    const int32_t status = callbacks_.reduce_scatter_sum(
        callbacks_.user_data, send, recv, recv_count, to_dl_dtype(dtype), stream.handle);
    check_status("Communicator::reduce_scatter_sum", "reduce_scatter_sum", status);
  }

 private:
  static void check_status(const char* op, const char* callback, int32_t status) {
    detail::require(status == 0, ErrorCode::kBackend, op, ": the caller's ", callback,
                    " callback failed (returned ", status, ", expected 0)");
  }

  mlakit_communicator_callbacks_t callbacks_;
  Device device_;
};

}  // namespace

}  // namespace mlakit::capi

struct mlakit_communicator {
  std::unique_ptr<mlakit::dist::Communicator> communicator;
};

extern "C" {

MLAKIT_API mlakit_status_t mlakit_communicator_create(
    const mlakit_communicator_callbacks_t* callbacks, mlakit_communicator_t** communicator) {
  constexpr const char* kOp = "mlakit_communicator_create";
  return guarded(kOp, [&] {
    require_pointer(kOp, "communicator", communicator);
    *communicator = nullptr;
    require_pointer(kOp, "callbacks", callbacks);
    const mlakit_communicator_callbacks_t& c = *callbacks;
    mlakit::detail::require(c.world_size >= 1, mlakit::ErrorCode::kInvalidArgument, kOp,
                            ": callbacks.world_size must be >= 1, got ", c.world_size);
    mlakit::detail::require(
        c.rank >= 0 && c.rank < c.world_size, mlakit::ErrorCode::kInvalidArgument, kOp,
        ": callbacks.rank must be in [0, world_size = ", c.world_size, "), got ", c.rank);
    require_pointer(kOp, "callbacks.all_gather", reinterpret_cast<const void*>(c.all_gather));
    require_pointer(kOp, "callbacks.reduce_scatter_sum",
                    reinterpret_cast<const void*>(c.reduce_scatter_sum));
    const mlakit::Device device = mlakit::capi::to_device(kOp, "callbacks.device", c.device);
    auto handle = std::make_unique<mlakit_communicator>();
    handle->communicator = std::make_unique<mlakit::capi::CallbackCommunicator>(c, device);
    *communicator = handle.release();
  });
}

MLAKIT_API void mlakit_communicator_destroy(mlakit_communicator_t* communicator) {
  delete communicator;
}

MLAKIT_API mlakit_status_t mlakit_attention_create_dcp(const mlakit_mla_config_t* config,
                                                       const DLTensor* kv_b_proj_weight,
                                                       const DLTensor* kv_b_proj_scale_inv,
                                                       mlakit_communicator_t* communicator,
                                                       mlakit_attention_t** attention) {
  constexpr const char* kOp = "MlaAttention";
  return guarded(kOp, [&] {
    require_pointer(kOp, "attention", attention);
    *attention = nullptr;
    require_pointer(kOp, "config", config);
    const mlakit::MlaAttentionConfig layer_config = mlakit::capi::to_config(kOp, *config);
    const mlakit::TensorView weight =
        mlakit::capi::to_view(kOp, "kv_b_proj_weight", kv_b_proj_weight);
    const std::optional<mlakit::TensorView> scale_inv =
        mlakit::capi::to_optional_view(kOp, "kv_b_proj_scale_inv", kv_b_proj_scale_inv);
    *attention = new mlakit_attention(layer_config, weight, scale_inv,
                                      communicator ? communicator->communicator.get() : nullptr);
  });
}

}  // extern "C"
