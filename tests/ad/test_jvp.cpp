// jvp of whole kernels: the example kernels against central differences of their double
// launch, the dot-product test <J u, w> = <u, J^T w> against vjp, the memory semantics (masks,
// `other`, block-pointer padding, atomics) on shapes that do not divide the tiles, argument
// handling (passive, integer, inout and strided tensors) and the errors for bad input.
#include <tilegrad/kernels/matmul.hpp>
#include <tilegrad/kernels/softmax.hpp>
#include <tilegrad/kernels/weighted_sum.hpp>
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include "../support/tensors.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_jvp {

namespace {

namespace tg = tilegrad;
using test_support::fill;
template <class T>
using owned = tg::owned_tensor<T>;

// x + h * u, element by element.
owned<double> moved(owned<double> const& x, double h, owned<double> const& u) {
  owned<double> r(x);
  for (std::int64_t i = 0; i < r.numel(); ++i)
    r.data()[i] += h * u.data()[i];
  return r;
}

double inner(owned<double> const& a, owned<double> const& b) {
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    s += a.data()[i] * b.data()[i];
  return s;
}
double abs_inner(owned<double> const& a, owned<double> const& b) {
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    s += std::abs(a.data()[i] * b.data()[i]);
  return s;
}

owned<double> random_like(owned<double> const& t, unsigned seed) {
  owned<double> r(t.view().shape().data(), static_cast<std::size_t>(t.rank()));
  fill(r, seed);
  return r;
}

// The three example kernels with their launch, for non-dividing shapes: each case names its
// inputs and its output so the checks below run over all of them alike.
struct example {
  char const* name;
  std::vector<owned<double>> inputs; // in kernel argument order, the output last
  owned<double> output;
};

std::vector<example> examples(unsigned seed) {
  std::vector<example> e;
  auto make = [&](char const* name, std::vector<std::vector<std::int64_t>> in,
                  std::vector<std::int64_t> out) {
    example x{name, {}, owned<double>(out.data(), out.size(), "y")};
    for (auto& s : in) {
      x.inputs.emplace_back(s.data(), s.size());
      fill(x.inputs.back(), seed++);
    }
    e.push_back(std::move(x));
  };
  make("weighted_sum", {{37, 70}, {70}}, {37});
  make("softmax", {{9, 37}}, {9, 37});
  make("matmul", {{33, 17}, {17, 45}}, {33, 45});
  return e;
}

template <int Inputs>
using arity = std::integral_constant<int, Inputs>;

// Runs `f(grid, kernel, arity<inputs>)` with the kernel of example `name`.
template <class F>
auto with_kernel(std::string const& name, F&& f) {
  if (name == "weighted_sum")
    return f(tg::grid(tg::cdiv(37, 16)), tg::kernels::weighted_sum_fwd<16, 32>, arity<2>{});
  if (name == "softmax")
    return f(tg::grid(9), tg::kernels::softmax_fwd<64>, arity<1>{});
  return f(tg::grid(tg::cdiv(33, 16) * tg::cdiv(45, 16)), tg::kernels::matmul_fwd<16, 16, 8, 2>,
           arity<2>{});
}

// The kernel's arguments: its inputs as tangent_in with three directions each, its output.
template <class Kernel, int Inputs>
tg::tangents<double> jvp_of(tg::grid g, Kernel const& k, arity<Inputs>, example& e,
                            std::vector<std::array<owned<double>, 3>> const& u) {
  auto in = [&](std::size_t a) {
    return tg::tangent_in(a == 0 ? "x0" : "x1", e.inputs[a], u[a][0], u[a][1], u[a][2]);
  };
  if constexpr (Inputs == 1)
    return tg::jvp(g, k, in(0), tg::tangent_out("y", e.output));
  else
    return tg::jvp(g, k, in(0), in(1), tg::tangent_out("y", e.output));
}

template <class Kernel, int Inputs>
void launch_double(tg::grid g, Kernel const& k, arity<Inputs>, std::vector<owned<double>> const& in,
                   owned<double>& out) {
  if constexpr (Inputs == 1)
    tg::launch(g, k, in[0].cview(), out.view());
  else
    tg::launch(g, k, in[0].cview(), in[1].cview(), out.view());
}

std::vector<std::array<owned<double>, 3>> directions(example const& e, unsigned seed) {
  std::vector<std::array<owned<double>, 3>> u;
  for (auto const& x : e.inputs)
    u.push_back({random_like(x, seed++), random_like(x, seed++), random_like(x, seed++)});
  return u;
}

TEST(JvpExamples, ForwardValuesAndTangentsMatchCentralDifferences) {
  for (auto& e : examples(100)) {
    auto const u = directions(e, 200);
    auto const r = with_kernel(
        e.name, [&](tg::grid g, auto const& k, auto n) { return jvp_of(g, k, n, e, u); });
    // The forward values went to the output: those of a plain double launch.
    owned<double> plain(e.output);
    with_kernel(e.name, [&](tg::grid g, auto const& k, auto n) {
      launch_double(g, k, n, e.inputs, plain);
      return 0;
    });
    for (std::int64_t i = 0; i < plain.numel(); ++i)
      ASSERT_NEAR(e.output.data()[i], plain.data()[i], 1e-13 * (1 + std::abs(plain.data()[i])))
          << e.name << " value " << i;
    constexpr double h = 1e-5;
    for (int k = 0; k < 3; ++k) {
      std::vector<owned<double>> up, down;
      for (std::size_t a = 0; a < e.inputs.size(); ++a) {
        up.push_back(moved(e.inputs[a], h, u[a][k]));
        down.push_back(moved(e.inputs[a], -h, u[a][k]));
      }
      owned<double> yu(e.output), yd(e.output);
      with_kernel(e.name, [&](tg::grid g, auto const& kern, auto n) {
        launch_double(g, kern, n, up, yu);
        launch_double(g, kern, n, down, yd);
        return 0;
      });
      auto const& t = r.tangent("y", k);
      ASSERT_EQ(t.numel(), e.output.numel());
      for (std::int64_t i = 0; i < t.numel(); ++i) {
        double const fd = (yu.data()[i] - yd.data()[i]) / (2 * h);
        ASSERT_NEAR(t.data()[i], fd, 1e-7 * (1 + std::abs(fd)))
            << e.name << " direction " << k << " element " << i;
      }
    }
  }
}

// <J u, w> = <u, J^T w>: forward mode against reverse mode, both exact up to round-off.
TEST(JvpExamples, DotProductTestAgainstVjp) {
  for (unsigned draw = 0; draw < 3; ++draw) {
    for (auto& e : examples(300 + 10 * draw)) {
      auto const u = directions(e, 400 + 10 * draw);
      auto const ju = with_kernel(
          e.name, [&](tg::grid g, auto const& k, auto n) { return jvp_of(g, k, n, e, u); });
      owned<double> const w = random_like(e.output, 500 + draw);
      owned<double> y2(e.output);
      auto const jtw = with_kernel(e.name, [&](tg::grid g, auto const& k, auto n) {
        if constexpr (n == 1)
          return tg::vjp(g, k, tg::in("x0", e.inputs[0]), tg::out("y", y2, w));
        else
          return tg::vjp(g, k, tg::in("x0", e.inputs[0]), tg::in("x1", e.inputs[1]),
                         tg::out("y", y2, w));
      });
      for (int k = 0; k < 3; ++k) {
        double const lhs = inner(ju.tangent("y", k), w);
        double rhs = 0, scale = abs_inner(ju.tangent("y", k), w);
        for (std::size_t a = 0; a < e.inputs.size(); ++a) {
          auto const& g = jtw[std::string("x").append(std::to_string(a))];
          rhs += inner(u[a][k], g);
          scale += abs_inner(u[a][k], g);
        }
        EXPECT_NEAR(lhs, rhs, 1e-10 * scale) << e.name << " draw " << draw << " direction " << k
                                             << ": <J u, w> = " << lhs << ", <u, J^T w> = " << rhs;
        EXPECT_GT(std::abs(lhs), 1e-3 * scale) << e.name << ": a degenerate test";
      }
    }
  }
}

TEST(JvpExamples, FloatDualsTrackTheDoubleTangents) {
  int const n = 37, d = 70;
  owned<float> x({n, d}), w({d}), y({n}), ux({n, d}), uw({d});
  fill(x, 1), fill(w, 2), fill(ux, 3), fill(uw, 4);
  auto const r =
      tg::jvp(tg::cdiv(n, 16), tg::kernels::weighted_sum_fwd<16, 32>, tg::tangent_in("x", x, ux),
              tg::tangent_in("w", w, uw), tg::tangent_out("y", y));
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(r["y"])>, owned<float>>);
  for (int i = 0; i < n; ++i) {
    double t = 0;
    for (int j = 0; j < d; ++j)
      t += double(ux(i, j)) * w(j) + double(x(i, j)) * uw(j);
    ASSERT_NEAR(r["y"](i), t, 1e-4) << i;
  }
}

