// The forward kernels of the example ladder (weighted sum, softmax, matmul) against plain
// loops, in float and double, on shapes that do not divide the tiles, on every executor; and
// the ladder's kernels refusing operands of another shape.
#include <tilegrad/kernels/layer_norm.hpp>
#include <tilegrad/kernels/matmul.hpp>
#include <tilegrad/kernels/softmax.hpp>
#include <tilegrad/kernels/weighted_sum.hpp>
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include "../support/tensors.hpp"

#include <cmath>
#include <random>
#include <vector>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_forward_kernels {

namespace tg = tilegrad;
using test_support::fill;
using test_support::tol;

namespace {

std::vector<tg::executor> executors() {
  std::vector<tg::executor> e{tg::executor::sequential};
  if (tg::executor_available(tg::executor::tbb)) e.push_back(tg::executor::tbb);
  if (tg::executor_available(tg::executor::openmp)) e.push_back(tg::executor::openmp);
  return e;
}

// The message of the std::invalid_argument run() throws ("no error" if none).
template <class Run>
std::string message(Run&& run) {
  try {
    run();
  } catch (std::invalid_argument const& e) {
    return std::string(e.what());
  }
  return std::string("no error");
}

} // namespace

template <class T>
class ForwardKernels : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(ForwardKernels, Types);

TYPED_TEST(ForwardKernels, WeightedSumMatchesLoop) {
  using T = TypeParam;
  for (auto [n, d] : {std::pair{1, 1}, {37, 70}, {100, 333}, {16, 64}}) {
    tg::owned_tensor<T> x({n, d}, "x"), w({d}, "w"), y({n}, "y");
    fill(x, 1);
    fill(w, 2);
    for (auto e : executors()) {
      for (T& v : y) v = T(123);
      tg::launch({e, 2}, tg::cdiv(n, 16), tg::kernels::weighted_sum_fwd<16, 32>, x.cview(),
                 w.cview(), y.view());
      for (int i = 0; i < n; ++i) {
        double r = 0;
        for (int j = 0; j < d; ++j) r += double(x(i, j)) * double(w(j));
        ASSERT_NEAR(y(i), r, tol<T>(2e-5) * (1 + d)) << "row " << i << " n=" << n << " d=" << d
                                                 << " executor " << tg::to_string(e);
      }
    }
  }
}

TYPED_TEST(ForwardKernels, SoftmaxMatchesLoop) {
  using T = TypeParam;
  for (auto [n, d] : {std::pair{1, 1}, {5, 37}, {33, 100}, {7, 128}}) {
    tg::owned_tensor<T> x({n, d}, "x"), y({n, d}, "y");
    fill(x, 3);
    for (T& v : x) v *= T(4);
    for (auto e : executors()) {
      tg::launch({e, 2}, n, tg::kernels::softmax_fwd<128>, x.cview(), y.view());
      for (int i = 0; i < n; ++i) {
        double m = -INFINITY, z = 0;
        for (int j = 0; j < d; ++j) m = std::max(m, double(x(i, j)));
        for (int j = 0; j < d; ++j) z += std::exp(double(x(i, j)) - m);
        for (int j = 0; j < d; ++j)
          ASSERT_NEAR(y(i, j), std::exp(double(x(i, j)) - m) / z, tol<T>(2e-5))
              << "(" << i << ", " << j << ") n=" << n << " d=" << d;
      }
    }
  }
}

TYPED_TEST(ForwardKernels, MatmulMatchesLoop) {
  using T = TypeParam;
  struct dims {
    int m, k, n;
  };
  for (auto [M, K, N] : {dims{1, 1, 1}, dims{33, 17, 45}, dims{70, 100, 37}, dims{64, 64, 64}}) {
    tg::owned_tensor<T> a({M, K}, "a"), b({K, N}, "b"), c({M, N}, "c");
    fill(a, 4);
    fill(b, 5);
    int const grid = tg::cdiv(M, 32) * tg::cdiv(N, 32);
    for (auto e : executors()) {
      for (T& v : c) v = T(123);
      tg::launch({e, 2}, grid, tg::kernels::matmul_fwd<32, 32, 16, 2>, a.cview(), b.cview(),
                 c.view());
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
          double r = 0;
          for (int k = 0; k < K; ++k) r += double(a(i, k)) * double(b(k, j));
          ASSERT_NEAR(c(i, j), r, tol<T>(2e-5) * (1 + K))
              << "(" << i << ", " << j << ") M=" << M << " K=" << K << " N=" << N;
        }
    }
  }
}

