// absorb_kv_b_proj (spec A.11, C.3, F-40): dequantize kv_b_proj.weight to the activation dtype and
// lay out the absorbed per-head matrices W_UK_T [N, P, L] and W_UV [N, L, V].
#include "mlakit/weights.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/check.hpp"
#include "core/device_memory.hpp"
#include "cpu/parallel.hpp"
#include "mlakit/ops.hpp"

namespace mlakit {
namespace {

using detail::require;
using detail::shape_string;
using detail::str_cat;

constexpr const char* kOp = "absorb_kv_b_proj";

bool is_fp8_dtype(DType dtype) { return dtype == DType::kFp8E4m3 || dtype == DType::kU8; }

int64_t cdiv(int64_t x, int64_t y) { return (x + y - 1) / y; }

// kv_b_proj_scale_inv: f32 [ceil(rows / 128), ceil(cols / 128)], any strides, on the host; every
// block scale finite and > 0 (a NaN, infinite, zero or negative scale would spoil every output
// of the layer).
void check_scale_inv(const TensorView& scale_inv, int64_t rows, int64_t cols) {
  detail::check_storage(kOp, "kv_b_proj_scale_inv", scale_inv);
  detail::check_device(kOp, "kv_b_proj_scale_inv", scale_inv, Device::cpu());
  detail::check_dtype(kOp, "kv_b_proj_scale_inv", scale_inv, {DType::kF32});
  const int64_t expected_rows = cdiv(rows, kFp8WeightBlock);
  const int64_t expected_cols = cdiv(cols, kFp8WeightBlock);
  require(scale_inv.ndim == 2 && scale_inv.shape[0] == expected_rows &&
              scale_inv.shape[1] == expected_cols,
          ErrorCode::kInvalidArgument, kOp, ": kv_b_proj_scale_inv must have shape [",
          expected_rows, ", ", expected_cols, "] (one scale per ", kFp8WeightBlock, "x",
          kFp8WeightBlock, " block of a [", rows, ", ", cols, "] kv_b_proj_weight), got ",
          shape_string(scale_inv));
  const float* scales = scale_inv.data_as<const float>();
  for (int64_t i = 0; i < expected_rows; ++i) {
    for (int64_t j = 0; j < expected_cols; ++j) {
      const float s = scales[i * scale_inv.strides[0] + j * scale_inv.strides[1]];
      require(std::isfinite(s) && s > 0.0f, ErrorCode::kInvalidArgument, kOp,
              ": kv_b_proj_scale_inv[", i, ", ", j,
              "] must be finite and > 0 (the scale of kv_b_proj_weight rows [", i * kFp8WeightBlock,
              ", ", std::min(rows, (i + 1) * kFp8WeightBlock), "), columns [", j * kFp8WeightBlock,
              ", ", std::min(cols, (j + 1) * kFp8WeightBlock), ")), got ", s);
    }
  }
}

void check_arguments(const TensorView& weight, const std::optional<TensorView>& scale_inv,
                     const MlaDims& dims, DType act_dtype) {
  dims.validate();
  detail::check_storage(kOp, "kv_b_proj_weight", weight);
  require(weight.device.is_cpu(), ErrorCode::kInvalidArgument, kOp,
          ": kv_b_proj_weight must be a host (cpu) tensor, got one on ",
          device_name(weight.device));
  detail::check_dtype(kOp, "kv_b_proj_weight", weight,
                      {DType::kF32, DType::kF16, DType::kBF16, DType::kFp8E4m3, DType::kU8});
  require(act_dtype == DType::kF32 || act_dtype == DType::kF16 || act_dtype == DType::kBF16,
          ErrorCode::kInvalidArgument, kOp, ": act_dtype must be f32, f16 or bf16, got ",
          dtype_name(act_dtype));
  const int64_t rows = dims.num_heads * dims.kv_b_out_dim();
  const int64_t cols = dims.kv_lora_rank;
  require(weight.ndim == 2 && weight.shape[0] == rows && weight.shape[1] == cols,
          ErrorCode::kInvalidArgument, kOp,
          ": kv_b_proj_weight must have shape [N * (P + V), L] = [", rows, ", ", cols, "] (N ",
          dims.num_heads, ", P ", dims.qk_nope_head_dim, ", V ", dims.v_head_dim, ", L ",
          dims.kv_lora_rank, "), got ", shape_string(weight));
  if (is_fp8_dtype(weight.dtype)) {
    require(scale_inv.has_value(), ErrorCode::kInvalidArgument, kOp, ": kv_b_proj_scale_inv (f32 [",
            cdiv(rows, kFp8WeightBlock), ", ", cdiv(cols, kFp8WeightBlock),
            "]) is required for an fp8 kv_b_proj_weight");
    check_scale_inv(*scale_inv, rows, cols);
  } else {
    require(!scale_inv.has_value(), ErrorCode::kInvalidArgument, kOp,
            ": kv_b_proj_scale_inv given for a non-fp8 kv_b_proj_weight (",
            dtype_name(weight.dtype), ")");
  }
}

}  // namespace

AbsorbedWeights absorb_kv_b_proj(const TensorView& weight,
                                 const std::optional<TensorView>& weight_scale_inv,
                                 const MlaDims& dims, DType act_dtype, Device device) {
  check_arguments(weight, weight_scale_inv, dims, act_dtype);

  const int64_t N = dims.num_heads, P = dims.qk_nope_head_dim, V = dims.v_head_dim;
  const int64_t L = dims.kv_lora_rank, rows_per_head = dims.kv_b_out_dim();
  AbsorbedWeights out;
  out.kv_b_proj = Tensor::empty({N * rows_per_head, L}, act_dtype);  // [N * (P + V), L]
  out.w_uk_t = Tensor::empty({N, P, L}, act_dtype);                  // [N, P, L]
  out.w_uv = Tensor::empty({N, L, V}, act_dtype);                    // [N, L, V]
  const TensorView& kv = out.kv_b_proj.view();
  const bool fp8 = is_fp8_dtype(weight.dtype);

  // Dequantize in f32 (fp8: code * scale of its 128x128 block; else the stored value), round once
  // to act_dtype (nearest even), then copy the rounded values into the two per-head layouts.
  cpu::parallel_for(0, N, [&](int64_t n) {
    for (int64_t j = 0; j < rows_per_head; ++j) {
      const int64_t r = n * rows_per_head + j;
      for (int64_t l = 0; l < L; ++l) {
        float x =
            load_float(weight.data, weight.dtype, r * weight.strides[0] + l * weight.strides[1]);
        if (fp8) {
          const TensorView& s = *weight_scale_inv;
          x *= s.data_as<const float>()[r / kFp8WeightBlock * s.strides[0] +
                                        l / kFp8WeightBlock * s.strides[1]];
        }
        store_float(kv.data, act_dtype, r * L + l, x);
      }
    }
    const int64_t esize = dtype_size(act_dtype);
    const char* head = static_cast<const char*>(kv.data) + n * rows_per_head * L * esize;
    char* uk_t = static_cast<char*>(out.w_uk_t.view().data) + n * P * L * esize;
    std::memcpy(uk_t, head, static_cast<size_t>(P * L * esize));  // rows [0, P) of the head
    char* uv = static_cast<char*>(out.w_uv.view().data) + n * L * V * esize;
    for (int64_t v = 0; v < V; ++v)    // row P + v of the head ...
      for (int64_t l = 0; l < L; ++l)  // ... becomes column v of W_UV[n]
        std::memcpy(uv + (l * V + v) * esize, head + ((P + v) * L + l) * esize,
                    static_cast<size_t>(esize));
  });
  if (device.is_cpu()) return out;
  // Built on the host (once, at load time), then moved to the device.
  AbsorbedWeights on_device;
  for (auto [host, dev] : {std::pair{&out.kv_b_proj, &on_device.kv_b_proj},
                           {&out.w_uk_t, &on_device.w_uk_t},
                           {&out.w_uv, &on_device.w_uv}}) {
    const TensorView& h = host->view();
    *dev = Tensor::empty(std::span<const int64_t>(h.shape, h.ndim), act_dtype, device);
    ops::copy(h, *dev);
  }
  detail::device_synchronize(device);  // the host copies are freed on return
  return on_device;
}

}  // namespace mlakit
