// The layer-norm kernels against plain loops, in float and double, on shapes where BlockN does
// not divide N nor Rows divide M: the forward (y, mean, rstd) and the backward's two launches
// (dx, then dw and db from the per-group partial sums), on every executor.
#include <tilegrad/kernels/layer_norm.hpp>
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include "../support/tensors.hpp"

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_layer_norm {

namespace tg = tilegrad;
using test_support::fill;
using test_support::tol;

namespace {

constexpr int BlockN = 64, Rows = 8, BG = 4;
constexpr float eps = 1e-5f;

std::vector<tg::executor> executors() {
  std::vector<tg::executor> e{tg::executor::sequential};
  if (tg::executor_available(tg::executor::tbb))
    e.push_back(tg::executor::tbb);
  if (tg::executor_available(tg::executor::openmp))
    e.push_back(tg::executor::openmp);
  return e;
}

// Row statistics in double, two passes as the kernel does.
template <class T>
std::pair<double, double> mean_rstd(tg::owned_tensor<T> const& x, std::int64_t i) {
  std::int64_t const n = x.size(1);
  double m = 0, v = 0;
  for (std::int64_t j = 0; j < n; ++j)
    m += double(x(i, j));
  m /= double(n);
  for (std::int64_t j = 0; j < n; ++j)
    v += (double(x(i, j)) - m) * (double(x(i, j)) - m);
  return {m, 1 / std::sqrt(v / double(n) + double(eps))};
}

// Shapes: one element; one partial block; several blocks, the last partial; whole blocks.
std::vector<std::pair<int, int>> const shapes{{1, 1}, {5, 37}, {37, 100}, {3, 700}, {16, 128}};

} // namespace

template <class T>
class LayerNorm : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(LayerNorm, Types);

TYPED_TEST(LayerNorm, ForwardMatchesLoop) {
  using T = TypeParam;
  for (auto [m, n] : shapes) {
    tg::owned_tensor<T> x({m, n}, "x"), w({n}, "w"), b({n}, "b"), y({m, n}, "y");
    tg::owned_tensor<T> mean({m}, "mean"), rstd({m}, "rstd");
    fill(x, 1);
    for (T& v : x)
      v = v * T(3) + T(2); // a mean far from 0
    fill(w, 2);
    fill(b, 3);
    for (auto e : executors()) {
      for (T& v : y)
        v = T(123);
      tg::launch({e, 2}, m, tg::kernels::layer_norm_fwd<BlockN>, x.cview(), w.cview(), b.cview(),
                 y.view(), mean.view(), rstd.view(), eps);
      for (int i = 0; i < m; ++i) {
        auto const [mu, rs] = mean_rstd(x, i);
        ASSERT_NEAR(mean(i), mu, tol<T>(1e-5) * 3) << "row " << i << " n=" << n;
        ASSERT_NEAR(rstd(i), rs, tol<T>(1e-5) * rs) << "row " << i << " n=" << n;
        for (int j = 0; j < n; ++j) {
          double const r = (double(x(i, j)) - mu) * rs * double(w(j)) + double(b(j));
          ASSERT_NEAR(y(i, j), r, tol<T>(2e-5) * (1 + std::abs(r)))
              << "(" << i << ", " << j << ") m=" << m << " n=" << n << " executor "
              << tg::to_string(e);
        }
      }
    }
  }
}

TYPED_TEST(LayerNorm, BackwardMatchesLoop) {
  using T = TypeParam;
  // The shapes above, and where the build has non-temporal stores one whose dx is large enough to
  // be streamed past the caches (output_hint: 32 MiB and more; rows of 4112 floats cover whole
  // cache lines). Elsewhere a streamed store is the plain one the shapes above take.
  auto bwd_shapes = shapes;
  if constexpr (tg::simd::has_stream_store<T, tg::simd::native_width<T>>)
    bwd_shapes.emplace_back(2045, 4112);
  for (auto [m, n] : bwd_shapes) {
    int const groups = tg::cdiv(m, Rows);
    tg::owned_tensor<T> x({m, n}, "x"), w({n}, "w"), b({n}, "b"), y({m, n}, "y");
    tg::owned_tensor<T> mean({m}, "mean"), rstd({m}, "rstd"), dy({m, n}, "dy"), dx({m, n}, "dx");
    tg::owned_tensor<T> pdw({groups, n}, "partial_dw"), pdb({groups, n}, "partial_db");
    tg::owned_tensor<T> dw({n}, "dw"), db({n}, "db");
    fill(x, 4);
    fill(w, 5);
    fill(b, 6);
    fill(dy, 7);
    tg::launch(m, tg::kernels::layer_norm_fwd<BlockN>, x.cview(), w.cview(), b.cview(), y.view(),
               mean.view(), rstd.view(), eps);

    // The reference in double, from the stored mean and rstd's definition.
    std::vector<double> rdx(std::size_t(m) * std::size_t(n)), rdw(n), rdb(n), rrs(m);
    for (int i = 0; i < m; ++i) {
      auto const [mu, rs] = mean_rstd(x, i);
      rrs[i] = rs;
      std::vector<double> xhat(n), wdy(n);
      double c1 = 0, c2 = 0;
      for (int j = 0; j < n; ++j) {
        xhat[j] = (double(x(i, j)) - mu) * rs;
        wdy[j] = double(w(j)) * double(dy(i, j));
        c1 += xhat[j] * wdy[j] / n;
        c2 += wdy[j] / n;
        rdw[j] += double(dy(i, j)) * xhat[j];
        rdb[j] += double(dy(i, j));
      }
      for (int j = 0; j < n; ++j)
        rdx[std::size_t(i) * std::size_t(n) + std::size_t(j)] = rs * (wdy[j] - (xhat[j] * c1 + c2));
    }

    for (auto e : executors()) {
      for (T& v : dx)
        v = T(123);
      tg::launch({e, 2}, groups, tg::kernels::layer_norm_bwd<BlockN, Rows>, x.cview(), w.cview(),
                 mean.cview(), rstd.cview(), dy.cview(), dx.view(), pdw.view(), pdb.view());
      tg::launch({e, 2}, tg::cdiv(n, BlockN), tg::kernels::layer_norm_reduce_dwdb<BG, BlockN>,
                 pdw.cview(), pdb.cview(), dw.view(), db.view());
      // The element furthest out of its tolerance, asserted once (8 million elements).
      double worst = -1;
      std::int64_t wi = 0, wj = 0;
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
          double const r = rdx[std::size_t(i) * std::size_t(n) + std::size_t(j)];
          double const q = std::abs(double(dx(i, j)) - r) / (tol<T>(1e-4) * (1 + rrs[i]));
          if (!(q <= worst)) { // (a NaN is the worst)
            worst = q;
            wi = i;
            wj = j;
          }
        }
      ASSERT_NEAR(dx(wi, wj), rdx[std::size_t(wi) * std::size_t(n) + std::size_t(wj)],
                  tol<T>(1e-4) * (1 + rrs[wi]))
          << "dx (" << wi << ", " << wj << ") m=" << m << " n=" << n << " executor "
          << tg::to_string(e);
      for (int j = 0; j < n; ++j) {
        ASSERT_NEAR(dw(j), rdw[j], tol<T>(1e-5) * (1 + m)) << "dw (" << j << ") m=" << m;
        ASSERT_NEAR(db(j), rdb[j], tol<T>(1e-5) * (1 + m)) << "db (" << j << ") m=" << m;
      }
    }
  }
}