// A row longer than the block lost its columns past Block with no error (the forward wrote
// softmax over the first Block columns and left the rest of y as it was).
TEST(ForwardKernels, SoftmaxRowsLongerThanTheBlockAreRefused) {
  tg::owned_tensor<float> x({3, 100}, "x"), y({3, 100}, "y"), dy({3, 100}, "dy"),
      dx({3, 100}, "dx"), y_short({3, 99}, "y_short");
  fill(x, 1);
  fill(dy, 2);
  std::string const fwd =
      message([&] { tg::launch(3, tg::kernels::softmax_fwd<64>, x.cview(), y.view()); });
  EXPECT_NE(fwd.find("softmax_fwd (program 0): 'x' has rows of 100 columns, more than Block = 64"),
            std::string::npos)
      << fwd;
  EXPECT_NE(fwd.find("Block = 128"), std::string::npos) << fwd;
  std::string const bwd = message(
      [&] { tg::launch(3, tg::kernels::softmax_bwd<64>, y.cview(), dy.cview(), dx.view()); });
  EXPECT_NE(bwd.find("softmax_bwd (program 0): 'y' has rows of 100 columns"), std::string::npos)
      << bwd;
  std::string const shape =
      message([&] { tg::launch(3, tg::kernels::softmax_fwd<128>, x.cview(), y_short.view()); });
  EXPECT_NE(shape.find("'y_short' is (3, 99) where 'x' is (3, 100)"), std::string::npos) << shape;
  // The reference refuses it too, rather than differentiating the first 64 columns.
  std::string const ref = message(
      [&] { (void)tg::vjp(3, tg::kernels::softmax_fwd<64>, tg::in("x", x), tg::out("y", y, dy)); });
  EXPECT_NE(ref.find("more than Block = 64"), std::string::npos) << ref;
  // Rows that fit still run.
  EXPECT_NO_THROW(tg::launch(3, tg::kernels::softmax_fwd<128>, x.cview(), y.view()));
}

// Operands of another shape were zero-padded or cut by the kernels' bounds with no error: a weight
// of 32 for rows of 40 summed the first 32 columns, a b of 48 rows for an a of 32 columns
// multiplied b's first 32, a layer-norm weight of 64 for rows of 100 gave y = 0 past column 64.
TEST(ForwardKernels, OperandsOfAnotherShapeAreRefused) {
  tg::owned_tensor<float> x({10, 40}, "x"), w({32}, "w"), y({10}, "y");
  std::string const ws = message([&] {
    tg::launch(1, tg::kernels::weighted_sum_fwd<16, 32>, x.cview(), w.cview(), y.view());
  });
  EXPECT_NE(ws.find("'w' has shape (32), expected (40)"), std::string::npos) << ws;
  tg::owned_tensor<float> a({20, 32}, "a"), b({48, 24}, "b"), c({20, 24}, "c");
  std::string const mm = message([&] {
    tg::launch(1, tg::kernels::matmul_fwd<32, 32, 16, 2>, a.cview(), b.cview(), c.view());
  });
  EXPECT_NE(mm.find("'b' has shape (48, 24), expected (32, 24)"), std::string::npos) << mm;
  tg::owned_tensor<float> xl({4, 100}, "x"), wl({64}, "w"), bl({100}, "b"), yl({4, 100}, "y"),
      mean({4}, "mean"), rstd({4}, "rstd");
  std::string const ln = message([&] {
    tg::launch(4, tg::kernels::layer_norm_fwd<64>, xl.cview(), wl.cview(), bl.cview(), yl.view(),
               mean.view(), rstd.view(), 1e-5);
  });
  EXPECT_NE(ln.find("'w' has shape (64), expected (100)"), std::string::npos) << ln;
  // Every program checks before its first access: with the first program alone checking, the
  // others wrote past an output of fewer rows while it threw (a crash on several threads).
  tg::owned_tensor<float> c_short({4, 24}, "c");
  std::string const later = message([&] {
    tg::kernels::matmul_fwd<32, 32, 16, 2>(tg::program({1, 0, 0}, {2, 1, 1}), a.cview(),
                                           tg::owned_tensor<float>({32, 24}, "b").cview(),
                                           c_short.view());
  });
  EXPECT_NE(later.find("'c' has shape (4, 24), expected (20, 24)"), std::string::npos) << later;
  std::string const second = message([&] {
    tg::launch({.exec = tg::executor::sequential}, 4, tg::kernels::layer_norm_fwd<128>, xl.cview(),
               bl.cview(), bl.cview(), yl.view(), mean.view(),
               tg::owned_tensor<float>({2}, "rstd").view(), 1e-5);
  });
  EXPECT_NE(second.find("'rstd' has shape (2), expected (4)"), std::string::npos) << second;
  EXPECT_NE(second.find("in program (0, 0, 0)"), std::string::npos) << second;
}

