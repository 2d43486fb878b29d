// Host-side layout logic of the CUDA elementwise kernels, which needs no GPU: merging the
// dimensions two views walk alike, describing them as rows of units, and choosing vector widths.
// The walk is replayed here exactly as kernel.cuh does it and must visit every element pair of
// the original views once.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <utility>
#include <vector>

#include "common/test_util.hpp"
#include "cuda/common/alignment.hpp"
#include "cuda/elementwise/layout.hpp"

namespace mlakit {
namespace {

TEST(CudaLayout, CommonAlignmentIsTheWidestPowerOfTwoDividingAll) {
  EXPECT_EQ(cuda::common_alignment({0x1000, 48, 0}), 16);
  EXPECT_EQ(cuda::common_alignment({0x1000, 40}), 8);
  EXPECT_EQ(cuda::common_alignment({0x1002, 16}), 2);
  EXPECT_EQ(cuda::common_alignment({7, 16}), 1);
  EXPECT_EQ(cuda::common_alignment({}), 16);
  EXPECT_EQ(cuda::common_alignment({64}, 4), 4);
}

TEST(CudaLayout, MergesDimensionsBothViewsWalkAlike) {
  const int64_t dense[] = {5, 7, 64};
  char base[1];
  const TensorView d = TensorView::contiguous(base, DType::kF32, dense);
  cuda::MergedDims m = cuda::merge_dims(d, d);
  EXPECT_EQ(m.ndim, 1);
  EXPECT_EQ(m.shape[0], 5 * 7 * 64);
  EXPECT_TRUE(m.inner_contiguous());

  // A stride-0 source merges its inner dims with the dense destination's, not the outer one.
  const TensorView broadcast = TensorView::strided(base, DType::kF32, {5, 7, 64}, {0, 64, 1});
  m = cuda::merge_dims(broadcast, d);
  ASSERT_EQ(m.ndim, 2);
  EXPECT_EQ(m.shape[0], 5);
  EXPECT_EQ(m.shape[1], 7 * 64);
  EXPECT_EQ(m.src_stride[0], 0);
  EXPECT_EQ(m.dst_stride[0], 7 * 64);

  // Size-1 dimensions vanish; a single element is one dimension of size 1.
  const TensorView ones = TensorView::strided(base, DType::kF32, {1, 1, 1}, {9, 3, 5});
  m = cuda::merge_dims(ones, ones);
  EXPECT_EQ(m.ndim, 1);
  EXPECT_EQ(m.shape[0], 1);
  EXPECT_TRUE(m.inner_contiguous());
}

// Every (src, dst) byte-offset pair the kernels visit, in kernel.cuh's order.
std::vector<std::pair<int64_t, int64_t>> walk(const cuda::RowsLayout& l) {
  std::vector<std::pair<int64_t, int64_t>> visits;
  for (int64_t i = 0; i < l.rows * l.units_per_row; ++i) {
    int64_t row = i / l.units_per_row, unit = i % l.units_per_row, src = 0, dst = 0;
    for (int d = l.outer_ndim - 1; d >= 0; --d) {
      const int64_t index = row % l.outer_shape[d];
      row /= l.outer_shape[d];
      src += index * l.src_outer_bytes[d];
      dst += index * l.dst_outer_bytes[d];
    }
    visits.emplace_back(src + unit * l.src_unit_bytes, dst + unit * l.dst_unit_bytes);
  }
  return visits;
}

// The same pairs from the original views, element by element.
std::vector<std::pair<int64_t, int64_t>> direct(const TensorView& src, const TensorView& dst) {
  std::vector<std::pair<int64_t, int64_t>> visits;
  for (int64_t linear = 0; linear < dst.numel(); ++linear) {
    int64_t rest = linear, s = 0, d = 0;
    for (int dim = dst.ndim - 1; dim >= 0; --dim) {
      const int64_t index = rest % dst.shape[dim];
      rest /= dst.shape[dim];
      s += index * src.strides[dim] * src.element_size();
      d += index * dst.strides[dim] * dst.element_size();
    }
    visits.emplace_back(s, d);
  }
  return visits;
}

TEST(CudaLayout, ElementWalkOfMergedRandomViewsVisitsEveryPairOnce) {
  auto rng = test::make_rng(1);
  std::uniform_int_distribution<int64_t> size(1, 5), pad(0, 2), ndim(1, 4);
  char base[1];
  for (int trial = 0; trial < 300; ++trial) {
    const int n = static_cast<int>(ndim(rng));
    // Random shapes; each view gets dense-with-padding strides over a random dimension order.
    std::vector<int64_t> shape(n);
    for (int64_t& s : shape) s = size(rng);
    auto strides_for = [&](std::vector<int> order) {
      std::vector<int64_t> strides(n);
      int64_t step = 1;
      for (int k = n - 1; k >= 0; --k) {
        strides[order[k]] = step;
        step *= shape[order[k]] + pad(rng);
      }
      if (std::bernoulli_distribution(0.2)(rng)) strides[0] = 0;  // broadcast the outermost
      return strides;
    };
    std::vector<int> order(n);
    for (int k = 0; k < n; ++k) order[k] = k;
    const std::vector<int64_t> dst_strides = strides_for(order);
    std::shuffle(order.begin(), order.end(), rng);
    const std::vector<int64_t> src_strides = strides_for(order);
    TensorView src, dst;
    src.data = dst.data = base;
    src.dtype = DType::kBF16;
    dst.dtype = DType::kF32;
    src.ndim = dst.ndim = n;
    for (int k = 0; k < n; ++k) {
      src.shape[k] = dst.shape[k] = shape[k];
      src.strides[k] = src_strides[k];
      dst.strides[k] = dst_strides[k];
    }
    const cuda::MergedDims m = cuda::merge_dims(src, dst);
    const cuda::RowsLayout l = cuda::rows_layout(m, 2, 4, m.inner(), m.src_stride[m.ndim - 1] * 2,
                                                 m.dst_stride[m.ndim - 1] * 4);
    EXPECT_EQ(walk(l), direct(src, dst)) << "trial " << trial;
  }
}

}  // namespace
}  // namespace mlakit
