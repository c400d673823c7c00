// Rounding jitter of a float64 reference (ad/jitter.hpp, check_backward's second look): each value
// the forward computes is read, by each reader, moved by a random fraction of its rounding error.
// The moves are checked against the bound that follows from the rule (a dot's error is u |A| |B|);
// values computed exactly are not moved; the jittered gradients are the same bits for any thread
// count and executor, and another seed moves them differently.
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include "../support/tensors.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace test_jitter {

namespace tg = tilegrad;

namespace {

constexpr double u32 = 0x1p-24; // the unit roundoff of the float computation jittered

// y = exp(x @ w), rows in blocks of 8 (20 rows: the last block masked), K = 16, N = 8.
auto const exp_of_product = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                        tg::tensor<T const> w, tg::tensor<T> y) {
  using F = tg::fp32<T>;
  auto const r = p.program_id(0) * 8 + tg::arange<0, 8>();
  auto const k = tg::arange<0, 16>();
  auto const c = tg::arange<0, 8>();
  auto const rin = tg::col(r < x.size(0));
  tg::tile<F, 8, 16> const xv = tg::load(x + tg::col(r) * x.stride(0) + tg::row(k), rin, 0.0);
  tg::tile<F, 16, 8> const wv = tg::load(w + tg::col(k) * w.stride(0) + tg::row(c));
  tg::tile<F, 8, 8> const z = tg::exp(tg::dot(xv, wv));
  tg::store(y + tg::col(r) * y.stride(0) + tg::row(c), z, rin);
};

// Selections, signs and maxima of the loads: nothing rounds. `a` is read by the row maximum and
// by the comparison with it: moved apart in either, the comparison would fail.
auto const exact_ops = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
  using F = tg::fp32<T>;
  auto const r = p.program_id(0) * 8 + tg::arange<0, 8>();
  auto const c = tg::arange<0, 16>();
  auto const rin = tg::col(r < x.size(0));
  tg::tile<F, 8, 16> const xv = tg::load(x + tg::col(r) * x.stride(0) + tg::row(c), rin, 0.0);
  tg::tile<F, 8, 16> const a = -tg::abs(tg::where(xv > 0.5, tg::maximum(xv, 0.75), -xv));
  tg::tile<F, 8> const m = tg::max<1>(a);
  tg::tile<F, 8, 16> const z = tg::where(a == tg::col(m), a * 3.0, a);
  tg::store(y + tg::col(r) * y.stride(0) + tg::row(c), z, rin);
};

struct product_case {
  tg::owned_tensor<double> x{{20, 16}, "x"}, w{{16, 8}, "w"}, y{{20, 8}, "y"}, dy{{20, 8}, "dy"};
  product_case() {
    test_support::fill(x, 1);
    test_support::fill(w, 2);
    test_support::fill(dy, 3);
  }
  tg::gradients<double> run(std::uint64_t seed, tg::launch_options o = {}, double scale = 1) {
    tg::ad::jitter_scope const jitter({seed, u32, scale});
    return tg::vjp(o, tg::grid(3), exp_of_product, tg::in("x", x), tg::in("w", w),
                   tg::out("y", y, dy));
  }
};

} // namespace

