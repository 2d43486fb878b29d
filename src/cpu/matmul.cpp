// CPU batched GEMM: the thread pool over tiles of c, one single-threaded sgemm per tile.
#include "cpu/matmul.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "cpu/parallel.hpp"
#include "cpu/sgemm.hpp"
#include "mlakit/dtype.hpp"

namespace mlakit::cpu {
namespace {

using detail::BatchedGemm;
using detail::GemmOperand;

// Largest tile of c one sgemm call computes. Why: 256 x 1024 f32 is 1 MiB, so the f32 scratch of
// a 16-bit c tile stays in a core's L2, and both sides are far above OpenBLAS's register blocks
// (at most 16 x 4 ... 32 x 6 on AVX-512), so a tile runs at the single-thread sgemm rate.
constexpr int64_t kMaxTileRows = 256;
constexpr int64_t kMaxTileCols = 1024;
// Smallest tile a split for more parallelism may produce. Why: below ~64 rows or columns the
// packing of the other operand is no longer amortized (measured in docs/kernels/gemm_cpu.md).
constexpr int64_t kMinTileRows = 64;
constexpr int64_t kMinTileCols = 64;
// Multiply-adds below which a call runs on the calling thread alone. Why: 2^18 MACs take a core
// about 10 us, the order of waking the pool's sleeping workers (and far less than workers that have
// to wait for a core on a loaded machine).
constexpr int64_t kMinParallelMacs = int64_t{1} << 18;
// Elements one conversion task handles. Why: 64 Ki f32 (256 KiB) amortizes the scheduling of a
// dynamic work item while still giving every thread work for a 512 x 512 operand.
constexpr int64_t kConvertChunkElems = int64_t{1} << 16;

int64_t cdiv(int64_t x, int64_t y) { return (x + y - 1) / y; }

// Offset in elements of element (r, c) of one matrix of `op`.
int64_t element_offset(const GemmOperand& op, int64_t r, int64_t c) {
  return op.col_major ? r + c * op.ld : r * op.ld + c;
}

char* byte_ptr(void* data, DType dtype, int64_t offset) {
  return static_cast<char*>(data) + offset * dtype_size(dtype);
}

// src: [n] f16 or bf16  ->  dst: [n] f32 (exact)
void widen_line(const void* src, DType dtype, float* dst, int64_t n) {
  const uint16_t* bits = static_cast<const uint16_t*>(src);
  if (dtype == DType::kBF16) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = bits_float(static_cast<uint32_t>(bits[i]) << 16);
    return;
  }
  int64_t i = 0;
#if defined(__F16C__)
  constexpr int64_t kLanes = 8;  // f16 values per 128-bit load, f32 per 256-bit store
  for (; i + kLanes <= n; i += kLanes) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bits + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) dst[i] = f16_bits_to_float(bits[i]);
}

// src: [n] f32  ->  dst: [n] f16 or bf16, round to nearest even
void narrow_line(const float* src, DType dtype, void* dst, int64_t n) {
  uint16_t* bits = static_cast<uint16_t*>(dst);
  if (dtype == DType::kBF16) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) bits[i] = float_to_bf16_bits(src[i]);
    return;
  }
  int64_t i = 0;
#if defined(__F16C__)
  constexpr int64_t kLanes = 8;  // f32 values per 256-bit load, f16 per 128-bit store
  for (; i + kLanes <= n; i += kLanes) {
    const __m128i h =
        _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(bits + i), h);
  }
#endif
  for (; i < n; ++i) bits[i] = float_to_f16_bits(src[i]);
}

// Dense f32 copy of a 16-bit operand ([batch, rows, cols], same orientation) in `buffer`; a
// broadcast operand (batch stride 0) is copied once.
GemmOperand widen_operand(const GemmOperand& op, int64_t batch, int64_t rows, int64_t cols,
                          std::vector<float>& buffer) {
  const int64_t copies = op.batch_stride == 0 ? 1 : batch;
  const int64_t lines = op.col_major ? cols : rows;  // contiguous runs per matrix
  const int64_t line = op.col_major ? rows : cols;   // elements per run
  buffer.resize(static_cast<size_t>(copies * lines * line));
  const int64_t lines_per_task = std::max<int64_t>(1, kConvertChunkElems / line);
  const int64_t total_lines = copies * lines;
  parallel_for(0, cdiv(total_lines, lines_per_task), [&](int64_t task) {
    const int64_t end = std::min(total_lines, (task + 1) * lines_per_task);
    for (int64_t l = task * lines_per_task; l < end; ++l) {
      const int64_t b = l / lines, r = l % lines;
      widen_line(byte_ptr(op.data, op.dtype, b * op.batch_stride + r * op.ld), op.dtype,
                 buffer.data() + l * line, line);
    }
  });
  return {buffer.data(), DType::kF32, op.col_major, line, copies == 1 ? 0 : lines * line};
}