// The backward kernels of the ladder cut or zero-padded operands of another shape as the forward
// ones did: a dy of 64 columns for rows of 100 gave dx = 0 past column 64 and dw, db from the
// first 64 columns; a partial buffer of fewer row tiles than the grid wrote past it (an error,
// but one naming the bounds, not the shape) or, with more rows, left rows unsummed.
TEST(BackwardKernels, OperandsOfAnotherShapeAreRefused) {
  tg::owned_tensor<float> x({40, 40}, "x"), w({32}, "w"), dy({40}, "dy"), dx({40, 40}, "dx"),
      partial({3, 40}, "partial_dw"), partial2({2, 40}, "partial_dw"), w40({40}, "w"),
      dw({32}, "dw");
  std::string const ws = message([&] {
    tg::launch(3, tg::kernels::weighted_sum_bwd<16, 32>, x.cview(), w.cview(), dy.cview(),
               dx.view(), partial.view());
  });
  EXPECT_NE(ws.find("'w' has shape (32), expected (40)"), std::string::npos) << ws;
  std::string const wp = message([&] {
    tg::launch(3, tg::kernels::weighted_sum_bwd<16, 32>, x.cview(), w40.cview(), dy.cview(),
               dx.view(), partial2.view());
  });
  EXPECT_NE(wp.find("'partial_dw' has shape (2, 40), expected (3, 40)"), std::string::npos) << wp;
  std::string const wr = message([&] {
    tg::launch(2, tg::kernels::weighted_sum_reduce_dw<8, 32>, partial.cview(), dw.view());
  });
  EXPECT_NE(wr.find("'dw' has shape (32), expected (40)"), std::string::npos) << wr;

  tg::owned_tensor<float> a({20, 32}, "a"), b({32, 20}, "b"), dc({20, 24}, "dc"),
      da({20, 32}, "da"), dc_short({18, 24}, "dc"), db({32, 24}, "db");
  std::string const mda = message([&] {
    tg::launch(tg::grid(1, 2), tg::kernels::matmul_bwd_da<32, 16, 32>, dc.cview(), b.cview(),
               da.view());
  });
  EXPECT_NE(mda.find("'b' has shape (32, 20), expected (32, 24)"), std::string::npos) << mda;
  std::string const mdb = message([&] {
    tg::launch(tg::grid(2, 1), tg::kernels::matmul_bwd_db<16, 32, 32>, a.cview(), dc_short.cview(),
               db.view());
  });
  EXPECT_NE(mdb.find("'dc' has shape (18, 24), expected (20, 24)"), std::string::npos) << mdb;

  tg::owned_tensor<float> xl({4, 100}, "x"), wl({100}, "w"), mean({4}, "mean"), rstd({4}, "rstd"),
      dyl({4, 64}, "dy"), dxl({4, 100}, "dx"), pdw({2, 100}, "partial_dw"),
      pdb({2, 100}, "partial_db"), dwl({100}, "dw"), dbl({64}, "db");
  std::string const ln = message([&] {
    tg::launch(2, tg::kernels::layer_norm_bwd<64, 2>, xl.cview(), wl.cview(), mean.cview(),
               rstd.cview(), dyl.cview(), dxl.view(), pdw.view(), pdb.view());
  });
  EXPECT_NE(ln.find("'dy' has shape (4, 64), expected (4, 100)"), std::string::npos) << ln;
  std::string const lr = message([&] {
    tg::launch(2, tg::kernels::layer_norm_reduce_dwdb<2, 64>, pdw.cview(), pdb.cview(), dwl.view(),
               dbl.view());
  });
  EXPECT_NE(lr.find("'db' has shape (64), expected (100)"), std::string::npos) << lr;
}

TEST(ForwardKernels, OutOfBoundsInKernelNamesProgramTensorAndLine) {
  tg::checked_scope on(true);
  tg::owned_tensor<float> x({10, 20}, "x"), y({10, 20}, "y");
  // A block of 32 columns without a mask reads past the 20 columns of x: rows 0-8 still read
  // inside x's memory (the next row), as in Triton; the last row runs past its end.
  static int line = 0;
  auto bad = []<class T>(tg::program const& p, tg::tensor<T const> in, tg::tensor<T> out) {
    auto cols = tg::arange<0, 32>();
    line = __LINE__ + 1;
    auto v = tg::load(in + p.program_id(0) * in.stride(0) + cols);
    tg::store(out + p.program_id(0) * out.stride(0) + cols, v, cols < out.size(1));
  };
  try {
    tg::launch({tg::executor::sequential, 1}, 10, bad, x.cview(), y.view());
    FAIL() << "expected an access_error";
  } catch (tg::access_error const& e) {
    std::string const what = e.what();
    EXPECT_NE(what.find("program (9, 0, 0)"), std::string::npos) << what;
    EXPECT_NE(what.find("'x'"), std::string::npos) << what;
    EXPECT_NE(what.find("shape (10, 20)"), std::string::npos) << what;
    EXPECT_NE(what.find("element (10, 0)"), std::string::npos) << what;
    EXPECT_NE(what.find("test_forward_kernels.cpp:" + std::to_string(line)), std::string::npos)
        << what;
    EXPECT_EQ(e.where().line(), static_cast<unsigned>(line));
  }
}

} // namespace test_forward_kernels
