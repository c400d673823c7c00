// The reference's magnitude sweeps (ad::magnitude_scope), which weigh check_backward's pass rule,
// against plain scalar loops over the terms of each gradient element (a term: the product of the
// partials along one path from a cotangent to the input): of absolute values, sum |term|
// (|J|^T |w|), of squares, sum term^2 (|J|^2^T w^2, the bf16 rule's random walk), and of counts,
// the number of nonzero terms (how many roundings a long sum of them takes). The kernel
// has a dot, an elementwise chain, a row broadcast, a sum over each row and an operand read twice
// (x * x: two terms), on shapes that do not fill the tiles; every sweep in float64 and float32.
// And the counts that mark branches (ad::branches_sweep) on a where, an abs and a maximum.
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include "../support/tensors.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

namespace test_magnitude_sweeps {

namespace tg = tilegrad;

namespace {

constexpr int BM = 16, BK = 32, BN = 32;
using kind = tg::ad::magnitude_kind;
constexpr std::int64_t M = 37, K = 20, N = 24;

// y = tanh(x @ w) * b (b broadcast down the rows), z = sum over each row of x * x.
constexpr auto kernel = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                    tg::tensor<T const> w, tg::tensor<T const> b, tg::tensor<T> y,
                                    tg::tensor<T> z) {
  using F = tg::fp32<T>;
  auto const rows = p.program_id(0) * BM + tg::arange<0, BM>();
  auto const ks = tg::arange<0, BK>();
  auto const cols = tg::arange<0, BN>();
  auto const rin = rows < x.size(0);
  tg::tile<F, BM, BK> const xs = tg::load(x + tg::col(rows) * x.stride(0) + tg::row(ks),
                                          tg::col(rin) & tg::row(ks < x.size(1)), 0.0f);
  tg::tile<F, BK, BN> const ws = tg::load(w + tg::col(ks) * w.stride(0) + tg::row(cols),
                                          tg::col(ks < w.size(0)) & tg::row(cols < w.size(1)), 0.0f);
  tg::tile<F, BN> const bs = tg::load(b + cols, cols < b.size(0), 0.0f);
  auto const t = tg::tanh(tg::dot(xs, ws));
  tg::store(y + tg::col(rows) * y.stride(0) + tg::row(cols), t * tg::row(bs),
            tg::col(rin) & tg::row(cols < y.size(1)));
  tg::store(z + rows, tg::sum<1>(xs * xs), rin);
};

template <class T>
struct sweeps {
  tg::owned_tensor<T> x{{M, K}}, w{{K, N}}, b{{N}}, y{{M, N}}, z{{M}}, dy{{M, N}}, dz{{M}};
  sweeps() {
    test_support::fill(x, 1);
    test_support::fill(w, 2);
    test_support::fill(b, 3);
    test_support::fill(dy, 4);
    test_support::fill(dz, 5);
    x(3, 4) = T(0); // terms of zero: not counted, nothing in the other sums
  }
  // The sweep, seeded with |cotangents|, their squares, or 1 where nonzero.
  tg::gradients<T> run(kind k) {
    auto const seed = [k](T v) {
      return k == kind::squares ? v * v : k == kind::counts ? T(v != 0) : std::abs(v);
    };
    tg::owned_tensor<T> sy{{M, N}}, sz{{M}};
    for (std::int64_t i = 0; i < dy.numel(); ++i)
      sy.data()[i] = seed(dy.data()[i]);
    for (std::int64_t i = 0; i < dz.numel(); ++i)
      sz.data()[i] = seed(dz.data()[i]);
    tg::ad::magnitude_scope const sweep(true, k);
    return tg::vjp(static_cast<int>(tg::cdiv(M, std::int64_t{BM})), kernel, tg::in("x", x),
                   tg::in("w", w), tg::in("b", b), tg::out("y", y, sy), tg::out("z", z, sz));
  }
};

// The terms, in double, summed as |term|, term^2 or counted.
struct expected {
  std::vector<double> x, w, b;
};
template <class T>
expected by_terms(sweeps<T> const& s, kind k) {
  auto const acc = [k](double& a, double term) {
    a += k == kind::squares ? term * term : k == kind::counts ? double(term != 0) : std::abs(term);
  };
  expected e{std::vector<double>(M * K), std::vector<double>(K * N), std::vector<double>(N)};
  for (std::int64_t i = 0; i < M; ++i) {
    for (std::int64_t j = 0; j < N; ++j) {
      double a = 0;
      for (std::int64_t k = 0; k < K; ++k)
        a += double(s.x(i, k)) * double(s.w(k, j));
      double const t = std::tanh(a), dy = s.dy(i, j), bj = s.b(j);
      // through tanh into the dot; magnitude sweeps weigh tanh's slope 1 - t^2 by its terms'
      // magnitudes, 1 + t^2 (what a backward computing it rounds)
      double const dt = dy * bj * (1 + t * t);
      for (std::int64_t k = 0; k < K; ++k) {
        acc(e.x[i * K + k], dt * double(s.w(k, j)));
        acc(e.w[k * N + j], dt * double(s.x(i, k)));
      }
      acc(e.b[j], dy * t);
    }
    for (std::int64_t k = 0; k < K; ++k) { // z = sum x * x: two terms per element
      double const term = double(s.dz(i)) * double(s.x(i, k));
      acc(e.x[i * K + k], term);
      acc(e.x[i * K + k], term);
    }
  }
  return e;
}

template <class T>
void expect_sweeps_match(double rel) {
  sweeps<T> s;
  for (kind k : {kind::absolute, kind::squares, kind::counts}) {
    auto const g = s.run(k);
    auto const e = by_terms(s, k);
    auto const check = [&](char const* name, std::vector<double> const& want) {
      auto const& got = g[name];
      ASSERT_EQ(got.numel(), static_cast<std::int64_t>(want.size()));
      for (std::size_t i = 0; i < want.size(); ++i) {
        ASSERT_GT(want[i], 0) << name << " " << i;
        EXPECT_NEAR(double(got.data()[i]), want[i], rel * want[i])
            << name << " " << i << " sweep " << static_cast<int>(k);
      }
    };
    check("x", e.x);
    check("w", e.w);
    check("b", e.b);
  }
}

// y1 = where(x > 0, x, x / 2), y2 = abs(x), y3 = maximum(x, w), elementwise in blocks of 64.
constexpr int EB = 64;
constexpr auto branchy = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                     tg::tensor<T const> w, tg::tensor<T> y1, tg::tensor<T> y2,
                                     tg::tensor<T> y3) {
  auto const offs = p.program_id(0) * EB + tg::arange<0, EB>();
  auto const m = offs < x.numel();
  tg::tile<T, EB> const xv = tg::load(x + offs, m, 0.0f), wv = tg::load(w + offs, m, 0.0f);
  tg::store(y1 + offs, tg::where(xv > 0.0f, xv, xv * 0.5f), m);
  tg::store(y2 + offs, tg::abs(xv), m);
  tg::store(y3 + offs, tg::maximum(xv, wv), m);
};