struct Tiling {
  int64_t m_tiles;
  int64_t n_tiles;
};

// Tiles of at most kMaxTileRows x kMaxTileCols; split further (rows first, then columns, never
// below kMinTile*) while there are fewer work items than threads.
Tiling choose_tiling(const BatchedGemm& g, int threads) {
  Tiling t{cdiv(g.m, kMaxTileRows), cdiv(g.n, kMaxTileCols)};
  while (g.batch * t.m_tiles * t.n_tiles < threads) {
    if (cdiv(g.m, t.m_tiles + 1) >= kMinTileRows) {
      ++t.m_tiles;
    } else if (cdiv(g.n, t.n_tiles + 1) >= kMinTileCols) {
      ++t.n_tiles;
    } else {
      break;
    }
  }
  return t;
}

// c[b][m0:m1, n0:n1] = a[b][m0:m1, :] @ w[b][:, n0:n1]; a and w are f32 here.
void gemm_tile(const BatchedGemm& g, const GemmOperand& a, const GemmOperand& w, int64_t b,
               int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  const int64_t rows = m1 - m0, cols = n1 - n0;
  const MatrixLayout layout = g.c.col_major ? MatrixLayout::kColMajor : MatrixLayout::kRowMajor;
  const auto trans = [&](const GemmOperand& op) { return op.col_major != g.c.col_major; };
  const float* a_tile =
      static_cast<const float*>(a.data) + b * a.batch_stride + element_offset(a, m0, 0);
  const float* w_tile =
      static_cast<const float*>(w.data) + b * w.batch_stride + element_offset(w, 0, n0);
  char* c_tile = byte_ptr(g.c.data, g.c.dtype, b * g.c.batch_stride + element_offset(g.c, m0, n0));
  const auto multiply_into = [&](float* out, int64_t ldc) {
    sgemm(layout, trans(a), trans(w), rows, cols, g.k, 1.0f, a_tile, a.ld, w_tile, w.ld, 0.0f, out,
          ldc);
  };
  if (g.c.dtype == DType::kF32) {
    multiply_into(reinterpret_cast<float*>(c_tile), g.c.ld);
    return;
  }
  // 16-bit c: sgemm into a dense f32 tile of c's orientation, then round line by line.
  thread_local std::vector<float> scratch;
  const int64_t lines = g.c.col_major ? cols : rows;
  const int64_t line = g.c.col_major ? rows : cols;
  scratch.resize(static_cast<size_t>(lines * line));
  multiply_into(scratch.data(), line);
  for (int64_t l = 0; l < lines; ++l) {
    narrow_line(scratch.data() + l * line, g.c.dtype, c_tile + l * g.c.ld * dtype_size(g.c.dtype),
                line);
  }
}

// K = 0: every output is an empty sum.
void fill_zero(const BatchedGemm& g) {
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t r = 0; r < g.m; ++r)
      for (int64_t c = 0; c < g.n; ++c)
        store_float(g.c.data, g.c.dtype, b * g.c.batch_stride + element_offset(g.c, r, c), 0.0f);
}

}  // namespace

void batched_gemm(const BatchedGemm& g) {
  if (g.batch == 0 || g.m == 0 || g.n == 0) return;
  if (g.k == 0) {
    fill_zero(g);
    return;
  }
  require_per_thread_blas("batched_matmul");
  thread_local std::vector<float> a_f32, w_f32;  // reused across calls of this thread
  const GemmOperand a =
      g.a.dtype == DType::kF32 ? g.a : widen_operand(g.a, g.batch, g.m, g.k, a_f32);
  const GemmOperand w =
      g.w.dtype == DType::kF32 ? g.w : widen_operand(g.w, g.batch, g.k, g.n, w_f32);
  const bool small = g.batch * g.m * g.n * g.k < kMinParallelMacs;
  const Tiling t = choose_tiling(g, small ? 1 : num_threads());
  const int64_t tiles = t.m_tiles * t.n_tiles;
  const auto run_item = [&](int64_t item) {
    const int64_t b = item / tiles, mi = item % tiles / t.n_tiles, ni = item % t.n_tiles;
    gemm_tile(g, a, w, b, g.m * mi / t.m_tiles, g.m * (mi + 1) / t.m_tiles, g.n * ni / t.n_tiles,
              g.n * (ni + 1) / t.n_tiles);
  };
  if (small) {
    for (int64_t item = 0; item < g.batch * tiles; ++item) run_item(item);
  } else {
    parallel_for(0, g.batch * tiles, run_item);
  }
}

}  // namespace mlakit::cpu
