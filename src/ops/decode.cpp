// ops::mla_decode: argument validation (shapes, dtypes, scales, schedule, workspace; index contents
// where the index tensors are readable on the host) and dispatch by device.
#include "cpu/decode.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/check.hpp"
#include "cpu/parallel.hpp"
#include "mlakit/kv_cache.hpp"
#include "mlakit/ops.hpp"

#ifdef MLAKIT_WITH_CUDA
#include "cuda/common/runtime.hpp"
#include "cuda/decode/decode.hpp"
#include "cuda/decode/schedule.hpp"
#endif

namespace mlakit::ops {

using detail::check_dtype;
using detail::check_inner_contiguous;
using detail::check_ndim;
using detail::check_size;
using detail::check_storage;
using detail::require;

namespace {

constexpr const char* kOp = "mla_decode";

bool is_fp8_dtype(DType d) { return d == DType::kFp8E4m3 || d == DType::kU8; }

// A decode kernel exists for tensors on `device` in this build.
bool has_backend(Device device) {
#ifdef MLAKIT_WITH_CUDA
  return device.is_cpu() || device.is_cuda();
#else
  return device.is_cpu();
#endif
}

int64_t read_i32(const TensorView& t, int64_t offset) {
  return static_cast<const int32_t*>(t.data)[offset];
}

// seq_lens: i32 [B] on the host; every value in [0, max_blocks * block_size], and 0 or >= s_q
// (a request's keys include its s_q new tokens).
void check_seq_lens_host(const TensorView& seq_lens, int64_t s_q, int64_t max_blocks,
                         int64_t block_size) {
  int64_t limit = 0;  // an empty block table or cache may claim any sizes: saturate
  if (__builtin_mul_overflow(max_blocks, block_size, &limit)) {
    limit = std::numeric_limits<int64_t>::max();
  }
  for (int64_t b = 0; b < seq_lens.size(0); ++b) {
    const int64_t len = read_i32(seq_lens, b * seq_lens.strides[0]);
    require(len >= 0 && len <= limit, ErrorCode::kInvalidArgument, kOp, ": seq_lens[", b,
            "] must be in [0, ", limit, "] (block_table width ", max_blocks, " x block_size ",
            block_size, "), got ", len);
    require(len == 0 || len >= s_q, ErrorCode::kInvalidArgument, kOp, ": seq_lens[", b,
            "] must be 0 or at least s_q = q.shape[1] = ", s_q,
            " (seq_lens count the new tokens too), got ", len);
  }
}

// The schedule kind the tensors' backend takes: host splits for the CPU, device-planned for CUDA.
void check_schedule_kind(const DecodeSchedule& s, Device device) {
  if (device.is_cuda()) {
    require(s.kind == DecodeScheduleKind::kDevicePlanned, ErrorCode::kInvalidArgument, kOp,
            ": CUDA tensors need a device-planned schedule (plan_mla_decode with the CUDA device), "
            "got a host-split schedule");
  } else {
    require(s.kind == DecodeScheduleKind::kHostSplits, ErrorCode::kInvalidArgument, kOp, ": ",
            detail::device_text(device),
            " tensors need a host-split schedule (plan_mla_decode with the CPU device and the "
            "seq_lens), got a device-planned schedule");
  }
}

// A device-planned schedule describes this call's shape.
void check_device_schedule_shape(const DecodeSchedule& s, int64_t batch, int64_t s_q,
                                 int64_t heads) {
  const DeviceDecodeSchedule& d = s.device;
  require(d.batch == batch && d.s_q == s_q && d.num_heads == heads, ErrorCode::kInvalidArgument,
          kOp, ": the schedule was planned for batch ", d.batch, ", s_q ", d.s_q, ", num_heads ",
          d.num_heads, " but q has batch ", batch, ", s_q ", s_q, ", num_heads ", heads,
          " (plan with plan_mla_decode for this shape)");
}

// Elements of a host-split workspace: one partial output row plus its LSE per (split, query,
// head), indexed by the global split; nullopt when the product overflows int64 (sizes >= 0).
std::optional<int64_t> workspace_elems_if_representable(int64_t splits, int64_t s_q, int64_t heads,
                                                        int64_t rank) {
  int64_t elems = 0;
  if (__builtin_mul_overflow(splits, s_q, &elems) || __builtin_mul_overflow(elems, heads, &elems) ||
      __builtin_add_overflow(rank, int64_t{1}, &rank) ||
      __builtin_mul_overflow(elems, rank, &elems)) {
    return std::nullopt;
  }
  return elems;
}

// f32 elements of split workspace `schedule` needs; `op` names the caller in messages. Throws
// instead of returning a wrapped size.
int64_t workspace_elems(const DecodeSchedule& schedule, int64_t s_q, int64_t num_heads,
                        int64_t kv_lora_rank, const char* op) {
  require(s_q >= 0 && num_heads >= 0 && kv_lora_rank >= 0 && schedule.total_splits >= 0,
          ErrorCode::kInvalidArgument, op, ": sizes must be >= 0, got total_splits ",
          schedule.total_splits, ", s_q ", s_q, ", num_heads ", num_heads, ", kv_lora_rank ",
          kv_lora_rank);
  if (schedule.kind == DecodeScheduleKind::kDevicePlanned) {
#ifdef MLAKIT_WITH_CUDA
    int64_t rows = 0;  // s_q x num_heads query rows per request
    require(!__builtin_mul_overflow(s_q, num_heads, &rows), ErrorCode::kInvalidArgument, op,
            ": s_q x num_heads = ", s_q, " x ", num_heads, " overflows int64");
    return cuda::device_plan_sizes(schedule, rows, kv_lora_rank, op).layout.total;
#else
    detail::fail(ErrorCode::kUnsupported,
                 detail::str_cat(op,
                                 ": device-planned schedules belong to the CUDA backend, which "
                                 "this build lacks"));
#endif
  }
  const std::optional<int64_t> elems =
      workspace_elems_if_representable(schedule.total_splits, s_q, num_heads, kv_lora_rank);
  require(elems.has_value(), ErrorCode::kInvalidArgument, op,
          ": total_splits x s_q x num_heads x (kv_lora_rank + 1) = ", schedule.total_splits, " x ",
          s_q, " x ", num_heads, " x (", kv_lora_rank, " + 1) overflows int64");
  return *elems;
}

// The entry width q must have and the latent width L, from q, out, the cache format and
// params.kv_lora_rank; messages name the argument that disagrees.
struct DecodeWidths {
  int64_t entry_dim;     // L + R: q.shape[3], K = entry[0:L+R]
  int64_t kv_lora_rank;  // L: out.shape[3], V = entry[0:L]
};
DecodeWidths decode_widths(const TensorView& q, const TensorView& kv_cache, const TensorView& out,
                           const DecodeParams& params) {
  const int64_t dim = q.size(3);
  if (params.kv_dtype == KvCacheDType::kFp8DsMla) {
    require(dim == kDsMlaKvLoraRank + kDsMlaRopeDim, ErrorCode::kInvalidArgument, kOp,
            ": q.shape[3] must equal ", kDsMlaKvLoraRank + kDsMlaRopeDim,
            " (kv_lora_rank 512 + rope 64, the only dims of kv_cache_dtype fp8_ds_mla), got ", dim);
  } else {
    require(kv_cache.size(2) == dim, ErrorCode::kInvalidArgument, kOp,
            ": kv_cache.shape[2] (the cache entry width) must equal q.shape[3] (L + R) = ", dim,
            ", got ", kv_cache.size(2), " (kv_cache shape ", detail::shape_string(kv_cache), ")");
  }
  const int64_t rank = params.kv_lora_rank > 0 ? params.kv_lora_rank : out.size(3);
  require(params.kv_lora_rank >= 0, ErrorCode::kInvalidArgument, kOp,
          ": kv_lora_rank must be > 0, got ", params.kv_lora_rank);
  require(rank > 0 && rank < dim, ErrorCode::kInvalidArgument, kOp,
          ": kv_lora_rank must be in [1, q.shape[3] - 1 = ", dim - 1, "] (L of L + R = ", dim,
          "), got ", rank);
  if (params.kv_dtype == KvCacheDType::kFp8DsMla) {
    require(rank == kDsMlaKvLoraRank, ErrorCode::kInvalidArgument, kOp,
            ": kv_lora_rank must be 512 for kv_cache_dtype fp8_ds_mla, got ", rank);
  }
  require(out.size(3) == rank, ErrorCode::kInvalidArgument, kOp,
          ": out.shape[3] must equal kv_lora_rank (the latent width L) = ", rank, ", got ",
          out.size(3), " (out shape ", detail::shape_string(out), ")");
  return {dim, rank};
}

// The structure of a host-split schedule (sizes, monotone offsets), independent of seq_lens'
// contents.
void check_schedule_shape(const DecodeSchedule& s, int64_t batch) {
  require(static_cast<int64_t>(s.split_offsets.size()) == batch + 1 &&
              static_cast<int64_t>(s.split_len.size()) == batch,
          ErrorCode::kInvalidArgument, kOp,
          ": schedule must describe the batch: split_offsets needs ", batch + 1,
          " entries and split_len ", batch, ", got ", s.split_offsets.size(), " and ",
          s.split_len.size());
  require(s.split_offsets[0] == 0, ErrorCode::kInvalidArgument, kOp,
          ": schedule.split_offsets[0] must be 0, got ", s.split_offsets[0]);
  for (int64_t b = 0; b < batch; ++b) {
    require(s.num_splits(b) >= 0 && s.num_splits(b) <= s.max_splits, ErrorCode::kInvalidArgument,
            kOp, ": schedule request ", b, " has ", s.num_splits(b),
            " splits, outside [0, max_splits = ", s.max_splits, "]");
  }
  require(s.total_splits == s.split_offsets[batch], ErrorCode::kInvalidArgument, kOp,
          ": schedule.total_splits (", s.total_splits, ") must equal split_offsets[B] (",
          s.split_offsets[batch], ")");
}

// The schedule covers each request's keys exactly: whole-block split lengths, ceil(len / split_len)
// splits, none for an empty request.
void check_schedule_host(const DecodeSchedule& s, const TensorView& seq_lens, int64_t block_size) {
  for (int64_t b = 0; b < seq_lens.size(0); ++b) {
    const int64_t len = read_i32(seq_lens, b * seq_lens.strides[0]);
    const int64_t split_len = s.split_len[b];
    require(split_len > 0 && split_len % block_size == 0, ErrorCode::kInvalidArgument, kOp,
            ": schedule.split_len[", b, "] must be a positive multiple of block_size ", block_size,
            ", got ", split_len);
    const int64_t expected = (len + split_len - 1) / split_len;
    require(s.num_splits(b) == expected, ErrorCode::kInvalidArgument, kOp,
            ": schedule does not match seq_lens: request ", b, " has seq_len ", len,
            " and split_len ", split_len, ", so it needs ", expected, " splits, got ",
            s.num_splits(b), " (plan with the same seq_lens)");
  }
}

// Every block id the keys [0, seq_lens[b]) reach lies in [0, num_blocks).
void check_block_ids_host(const TensorView& block_table, const TensorView& seq_lens,
                          int64_t block_size, int64_t num_blocks) {
  for (int64_t b = 0; b < seq_lens.size(0); ++b) {
    const int64_t len = read_i32(seq_lens, b * seq_lens.strides[0]);
    const int64_t used = (len + block_size - 1) / block_size;
    for (int64_t c = 0; c < used; ++c) {
      const int64_t id =
          read_i32(block_table, b * block_table.strides[0] + c * block_table.strides[1]);
      require(id >= 0 && id < num_blocks, ErrorCode::kOutOfRange, kOp, ": block_table[", b, ", ", c,
              "] = ", id, " is outside the cache's ", num_blocks, " blocks (request ", b, " reads ",
              used, " blocks for seq_len ", len, ")");
    }
  }
}

// 16-bit dtype of the rope values inside fp8_ds_mla entries: the activation dtype, seen on q
// (16-bit q) or else on out (fp8 q).
DType ds_mla_rope_dtype(const TensorView& q, const TensorView& out) {
  if (is_float16(q.dtype)) return q.dtype;
  require(is_float16(out.dtype), ErrorCode::kInvalidArgument, kOp,
          ": kv_cache_dtype fp8_ds_mla stores rope values in the 16-bit activation dtype, so q or "
          "out must be f16 or bf16, got q ",
          dtype_name(q.dtype), " and out ", dtype_name(out.dtype));
  return out.dtype;
}

// q_scale / k_scale given as a tensor (DecodeParams::q_scale_tensor): f32 [1] or [B] on q's
// device, apart from the outputs. Host values are read and checked now, each as the float form
// checks its float ("q_scale[b]" names a per-request one). Absent: no tensor (data nullptr).
DecodeScaleTensor scale_tensor(const char* name, const std::optional<TensorView>& t,
                               const TensorView& q, const TensorView& out, const TensorView& lse) {
  if (!t) return {};
  const int64_t batch = q.size(0);
  detail::check_request_scale_tensor(kOp, name, *t, q.device, batch);
  detail::check_scale_apart(kOp, *t, "out", out, name);
  detail::check_scale_apart(kOp, *t, "lse", lse, name);
  const DecodeScaleTensor scales{static_cast<const float*>(t->data),
                                 t->numel() == 1 ? 0 : t->strides[0]};
  if (!q.device.is_cuda()) {
    const int64_t count = scales.stride == 0 ? 1 : batch;
    for (int64_t b = 0; b < count; ++b) {
      const std::string what = count == 1 ? name : detail::str_cat(name, "[", b, "]");
      detail::check_positive_finite(kOp, what.c_str(), scales.data[b * scales.stride]);
    }
  }
  return scales;
}

// The tensors and scalars, without reading device tensors' contents; returns the kernel's
// arguments but the workspace.
DecodeProblem validate_tensors(const TensorView& q, const TensorView& kv_cache,
                               const TensorView& block_table, const TensorView& seq_lens,
                               const TensorView& out, const TensorView& lse,
                               const DecodeParams& params) {
  for (const auto& [name, t] : {std::pair<const char*, const TensorView*>{"q", &q},
                                {"kv_cache", &kv_cache},
                                {"block_table", &block_table},
                                {"seq_lens", &seq_lens},
                                {"out", &out},
                                {"lse", &lse}}) {
    check_storage(kOp, name, *t);
  }
  check_ndim(kOp, "q", q, 4);
  check_ndim(kOp, "kv_cache", kv_cache, 3);
  check_ndim(kOp, "out", out, 4);
  check_ndim(kOp, "lse", lse, 3);
  check_ndim(kOp, "block_table", block_table, 2);
  check_ndim(kOp, "seq_lens", seq_lens, 1);

  if (is_fp8(params.kv_dtype)) {
    check_dtype(kOp, "q", q, {DType::kF32, DType::kF16, DType::kBF16, DType::kFp8E4m3, DType::kU8});
  } else {
    check_dtype(kOp, "q (fp8 q needs an fp8 kv_cache_dtype)", q,
                {DType::kF32, DType::kF16, DType::kBF16});
  }
  check_inner_contiguous(kOp, "q", q);
  const int64_t heads = q.size(2);

  detail::check_float_activation(kOp, "out", out);
  check_inner_contiguous(kOp, "out", out);
  constexpr const char* kQueryDims[3] = {"batch B", "s_q", "num_heads"};
  for (int d = 0; d < 3; ++d)
    detail::check_size_matches(kOp, "out", out, d, "q", q, d, kQueryDims[d]);
  const auto [dim, rank] = decode_widths(q, kv_cache, out, params);
  check_kv_cache(kOp, kv_cache, params.kv_dtype,
                 MlaDims{.num_heads = heads, .kv_lora_rank = rank, .qk_rope_head_dim = dim - rank});

  check_dtype(kOp, "lse", lse, {DType::kF32});
  for (int d = 0; d < 3; ++d)
    detail::check_size_matches(kOp, "lse", lse, d, "q", q, d, kQueryDims[d]);

  check_dtype(kOp, "block_table", block_table, {DType::kI32});
  detail::check_size_matches(kOp, "block_table", block_table, 0, "q", q, 0, kQueryDims[0]);
  check_dtype(kOp, "seq_lens", seq_lens, {DType::kI32});
  detail::check_size_matches(kOp, "seq_lens", seq_lens, 0, "q", q, 0, kQueryDims[0]);

  detail::check_positive_finite(kOp, "scale", params.scale);
  const DecodeScaleTensor q_scales = scale_tensor("q_scale", params.q_scale_tensor, q, out, lse);
  if (!params.q_scale_tensor) detail::check_positive_finite(kOp, "q_scale", params.q_scale);
  const DecodeScaleTensor k_scales = scale_tensor("k_scale", params.k_scale_tensor, q, out, lse);
  if (!params.k_scale_tensor) detail::check_positive_finite(kOp, "k_scale", params.k_scale);

  detail::check_outputs_apart(
      kOp, {{"out", &out}, {"lse", &lse}},
      {{"q", &q}, {"kv_cache", &kv_cache}, {"block_table", &block_table}, {"seq_lens", &seq_lens}});

  DecodeProblem p;
  p.q = q;
  p.kv_cache = kv_cache;
  p.block_table = block_table;
  p.seq_lens = seq_lens;
  p.out = out;
  p.lse = lse;
  p.kv_dtype = params.kv_dtype;
  p.kv_lora_rank = rank;
  p.entry_dim = dim;
  if (params.kv_dtype == KvCacheDType::kFp8DsMla) p.rope_dtype = ds_mla_rope_dtype(q, out);
  const bool fp8_q = is_fp8_dtype(q.dtype);
  const bool fp8_values = params.kv_dtype == KvCacheDType::kFp8E4m3;
  p.score_scale =
      params.scale * (fp8_q ? params.q_scale : 1.0f) * (fp8_values ? params.k_scale : 1.0f);
  p.value_scale = fp8_values ? params.k_scale : 1.0f;
  p.q_scales = q_scales;
  p.k_scales = k_scales;
  p.softmax_scale = params.scale;
  p.q_scale = params.q_scale;
  p.k_scale = params.k_scale;
  p.q_scale_applies = fp8_q;
  p.k_scale_applies = fp8_values;
  return p;
}

// The schedule (its kind for `device`, its structure or planned shape) and the workspace it
// needs; sets p.workspace.
void validate_schedule(DecodeProblem& p, Device device, const DecodeSchedule& schedule,
                       const TensorView& workspace) {
  const int64_t batch = p.q.size(0), s_q = p.q.size(1), heads = p.q.size(2);
  check_schedule_kind(schedule, device);
  if (schedule.kind == DecodeScheduleKind::kHostSplits) {
    check_schedule_shape(schedule, batch);
  } else {
    check_device_schedule_shape(schedule, batch, s_q, heads);
  }
  check_storage(kOp, "split_workspace", workspace);
  check_dtype(kOp, "split_workspace", workspace, {DType::kF32});
  detail::check_contiguous(kOp, "split_workspace", workspace);
  const int64_t needed = workspace_elems(schedule, s_q, heads, p.kv_lora_rank, kOp);
  require(workspace.numel() >= needed, ErrorCode::kInvalidArgument, kOp,
          ": split_workspace must hold at least ", needed,
          " f32 elements (mla_decode_workspace_elems of the schedule), got ", workspace.numel());
  detail::check_outputs_apart(kOp, {{"split_workspace", &workspace}},
                              {{"q", &p.q},
                               {"kv_cache", &p.kv_cache},
                               {"block_table", &p.block_table},
                               {"seq_lens", &p.seq_lens},
                               {"out", &p.out},
                               {"lse", &p.lse}});
  p.workspace = workspace.data_as<float>();
}

// Contents of the index tensors, for backends whose index tensors the host can read.
void validate_indices_host(const DecodeProblem& p, const DecodeSchedule& schedule) {
  const int64_t block_size = p.kv_cache.size(1);
  check_seq_lens_host(p.seq_lens, p.q.size(1), p.block_table.size(1), block_size);
  check_schedule_host(schedule, p.seq_lens, block_size);
  check_block_ids_host(p.block_table, p.seq_lens, block_size, p.kv_cache.size(0));
}

}  // namespace

int64_t mla_decode_workspace_elems(const DecodeSchedule& schedule, int64_t s_q, int64_t num_heads,
                                   int64_t kv_lora_rank) {
  return workspace_elems(schedule, s_q, num_heads, kv_lora_rank, "mla_decode_workspace_elems");
}

void mla_decode(const TensorView& q, const TensorView& kv_cache, const TensorView& block_table,
                const TensorView& seq_lens, const TensorView& out, const TensorView& lse,
                const DecodeParams& params, const DecodeSchedule& schedule,
                const TensorView& split_workspace, Stream stream) {
  const Device device = detail::common_device(kOp, {{"q", &q},
                                                    {"kv_cache", &kv_cache},
                                                    {"block_table", &block_table},
                                                    {"seq_lens", &seq_lens},
                                                    {"out", &out},
                                                    {"lse", &lse},
                                                    {"split_workspace", &split_workspace}});
  if (!has_backend(device)) detail::unsupported_device(kOp, device);
  DecodeProblem problem = validate_tensors(q, kv_cache, block_table, seq_lens, out, lse, params);
  validate_schedule(problem, device, schedule, split_workspace);
  for (const auto& [name, t] : {std::pair{"q_scale", &params.q_scale_tensor},
                                std::pair{"k_scale", &params.k_scale_tensor}}) {
    if (*t) detail::check_scale_apart(kOp, **t, "split_workspace", split_workspace, name);
  }
#ifdef MLAKIT_WITH_CUDA
  // Index contents stay on the device (no host sync): the kernel guards them itself.
  if (device.is_cuda()) {
    cuda::mla_decode(problem, schedule, stream);
    return;
  }
#else
  (void)stream;
#endif
  validate_indices_host(problem, schedule);
  cpu::mla_decode(problem, schedule);
}

void mla_decode(const TensorView& q, const TensorView& kv_cache, const TensorView& block_table,
                const TensorView& seq_lens, const TensorView& out, const TensorView& lse,
                const DecodeParams& params) {
  const Device device = detail::common_device(kOp, {{"q", &q},
                                                    {"kv_cache", &kv_cache},
                                                    {"block_table", &block_table},
                                                    {"seq_lens", &seq_lens},
                                                    {"out", &out},
                                                    {"lse", &lse}});
  if (!has_backend(device)) detail::unsupported_device(kOp, device);
  // Everything but the schedule is checked before planning and allocating.
  const DecodeProblem problem =
      validate_tensors(q, kv_cache, block_table, seq_lens, out, lse, params);
  const int64_t block_size = kv_cache.size(1);
  require(block_size <= std::numeric_limits<int32_t>::max(), ErrorCode::kInvalidArgument, kOp,
          ": kv_cache.shape[1] (block_size) must be at most 2^31 - 1, got ", block_size);
  DecodeSchedule schedule;
  if (device.is_cpu()) {  // the CPU plans from the lengths
    check_seq_lens_host(seq_lens, q.size(1), block_table.size(1), block_size);
    std::vector<int32_t> lens(seq_lens.size(0));
    for (int64_t b = 0; b < seq_lens.size(0); ++b) {
      lens[b] = static_cast<int32_t>(read_i32(seq_lens, b * seq_lens.strides[0]));
    }
    schedule = plan_decode_splits(lens, block_size, cpu::num_threads());
  } else {  // the GPU from the shape only (the lengths stay on the device)
    // seq_lens are i32: no length exceeds 2^31 - 1, however wide the block table.
    int64_t max_seq_len = 0;
    if (__builtin_mul_overflow(block_table.size(1), block_size, &max_seq_len) ||
        max_seq_len > std::numeric_limits<int32_t>::max()) {
      max_seq_len = std::numeric_limits<int32_t>::max();
    }
    const DecodePlanShape shape{device,
                                q.size(0),
                                q.size(1),
                                q.size(2),
                                block_size,
                                max_seq_len,
                                /*batch_invariant=*/false};
    schedule = plan_mla_decode(shape, {});
  }
  const int64_t elems =
      mla_decode_workspace_elems(schedule, q.size(1), q.size(2), problem.kv_lora_rank);
  const Tensor workspace = Tensor::empty({std::max<int64_t>(1, elems)}, DType::kF32, device);
  mla_decode(q, kv_cache, block_table, seq_lens, out, lse, params, schedule, workspace);
#ifdef MLAKIT_WITH_CUDA
  if (device.is_cuda()) {  // the workspace is freed on return: wait for the kernels that use it
    const cuda::DeviceGuard guard(device, kOp);
    cuda::check_cuda(cudaStreamSynchronize(nullptr), kOp, "cudaStreamSynchronize");
  }
#endif
}

}  // namespace mlakit::ops