TEST(JvpArguments, UnmarkedFloatTensorsArePassive) {
  int const n = 21, d = 40;
  owned<double> x({n, d}), w({d}), y({n}), ux({n, d});
  fill(x, 5), fill(w, 6), fill(ux, 7);
  auto const r = tg::jvp(tg::cdiv(n, 16), tg::kernels::weighted_sum_fwd<16, 32>,
                         tg::tangent_in("x", x, ux), w.cview(), tg::tangent_out("y", y));
  for (int i = 0; i < n; ++i) {
    double t = 0, v = 0;
    for (int j = 0; j < d; ++j)
      t += ux(i, j) * w(j), v += x(i, j) * w(j);
    ASSERT_NEAR(r["y"](i), t, 1e-12) << i;
    ASSERT_NEAR(y(i), v, 1e-12) << i;
  }
  EXPECT_FALSE(r.contains("x"));
  EXPECT_TRUE(r.contains("y"));
}

// A gather through an integer index tensor, scaled by a number: both pass through unchanged.
constexpr auto gather = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                    tg::tensor<std::int32_t const> idx, double scale,
                                    tg::tensor<T> y) {
  auto const offs = p.program_id(0) * 8 + tg::arange<0, 8>();
  auto const mask = offs < y.size(0);
  auto const i = tg::load(idx + offs, mask);
  tg::store(y + offs, tg::load(x + i, mask) * scale, mask);
};