TEST(Jitter, AProductReadByExpMovesTheGradientByNoMoreThanItsRoundingAllows) {
  product_case c;
  auto const g0 = c.run(0); // seed 0: no jitter
  auto const gj = c.run(7);
  // z = exp(x w) is read by exp's rule as exp(x w + s e), |s| <= 1, e = u |x| |w|; x and w are
  // loads (exact). So |dx' - dx| <= sum_j |dy| z (exp(e) - 1) |w| and likewise for dw.
  auto e = [&](int i, int j) {
    double s = 0;
    for (int k = 0; k < 16; ++k) s += std::abs(c.x.data()[i * 16 + k] * c.w.data()[k * 8 + j]);
    return u32 * s;
  };
  auto z = [&](int i, int j) {
    double s = 0;
    for (int k = 0; k < 16; ++k) s += c.x.data()[i * 16 + k] * c.w.data()[k * 8 + j];
    return std::exp(s);
  };
  double largest = 0; // the largest move as a fraction of its bound
  for (int i = 0; i < 20; ++i)
    for (int k = 0; k < 16; ++k) {
      double bound = 0;
      for (int j = 0; j < 8; ++j)
        bound += std::abs(c.dy.data()[i * 8 + j]) * z(i, j) * std::expm1(e(i, j)) *
                 std::abs(c.w.data()[k * 8 + j]);
      double const moved = std::abs(gj["x"].data()[i * 16 + k] - g0["x"].data()[i * 16 + k]);
      EXPECT_LE(moved, bound * (1 + 1e-6) + 1e-300) << "dx " << i << " " << k;
      largest = std::max(largest, moved / bound);
    }
  for (int k = 0; k < 16; ++k)
    for (int j = 0; j < 8; ++j) {
      double bound = 0;
      for (int i = 0; i < 20; ++i)
        bound += std::abs(c.dy.data()[i * 8 + j]) * z(i, j) * std::expm1(e(i, j)) *
                 std::abs(c.x.data()[i * 16 + k]);
      double const moved = std::abs(gj["w"].data()[k * 8 + j] - g0["w"].data()[k * 8 + j]);
      EXPECT_LE(moved, bound * (1 + 1e-6) + 1e-300) << "dw " << k << " " << j;
      largest = std::max(largest, moved / bound);
    }
  EXPECT_GT(largest, 0.2); // the moves are the size of the roundings, not nothing
  // The forward's values move as well: y = exp(x w) as its reader, the store, saw it. exp read
  // the product moved (by at most z expm1(e)), and the store reads y moved by up to its error
  // (that move and u |y|, drawn again). The plain run's y is exp of the float64 product.
  tg::owned_tensor<double> y0 = c.y;
  c.run(0);
  for (int i = 0; i < 20; ++i)
    for (int j = 0; j < 8; ++j)
      EXPECT_NEAR(y0.data()[i * 8 + j], c.y.data()[i * 8 + j],
                  z(i, j) * (2 * std::expm1(e(i, j)) + u32) * 1.01);
}

TEST(Jitter, HalfTheScaleMovesTheGradientsHalfAsFar) {
  // The draws depend on the seed and the program only: a smaller scale moves every value read by
  // that fraction of the same amount, and a gradient that depends smoothly on them moves by it.
  product_case c;
  auto const g0 = c.run(0);
  auto const g1 = c.run(5);
  auto const g2 = c.run(5, {}, 0.5);
  for (char const* t : {"x", "w"})
    for (std::int64_t i = 0; i < g0[t].numel(); ++i) {
      double const d1 = g1[t].data()[i] - g0[t].data()[i], d2 = g2[t].data()[i] - g0[t].data()[i];
      EXPECT_NEAR(2 * d2, d1, 1e-3 * std::abs(d1) + 1e-13 * std::abs(g0[t].data()[i])) << t << i;
    }
}

TEST(Jitter, TheSameSeedGivesTheSameBitsForAnyThreadsAndExecutor) {
  product_case c;
  auto const ref = c.run(11, {.exec = tg::executor::sequential});
  for (auto exec : {tg::executor::tbb, tg::executor::openmp, tg::executor::sequential})
    for (int threads : {1, 2, 3}) {
      if (!tg::executor_available(exec))
        continue;
      auto const g = c.run(11, {.exec = exec, .num_threads = threads});
      for (char const* t : {"x", "w"})
        for (std::int64_t i = 0; i < ref[t].numel(); ++i)
          ASSERT_EQ(g[t].data()[i], ref[t].data()[i]) << t << " " << i;
    }
  auto const other = c.run(12);
  bool differs = false;
  for (std::int64_t i = 0; i < ref["x"].numel(); ++i)
    differs |= other["x"].data()[i] != ref["x"].data()[i];
  EXPECT_TRUE(differs);
}

TEST(Jitter, ValuesComputedExactlyAreNotMoved) {
  // Loads are exact, and so are selections, signs and maxima of them: the comparison with a row's
  // maximum holds as in the plain run (the maxima take 3 times the adjoint), and the gradients
  // are the same bits.
  tg::owned_tensor<double> x({20, 16}, "x"), y({20, 16}, "y"), dy({20, 16}, "dy");
  test_support::fill(x, 4);
  test_support::fill(dy, 5);
  auto const g0 = tg::vjp(tg::grid(3), exact_ops, tg::in("x", x), tg::out("y", y, dy));
  tg::ad::jitter_scope const jitter({9, u32});
  auto const gj = tg::vjp(tg::grid(3), exact_ops, tg::in("x", x), tg::out("y", y, dy));
  bool nonzero = false;
  for (std::int64_t i = 0; i < g0["x"].numel(); ++i) {
    ASSERT_EQ(gj["x"].data()[i], g0["x"].data()[i]) << i;
    nonzero |= g0["x"].data()[i] != 0;
  }
  EXPECT_TRUE(nonzero);
}

