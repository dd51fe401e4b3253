// reference::matmul_nt — C = A · Wᵀ in double, the arithmetic core of the CPU reference.
//
// Both operands are row-major with K contiguous, so every output is a dot product of two
// contiguous rows. The loops are blocked so that a panel of W stays in cache while the rows of
// A stream past it:
//
//   for each panel of kPanelRows rows of W            (output columns j0 .. j0+kPanelRows)
//     for each depth block of kDepth along K          (panel slice: kPanelRows × kDepth doubles,
//                                                      256 KiB, lives in L2)
//       for each pair of rows of A                    (2 × kDepth doubles, in L1)
//         for each quad of rows of W in the panel     one 2×4 tile: 8 dot products at once,
//           C[i..i+1, j..j+3] += A[i..i+1, d] · W[j..j+3, d]     4 lanes along K each
//
// The 2×4 tile with 4 lanes keeps 8 vector accumulators plus 6 operand vectors in the 16 AVX2
// registers; every operand load feeds 2 or 4 multiply-adds.
//
// Determinism: each output is summed in an order fixed by K alone (lanes, then depth blocks),
// never by the thread split, so the result does not depend on how many threads ran.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "qgemm/error.hpp"
#include "qgemm/reference.hpp"

namespace qgemm::reference {
namespace {

constexpr std::int64_t kTileRows = 2;     // rows of A per tile
constexpr std::int64_t kTileCols = 4;     // rows of W (output columns) per tile
constexpr std::int64_t kLanes = 4;        // doubles per vector step along K
constexpr std::int64_t kDepth = 256;      // K per depth block
constexpr std::int64_t kPanelRows = 128;  // rows of W per panel
// Below this many multiply-adds one thread finishes before others would have started.
constexpr std::int64_t kParallelThreshold = std::int64_t{1} << 21;

using Lanes = double __attribute__((vector_size(kLanes * sizeof(double))));

// c[r·ldc + col] += Σ_{d < depth} a[r·k + d] · w[col·k + d] for a Rows × Cols tile.
template <int Rows, int Cols>
inline __attribute__((always_inline)) void dot_tile(const double* a, const double* w,
                                                    std::int64_t k, std::int64_t depth, double* c,
                                                    std::int64_t ldc) {
  // Fully unrolled so that the accumulators live in registers, not on the stack.
  Lanes accumulators[Rows][Cols] = {};
  std::int64_t d = 0;
  for (; d + kLanes <= depth; d += kLanes) {
    Lanes a_lanes[Rows], w_lanes[Cols];
    // memcpy: unaligned vector loads (rows start anywhere when k is odd).
#pragma GCC unroll 4
    for (int r = 0; r < Rows; ++r) std::memcpy(&a_lanes[r], a + r * k + d, sizeof(Lanes));
#pragma GCC unroll 4
    for (int col = 0; col < Cols; ++col) std::memcpy(&w_lanes[col], w + col * k + d, sizeof(Lanes));
#pragma GCC unroll 4
    for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 4
      for (int col = 0; col < Cols; ++col) accumulators[r][col] += a_lanes[r] * w_lanes[col];
  }
#pragma GCC unroll 4
  for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 4
    for (int col = 0; col < Cols; ++col) {
      const Lanes& lanes = accumulators[r][col];
      double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
      for (std::int64_t tail = d; tail < depth; ++tail) sum += a[r * k + tail] * w[col * k + tail];
      c[r * ldc + col] += sum;
    }
  }
}

// Accumulates rows [row_begin, row_end) × columns [col_begin, col_end) of C (C is [m, n]).
struct TileRange {
  std::int64_t row_begin, row_end, col_begin, col_end;
};

inline __attribute__((always_inline)) void multiply_range(const double* a, const double* w,
                                                          std::int64_t n, std::int64_t k,
                                                          const TileRange& range, double* c) {
  for (std::int64_t panel = range.col_begin; panel < range.col_end; panel += kPanelRows) {
    const std::int64_t panel_end = std::min(range.col_end, panel + kPanelRows);
    for (std::int64_t block = 0; block < k; block += kDepth) {
      const std::int64_t depth = std::min(kDepth, k - block);
      std::int64_t i = range.row_begin;
      for (; i + kTileRows <= range.row_end; i += kTileRows) {
        const double* a_rows = a + i * k + block;
        std::int64_t j = panel;
        for (; j + kTileCols <= panel_end; j += kTileCols)
          dot_tile<kTileRows, kTileCols>(a_rows, w + j * k + block, k, depth, c + i * n + j, n);
        for (; j < panel_end; ++j)
          dot_tile<kTileRows, 1>(a_rows, w + j * k + block, k, depth, c + i * n + j, n);
      }
      for (; i < range.row_end; ++i) {
        const double* a_row = a + i * k + block;
        std::int64_t j = panel;
        for (; j + kTileCols <= panel_end; j += kTileCols)
          dot_tile<1, kTileCols>(a_row, w + j * k + block, k, depth, c + i * n + j, n);
        for (; j < panel_end; ++j)
          dot_tile<1, 1>(a_row, w + j * k + block, k, depth, c + i * n + j, n);
      }
    }
  }
}

// The same loops compiled twice: for CPUs with AVX2+FMA (4 lanes in one register, fused
// multiply-add) and for the x86-64 baseline; chosen once at run time.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2,fma"))) void multiply_range_avx2(const double* a, const double* w,
                                                             std::int64_t n, std::int64_t k,
                                                             const TileRange& range, double* c) {
  multiply_range(a, w, n, k, range, c);
}
bool cpu_has_avx2_fma() {
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return supported;
}
#endif