TEST(JvpArguments, IntegerTensorsAndNumbersPassThrough) {
  int const n = 19, m = 11;
  owned<double> x({m}), y({n}), u({m});
  owned<std::int32_t> idx({n});
  fill(x, 8), fill(u, 9);
  for (int i = 0; i < n; ++i)
    idx(i) = (i * 7) % m;
  auto const r = tg::jvp(tg::cdiv(n, 8), gather, tg::tangent_in("x", x, u), idx.cview(), 2.5,
                         tg::tangent_out("y", y));
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(y(i), x(idx(i)) * 2.5) << i;
    ASSERT_EQ(r["y"](i), u(idx(i)) * 2.5) << i;
  }
}

// y <- y * x + 1 in place.
constexpr auto scale_in_place = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                            tg::tensor<T> y) {
  auto const offs = p.program_id(0) * 16 + tg::arange<0, 16>();
  auto const mask = offs < y.size(0);
  auto const yp = y + offs;
  tg::store(yp, tg::load(yp, mask) * tg::load(x + offs, mask) + 1, mask);
};

TEST(JvpArguments, InoutTensorStartsAlongItsTangent) {
  int const n = 45;
  owned<double> x({n}), y({n}), ux({n}), uy({n}), vx({n}), vy({n});
  fill(x, 10), fill(y, 11), fill(ux, 12), fill(uy, 13), fill(vx, 14), fill(vy, 15);
  owned<double> const y0(y);
  auto const r = tg::jvp(tg::cdiv(n, 16), scale_in_place, tg::tangent_in("x", x, ux, vx),
                         tg::tangent_inout("y", y, uy, vy));
  for (int i = 0; i < n; ++i) {
    ASSERT_DOUBLE_EQ(y(i), y0(i) * x(i) + 1) << i;
    ASSERT_NEAR(r["y"](i), uy(i) * x(i) + y0(i) * ux(i), 1e-14) << i;
    ASSERT_NEAR(r.tangent("y", 1)(i), vy(i) * x(i) + y0(i) * vx(i), 1e-14) << i;
  }
}

// y[i, j] = 2 * x[i, j] over a strided view: the dual copy keeps the view's layout.
constexpr auto double_2d = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                       tg::tensor<T> y) {
  auto const r = p.program_id(0);
  auto const c = tg::arange<0, 16>();
  auto const mask = c < x.size(1);
  tg::store(y + r * y.stride(0) + c * y.stride(1),
            tg::load(x + r * x.stride(0) + c * x.stride(1), mask) * 2, mask);
};

TEST(JvpArguments, StridedViews) {
  int const n = 6, m = 13;
  owned<double> buf({m, n}), ubuf({m, n}), y({n, m});
  fill(buf, 16), fill(ubuf, 17);
  // x is the transpose of buf, u a plain contiguous tensor of x's shape.
  tg::tensor<double const> const xt(buf.data(), {n, m}, {1, n}, "x");
  owned<double> u({n, m});
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < m; ++j)
      u(i, j) = ubuf(j, i);
  auto const r = tg::jvp(n, double_2d, tg::tangent_in("x", xt, u), tg::tangent_out("y", y));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < m; ++j) {
      ASSERT_EQ(y(i, j), 2 * buf(j, i)) << i << ", " << j;
      ASSERT_EQ(r["y"](i, j), 2 * ubuf(j, i)) << i << ", " << j;
    }
}

// ---------------------------------------------------------------------------------------------
// Memory semantics
// ---------------------------------------------------------------------------------------------

// Lanes past n read `other` = 2.5 (zero tangent); the store reaches 5 elements past n.
constexpr auto masked_square = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                           tg::tensor<T> y) {
  auto const offs = p.program_id(0) * 16 + tg::arange<0, 16>();
  auto const v = tg::load(x + offs, offs < x.size(0), 2.5);
  tg::store(y + offs, v * v + 1, offs < y.size(0));
};