// t = x * w rounds; a and b are |t| (exact: no rounding of their own), each read by its own
// statement; y = t where a == b, else -t (a selection: exact, so its store moves nothing more).
auto const read_twice = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                    tg::tensor<T const> w, tg::tensor<T> y) {
  using F = tg::fp32<T>;
  auto const i = p.program_id(0) * 16 + tg::arange<0, 16>();
  auto const in = i < x.size(0);
  tg::tile<F, 16> const t = tg::load(x + i, in, 0.0) * tg::load(w + i, in, 0.0);
  tg::tile<F, 16> const a = tg::abs(t);
  tg::tile<F, 16> const b = tg::abs(t);
  tg::store(y + i, tg::where(a == b, t, -t), in);
};

TEST(Jitter, WholeMovesAreOneDrawPerValueOfItsOwnRounding) {
  // The first look's kind (jitter_settings::whole): t moves by its whole rounding u |t|, up or
  // down, and both |t| read the same moved t, as a float forward rounds t once: a and b are
  // equal and y = t moved. Drawn per reader (the second look's kind), they differ (y = -t).
  tg::owned_tensor<double> x({37}, "x"), w({37}, "w"), y({37}, "y"), dy({37}, "dy");
  test_support::fill(x, 6);
  test_support::fill(w, 7);
  test_support::fill(dy, 8);
  auto run = [&](bool whole) {
    tg::ad::jitter_scope const jitter({11, u32, 1, whole});
    return tg::vjp(tg::grid(3), read_twice, tg::in("x", x), tg::in("w", w), tg::out("y", y, dy));
  };
  (void)run(true);
  int up = 0, down = 0;
  for (std::int64_t i = 0; i < 37; ++i) {
    double const t = x(i) * w(i), move = y(i) - t;
    // (y = t + the move: a == b.)
    EXPECT_NEAR(std::abs(move), u32 * std::abs(t), 1e-3 * u32 * std::abs(t)) << i;
    up += move > 0;
    down += move < 0;
  }
  EXPECT_GT(up, 5);
  EXPECT_GT(down, 5);
  (void)run(false);
  double apart = 0;
  for (std::int64_t i = 0; i < 37; ++i)
    apart = std::max(apart, std::abs(y(i) - x(i) * w(i)) / (u32 * std::abs(x(i) * w(i))));
  EXPECT_GT(apart, 1.01) << "drawn per reader, a and b should differ";
}

// y = |x w| and z = |x / w|: products and quotients by w, a power of two in even lanes (0.25 to
// 4, a float computation rounds nothing there) and not in odd ones.
auto const scaled = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T const> w,
                                tg::tensor<T> y, tg::tensor<T> z) {
  using F = tg::fp32<T>;
  auto const i = p.program_id(0) * 16 + tg::arange<0, 16>();
  auto const in = i < x.size(0);
  tg::tile<F, 16> const xv = tg::load(x + i, in, 0.0);
  tg::tile<F, 16> const wv = tg::load(w + i, in, 1.0);
  tg::tile<F, 16> const t = xv * wv;
  tg::tile<F, 16> const q = xv / wv;
  tg::store(y + i, tg::abs(t), in);
  tg::store(z + i, tg::abs(q), in);
};

TEST(Jitter, ProductsAndQuotientsByPowersOfTwoAreExact) {
  // A scale of 0.5 or a division by 4 rounds nothing in float: such lanes must not move (a softmax
  // of logits near 1e5 scaled by 0.5 otherwise tolerates a wrong dx of 3e-4), the others move by
  // their whole rounding.
  tg::owned_tensor<double> x({37}, "x"), w({37}, "w"), y({37}, "y"), z({37}, "z");
  tg::owned_tensor<double> dy({37}, "dy"), dz({37}, "dz");
  test_support::fill(x, 12);
  test_support::fill(dy, 13);
  test_support::fill(dz, 14);
  for (std::int64_t i = 0; i < 37; ++i)
    w(i) = i % 2 == 0 ? std::ldexp(i % 4 == 0 ? 1.0 : -1.0, int(i % 5) - 2) : 0.3 + 0.01 * i;
  tg::ad::jitter_scope const jitter({15, u32, 1, true});
  (void)tg::vjp(tg::grid(3), scaled, tg::in("x", x), tg::in("w", w), tg::out("y", y, dy),
                tg::out("z", z, dz));
  for (std::int64_t i = 0; i < 37; ++i) {
    double const t = std::abs(x(i) * w(i)), q = std::abs(x(i) / w(i));
    if (i % 2 == 0) {
      EXPECT_EQ(y(i), t) << i;
      EXPECT_EQ(z(i), q) << i;
    } else {
      EXPECT_NEAR(std::abs(y(i) - t), u32 * t, 1e-3 * u32 * t) << i;
      EXPECT_NEAR(std::abs(z(i) - q), u32 * q, 1e-3 * u32 * q) << i;
    }
  }
}

