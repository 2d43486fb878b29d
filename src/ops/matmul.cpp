// ops::batched_matmul: validation (backend-independent) and device dispatch.
#include "ops/matmul.hpp"

#include <algorithm>
#include <climits>
#include <optional>
#include <ostream>

#include "core/check.hpp"
#include "cpu/matmul.hpp"
#include "mlakit/ops.hpp"

#ifdef MLAKIT_WITH_CUDA
#include "cuda/gemm/batched_gemm.hpp"
#endif

namespace mlakit::detail {
namespace {

constexpr const char* kOp = "batched_matmul";

// One [batch, rows, cols] operand as a BLAS matrix per batch index, if it is one: stride 1 along
// the columns (row-major) or along the rows (column-major), and a leading stride that keeps rows
// (columns) apart. A dimension of size 1 has no meaningful stride and fits either layout.
std::optional<GemmOperand> as_blas_matrix(const TensorView& t) {
  const int64_t rows = t.shape[1], cols = t.shape[2];
  GemmOperand op{t.data, t.dtype, false, std::max<int64_t>(cols, 1), t.strides[0]};
  if (t.numel() == 0) return op;  // nothing is read or written: any strides will do
  if (t.strides[2] == 1 || cols == 1) {
    op.ld = rows == 1 ? std::max<int64_t>(cols, 1) : t.strides[1];
    if (op.ld >= cols) return op;
  }
  if (t.strides[1] == 1 || rows == 1) {
    op.col_major = true;
    op.ld = cols == 1 ? std::max<int64_t>(rows, 1) : t.strides[2];
    if (op.ld >= rows) return op;
  }
  return std::nullopt;
}

GemmOperand blas_matrix(const char* name, const TensorView& t) {
  const std::optional<GemmOperand> op = as_blas_matrix(t);
  require(op.has_value(), ErrorCode::kInvalidArgument, kOp, ": ", name,
          " must be a row-major or a transposed matrix per batch index (stride 1 in its last "
          "dimension and a row stride >= ",
          t.shape[2],
          ", or stride 1 in its second-to-last dimension and a column stride >= ", t.shape[1],
          "), got shape ", shape_string(t), " with strides ", strides_string(t));
  return *op;
}

// " (a [..], w [..], c [..])" for messages, formatted only when a check fails (this runs on every
// call: an eagerly built string would cost a stream and three shape strings each time).
struct ShapesNote {
  const TensorView& a;
  const TensorView& w;
  const TensorView& c;
};
std::ostream& operator<<(std::ostream& os, const ShapesNote& s) {
  return os << " (a " << shape_string(s.a) << ", w " << shape_string(s.w) << ", c "
            << shape_string(s.c) << ")";
}

void check_blas_int(const char* what, int64_t value) {
  require(value <= INT_MAX, ErrorCode::kUnsupported, kOp, ": ", what,
          " must fit the 32-bit BLAS integer (<= ", INT_MAX, "), got ", value);
}

}  // namespace

BatchedGemm describe_batched_matmul(const TensorView& a, const TensorView& w, const TensorView& c) {
  check_ndim(kOp, "a", a, 3);
  check_ndim(kOp, "w", w, 3);
  check_ndim(kOp, "c", c, 3);
  check_storage(kOp, "a", a);
  check_storage(kOp, "w", w);
  check_storage(kOp, "c", c);
  common_device(kOp, {{"a", &a}, {"w", &w}, {"c", &c}});
  check_outputs_apart(kOp, {{"c", &c}}, {{"a", &a}, {"w", &w}});
  check_float_activation(kOp, "a", a);
  check_float_activation(kOp, "w", w);
  check_float_activation(kOp, "c", c);

  BatchedGemm g;
  g.batch = a.shape[0];
  g.m = a.shape[1];
  g.k = a.shape[2];
  g.n = w.shape[2];
  const ShapesNote shapes{a, w, c};
  require(w.shape[0] == g.batch, ErrorCode::kInvalidArgument, kOp,
          ": w.shape[0] must equal the batch a.shape[0] = ", g.batch, ", got ", w.shape[0], shapes);
  require(w.shape[1] == g.k, ErrorCode::kInvalidArgument, kOp,
          ": w.shape[1] must equal K = a.shape[2] = ", g.k, ", got ", w.shape[1], shapes);
  require(c.shape[0] == g.batch, ErrorCode::kInvalidArgument, kOp,
          ": c.shape[0] must equal the batch a.shape[0] = ", g.batch, ", got ", c.shape[0], shapes);
  require(c.shape[1] == g.m, ErrorCode::kInvalidArgument, kOp,
          ": c.shape[1] must equal M = a.shape[1] = ", g.m, ", got ", c.shape[1], shapes);
  require(c.shape[2] == g.n, ErrorCode::kInvalidArgument, kOp,
          ": c.shape[2] must equal Ncol = w.shape[2] = ", g.n, ", got ", c.shape[2], shapes);

  g.a = blas_matrix("a", a);
  g.w = blas_matrix("w", w);
  g.c = blas_matrix("c", c);

  check_blas_int("M", g.m);
  check_blas_int("Ncol", g.n);
  check_blas_int("K", g.k);
  check_blas_int("the leading stride of a", g.a.ld);
  check_blas_int("the leading stride of w", g.w.ld);
  check_blas_int("the leading stride of c", g.c.ld);
  return g;
}

}  // namespace mlakit::detail

namespace mlakit::ops {

void batched_matmul(const TensorView& a, const TensorView& w, const TensorView& c,
                    [[maybe_unused]] Stream stream) {
  const detail::BatchedGemm gemm = detail::describe_batched_matmul(a, w, c);
  if (c.device.is_cuda()) {
#ifdef MLAKIT_WITH_CUDA
    return cuda::batched_gemm(gemm, c.device, stream);
#else
    detail::unsupported_device("batched_matmul", c.device);
#endif
  }
  cpu::batched_gemm(gemm);
}

}  // namespace mlakit::ops
