// Kernels written the way Triton users write them, differentiated whole: masks and label tiles
// made inside loops, integer weights updated in place, where() around log, division and an
// overflowing exp, a tile as load's `other`, and item() passed back into tiles. Each gradient is
// checked three ways, none of them a closed form: vjp against central differences of the double
// launch, element by element; vjp against jvp (<J u, w> = <u, J^T w>); and vjp at float against
// vjp at double.
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_user_kernels {

namespace {

namespace tg = tilegrad;
template <class T>
using owned = tg::owned_tensor<T>;

constexpr int B = 16; // block of every kernel below; the sizes do not divide it
constexpr int N = 37;

owned<double> uniform(std::int64_t n, unsigned seed, double lo = -1, double hi = 1) {
  owned<double> t({n}, "t");
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  for (double& v : t)
    v = d(rng);
  return t;
}

owned<float> to_float(owned<double> const& t) {
  owned<float> f({t.numel()}, "f");
  for (std::int64_t i = 0; i < t.numel(); ++i)
    f(i) = static_cast<float>(t(i));
  return f;
}

double dot(owned<double> const& a, owned<double> const& b) {
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    s += a(i) * b(i);
  return s;
}

// A kernel of the form (program, x, z, y): two rank-1 inputs of N elements (z may go unused),
// an output of N elements, one program per block of B.
template <class K>
struct user_kernel {
  K kernel;
  owned<double> x, z;
  std::function<bool(std::int64_t)> smooth_at_x = [](std::int64_t) { return true; };

  owned<double> forward(owned<double> const& xv, owned<double> const& zv) const {
    owned<double> y({N}, "y");
    tg::launch(tg::cdiv(N, B), kernel, xv.cview(), zv.cview(), y.view());
    return y;
  }

  // vjp, jvp, central differences and the float reference, compared.
  void check(unsigned seed) const {
    owned<double> const w = uniform(N, seed + 1, 0.5, 1.5); // non-unit cotangents
    owned<double> const ux = uniform(N, seed + 2), uz = uniform(N, seed + 3);
    owned<double> xx(x), zz(z), y({N}, "y");
    auto g = tg::vjp(tg::cdiv(N, B), kernel, tg::in("x", xx), tg::in("z", zz), tg::out("y", y, w));
    auto const& gx = g["x"];
    auto const& gz = g["z"];
    for (std::int64_t i = 0; i < N; ++i) {
      ASSERT_TRUE(std::isfinite(gx(i))) << "dx(" << i << ") = " << gx(i);
      ASSERT_TRUE(std::isfinite(gz(i))) << "dz(" << i << ") = " << gz(i);
    }

    // Central differences of <w, y>, one element at a time.
    double const h = 1e-6;
    auto fd = [&](owned<double> const& base, bool is_x, std::int64_t i) {
      owned<double> plus(base), minus(base);
      plus(i) += h;
      minus(i) -= h;
      auto const yp = is_x ? forward(plus, z) : forward(x, plus);
      auto const ym = is_x ? forward(minus, z) : forward(x, minus);
      double s = 0;
      for (std::int64_t j = 0; j < N; ++j)
        s += w(j) * (yp(j) - ym(j));
      return s / (2 * h);
    };
    for (std::int64_t i = 0; i < N; ++i) {
      if (smooth_at_x(i)) {
        double const want = fd(x, true, i);
        EXPECT_NEAR(gx(i), want, 1e-6 * (1 + std::abs(want))) << "dx(" << i << ")";
      }
      double const want = fd(z, false, i);
      EXPECT_NEAR(gz(i), want, 1e-6 * (1 + std::abs(want))) << "dz(" << i << ")";
    }

    // Forward mode along (ux, uz) against reverse mode along w.
    owned<double> yt({N}, "y");
    auto const t = tg::jvp(tg::cdiv(N, B), kernel, tg::tangent_in("x", x, ux),
                           tg::tangent_in("z", z, uz), tg::tangent_out("y", yt));
    double const jvp_side = dot(t["y"], w), vjp_side = dot(ux, gx) + dot(uz, gz);
    EXPECT_NEAR(jvp_side, vjp_side, 1e-10 * (1 + std::abs(jvp_side))) << "<J u, w> vs <u, J^T w>";

    // The float instantiation records the same tape with adjoint<float>.
    auto xf = to_float(x), zf = to_float(z), wf = to_float(w);
    owned<float> yf({N}, "y");
    auto gf =
        tg::vjp(tg::cdiv(N, B), kernel, tg::in("x", xf), tg::in("z", zf), tg::out("y", yf, wf));
    for (std::int64_t i = 0; i < N; ++i) {
      EXPECT_NEAR(gf["x"](i), gx(i), 1e-4 * (1 + std::abs(gx(i)))) << "float dx(" << i << ")";
      EXPECT_NEAR(gf["z"](i), gz(i), 1e-4 * (1 + std::abs(gz(i)))) << "float dz(" << i << ")";
    }
  }
};

template <class K>
user_kernel<K> make(K k, unsigned seed) {
  return {k, uniform(N, seed), uniform(N, seed + 100)};
}

// ---- plain tiles inside recorded expressions --------------------------------------------------

// A mask made inside the loop: y = sum over it of where(o <= it, x * z, 0).
auto const mask_in_loop = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                      tg::tensor<T const> z, tg::tensor<T> y) {
  auto const o = p.program_id(0) * B + tg::arange<0, B>();
  auto const in = o < x.size(0);
  tg::tile<tg::fp32<T>, B> const v = tg::load(x + o, in) * tg::load(z + o, in);
  auto const lane = tg::arange<0, B>();
  tg::tile<tg::fp32<T>, B> acc = tg::zeros<tg::fp32<T>, B>();
  for (int it = 0; it < 4; ++it) {
    tg::tile<bool, B> const keep = lane % 4 <= it;
    acc = acc + tg::where(keep, v, 0.0);
  }
  tg::store(y + o, acc, in);
};

// An integer weight tile updated in place inside the loop.
auto const int_weights_in_loop = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                             tg::tensor<T const> z, tg::tensor<T> y) {
  auto const o = p.program_id(0) * B + tg::arange<0, B>();
  auto const in = o < x.size(0);
  auto const v = tg::load(x + o, in);
  tg::tile<int, B> w = tg::arange<0, B>() % 3 + 1;
  tg::tile<tg::fp32<T>, B> acc = tg::load(z + o, in);
  for (int it = 0; it < 3; ++it) {
    acc = acc + v * tg::to<tg::fp32<T>>(w);
    w = w + 1;
  }
  tg::store(y + o, acc, in);
};