// acc = 1.1 acc + x[:, j] for each column j, then y = |acc|: a carried value that rounds at every
// step, walked by tg::loop (Loop) or by a plain loop.
template <bool Loop>
constexpr auto carried_sum = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                         tg::tensor<T> y) {
  using F = tg::fp32<T>;
  auto const r = p.program_id(0) * 16 + tg::arange<0, 16>();
  auto const in = r < x.size(0);
  auto acc = tg::zeros<F, 16>();
  auto const body = [=](int j, auto& a) {
    a = a * 1.1 + tg::load(x + r * x.stride(0) + j, in, 0.0);
  };
  if constexpr (Loop)
    tg::loop(0, int(x.size(1)), 1, acc, body);
  else
    for (int j = 0; j < x.size(1); ++j) body(j, acc);
  tg::store(y + r, tg::abs(acc), in);
};

TEST(Jitter, ACheckpointedLoopCarriesErrorsAndDrawsAsThePlainLoop) {
  // Checkpointed (a record budget of 0), the carried sum keeps its error estimates from one
  // iteration to the next, and a replay in the sweep draws what the forward run drew: y and dx are
  // the plain loop's bits, in both kinds of moves. (Without the estimates the sum moved nowhere.)
  tg::owned_tensor<double> x({37, 9}, "x"), y0({37}, "y"), y1({37}, "y"), dy({37}, "dy");
  test_support::fill(x, 16);
  test_support::fill(dy, 17);
  std::size_t const budget = tg::set_loop_record_budget(0);
  for (bool whole : {true, false}) {
    tg::ad::jitter_scope const jitter({19, u32, 1, whole});
    auto const g0 = tg::vjp(tg::grid(3), carried_sum<false>, tg::in("x", x), tg::out("y", y0, dy));
    auto const g1 = tg::vjp(tg::grid(3), carried_sum<true>, tg::in("x", x), tg::out("y", y1, dy));
    double moved = 0;
    for (std::int64_t i = 0; i < 37; ++i) {
      ASSERT_EQ(y1(i), y0(i)) << i << (whole ? " whole" : " per reader");
      double exact = 0;
      for (int j = 0; j < 9; ++j) exact = exact * 1.1 + x(i, j);
      moved = std::max(moved, std::abs(y1(i) - std::abs(exact)) / (u32 * std::abs(exact)));
    }
    EXPECT_GT(moved, 0.5);
    for (std::int64_t i = 0; i < x.numel(); ++i)
      ASSERT_EQ(g1["x"].data()[i], g0["x"].data()[i]) << i << (whole ? " whole" : " per reader");
  }
  tg::set_loop_record_budget(budget);
}

// Prefix sums of a loaded (20, 37) block: along the rows (y) and from the end of each column (z),
// each stored (a store writes the values as a reader sees them).
constexpr auto prefix_sums = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                         tg::tensor<T> y, tg::tensor<T> z) {
  using F = tg::fp32<T>;
  auto const r = p.program_id(0) * 8 + tg::arange<0, 8>();
  auto const c = tg::arange<0, 37>();
  auto const rin = tg::col(r < x.size(0));
  auto const at = tg::col(r) * x.stride(0) + tg::row(c);
  tg::tile<F, 8, 37> const xv = tg::load(x + at, rin, 0.0);
  tg::tile<F, 8, 37> const cy = tg::cumsum<1>(xv);
  tg::tile<F, 8, 37> const cz = tg::cumsum<0, true>(xv);
  tg::store(y + at, cy, rin);
  tg::store(z + at, cz, rin);
};