TEST(JvpMemory, MaskedLanesAndOtherHaveZeroTangent) {
  int const n = 37;
  owned<double> x({n}), u({n}), y({n + 5});
  fill(x, 18), fill(u, 19);
  for (auto& v : y)
    v = -7;
  auto const r = tg::jvp(tg::cdiv(n + 5, 16), masked_square, tg::tangent_in("x", x, u),
                         tg::tangent_out("y", y));
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(y(i), x(i) * x(i) + 1) << i;
    ASSERT_EQ(r["y"](i), 2 * x(i) * u(i)) << i;
  }
  for (int i = n; i < n + 5; ++i) {
    ASSERT_EQ(y(i), 2.5 * 2.5 + 1) << i;
    ASSERT_EQ(r["y"](i), 0) << i;
  }
}

// Rows of 64 lanes over a 5 x 37 tensor, read contiguously (runs of 16 lanes that the mask turns
// on whole are copied as runs, the rest lane by lane) and every other element (no runs), masked
// by row and column: y = x * x[:, ::2 of the row's first 19] + 3, with `other` 0.5.
constexpr auto rows_and_strides = []<class T>(tg::program const&, tg::tensor<T const> x,
                                              tg::tensor<T> y) {
  auto const r = tg::arange<0, 8>();
  auto const c = tg::arange<0, 64>();
  auto const m = tg::col(r < x.size(0)) & tg::row(c < x.size(1));
  auto const at = tg::col(r) * x.stride(0) + tg::row(c);
  auto const v = tg::load(x + at, m, 0.5);
  auto const half = tg::col(r < x.size(0)) & tg::row(c < (x.size(1) + 1) / 2);
  auto const w = tg::load(x + tg::col(r) * x.stride(0) + tg::row(c * 2), half, 0.5);
  tg::store(y + tg::col(r) * y.stride(0) + tg::row(c), v * w + 3, m);
};

TEST(JvpMemory, RowsReadAsRunsAndLaneByLaneAgreeWithAPlainLoop) {
  owned<double> x({5, 37}), u({5, 37}), y({5, 37});
  fill(x, 31), fill(u, 32);
  auto const r = tg::jvp(1, rows_and_strides, tg::tangent_in("x", x, u), tg::tangent_out("y", y));
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 37; ++j) {
      bool const in = j < 19;
      double const w = in ? x(i, 2 * j) : 0.5, dw = in ? u(i, 2 * j) : 0.0;
      ASSERT_EQ(y(i, j), x(i, j) * w + 3) << i << ", " << j;
      ASSERT_NEAR(r["y"](i, j), u(i, j) * w + x(i, j) * dw, 1e-15) << i << ", " << j;
    }
}

// 4 x 4 blocks of a 5 x 7 tensor, padded past its edges, stored whole into 8 x 8 outputs: the
// block itself, and exp(b) + b.
template <tg::padding Pad>
constexpr auto padded_blocks =
    []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> raw, tg::tensor<T> y) {
      std::int64_t const r = p.program_id(0) * 4, c = p.program_id(1) * 4;
      auto const b = tg::load(tg::make_block_ptr<4, 4>(x, {r, c}), tg::bounds<0, 1>, Pad);
      tg::store(tg::make_block_ptr<4, 4>(raw, {r, c}), b);
      tg::store(tg::make_block_ptr<4, 4>(y, {r, c}), exp(b) + b);
    };

TEST(JvpMemory, BlockPointerPaddingHasZeroTangent) {
  owned<double> x({5, 7}), u({5, 7}), v({5, 7});
  fill(x, 20), fill(u, 21), fill(v, 22);
  for (auto pad : {tg::padding::zero, tg::padding::nan, tg::padding::neg_inf}) {
    owned<double> raw({8, 8}), y({8, 8});
    auto run = [&](auto const& kernel) {
      return tg::jvp(tg::grid(2, 2), kernel, tg::tangent_in("x", x, u, v),
                     tg::tangent_out("raw", raw), tg::tangent_out("y", y));
    };
    auto const r = pad == tg::padding::zero  ? run(padded_blocks<tg::padding::zero>)
                   : pad == tg::padding::nan ? run(padded_blocks<tg::padding::nan>)
                                             : run(padded_blocks<tg::padding::neg_inf>);
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 8; ++j) {
        bool const inside = i < 5 && j < 7;
        if (inside) {
          ASSERT_EQ(raw(i, j), x(i, j));
          ASSERT_EQ(r["raw"](i, j), u(i, j));
          ASSERT_EQ(r.tangent("raw", 1)(i, j), v(i, j));
          double const dy = std::exp(x(i, j)) + 1;
          ASSERT_NEAR(y(i, j), std::exp(x(i, j)) + x(i, j), 1e-14);
          ASSERT_NEAR(r["y"](i, j), dy * u(i, j), 1e-14) << i << ", " << j;
          ASSERT_NEAR(r.tangent("y", 1)(i, j), dy * v(i, j), 1e-14) << i << ", " << j;
        } else {
          // The padding: zero, NaN or -inf, with zero tangents.
          if (pad == tg::padding::zero)
            ASSERT_EQ(raw(i, j), 0);
          else if (pad == tg::padding::nan)
            ASSERT_TRUE(std::isnan(raw(i, j)));
          else
            ASSERT_EQ(raw(i, j), -std::numeric_limits<double>::infinity());
          ASSERT_EQ(r["raw"](i, j), 0) << i << ", " << j;
          ASSERT_EQ(r.tangent("raw", 1)(i, j), 0) << i << ", " << j;
          if (pad == tg::padding::zero) { // exp(0) + 0, tangent 0
            ASSERT_EQ(y(i, j), 1);
            ASSERT_EQ(r["y"](i, j), 0);
          }
        }
      }
  }
}