// Rows of large values that vary little or not at all, N = 4097: the mean summed in float is a
// few ulp off, and the squares of that error were the variance of a constant row (rstd 302.1 for
// 316.2 at 12345.678, y = b off by 0.3, the backward's dx 4.5 % off). The pass that takes the
// variance also sums the deviations, which corrects mean and variance: a constant row gives
// y = b and rstd = 1 / sqrt(eps), as PyTorch's layer norm does, and a row of 1e4 + 1e-2 u its
// statistics in double to float's precision.
TEST(LayerNormForward, RowsOfLargeValuesThatVaryLittleKeepTheirStatistics) {
  std::int64_t const m = 4, n = 4097;
  tg::owned_tensor<float> x({m, n}), w({n}), b({n}), y({m, n}), mean({m}), rstd({m});
  fill(w, 1);
  fill(b, 2);
  std::vector<float> const constant = {1000.3f, 12345.678f, -7777.7f};
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j)
      x(i, j) = i < 3 ? constant[static_cast<std::size_t>(i)]
                      : 1e4f + 1e-2f * static_cast<float>(std::sin(0.7 * double(j)));
  tg::launch(m, tg::kernels::layer_norm_fwd<BlockN>, x.cview(), w.cview(), b.cview(), y.view(),
             mean.view(), rstd.view(), double(eps));
  for (std::int64_t i = 0; i < m; ++i) {
    auto const [mu, rs] = test_support::stats_of_row(x, i, double(eps));
    EXPECT_NEAR(mean(i), mu, 1e-7 * std::abs(mu)) << i;
    EXPECT_NEAR(rstd(i), rs, 1e-5 * rs) << i;
    for (std::int64_t j = 0; j < n; ++j) {
      double const want = (x(i, j) - mu) * rs * w(j) + b(j);
      ASSERT_NEAR(y(i, j), want, 2e-3) << i << ", " << j; // (x - mean) rounds to 1e-3 at 1e4
      if (i < 3) {
        ASSERT_EQ(y(i, j), b(j)) << i << ", " << j;
      }
    }
  }
}

} // namespace test_layer_norm
