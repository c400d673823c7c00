// jvp of launches of bf16 tensors: the kernel runs on dual<float> copies (bf16 rounding
// differentiated as identity, as vjp does), the tangents are float, the bf16 outputs receive the
// float results rounded. Checked on bf16 FlashAttention (a float logsumexp beside bf16 tensors,
// ragged N != Nk, batch and head > 0) against jvp of float copies of the same values, against
// vjp by the dot-product test, and against central differences of the double launch.
#include <tilegrad/kernels/flash_attention.hpp>
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include "../support/tensors.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_jvp_bf16 {

namespace {

namespace tg = tilegrad;
using test_support::fill;
template <class T>
using owned = tg::owned_tensor<T>;

constexpr int B = 2, H = 2, N = 70, NK = 45, D = 32, BQ = 32, BK = 32;
constexpr auto fwd = tg::kernels::flash_attention_fwd<D, BQ, BK, true>;
tg::grid const grid_of{tg::cdiv(N, BQ), H, B};
double const scale = 0.3;

template <class To, class From>
owned<To> converted(owned<From> const& t, char const* name) {
  owned<To> r(t.view().shape().data(), static_cast<std::size_t>(t.rank()), name);
  for (std::int64_t i = 0; i < t.numel(); ++i)
    r.data()[i] = static_cast<To>(t.data()[i]);
  return r;
}

template <class T>
owned<T> random_tensor(std::initializer_list<std::int64_t> shape, unsigned seed, char const* name) {
  owned<float> f(shape, name);
  fill(f, seed);
  return converted<T>(f, name);
}

double inner(owned<float> const& a, owned<float> const& b) {
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    s += double(a.data()[i]) * double(b.data()[i]);
  return s;
}
double abs_inner(owned<float> const& a, owned<float> const& b) {
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    s += std::abs(double(a.data()[i]) * double(b.data()[i]));
  return s;
}

} // namespace

TEST(JvpBf16, AttentionEqualsJvpOfFloatCopiesAndMatchesVjpAndDifferences) {
  auto const q = random_tensor<tg::bf16>({B, H, N, D}, 1, "q");
  auto const k = random_tensor<tg::bf16>({B, H, NK, D}, 2, "k");
  auto const v = random_tensor<tg::bf16>({B, H, NK, D}, 3, "v");
  owned<float> uq({B, H, N, D}, "uq"), uk({B, H, NK, D}, "uk"), uv({B, H, NK, D}, "uv");
  fill(uq, 4), fill(uk, 5), fill(uv, 6);
  owned<tg::bf16> o({B, H, N, D}, "o");
  owned<float> lse({B, H, N}, "lse");
  auto const t = tg::jvp(grid_of, fwd, tg::tangent_in("q", q, uq), tg::tangent_in("k", k, uk),
                         tg::tangent_in("v", v, uv), tg::tangent_out("o", o),
                         tg::tangent_out("lse", lse), scale);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(t["o"])>, owned<float>>);

  // The same values as float tensors: the same dual<float> computation, so the same bits.
  auto const qf = converted<float>(q, "q"), kf = converted<float>(k, "k"),
             vf = converted<float>(v, "v");
  owned<float> of({B, H, N, D}, "o"), lsef({B, H, N}, "lse");
  auto const tf = tg::jvp(grid_of, fwd, tg::tangent_in("q", qf, uq), tg::tangent_in("k", kf, uk),
                          tg::tangent_in("v", vf, uv), tg::tangent_out("o", of),
                          tg::tangent_out("lse", lsef), scale);
  for (char const* name : {"o", "lse"}) {
    auto const& a = t[name];
    auto const& b = tf[name];
    ASSERT_EQ(a.numel(), b.numel());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * std::size_t(a.numel())), 0) << name;
  }
  // The outputs receive the float results, o rounded to bf16.
  for (std::int64_t i = 0; i < o.numel(); ++i)
    ASSERT_EQ(o.data()[i].bits, tg::bf16(of.data()[i]).bits) << "o element " << i;
  for (std::int64_t i = 0; i < lse.numel(); ++i)
    ASSERT_EQ(lse.data()[i], lsef.data()[i]) << "lse element " << i;

  // Dot-product test against vjp of the same bf16 launch: <J u, w> = <u, J^T w>.
  owned<float> wo({B, H, N, D}, "wo"), wl({B, H, N}, "wl");
  fill(wo, 7), fill(wl, 8);
  owned<tg::bf16> o2({B, H, N, D}, "o");
  owned<float> lse2({B, H, N}, "lse");
  auto const wob = converted<tg::bf16>(wo, "wo");
  auto const g = tg::vjp(grid_of, fwd, tg::in("q", q), tg::in("k", k), tg::in("v", v),
                         tg::out("o", o2, wob), tg::out("lse", lse2, wl), scale);
  auto const wof = converted<float>(wob, "wo");
  double const lhs = inner(t["o"], wof) + inner(t["lse"], wl);
  double const rhs = inner(uq, g["q"]) + inner(uk, g["k"]) + inner(uv, g["v"]);
  double const size = abs_inner(t["o"], wof) + abs_inner(t["lse"], wl);
  EXPECT_NEAR(lhs, rhs, 1e-5 * size) << "<J u, w> = " << lhs << ", <u, J^T w> = " << rhs;
  EXPECT_GT(std::abs(lhs), 1e-3 * size) << "a degenerate test";

  // Central differences of the double launch at the bf16 values, along u.
  auto const qd = converted<double>(q, "q"), kd = converted<double>(k, "k"),
             vd = converted<double>(v, "v");
  auto const ud = [](owned<float> const& u) { return converted<double>(u, "u"); };
  auto const uqd = ud(uq), ukd = ud(uk), uvd = ud(uv);
  auto const run = [&](double h) {
    auto mv = [&](owned<double> const& x, owned<double> const& u) {
      owned<double> r(x);
      for (std::int64_t i = 0; i < r.numel(); ++i)
        r.data()[i] += h * u.data()[i];
      return r;
    };
    auto const a = mv(qd, uqd), b = mv(kd, ukd), c = mv(vd, uvd);
    owned<double> od({B, H, N, D}, "o"), ld({B, H, N}, "lse");
    tg::launch(grid_of, fwd, a.cview(), b.cview(), c.cview(), od.view(), ld.view(), scale);
    return std::pair{od, ld};
  };
  double const h = 1e-4;
  auto const [op, lp] = run(h);
  auto const [om, lm] = run(-h);
  double worst = 0;
  for (std::int64_t i = 0; i < op.numel(); ++i)
    worst = std::max(worst,
                     std::abs((op.data()[i] - om.data()[i]) / (2 * h) - double(t["o"].data()[i])));
  for (std::int64_t i = 0; i < lp.numel(); ++i)
    worst = std::max(
        worst, std::abs((lp.data()[i] - lm.data()[i]) / (2 * h) - double(t["lse"].data()[i])));
  EXPECT_LT(worst, 1e-4) << "the largest difference from central differences";
}