TEST(Jitter, APrefixSumCarriesTheRoundingsOfItsPartialSums) {
  // A float prefix sum rounds each partial sum y_k by up to u |y_k|, and every later sum carries
  // those roundings. Whole moves: y_i moves by u sum_{k <= i} |y_k| (exactly), one way per line,
  // both ways over the lines; half the scale, half the move. Drawn per reader: each value moves
  // by at most u sum_{k <= i} |y_k|, and does move. (Before, a prefix sum moved nothing, and
  // a check of a kernel that sums 500 positive terms in sequence raised k to 5e7.)
  tg::owned_tensor<double> x({20, 37}, "x"), y({20, 37}, "y"), z({20, 37}, "z");
  tg::owned_tensor<double> dy({20, 37}, "dy"), dz({20, 37}, "dz");
  test_support::fill(x, 20);
  test_support::fill(dy, 21);
  test_support::fill(dz, 22);
  for (std::int64_t i = 0; i < x.numel(); ++i) // (a few lines of one sign: partial sums grow)
    if (i % 74 < 37)
      x.data()[i] = std::abs(x.data()[i]);
  auto run = [&](bool whole, double scale) {
    tg::ad::jitter_scope const jitter({23, u32, scale, whole});
    (void)tg::vjp(tg::grid(3), prefix_sums, tg::in("x", x), tg::out("y", y, dy),
                  tg::out("z", z, dz));
  };
  for (double scale : {1.0, 0.5}) {
    run(true, scale);
    int up = 0, down = 0;
    for (std::int64_t i = 0; i < 20; ++i) {
      double exact = 0, walk = 0;
      int sign = 0;
      for (std::int64_t j = 0; j < 37; ++j) {
        exact += x(i, j);
        walk += scale * u32 * std::abs(exact);
        double const move = y(i, j) - exact;
        EXPECT_NEAR(std::abs(move), walk, 1e-6 * walk) << i << ", " << j;
        int const s = move > 0 ? 1 : -1;
        if (j == 0)
          sign = s;
        EXPECT_EQ(s, sign) << i << ", " << j << ": one way along a line";
      }
      up += sign > 0;
      down += sign < 0;
    }
    EXPECT_GT(up, 2);
    EXPECT_GT(down, 2);
  }
  run(false, 1);
  double moved = 0;
  for (std::int64_t j = 0; j < 37; ++j) {
    double exact = 0, walk = 0;
    for (std::int64_t i = 19; i >= 0; --i) { // (from the end of each program's 8 rows)
      if (i % 8 == 7 || i == 19)
        exact = walk = 0;
      exact += x(i, j);
      walk += std::abs(exact);
      double const size = u32 * walk, move = std::abs(z(i, j) - exact);
      EXPECT_LE(move, size * (1 + 1e-6) + 1e-300) << i << ", " << j;
      moved = std::max(moved, move / size);
    }
  }
  EXPECT_GT(moved, 0.5);
}

// t = x * w, stored into s and read back (through pointers or a block), then y = |reload|.
template <bool Block>
constexpr auto stored_and_reloaded = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                                 tg::tensor<T const> w, tg::tensor<T> s,
                                                 tg::tensor<T> y) {
  using F = tg::fp32<T>;
  auto const i = p.program_id(0) * 16 + tg::arange<0, 16>();
  auto const in = i < x.size(0);
  tg::tile<F, 16> const t = tg::load(x + i, in, 0.0) * tg::load(w + i, in, 0.0);
  if constexpr (Block) {
    auto const bp = tg::make_block_ptr<16>(s, {p.program_id(0) * 16});
    tg::store(bp, t, tg::bounds<0>);
    tg::store(y + i, tg::abs(tg::load(bp, tg::bounds<0>)), in);
  } else {
    tg::store(s + i, t, in);
    tg::store(y + i, tg::abs(tg::load(s + i, in, 0.0)), in);
  }
};