void multiply_range_baseline(const double* a, const double* w, std::int64_t n, std::int64_t k,
                             const TileRange& range, double* c) {
  multiply_range(a, w, n, k, range, c);
}

void multiply_range_best(const double* a, const double* w, std::int64_t n, std::int64_t k,
                         const TileRange& range, double* c) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (cpu_has_avx2_fma()) return multiply_range_avx2(a, w, n, k, range, c);
#endif
  multiply_range_baseline(a, w, n, k, range, c);
}

// Splits C among threads: by row pairs when there are enough rows (each thread then reads all
// of W once), otherwise by column quads (decode-sized M: each thread reads part of W).
std::vector<TileRange> split_work(std::int64_t m, std::int64_t n, std::int64_t k) {
  const std::int64_t hardware = std::max(1u, std::thread::hardware_concurrency());
  const std::int64_t work = m * n * k;
  std::int64_t workers = work < kParallelThreshold ? 1 : hardware;
  std::vector<TileRange> ranges;
  auto split = [&](std::int64_t extent, std::int64_t unit, auto make_range) {
    const std::int64_t units = (extent + unit - 1) / unit;
    const std::int64_t parts = std::max<std::int64_t>(1, std::min(workers, units));
    const std::int64_t units_per_part = (units + parts - 1) / parts;
    for (std::int64_t begin = 0; begin < extent; begin += units_per_part * unit)
      ranges.push_back(make_range(begin, std::min(extent, begin + units_per_part * unit)));
  };
  if (m >= kTileRows * workers) {
    split(m, kTileRows, [&](std::int64_t b, std::int64_t e) { return TileRange{b, e, 0, n}; });
  } else {
    split(n, kTileCols, [&](std::int64_t b, std::int64_t e) { return TileRange{0, m, b, e}; });
  }
  return ranges;
}

}  // namespace

std::vector<double> matmul_nt(const double* a, const double* w, std::int64_t m, std::int64_t n,
                              std::int64_t k, const double* bias) {
  require(m >= 1 && n >= 1 && k >= 1,
          "reference::matmul_nt: shape m = {}, n = {}, k = {} (rule: every size >= 1)", m, n, k);
  require(a != nullptr, "reference::matmul_nt: a is null (rule: A [m, k] must be given)");
  require(w != nullptr, "reference::matmul_nt: w is null (rule: W [n, k] must be given)");
  std::vector<double> c(static_cast<std::size_t>(m * n), 0.0);
  const std::vector<TileRange> ranges = split_work(m, n, k);
  if (ranges.size() == 1) {
    multiply_range_best(a, w, n, k, ranges.front(), c.data());
  } else {
    std::vector<std::thread> threads;
    threads.reserve(ranges.size());
    for (const TileRange& range : ranges)
      threads.emplace_back([&, range] { multiply_range_best(a, w, n, k, range, c.data()); });
    for (auto& thread : threads) thread.join();
  }
  if (bias != nullptr) {
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) c[i * n + j] += bias[j];
  }
  return c;
}

}  // namespace qgemm::reference