// Cross-entropy over rows of four classes, with the labels loaded into an int tile inside the
// loop over row groups and compared with a column arange (the one-hot mask).
constexpr int C = 4;
auto const cross_entropy = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                       tg::tensor<T const> z, tg::tensor<T> y) {
  // x holds N logits read as rows of C (the last row partial); z scales them. Each program
  // handles B logits = B / C rows, two row groups of B / (2 C).
  constexpr int R = B / (2 * C);
  auto const cls = tg::arange<0, C>();
  for (int half = 0; half < 2; ++half) {
    auto const rows = (p.program_id(0) * B + half * (B / 2)) / C + tg::arange<0, R>();
    auto const off = tg::col(rows) * C + tg::row(cls);
    auto const m = off < x.size(0);
    tg::tile<int, R> const labels = rows % C; // as if loaded from a label tensor
    auto const logits = tg::load(x + off, m, -INFINITY) + tg::load(z + off, m);
    auto const mx = tg::max<1>(logits);
    auto const lse = mx + tg::log(tg::sum<1>(tg::exp(logits - tg::col(mx))));
    auto const onehot = tg::col(labels) == tg::row(cls);
    auto const picked = tg::sum<1>(tg::where(onehot & m, logits, 0.0));
    // The loss of row r goes to its first logit's slot of y; the other slots get 0.
    auto const loss = tg::where(tg::row(cls) == 0, tg::col(lse - picked), 0.0);
    tg::store(y + off, loss, m);
  }
};