TEST(Jitter, AValueStoredAndReloadedMovesAsWhereItIsRead) {
  // A reload carries no error estimate: the store writes the values as a reader sees them, so the
  // reload reads t moved by its whole rounding u |t| (whole moves), or by at most that (drawn per
  // reader). Before, t went through memory unmoved, and a check of sin(t) reloaded let a dx 10 %
  // off pass (tests/check/test_checker_edges.cpp).
  tg::owned_tensor<double> x({37}, "x"), w({37}, "w"), s({37}, "s"), y({37}, "y"), dy({37}, "dy");
  test_support::fill(x, 24);
  test_support::fill(w, 25);
  test_support::fill(dy, 26);
  auto check = [&](auto kernel, char const* how) {
    for (bool whole : {true, false}) {
      tg::ad::jitter_scope const jitter({27, u32, 1, whole});
      (void)tg::vjp(tg::grid(3), kernel, tg::in("x", x), tg::in("w", w), s.view(),
                    tg::out("y", y, dy));
      double moved = 0;
      for (std::int64_t i = 0; i < 37; ++i) {
        double const t = std::abs(x(i) * w(i)), move = std::abs(y(i) - t);
        if (whole)
          EXPECT_NEAR(move, u32 * t, 1e-3 * u32 * t) << how << ' ' << i;
        else
          EXPECT_LE(move, u32 * t * (1 + 1e-9)) << how << ' ' << i;
        moved = std::max(moved, move / (u32 * t));
      }
      EXPECT_GT(moved, 0.5) << how << (whole ? " whole" : " per reader");
    }
  };
  check(stored_and_reloaded<false>, "pointers");
  check(stored_and_reloaded<true>, "block");
}

// The bit tests the jitter and the second look use, against the library functions they replace:
// whether a double is a power of two or zero (frexp), and the spacing of float and double values
// (nextafter) and of bf16 values (ilogb, ldexp), over zeros, subnormals, normals next to powers
// of two, the largest finite values, infinities and NaN, and random bit patterns.
TEST(JitterBits, PowersOfTwoAndSpacingsAgreeWithTheLibrary) {
  auto const by_frexp = [](double x) {
    int e;
    return x == 0 || (std::isfinite(x) && std::frexp(x, &e) == (x < 0 ? -0.5 : 0.5));
  };
  auto const by_nextafter = []<class E>(E x) {
    return static_cast<double>(std::nextafter(x, std::numeric_limits<E>::infinity()) - x);
  };
  std::vector<double> xs{0.0,
                         -0.0,
                         1.0,
                         -1.0,
                         0.5,
                         3.0,
                         0.125,
                         1.0000000000000002,
                         std::numeric_limits<double>::denorm_min(),
                         3 * std::numeric_limits<double>::denorm_min(),
                         std::numeric_limits<double>::min(),
                         std::numeric_limits<double>::min() / 2,
                         std::numeric_limits<double>::max(),
                         std::numeric_limits<double>::infinity(),
                         -std::numeric_limits<double>::infinity(),
                         std::numeric_limits<double>::quiet_NaN(),
                         double(std::numeric_limits<float>::max()),
                         double(std::numeric_limits<float>::denorm_min()),
                         0x1p-1074,
                         0x1p1023,
                         0x1.8p-1060};
  std::mt19937_64 rng(15);
  for (int i = 0; i < 100000; ++i) {
    std::uint64_t b = rng();
    if (i % 4 == 0)
      b &= ~((std::uint64_t{1} << 52) - 1); // a power of two, or infinity / NaN's exponent
    if (i % 4 == 1)
      b &= (std::uint64_t{1} << 63) | ((std::uint64_t{1} << 52) - 1); // subnormal
    if (i % 4 == 2)
      b = std::bit_cast<std::uint64_t>(double(std::bit_cast<float>(static_cast<std::uint32_t>(b))));
    xs.push_back(std::bit_cast<double>(b));
  }
  int powers = 0;
  for (double const x : xs) {
    EXPECT_EQ(tg::ad::power_of_two_or_zero(x), by_frexp(x)) << x;
    powers += by_frexp(x);
    if (std::isnan(x))
      continue;
    double const got = tg::detail::ulp_of<double>(x), want = by_nextafter(std::abs(x));
    EXPECT_TRUE(got == want || (std::isnan(got) && std::isnan(want))) << x;
    if (std::isfinite(x)) { // bf16: 8 significant bits, the smallest normal's spacing below it
      int const e = x != 0 ? std::max(std::ilogb(std::abs(x)), -126) : -126;
      EXPECT_EQ(tg::detail::ulp_of<tg::bf16>(x), std::ldexp(1.0, e - 7)) << x;
    }
    float const f = static_cast<float>(std::abs(x));
    if (double(f) == std::abs(x)) {
      double const gotf = tg::detail::ulp_of<float>(x), wantf = by_nextafter(f);
      EXPECT_TRUE(gotf == wantf || (std::isnan(gotf) && std::isnan(wantf))) << x;
    }
  }
  EXPECT_GT(powers, 20000); // the patterns reach both answers
}

} // namespace test_jitter