// s = sum(exp(x * w)) over a row of 5 in blocks of 8, the masked lanes -inf (other) times w's
// 1 (other): constants with tangent 0, which must not make the row's tangent NaN. Once through
// pointer tiles, once through block pointers (x padded with -inf, w's padding replaced by 1).
constexpr auto masked_row_products = []<class T>(tg::program const&, tg::tensor<T const> x,
                                                 tg::tensor<T const> w, tg::tensor<T> s) {
  auto const c = tg::arange<0, 8>();
  auto const m = c < x.size(0);
  tg::tile<tg::fp32<T>, 8> const v =
      tg::load(x + c, m, -INFINITY) * tg::load(w + c, m, 1.0f);
  tg::store(s + 0, tg::sum(tg::exp(v)));
  tg::tile<tg::fp32<T>, 8> const vb =
      tg::load(tg::make_block_ptr<8>(x, {0}), tg::bounds<0>, tg::padding::neg_inf) *
      tg::where(m, tg::load(tg::make_block_ptr<8>(w, {0}), tg::bounds<0>), 1.0f);
  tg::store(s + 1, tg::sum(tg::exp(vb)));
};

TEST(JvpMemory, MaskedInfiniteConstantsTimesValuesWithTangents) {
  owned<double> x({5}, "x"), w({5}, "w"), s({2}, "s"), ux({5}), uw({5});
  fill(x, 30), fill(w, 31), fill(ux, 32), fill(uw, 33);
  auto const r = tg::jvp(1, masked_row_products, tg::tangent_in("x", x, ux),
                         tg::tangent_in("w", w, uw), tg::tangent_out("s", s));
  double want = 0;
  for (int i = 0; i < 5; ++i)
    want += std::exp(x(i) * w(i)) * (ux(i) * w(i) + x(i) * uw(i));
  // Central differences in double along (ux, uw).
  double const h = 1e-6;
  owned<double> xu = moved(x, h, ux), wu = moved(w, h, uw), xd = moved(x, -h, ux),
                wd = moved(w, -h, uw), su({2}), sd({2});
  tg::launch(1, masked_row_products, xu.cview(), wu.cview(), su.view());
  tg::launch(1, masked_row_products, xd.cview(), wd.cview(), sd.view());
  for (int j = 0; j < 2; ++j) {
    ASSERT_TRUE(std::isfinite(r["s"](j))) << j;
    EXPECT_NEAR(r["s"](j), want, 1e-12 * (1 + std::abs(want))) << j;
    EXPECT_NEAR(r["s"](j), (su(j) - sd(j)) / (2 * h), 1e-7) << j;
  }
}

// Every program adds 1.5 * x[row, :] into y (row-sum of 13 programs, a tail of 37 - 32 lanes);
// every program also takes the element-wise max into z.
constexpr auto atomic_rows = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                         tg::tensor<T> y, tg::tensor<T> z) {
  auto const c = tg::arange<0, 32>();
  for (int c0 = 0; c0 < x.size(1); c0 += 32) {
    auto const cols = c0 + c;
    auto const mask = cols < x.size(1);
    auto const v = tg::load(x + p.program_id(0) * x.stride(0) + cols, mask);
    tg::atomic_add(y + cols, v * 1.5, mask);
    tg::atomic_max(z + cols, v, mask);
  }
};