TEST(JvpBf16, AnUnmarkedBf16InputIsPassiveAndAnInoutStartsAlongItsTangent) {
  // y (bf16, in place) = y * 2 + x, x bf16 unmarked: dy = 2 u.
  auto const kern = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const i = p.program_id(0) * 16 + tg::arange<0, 16>();
    auto const m = i < x.size(0);
    auto const yv = tg::to<tg::fp32<T>>(tg::load(y + i, m));
    auto const xv = tg::to<tg::fp32<T>>(tg::load(x + i, m));
    tg::store(y + i, tg::to<T>(yv * 2.0f + xv), m);
  };
  int const n = 37;
  auto const x = random_tensor<tg::bf16>({n}, 11, "x");
  auto y = random_tensor<tg::bf16>({n}, 12, "y");
  auto const y0 = converted<float>(y, "y0");
  owned<float> u({n}, "u");
  fill(u, 13);
  auto const t = tg::jvp(tg::cdiv(n, 16), kern, x.cview(), tg::tangent_inout("y", y, u));
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(t["y"](i), 2 * u(i)) << i;
    EXPECT_EQ(y(i).bits, tg::bf16(y0(i) * 2.0f + static_cast<float>(x(i))).bits) << i;
  }
}

// A fixed bf16 table passed before the marked tensors does not make the launch a bf16 one: the
// launch's float type is that of its marked tensors (bf16 when one of them is). With the table
// first, jvp stopped compiling for a float launch, and vjp of a double launch ran in float.
constexpr auto scaled_by_table = []<class T>(tg::program const& p, tg::tensor<tg::bf16 const> table,
                                             tg::tensor<T const> x, tg::tensor<T> y) {
  auto const c = p.program_id(0) * 16 + tg::arange<0, 16>();
  auto const m = c < x.size(0);
  tg::tile<tg::fp32<T>, 16> const s = tg::load(table + c, m, 0.0f);
  tg::tile<tg::fp32<T>, 16> const v = tg::load(x + c, m);
  tg::store(y + c, tg::exp(v) * s, m);
};

TEST(JvpBf16, AnUnmarkedBf16TableFirstLeavesTheLaunchFloatOrDouble) {
  int const n = 21;
  owned<tg::bf16> table({n}, "table");
  for (int i = 0; i < n; ++i)
    table(i) = tg::bf16(0.25f * static_cast<float>(i + 1));
  // float: jvp and vjp in float.
  owned<float> x({n}, "x"), y({n}, "y"), u({n}, "u"), dy({n}, "dy");
  fill(x, 21), fill(u, 22), fill(dy, 23);
  auto const t = tg::jvp(tg::cdiv(n, 16), scaled_by_table, table.cview(), tg::tangent_in("x", x, u),
                         tg::tangent_out("y", y));
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(t["y"])>, owned<float>>);
  // double: the gradients and the output in double (they came back float, the output rounded).
  owned<double> xd({n}, "x"), yd({n}, "y"), dyd({n}, "dy");
  for (int i = 0; i < n; ++i)
    xd(i) = 0.1 + 0.05 * i, dyd(i) = 1.0 - 0.03 * i;
  auto const g = tg::vjp(tg::cdiv(n, 16), scaled_by_table, table.cview(), tg::in("x", xd),
                         tg::out("y", yd, dyd));
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(g["x"])>, owned<double>>);
  for (int i = 0; i < n; ++i) {
    double const s = static_cast<double>(static_cast<float>(table(i)));
    EXPECT_NEAR(t["y"](i), std::exp(double(x(i))) * s * double(u(i)), 1e-5) << i;
    EXPECT_DOUBLE_EQ(yd(i), std::exp(xd(i)) * s) << i;
    EXPECT_DOUBLE_EQ(g["x"](i), std::exp(xd(i)) * s * dyd(i)) << i;
  }
}

} // namespace test_jvp_bf16
