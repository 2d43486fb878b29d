// cuBLAS batched GEMM: operand types and scratch conversions; the product itself goes through
// cuBLASLt with a cached plan (lt_matmul.hpp).
#include "cuda/gemm/batched_gemm.hpp"

#include <climits>

#include "core/check.hpp"
#include "cuda/common/runtime.hpp"
#include "cuda/elementwise/launch.hpp"
#include "cuda/gemm/column_major_gemm.hpp"
#include "cuda/gemm/cublas_context.hpp"
#include "cuda/gemm/lt_matmul.hpp"

namespace mlakit::cuda {

namespace {

using detail::BatchedGemm;
using detail::GemmOperand;

constexpr const char* kOp = "batched_matmul";
// Scratch parts start on 256-byte boundaries (cudaMalloc's alignment; cuBLAS prefers >= 16).
constexpr int64_t kScratchAlign = 256;

// The type a and w are multiplied in: their common type; else the 16-bit one (the f32 operand
// is rounded to it), or f32 for f16 with bf16.
DType operand_type(DType a, DType w) {
  if (a == w) return a;
  if (a == DType::kF32) return w;
  if (w == DType::kF32) return a;
  return DType::kF32;
}

// cuBLAS writes c itself for (T, T, T) and, with 16-bit T, (T, T, f32).
bool writes_c_directly(DType operands, DType c) {
  return c == operands || (c == DType::kF32 && operands != DType::kF32);
}

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// A [copies, lines, line] view of an operand's storage: lines are its contiguous runs (rows of a
// row-major matrix, columns of a column-major one).
TensorView lines_view(const GemmOperand& op, int64_t copies, int64_t rows, int64_t cols,
                      Device device) {
  const int64_t lines = op.col_major ? cols : rows, line = op.col_major ? rows : cols;
  return TensorView::strided(op.data, op.dtype, {copies, lines, line}, {op.batch_stride, op.ld, 1},
                             device);
}

// A dense copy of `op` ([batch, rows, cols], same orientation) converted to `to`, at `scratch`.
// A broadcast operand (batch stride 0) is converted once.
GemmOperand convert_operand(const GemmOperand& op, int64_t batch, int64_t rows, int64_t cols,
                            DType to, void* scratch, Device device, Stream stream) {
  const int64_t copies = op.batch_stride == 0 ? 1 : batch;
  const int64_t line = op.col_major ? rows : cols;
  const TensorView src = lines_view(op, copies, rows, cols, device);
  const TensorView dst =
      TensorView::contiguous(scratch, to, {copies, src.shape[1], src.shape[2]}, device);
  cuda::copy(src, dst, stream);
  return {scratch, to, op.col_major, line, copies == 1 ? 0 : rows * cols};
}

int64_t dense_bytes(int64_t copies, int64_t rows, int64_t cols, DType dtype) {
  return round_up(copies * rows * cols * dtype_size(dtype), kScratchAlign);
}

// c = a @ w for every batch index, all three in cuBLAS-supported types: through cuBLASLt with the
// problem's cached plan, or cublasGemmStridedBatchedEx when cuBLASLt has no algorithm for it.
void gemm(CublasContext& ctx, const GemmOperand& a, const GemmOperand& w, const GemmOperand& c,
          const BatchedGemm& g, cudaStream_t stream) {
  const ColumnMajorGemm cm = column_major_gemm(a, w, c, g);
  if (lt_matmul(ctx.lt, ctx.lt_plans, cm, ctx.workspace, kCublasWorkspaceBytes, stream, kOp)) {
    return;
  }
  const float alpha = 1.0f, beta = 0.0f;
  const auto i32 = [](int64_t v) { return static_cast<int>(v); };
  check_cublas(cublasGemmStridedBatchedEx(
                   ctx.handle, cm.a.op, cm.b.op, i32(cm.m), i32(cm.n), i32(cm.k), &alpha, cm.a.data,
                   cm.a.type, i32(cm.a.ld), cm.a.batch_stride, cm.b.data, cm.b.type, i32(cm.b.ld),
                   cm.b.batch_stride, &beta, cm.d, cm.d_type, i32(cm.ldd), cm.batch_stride_d,
                   i32(cm.batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               kOp, "cublasGemmStridedBatchedEx");
}

}  // namespace

void batched_gemm(const BatchedGemm& g, Device device, Stream stream) {
  if (g.batch == 0 || g.m == 0 || g.n == 0) return;
  detail::require(g.batch <= INT_MAX, ErrorCode::kUnsupported, kOp,
                  ": the batch must fit cuBLAS's 32-bit batch count (<= ", INT_MAX, "), got ",
                  g.batch);
  DeviceGuard guard(device, kOp);
  if (g.k == 0) {  // every output is an empty sum
    cuda::fill_zero(lines_view(g.c, g.batch, g.m, g.n, device), stream);
    return;
  }
  const cudaStream_t s = as_cuda_stream(stream);
  CublasContext& ctx = cublas_context(s, kOp);
  std::lock_guard<std::mutex> lock(ctx.mutex);

  const DType type = operand_type(g.a.dtype, g.w.dtype);
  const bool convert_a = g.a.dtype != type, convert_w = g.w.dtype != type;
  const bool direct_c = writes_c_directly(type, g.c.dtype);
  const int64_t a_bytes =
      convert_a ? dense_bytes(g.a.batch_stride == 0 ? 1 : g.batch, g.m, g.k, type) : 0;
  const int64_t w_bytes =
      convert_w ? dense_bytes(g.w.batch_stride == 0 ? 1 : g.batch, g.k, g.n, type) : 0;
  const int64_t c_bytes = direct_c ? 0 : dense_bytes(g.batch, g.m, g.n, DType::kF32);
  if (a_bytes + w_bytes + c_bytes > 0) reserve_scratch(ctx, a_bytes + w_bytes + c_bytes, s, kOp);
  char* scratch = static_cast<char*>(ctx.scratch);

  const GemmOperand a =
      convert_a ? convert_operand(g.a, g.batch, g.m, g.k, type, scratch, device, stream) : g.a;
  const GemmOperand w =
      convert_w ? convert_operand(g.w, g.batch, g.k, g.n, type, scratch + a_bytes, device, stream)
                : g.w;
  if (direct_c) return gemm(ctx, a, w, g.c, g, s);
  // f32 tile in c's orientation, then rounded into c.
  const int64_t line = g.c.col_major ? g.m : g.n;
  const GemmOperand c32{scratch + a_bytes + w_bytes, DType::kF32, g.c.col_major, line, g.m * g.n};
  gemm(ctx, a, w, c32, g, s);
  cuda::copy(lines_view(c32, g.batch, g.m, g.n, device), lines_view(g.c, g.batch, g.m, g.n, device),
             stream);
}

}  // namespace mlakit::cuda