TEST(JvpMemory, AtomicAddSumsTangentsAndAtomicMaxTakesTheWinnersTangent) {
  int const rows = 13, n = 37;
  owned<double> x({rows, n}), u({rows, n}), v({rows, n});
  fill(x, 23), fill(u, 24), fill(v, 25);
  std::vector<std::pair<tg::executor, int>> configs{{tg::executor::sequential, 1}};
  if (tg::executor_available(tg::executor::tbb))
    configs.push_back({tg::executor::tbb, 4});
  if (tg::executor_available(tg::executor::openmp))
    configs.push_back({tg::executor::openmp, 4});
  for (auto [e, threads] : configs) {
    owned<double> y({n}), z({n});
    for (int j = 0; j < n; ++j)
      y(j) = 0.5, z(j) = -10;
    auto const r = tg::jvp({e, threads}, rows, atomic_rows, tg::tangent_in("x", x, u, v),
                           tg::tangent_out("y", y), tg::tangent_out("z", z));
    for (int j = 0; j < n; ++j) {
      double sy = 0.5, su = 0, sv = 0;
      int best = 0;
      for (int i = 0; i < rows; ++i) {
        sy += 1.5 * x(i, j), su += 1.5 * u(i, j), sv += 1.5 * v(i, j);
        if (x(i, j) > x(best, j))
          best = i;
      }
      ASSERT_NEAR(y(j), sy, 1e-13) << tg::to_string(e) << " " << j;
      ASSERT_NEAR(r["y"](j), su, 1e-13) << tg::to_string(e) << " " << j;
      ASSERT_NEAR(r.tangent("y", 1)(j), sv, 1e-13) << tg::to_string(e) << " " << j;
      ASSERT_EQ(z(j), x(best, j)) << j;
      ASSERT_EQ(r["z"](j), u(best, j)) << tg::to_string(e) << " " << j;
      ASSERT_EQ(r.tangent("z", 1)(j), v(best, j)) << tg::to_string(e) << " " << j;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Bad input
// ---------------------------------------------------------------------------------------------

TEST(JvpErrors, TangentShapeNameTwiceAndUnknownResults) {
  int const n = 37, d = 70;
  owned<double> x({n, d}), w({d}), y({n}), ux({n, d}), uw({d}), bad_shape({n, d + 1}),
      bad_rank({n * d});
  auto run = [&](auto... args) {
    return tg::jvp(tg::cdiv(n, 16), tg::kernels::weighted_sum_fwd<16, 32>, args...);
  };
  EXPECT_THROW(
      run(tg::tangent_in("x", x, bad_shape), tg::tangent_in("w", w, uw), tg::tangent_out("y", y)),
      std::invalid_argument);
  EXPECT_THROW(run(tg::tangent_in("x", x, bad_rank), w.cview(), tg::tangent_out("y", y)),
               std::invalid_argument);
  EXPECT_THROW(run(tg::tangent_in("x", x, ux, bad_shape), tg::tangent_in("w", w, uw, uw),
                   tg::tangent_out("y", y)),
               std::invalid_argument);
  EXPECT_THROW(run(tg::tangent_in("x", x, ux), tg::tangent_in("x", w, uw), tg::tangent_out("y", y)),
               std::invalid_argument);
  try {
    run(tg::tangent_in("x", x, ux), w.cview(), tg::tangent_out("x", y));
    ADD_FAILURE() << "a name given twice was accepted";
  } catch (std::invalid_argument const& e) {
    EXPECT_NE(std::string(e.what()).find("'x' is given twice"), std::string::npos) << e.what();
  }
  auto const r =
      run(tg::tangent_in("x", x, ux), tg::tangent_in("w", w, uw), tg::tangent_out("y", y));
  EXPECT_THROW(r["w"], std::out_of_range);
  EXPECT_THROW(r["nope"], std::out_of_range);
  EXPECT_THROW(r.tangent("y", 1), std::out_of_range);
  EXPECT_THROW(r.tangent("y", -1), std::out_of_range);
  EXPECT_NO_THROW(r.tangent("y", 0));
}

// jvp runs the kernel on dual copies of the tensors: an access outside a tensor would be outside
// its copy (a heap overflow where a release build checks nothing), so jvp checks bounds always.
TEST(JvpErrors, OutOfBoundsAccessesThrowInEveryBuild) {
  tg::checked_scope const unchecked(false); // as in a release build
  owned<double> x({20}), y({20}), u({20});
  fill(x, 20), fill(u, 21);
  auto k = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y, int past) {
    auto const i = p.program_id(0) * 16 + tg::arange<0, 16>();
    auto const in = i < x.size(0);
    auto const v = tg::load(x + i, past == 1 ? i < x.size(0) + 1 : in, 0.0);
    tg::store(y + i, v * 2.0, past == 2 ? i < y.size(0) + 1 : in);
  };
  for (int past : {1, 2}) {
    try {
      (void)tg::jvp(2, k, tg::tangent_in("x", x, u), tg::tangent_out("y", y), past);
      ADD_FAILURE() << "an out-of-bounds " << (past == 1 ? "load" : "store") << " passed";
    } catch (tg::access_error const& e) {
      EXPECT_EQ(e.program(), "program (1, 0, 0)");
      EXPECT_EQ(e.tensor(), past == 1 ? "x" : "y");
      EXPECT_EQ(e.element(), "(20)");
    }
  }
  auto const r = tg::jvp(2, k, tg::tangent_in("x", x, u), tg::tangent_out("y", y), 0);
  EXPECT_EQ(r["y"](19), 2 * u(19));
}

// Two float tensors sharing an element, one of them marked or written: each would get a dual
// copy of its own and not see the other's writes (z = 9 where the launch gives 16). vjp refuses
// the same arguments.
TEST(JvpErrors, TensorsSharingAnElementAreRefused) {
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y,
                       tg::tensor<T> z) {
    auto const i = tg::arange<0, 32>();
    auto const m = i < x.size(0);
    auto const xi = x + i * x.stride(0);
    tg::store(y + i * y.stride(0), tg::load(xi, m, 0.0) + 1.0, m);
    auto const v = tg::load(xi, m, 0.0);
    tg::store(z + i, v * v, m);
  };
  owned<double> x({20}), z({20}), u({20}), other({20});
  fill(x, 22), fill(u, 23);
  std::string m;
  try {
    (void)tg::jvp(1, k, tg::tangent_in("x", x, u), x.view(), tg::tangent_out("z", z));
  } catch (std::invalid_argument const& e) {
    m = e.what();
  }
  EXPECT_NE(m.find("tensors 'x' (tangent_in, shape (20)) and"), std::string::npos) << m;
  EXPECT_NE(m.find("share memory: element (0)"), std::string::npos) << m;
  // Views of one buffer that share no element are fine (even and odd elements).
  owned<double> buf({40}), ub({20});
  fill(buf, 24), fill(ub, 25);
  tg::tensor<double const> const even(buf.data(), {20}, {2}, "even");
  tg::tensor<double> const odd(buf.data() + 1, {20}, {2}, "odd");
  EXPECT_NO_THROW(
      (void)tg::jvp(1, k, tg::tangent_in("x", even, ub), odd, tg::tangent_out("z", z)));
}

TEST(JvpErrors, ABroadcastViewWithATangentIsRefused) {
  // x: a (3, 5) view of 5 values with strides (0, 1), a direction that differs from row to row.
  // One dual per memory element kept one row's tangent for all three (silently); vjp refuses
  // such a view too.
  owned<double> buf({5}), u({3, 5}), y({3, 5});
  fill(buf, 18), fill(u, 19);
  tg::tensor<double const> const x(buf.data(), {3, 5}, {0, 1}, "x");
  try {
    (void)tg::jvp(3, double_2d, tg::tangent_in("x", x, u), tg::tangent_out("y", y));
    ADD_FAILURE() << "a broadcast view with a tangent was accepted";
  } catch (std::invalid_argument const& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'x' has strides (0, 1)"), std::string::npos)
        << e.what();
  }
  // The same values as a tensor of their own: each element its own tangent.
  owned<double> xs({3, 5});
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 5; ++j)
      xs(i, j) = buf(j);
  auto const r = tg::jvp(3, double_2d, tg::tangent_in("x", xs, u), tg::tangent_out("y", y));
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 5; ++j)
      ASSERT_EQ(r["y"](i, j), 2 * u(i, j)) << i << ", " << j;
}