TEST(UserKernels, MaskMadeInsideTheLoop) {
  make(mask_in_loop, 1).check(11);
}
TEST(UserKernels, IntegerWeightsUpdatedInTheLoop) {
  make(int_weights_in_loop, 2).check(12);
}
TEST(UserKernels, CrossEntropyWithLabelTilesMadeInsideTheLoop) {
  make(cross_entropy, 3).check(13);
}

// ---- where() and the branch it did not take ------------------------------------------------

// where(x > 0, log(x), 0) * z, with exact zeros and negative x.
auto const log_where = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                   tg::tensor<T const> z, tg::tensor<T> y) {
  auto const o = p.program_id(0) * B + tg::arange<0, B>();
  auto const in = o < x.size(0);
  auto const v = tg::load(x + o, in);
  tg::store(y + o, tg::where(v > 0, tg::log(v), 0.0) * tg::load(z + o, in), in);
};

// A mean over groups of four lanes whose count may be zero: where(cnt > 0, s / cnt, 0).
auto const group_mean = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                    tg::tensor<T const> z, tg::tensor<T> y) {
  auto const o = p.program_id(0) * B + tg::arange<0, B>();
  auto const in = o < x.size(0);
  auto const v = tg::load(x + o, in);
  auto const keep = v > 0; // lanes that count
  auto const g = tg::reshape<B / 4, 4>(tg::where(keep, v, 0.0) * tg::load(z + o, in));
  auto const cnt = tg::sum<1>(tg::reshape<B / 4, 4>(tg::to<tg::fp32<T>>(keep)));
  auto const s = tg::sum<1>(g);
  tg::tile<tg::fp32<T>, B / 4> const mean = tg::where(cnt > 0, s / cnt, 0.0);
  tg::store(y + o, tg::reshape<B>(tg::broadcast_to<B / 4, 4>(tg::col(mean))), in);
};

// Entropy terms p log p, masked where p is 0, and an exp that overflows in the untaken branch.
auto const entropy_and_exp = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                         tg::tensor<T const> z, tg::tensor<T> y) {
  auto const o = p.program_id(0) * B + tg::arange<0, B>();
  auto const in = o < x.size(0);
  auto const v = tg::load(x + o, in);
  auto const q = tg::load(z + o, in);
  tg::tile<tg::fp32<T>, B> const plogp = tg::where(v > 0, v * tg::log(v), 0.0);
  tg::tile<tg::fp32<T>, B> const big = tg::exp(q * 1000.0); // inf where q > 0.71 in double
  tg::store(y + o, plogp + tg::where(q < 0.0, big, q), in);
};

TEST(UserKernels, WhereAroundLogAtZeroHasAFiniteGradient) {
  auto k = make(log_where, 4);
  for (std::int64_t i = 0; i < N; i += 3)
    k.x(i) = i % 2 ? 0.0 : -k.x(i) * k.x(i); // exact zeros and negatives
  k.smooth_at_x = [&](std::int64_t i) { return k.x(i) != 0; };
  k.check(14);
}

TEST(UserKernels, WhereAroundADivisionByAnEmptyCount) {
  auto k = make(group_mean, 5);
  for (std::int64_t i = 0; i < 8; ++i)
    k.x(i) = -1 - 0.1 * i; // the first two groups count nothing
  k.smooth_at_x = [&](std::int64_t i) { return k.x(i) != 0; };
  k.check(15);
}

TEST(UserKernels, WhereAroundPLogPAndAnOverflowingExp) {
  auto k = make(entropy_and_exp, 6);
  for (std::int64_t i = 0; i < N; i += 4)
    k.x(i) = 0; // p = 0: p log p is 0 * -inf in the untaken branch
  k.smooth_at_x = [&](std::int64_t i) { return k.x(i) != 0; };
  k.check(16);
}

// ---- a tile as load's `other` ----------------------------------------------------------------