// The counts of x's and w's terms, seeded with 1: with `branches`, a term counts 2 at each second
// choice (where's false side, abs at a negative value, maximum's second operand).
template <class T>
void expect_branch_counts(kind k) {
  constexpr std::int64_t n = 150;
  tg::owned_tensor<T> x{{n}}, w{{n}}, y1{{n}}, y2{{n}}, y3{{n}}, ones{{n}};
  test_support::fill(x, 7);
  test_support::fill(w, 8);
  for (T& v : ones)
    v = T(1);
  tg::gradients<T> g = [&] {
    tg::ad::magnitude_scope const sweep(true, k);
    return tg::vjp(static_cast<int>(tg::cdiv(n, std::int64_t{EB})), branchy, tg::in("x", x),
                   tg::in("w", w), tg::out("y1", y1, ones), tg::out("y2", y2, ones),
                   tg::out("y3", y3, ones));
  }();
  double const two = k == kind::branches ? 2 : 1;
  for (std::int64_t i = 0; i < n; ++i) {
    double const xi = double(x(i)), wi = double(w(i));
    ASSERT_NE(xi, 0.0);
    double const want_x = (xi > 0 ? 1 : two) + (xi > 0 ? 1 : two) + (wi > xi ? 0 : 1);
    double const want_w = wi > xi ? two : 0;
    EXPECT_EQ(double(g["x"].data()[i]), want_x) << i << " " << static_cast<int>(k);
    EXPECT_EQ(double(g["w"].data()[i]), want_w) << i << " " << static_cast<int>(k);
  }
}

} // namespace

TEST(MagnitudeSweeps, BranchesSweepsMarkEachSecondChoiceOfATerm) {
  // check_backward counts terms so in both precisions: where the counts differ, a branch went
  // otherwise (a leaky relu keeps its term on both branches, and only the marks tell them apart).
  for (kind k : {kind::counts, kind::branches}) {
    expect_branch_counts<double>(k);
    expect_branch_counts<float>(k);
  }
}

TEST(MagnitudeSweeps, SumTheTermsOfEachElementByAbsoluteValueOrSquareOrCountThem) {
  expect_sweeps_match<double>(1e-12);
  expect_sweeps_match<float>(1e-5);
}

TEST(MagnitudeSweeps, SquaresAreAtMostTheSquareOfTheMagnitudes) {
  // sum term^2 <= (sum |term|)^2, with room for a random walk: over 20 terms of the dot, x's
  // squares are well below the square of its magnitudes.
  sweeps<double> s;
  auto const m = s.run(kind::absolute), q = s.run(kind::squares);
  double ratio = 0;
  for (std::int64_t i = 0; i < m["x"].numel(); ++i) {
    double const a = m["x"].data()[i], sq = q["x"].data()[i];
    EXPECT_LE(sq, a * a * (1 + 1e-12)) << i;
    ratio = std::max(ratio, std::sqrt(sq) / a);
  }
  EXPECT_LT(ratio, 0.9);
}

} // namespace test_magnitude_sweeps