// A float mask (Triton's `x * (x > 0)` form) times a function infinitely steep at 0: at x = 0
// the tangent of sqrt is inf, and the mask's 0 times it was NaN in forward mode where reverse
// mode passes the mask's zero adjoint on and gives 0. Both modes now give 0 there, and the
// derivative elsewhere.
TEST(JvpEdges, AZeroPartialTimesAnInfiniteTangentIsZeroAsInReverseMode) {
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const i = tg::arange<0, 8>();
    auto const m = i < x.size(0);
    tg::tile<T, 8> const v = tg::load(x + i, m, 1.0);
    tg::tile<T, 8> const g = tg::to<float>(v > 0) * tg::sqrt(tg::maximum(v, 0.0));
    tg::tile<T, 8> const h = g / (v + 2.0) + tg::exp(g * 0.0); // a zero partial of exp too
    tg::store(y + i, h, m);
  };
  owned<double> x({5}, "x"), u({5}, "u"), y({5}, "y"), dy({5}, "dy");
  double const xs[5] = {0.0, 0.25, -0.5, 0.0, 4.0};
  for (int i = 0; i < 5; ++i)
    x(i) = xs[i], u(i) = 1, dy(i) = 1;
  auto const t = tg::jvp(1, k, tg::tangent_in("x", x, u), tg::tangent_out("y", y));
  auto const g = tg::vjp(1, k, tg::in("x", x), tg::out("y", y, dy));
  for (int i = 0; i < 5; ++i) {
    double const v = xs[i], s = v > 0 ? std::sqrt(v) : 0.0;
    double const want = v > 0 ? 1 / (2 * s) / (v + 2) - s / ((v + 2) * (v + 2)) : 0.0;
    EXPECT_NEAR(t["y"](i), want, 1e-12) << "x = " << v;
    EXPECT_NEAR(g["x"](i), want, 1e-12) << "x = " << v;
  }
}