// Lanes past the end of x read their value from exp(z) instead.
auto const other_tile = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                    tg::tensor<T const> z, tg::tensor<T> y) {
  auto const o = p.program_id(0) * B + tg::arange<0, B>();
  auto const in = o < z.size(0);
  tg::tile<tg::fp32<T>, B> const fallback = tg::exp(tg::load(z + o, in));
  auto const v = tg::load(x + o, (o % 3 != 0) & in, fallback);
  tg::store(y + o, v * v, in);
};

TEST(UserKernels, ATileAsOtherReceivesTheMaskedOffLanesGradient) {
  make(other_tile, 7).check(17);
}

// ---- item() passed back into tiles ------------------------------------------------------------

auto const item_back_into_tiles = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                              tg::tensor<T const> z, tg::tensor<T> y) {
  auto const o = p.program_id(0) * B + tg::arange<0, B>();
  auto const in = o < x.size(0);
  auto const v = tg::load(x + o, in);
  auto const s = tg::sum(v * v).item();     // a number of the kernel's mode
  auto const t = s * s - tg::max(v).item(); // arithmetic on numbers keeps the derivative
  tg::tile<tg::fp32<T>, B> const a = tg::full<tg::fp32<T>, B>(s);
  tg::tile<tg::fp32<T>, B> const b(t);
  auto const q = tg::load(z + o, in);
  if (s > 0.5) // data-dependent control flow on the number
    tg::store(y + o, a * q + b * v + s, in);
  else
    tg::store(y + o, q - t, in);
};

TEST(UserKernels, ItemPassedBackIntoTilesKeepsItsDerivative) {
  make(item_back_into_tiles, 8).check(18);
}

// Triton's tl.where(c, s, 0.0) and tl.where(c, s, t) with numbers s and t of the kernel's mode:
// in every mode (reverse mode did not compile), each branch's derivative flowing back to it.
auto const items_as_branches = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                           tg::tensor<T const> z, tg::tensor<T> y) {
  auto const o = p.program_id(0) * B + tg::arange<0, B>();
  auto const in = o < x.size(0);
  auto const v = tg::load(x + o, in);
  auto const q = tg::load(z + o, in);
  auto const s = tg::max(tg::where(in, v, -1e30f)).item();
  auto const t = tg::sum(v * q).item();
  tg::tile<tg::fp32<T>, B> const a = tg::where(q > 0, s, 0.0f);
  tg::tile<tg::fp32<T>, B> const b = tg::where(v > q, s, t);
  tg::store(y + o, a * v + b, in);
};

TEST(UserKernels, ItemsAsTheBranchesOfWhereKeepTheirDerivatives) {
  make(items_as_branches, 9).check(19);
}

// A tile made from a number, `tile<fp32<T>, B> acc(0.0f)`: it compiled on the fast path and in
// forward mode, not in reverse mode (the adjoint tile took only an adjoint number).
auto const tiles_from_numbers = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                            tg::tensor<T const> z, tg::tensor<T> y) {
  auto const o = p.program_id(0) * B + tg::arange<0, B>();
  auto const in = o < x.size(0);
  tg::tile<tg::fp32<T>, B> acc(0.0f);
  tg::tile<tg::fp32<T>, B> const c(1.5), d(2);
  acc += tg::load(x + o, in) * c;
  tg::store(y + o, acc * tg::load(z + o, in) + d, in);
};

TEST(UserKernels, TilesMadeFromNumbersInEveryMode) {
  make(tiles_from_numbers, 10).check(20);
}

// where with a bool number for its condition (tl.where broadcasts a scalar condition): a branch
// per program, and one per step of a loop, in every mode.
auto const scalar_conditions = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                           tg::tensor<T const> z, tg::tensor<T> y) {
  auto const o = p.program_id(0) * B + tg::arange<0, B>();
  auto const in = o < x.size(0);
  tg::tile<tg::fp32<T>, B> const v = tg::load(x + o, in);
  tg::tile<tg::fp32<T>, B> const q = tg::load(z + o, in);
  tg::tile<tg::fp32<T>, B> acc = tg::where(p.program_id(0) == 1, v * q, v + q);
  for (int k = 0; k < 3; ++k)
    acc = tg::where(k % 2 == 0, acc * v, 0.5f) + tg::where(k == 2, 1.0f, q);
  tg::store(y + o, acc, in);
};

TEST(UserKernels, WhereTakesABoolNumberForItsCondition) {
  make(scalar_conditions, 11).check(21);
  // The values against a plain loop (the check above compares derivatives only).
  owned<double> const x = uniform(N, 12), z = uniform(N, 13);
  owned<double> y({N}, "y");
  tg::launch(tg::cdiv(N, B), scalar_conditions, x.cview(), z.cview(), y.view());
  owned<float> const xf = to_float(x), zf = to_float(z);
  owned<float> yf({N}, "y");
  tg::launch(tg::cdiv(N, B), scalar_conditions, xf.cview(), zf.cview(), yf.view());
  for (std::int64_t i = 0; i < N; ++i) {
    double const v = x(i), q = z(i);
    double acc = i / B == 1 ? v * q : v + q;
    for (int k = 0; k < 3; ++k)
      acc = (k % 2 == 0 ? acc * v : 0.5) + (k == 2 ? 1.0 : q);
    EXPECT_NEAR(y(i), acc, 1e-12) << i;
    EXPECT_NEAR(yf(i), acc, 1e-5) << i;
  }
}

} // namespace

// ---- a float64 reference of a float launch --------------------------------------------------

// y = sigmoid(s * x) * z, with the scale passed as a number of the kernel's own float type.
auto const scaled = []<class T, class S>(tg::program const& p, tg::tensor<T const> x,
                                         tg::tensor<T const> z, tg::tensor<T> y, S s) {
  auto const o = p.program_id(0) * B + tg::arange<0, B>();
  auto const in = o < x.size(0);
  tg::tile<tg::fp32<T>, B> const v = tg::sigmoid(tg::load(x + o, in) * s) * tg::load(z + o, in);
  tg::store(y + o, v, in);
};

TEST(UserKernels, VjpAsDoubleOfAFloatLaunchIsTheDoubleLaunchsVjp) {
  owned<double> const xd = uniform(N, 7), zd = uniform(N, 8), wd = uniform(N, 9, 0.5, 1.5);
  owned<float> const x = to_float(xd), z = to_float(zd), w = to_float(wd);
  owned<float> y({N}, "y");
  float const s = 1.0f / std::sqrt(3.0f);
  auto const g = tg::vjp_as<double>(tg::cdiv(N, B), scaled, tg::in("x", x), tg::in("z", z),
                                    tg::out("y", y, w), s);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(g["x"])>, owned<double>>);

  // By hand: double copies of every tensor, and the number as a double.
  owned<double> xc({N}, "x"), zc({N}, "z"), wc({N}, "w"), yc({N}, "y");
  for (std::int64_t i = 0; i < N; ++i) {
    xc(i) = x(i);
    zc(i) = z(i);
    wc(i) = w(i);
  }
  auto const want = tg::vjp(tg::cdiv(N, B), scaled, tg::in("x", xc), tg::in("z", zc),
                            tg::out("y", yc, wc), double(s));
  for (std::int64_t i = 0; i < N; ++i) {
    EXPECT_EQ(g["x"](i), want["x"](i)) << i; // the same double computation, bit for bit
    EXPECT_EQ(g["z"](i), want["z"](i)) << i;
    EXPECT_EQ(y(i), static_cast<float>(yc(i))) << i; // the output, rounded back
    EXPECT_EQ(x(i), static_cast<float>(xd(i)));      // inputs untouched
  }
  // The float vjp differs from it by float rounding only.
  owned<float> yf({N}, "y");
  auto const gf =
      tg::vjp(tg::cdiv(N, B), scaled, tg::in("x", x), tg::in("z", z), tg::out("y", yf, w), s);
  bool differs = false;
  for (std::int64_t i = 0; i < N; ++i) {
    EXPECT_NEAR(gf["x"](i), g["x"](i), 1e-6 * (1 + std::abs(g["x"](i))));
    differs |= double(gf["x"](i)) != g["x"](i);
  }
  EXPECT_TRUE(differs) << "the double reference should not be the float one widened";
}

} // namespace test_user_kernels