// Triton's `acc = tl.dot(acc * s, w, acc)` on dual tiles (which live on the heap): the operand
// that reads acc is evaluated before acc is reused for the result (it crashed).
// fma(a, b, c) rounds once in forward mode too: fma(x, x, -(x * x)) is the rounding error of
// x * x, as on the fast path and in reverse mode, where jvp computed x * x + c (0).
TEST(JvpEdges, FmaRoundsOnceAsOnTheFastPath) {
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const i = tg::arange<0, 19>();
    tg::tile<T, 19> const v = tg::load(x + i);
    tg::tile<T, 19> const sq = v * v;
    tg::store(y + i, tg::fma(v, v, -sq));
  };
  owned<double> x({19}, "x"), y({19}, "y"), yt({19}, "y"), u({19}, "u");
  for (int i = 0; i < 19; ++i)
    x(i) = 1.0 + 0.1 * i + 1e-9 * i * i, u(i) = 1;
  tg::launch(1, k, x.cview(), y.view());
  auto const t = tg::jvp(1, k, tg::tangent_in("x", x, u), tg::tangent_out("y", yt));
  int residues = 0;
  for (int i = 0; i < 19; ++i) {
    EXPECT_EQ(yt(i), y(i)) << i;
    residues += y(i) != 0;
    EXPECT_EQ(t["y"](i), 0.0) << i; // d/dx (x x - x x)
  }
  EXPECT_GT(residues, 0); // (the products do round)
}

// atomic_max and atomic_min of equal values from 64 programs, each with its own tangent: the
// element that gets there first keeps its tangent. On the sequential executor that is program 0,
// on every run, and the tangent is linear in the direction (jvp of -u is minus jvp of u).
TEST(JvpEdges, AtomicMaxTiesKeepTheFirstElementsTangent) {
  auto k = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> mx,
                       tg::tensor<T> mn) {
    auto const i = tg::arange<0, 4>();
    tg::tile<T, 4> const v = tg::load(x + p.program_id(0) * 4 + i);
    (void)tg::atomic_max(mx + i, v);
    (void)tg::atomic_min(mn + i, v);
  };
  int const programs = 64;
  owned<double> x({programs * 4}, "x"), u({programs * 4}, "u"), nu({programs * 4}, "nu");
  for (int i = 0; i < programs * 4; ++i)
    x(i) = 1.0, u(i) = 1 + (i / 4 * 37) % programs, nu(i) = -u(i);
  for (int run = 0; run < 3; ++run)
    for (bool negated : {false, true}) {
      owned<double> mx({4}, "mx"), mn({4}, "mn");
      for (int j = 0; j < 4; ++j)
        mx(j) = -5, mn(j) = 5;
      auto const t = tg::jvp({tg::executor::sequential, 1}, programs, k,
                             tg::tangent_in("x", x, negated ? nu : u), tg::tangent_out("mx", mx),
                             tg::tangent_out("mn", mn));
      for (int j = 0; j < 4; ++j) {
        ASSERT_EQ(t["mx"](j), negated ? -u(j) : u(j)) << run;
        ASSERT_EQ(t["mn"](j), negated ? -u(j) : u(j)) << run;
      }
    }
}

constexpr int acc_side = 16;
TEST(JvpEdges, AnAccumulatorReadByAnOperandExpression) {
  constexpr int S = acc_side;
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T const> w,
                       tg::tensor<T> y) {
    constexpr int S = acc_side;
    auto const r = tg::arange<0, S>();
    auto const off = tg::col(r) * S + tg::row(r);
    tg::tile<T, S, S> acc = tg::load(x + off);
    tg::tile<T, S, S> const wt = tg::load(w + off);
    acc = tg::dot(acc * 0.5, wt, std::move(acc));
    tg::store(y + off, acc);
  };
  owned<double> x({S, S}, "x"), w({S, S}, "w"), y({S, S}, "y"), u({S, S}, "u");
  fill(x, 31), fill(u, 32);
  for (int i = 0; i < S; ++i)
    for (int j = 0; j < S; ++j)
      w(i, j) = i == j ? 1.0 : 0.0;
  auto const t = tg::jvp(1, k, tg::tangent_in("x", x, u), w.cview(), tg::tangent_out("y", y));
  for (int i = 0; i < S; ++i)
    for (int j = 0; j < S; ++j) {
      ASSERT_NEAR(y(i, j), 1.5 * x(i, j), 1e-12) << i << ", " << j;
      ASSERT_NEAR(t["y"](i, j), 1.5 * u(i, j), 1e-12) << i << ", " << j;
    }
}

} // namespace

} // namespace test_jvp
