// Scalar arguments, offsets and element types that must mean the same in every mode:
// - the fp64 reference is fp64 throughout: attention's scale (and layer norm's eps) reach the
//   double and adjoint<double> instantiations unrounded (d = 32 and 128, where 1/sqrt(d) is not
//   a float);
// - offsets built from an int32 tile and an int64 stride or size are int64 (as in Triton) and
//   do not wrap at 2^31; masks against 64-bit sizes compare exactly; loads and stores through
//   int64 offsets, affine or gathered, have their gradients (central differences, jvp);
// - a grid with an extent 0 runs no program in launch, jvp and vjp alike;
// - a double tile widens a float tile in every mode, and full<fp32<T>>(-INFINITY) compiles in
//   every mode.
#include <tilegrad/kernels/block_sparse_attention.hpp>
#include <tilegrad/kernels/flash_attention.hpp>
#include <tilegrad/kernels/layer_norm.hpp>
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include "../support/attention.hpp"
#include "../support/tensors.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_scalars_and_offsets {

namespace tg = tilegrad;
namespace tk = tilegrad::kernels;

namespace {

template <class T>
void fill(tg::owned_tensor<T>& t, unsigned seed, double lo = -1, double hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  for (T& v : t)
    v = static_cast<T>(d(rng));
}

double max_abs(std::vector<double> const& v) {
  double m = 0;
  for (double x : v)
    m = std::max(m, std::abs(x));
  return m;
}

// ---------------------------------------------------------------------------------------------
// fp64 scalars
// ---------------------------------------------------------------------------------------------

static_assert(std::is_same_v<decltype(tk::attention_options::scale), double>);
static_assert(std::is_same_v<decltype(tk::block_sparse_options::scale), double>);

TEST(Fp64Scalars, DefaultAttentionScaleIsDouble) {
  EXPECT_EQ(tk::detail::default_scale(0, 32), 1 / std::sqrt(32.0));
  EXPECT_EQ(tk::detail::default_scale(0, 128), 1 / std::sqrt(128.0));
  EXPECT_EQ(tk::detail::default_scale(0.1, 32), 0.1);
}

// Plain attention and its gradients in double: o = softmax(scale q kᵀ [causal]) v, and dq, dk,
// dv for the cotangent d_o. (B, H) = (1, 1).
struct attention_grads {
  std::vector<double> dq, dk, dv;
};
attention_grads reference_backward(tg::owned_tensor<double> const& q,
                                   tg::owned_tensor<double> const& k,
                                   tg::owned_tensor<double> const& v,
                                   tg::owned_tensor<double> const& d_o, double scale, bool causal) {
  std::int64_t const n = q.size(2), m = k.size(2), d = q.size(3);
  attention_grads g{std::vector<double>(static_cast<std::size_t>(n * d)),
                    std::vector<double>(static_cast<std::size_t>(m * d)),
                    std::vector<double>(static_cast<std::size_t>(m * d))};
  std::vector<double> p(static_cast<std::size_t>(m)), dp(static_cast<std::size_t>(m));
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t const keys = causal ? std::min(i + 1, m) : m;
    double mx = -INFINITY;
    for (std::int64_t j = 0; j < keys; ++j) {
      double s = 0;
      for (std::int64_t c = 0; c < d; ++c)
        s += q(0, 0, i, c) * k(0, 0, j, c);
      p[j] = s * scale;
      mx = std::max(mx, p[j]);
    }
    double sum = 0;
    for (std::int64_t j = 0; j < keys; ++j)
      sum += (p[j] = std::exp(p[j] - mx));
    double delta = 0; // sum_j p_j dp_j
    for (std::int64_t j = 0; j < keys; ++j) {
      p[j] /= sum;
      dp[j] = 0;
      for (std::int64_t c = 0; c < d; ++c)
        dp[j] += d_o(0, 0, i, c) * v(0, 0, j, c);
      delta += p[j] * dp[j];
    }
    for (std::int64_t j = 0; j < keys; ++j) {
      double const ds = p[j] * (dp[j] - delta) * scale;
      for (std::int64_t c = 0; c < d; ++c) {
        g.dq[static_cast<std::size_t>(i * d + c)] += ds * k(0, 0, j, c);
        g.dk[static_cast<std::size_t>(j * d + c)] += ds * q(0, 0, i, c);
        g.dv[static_cast<std::size_t>(j * d + c)] += p[j] * d_o(0, 0, i, c);
      }
    }
  }
  return g;
}

// The fp64 reference gradient of the FlashAttention forward kernel (vjp in double) against the
// plain double gradients, to 1e-12 of the largest: a scale rounded to float is 1e-8 off.
template <int D, int BQ, int BK, bool Causal>
void check_attention_vjp(std::int64_t n) {
  tg::owned_tensor<double> q({1, 1, n, D}, "q"), k({1, 1, n, D}, "k"), v({1, 1, n, D}, "v"),
      o({1, 1, n, D}, "o"), d_o({1, 1, n, D}, "do"), lse({1, 1, n}, "lse");
  fill(q, 1, -2, 2), fill(k, 2, -2, 2), fill(v, 3), fill(d_o, 4);
  double const scale = 1 / std::sqrt(double(D));
  auto const g = tg::vjp(tg::grid(tg::cdiv<int>(int(n), BQ), 1, 1),
                         tk::flash_attention_fwd<D, BQ, BK, Causal>, tg::in("q", q), tg::in("k", k),
                         tg::in("v", v), tg::out("o", o, d_o), lse.view(), scale);
  auto const want = reference_backward(q, k, v, d_o, scale, Causal);
  for (auto [name, ref] : {std::pair{"q", &want.dq}, {"k", &want.dk}, {"v", &want.dv}}) {
    double err = 0;
    for (std::size_t i = 0; i < ref->size(); ++i)
      err = std::max(err, std::abs(g[name].data()[i] - (*ref)[i]));
    EXPECT_LE(err, 1e-12 * max_abs(*ref)) << "d" << name << " at D = " << D;
  }
}

TEST(Fp64Scalars, FlashAttentionGradientInDoubleIsDouble) {
  check_attention_vjp<32, 64, 64, false>(70);
  check_attention_vjp<128, 32, 64, true>(45);
}

// The double forward of block-sparse attention (every block listed) at d = 32.
TEST(Fp64Scalars, BlockSparseAttentionInDoubleIsDouble) {
  constexpr int D = 32, B = 16;
  std::int64_t const n = 40;
  tg::owned_tensor<double> q({1, 1, n, D}, "q"), k({1, 1, n, D}, "k"), v({1, 1, n, D}, "v"),
      o({1, 1, n, D}, "o"), lse({1, 1, n}, "lse");
  fill(q, 5, -2, 2), fill(k, 6, -2, 2), fill(v, 7);
  auto const t = tk::make_block_table(1, 1, tg::cdiv<std::int64_t>(n, B),
                                      tg::cdiv<std::int64_t>(n, B), [](auto...) { return true; });
  double const scale = 1 / std::sqrt(double(D));
  tg::launch(tg::grid(tg::cdiv<int>(int(n), B), 1, 1), tk::block_sparse_attention_fwd<D, B, B>,
             q.cview(), k.cview(), v.cview(), t.count.cview(), t.index.cview(), o.view(),
             lse.view(), scale);
  std::vector<double> ro, rl;
  test_support::reference_attention(
      q, k, v, scale, [](auto...) { return true; }, ro, rl);
  for (std::int64_t i = 0; i < o.numel(); ++i)
    ASSERT_NEAR(o.data()[i], ro[static_cast<std::size_t>(i)], 1e-12 * max_abs(ro)) << i;
  for (std::int64_t i = 0; i < n; ++i)
    ASSERT_NEAR(lse.data()[i], rl[static_cast<std::size_t>(i)], 1e-12 * max_abs(rl)) << i;
}

// Layer norm's eps reaches the double instantiation unrounded: eps = 0.1 (float(0.1) is 1.5e-9
// off) on rows of small variance.
TEST(Fp64Scalars, LayerNormEpsInDoubleIsDouble) {
  constexpr int BlockN = 64;
  std::int64_t const m = 3, n = 75;
  tg::owned_tensor<double> x({m, n}, "x"), w({n}, "w"), b({n}, "b"), y({m, n}, "y"),
      mean({m}, "mean"), rstd({m}, "rstd");
  fill(x, 8, -0.1, 0.1), fill(w, 9), fill(b, 10);
  double const eps = 0.1;
  tg::launch(int(m), tk::layer_norm_fwd<BlockN>, x.cview(), w.cview(), b.cview(), y.view(),
             mean.view(), rstd.view(), eps);
  for (std::int64_t i = 0; i < m; ++i) {
    double const r = test_support::stats_of_row(x, i, eps).rstd;
    EXPECT_NEAR(rstd(i), r, 1e-14 * r) << "row " << i;
  }
}

// ---------------------------------------------------------------------------------------------
// int64 offsets and exact masks
// ---------------------------------------------------------------------------------------------

TEST(Int64Offsets, AnInt32TileMeetingAnInt64NumberIsInt64) {
  std::int64_t const stride = (std::int64_t{1} << 31) + 8;
  auto const rows = tg::arange<0, 4>();
  auto const offs = tg::col(rows) * stride + tg::row(tg::arange<0, 3>());
  static_assert(std::is_same_v<tg::value_of_t<decltype(offs)>, std::int64_t>);
  tg::tile<std::int64_t, 4, 3> const o = offs;
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 3; ++c)
      EXPECT_EQ(o(r, c), r * stride + c) << r << ", " << c;
  // Narrower numbers keep the tile's type (Triton's literals); bool and int16 tiles widen too.
  static_assert(std::is_same_v<tg::value_of_t<decltype(rows * 3)>, std::int32_t>);
  static_assert(std::is_same_v<tg::value_of_t<decltype(rows * std::int64_t{3})>, std::int64_t>);
  static_assert(std::is_same_v<tg::value_of_t<decltype(rows * std::size_t{3})>, std::int64_t>);
  static_assert(std::is_same_v<tg::value_of_t<decltype(rows * 2.0)>, float>);
  static_assert(
      std::is_same_v<tg::value_of_t<decltype((rows < 2) + std::int64_t{1})>, std::int64_t>);
  static_assert(
      std::is_same_v<tg::value_of_t<decltype(tg::to<std::int16_t>(rows) * 3L)>, std::int64_t>);
}

TEST(Int64Offsets, PointerTilesOfAViewWithAHugeStrideAddressPast2To31) {
  // A view of 2 rows 2^31 + 8 elements apart over a buffer that holds row 0 only: its offsets
  // are built and checked, and only row 0 is read.
  std::int64_t const stride = (std::int64_t{1} << 31) + 8;
  float buf[4] = {1, 2, 3, 4};
  tg::tensor<float const> x(buf, {2, 4}, {stride, 1}, "x");
  auto const rows = tg::arange<0, 2>();
  auto const cols = tg::arange<0, 4>();
  auto const p = x + (tg::col(rows) * x.stride(0) + tg::row(cols));
  // The rows of affine offsets that loads and stores walk (contiguous: vector accesses).
  static_assert(tg::detail::is_affine_v<std::remove_cvref_t<decltype(p.offsets)>>);
  EXPECT_EQ(p.rows[1].base, stride);
  EXPECT_EQ(p.rows[1].step, 1);
  EXPECT_TRUE(p.rows[1].ok);
  tg::tile<float, 2, 4> const v = tg::load(p, tg::col(rows) < 1, -1.0f);
  for (int c = 0; c < 4; ++c) {
    EXPECT_EQ(v(0, c), buf[c]);
    EXPECT_EQ(v(1, c), -1.0f);
  }
}

TEST(Int64Offsets, MasksAgainstSizesPast2To31AreExact) {
  auto const r = tg::arange<0, 8>();
  std::int64_t const big = 3'000'000'000; // int32(big) is negative
  tg::tile<bool, 8> const lt = (r < big);
  tg::tile<bool, 8> const ge = (r >= big);
  tg::tile<bool, 8> const gt = (big > r);
  tg::tile<bool, 8> const le = (r <= big - 1);
  tg::tile<bool, 8> const small = r < std::int64_t{5}, rev = std::int64_t{5} <= r;
  tg::tile<bool, 8> const eq = r == big, ne = r != big + 2, zero = r < std::int64_t{0};
  for (int i = 0; i < 8; ++i) {
    EXPECT_TRUE(lt(i));
    EXPECT_FALSE(ge(i));
    EXPECT_TRUE(gt(i));
    EXPECT_TRUE(le(i));
    EXPECT_EQ(small(i), i < 5);
    EXPECT_EQ(rev(i), i >= 5);
    EXPECT_FALSE(eq(i));
    EXPECT_TRUE(ne(i));
    EXPECT_FALSE(zero(i));
  }
  // Below every int32 the comparison has no int32 form: an error, not a wrong mask.
  EXPECT_THROW(((void)tg::tile<bool, 8>(r > -big)), std::out_of_range);
  // At the type's smallest value, <= and > have their form; < and >= (x <= n - 1, x > n - 1)
  // have none, and the message says why (it said "below every value it holds").
  std::int64_t const lowest = std::numeric_limits<std::int32_t>::min();
  tg::tile<bool, 8> const le_min = r <= lowest, gt_min = r > lowest;
  for (int i = 0; i < 8; ++i)
    EXPECT_TRUE(!le_min(i) && gt_min(i));
  auto expect_refused = [](auto&& compare, std::string const& op) {
    try {
      (void)tg::tile<bool, 8>(compare());
      ADD_FAILURE() << op << " did not throw";
    } catch (std::out_of_range const& e) {
      std::string const what = e.what();
      EXPECT_NE(what.find("by " + op + ", its type's smallest value"), std::string::npos) << what;
      EXPECT_EQ(what.find("below every value it holds:"), std::string::npos) << what;
    }
  };
  expect_refused([&] { return r < lowest; }, "<");
  expect_refused([&] { return r >= lowest; }, ">=");
  // A 16-bit tile against a number past its range.
  tg::tile<bool, 8> const s16 = tg::to<std::int16_t>(r) < std::int64_t{70'000};
  for (int i = 0; i < 8; ++i)
    EXPECT_TRUE(s16(i));
}

// y[i, j] = x[i, j]^2 + 2 x[i, (7 j) % n]: rows addressed through col(rows) * stride (int64,
// affine: vector loads and stores), and a gather along the row through int64 offsets.
template <int BR, int BC>
constexpr auto square_and_gather = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                               tg::tensor<T> y) {
  auto const rows = p.program_id(0) * BR + tg::arange<0, BR>();
  auto const cols = tg::arange<0, BC>();
  auto const mask = (tg::col(rows) < x.size(0)) & (tg::row(cols) < x.size(1));
  auto const offs = tg::col(rows) * x.stride(0) + tg::row(cols) * x.stride(1);
  static_assert(std::is_same_v<tg::value_of_t<decltype(offs)>, std::int64_t>);
  static_assert(tg::detail::is_affine_v<decltype(offs)>, "contiguous rows stay vector accesses");
  tg::tile<tg::fp32<T>, BR, BC> const a = tg::load(x + offs, mask, 0.0f);
  auto const perm = tg::row(cols) * 7 % x.size(1);
  tg::tile<tg::fp32<T>, BR, BC> const b =
      tg::load(x + (tg::col(rows) * x.stride(0) + perm * x.stride(1)), mask, 0.0f);
  tg::store(y + (tg::col(rows) * y.stride(0) + tg::row(cols) * y.stride(1)), a * a + b * 2.0f,
            mask);
};

// A (rows, cols) -> (rows, cols) kernel over cdiv(rows, BR) programs: the float path against the
// double one, vjp in double against central differences of <dy, y(x)>, and <dy, J u> of jvp
// against <vjp(dy), u>.
template <int BR, class K>
void check_gradients(K const& kernel, std::int64_t rows, std::int64_t cols, double fd_tol = 1e-7) {
  int const programs = tg::cdiv<int>(int(rows), BR);
  tg::owned_tensor<double> x({rows, cols}, "x"), y({rows, cols}, "y"), dy({rows, cols}, "dy"),
      u({rows, cols}, "u");
  fill(x, 11), fill(dy, 12), fill(u, 13);
  tg::launch(programs, kernel, x.cview(), y.view());
  tg::owned_tensor<float> xf({rows, cols}, "x"), yf({rows, cols}, "y");
  for (std::int64_t i = 0; i < x.numel(); ++i)
    xf.data()[i] = static_cast<float>(x.data()[i]);
  tg::launch(programs, kernel, xf.cview(), yf.view());
  for (std::int64_t i = 0; i < y.numel(); ++i)
    ASSERT_NEAR(yf.data()[i], y.data()[i], 1e-5 * (1 + std::abs(y.data()[i]))) << i;

  auto const g = tg::vjp(programs, kernel, tg::in("x", x), tg::out("y", y, dy));
  auto loss = [&](tg::owned_tensor<double> const& at) {
    tg::owned_tensor<double> out({rows, cols}, "out");
    tg::launch(programs, kernel, at.cview(), out.view());
    double l = 0;
    for (std::int64_t i = 0; i < out.numel(); ++i)
      l += dy.data()[i] * out.data()[i];
    return l;
  };
  double const h = 1e-6;
  tg::owned_tensor<double> at({rows, cols}, "at");
  std::copy(x.begin(), x.end(), at.begin());
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    double const x0 = at.data()[i];
    at.data()[i] = x0 + h;
    double const lp = loss(at);
    at.data()[i] = x0 - h;
    double const lm = loss(at);
    at.data()[i] = x0;
    double const fd = (lp - lm) / (2 * h);
    ASSERT_NEAR(g["x"].data()[i], fd, fd_tol * (1 + std::abs(fd))) << "dx at " << i;
  }

  auto const t = tg::jvp(programs, kernel, tg::tangent_in("x", x, u), tg::tangent_out("y", y));
  double forward = 0, reverse = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    forward += dy.data()[i] * t["y"].data()[i];
    reverse += g["x"].data()[i] * u.data()[i];
  }
  EXPECT_NEAR(forward, reverse, 1e-12 * (1 + std::abs(forward)));
}

TEST(Int64Offsets, LoadsAndStoresThroughInt64OffsetsHaveGradients) {
  check_gradients<8>(square_and_gather<8, 16>, 13, 11); // tiles of 8 x 16 over 13 x 11
}

// ---------------------------------------------------------------------------------------------
// Grids with an extent 0
// ---------------------------------------------------------------------------------------------

constexpr auto doubled = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y,
                                     tg::tensor<T> z) {
  auto const offs = p.program_id(0) * 4 + tg::arange<0, 4>();
  auto const mask = offs < x.size(0);
  tg::tile<tg::fp32<T>, 4> const v = tg::load(x + offs, mask);
  tg::store(y + offs, v * 2.0f, mask);
  tg::store(z + offs, tg::load(z + offs, mask) * v, mask);
};

TEST(ZeroGrid, LaunchJvpAndVjpRunNoProgram) {
  // cdiv(0, 4) programs: the kernel over an empty range, as Triton's launch of a zero grid.
  tg::owned_tensor<double> x({6}, "x"), y({6}, "y"), z({6}, "z"), dy({6}, "dy"), dz({6}, "dz"),
      u({6}, "u");
  fill(x, 14), fill(y, 15), fill(z, 16), fill(dy, 17), fill(dz, 18), fill(u, 19);
  std::vector<double> const y0(y.begin(), y.end()), z0(z.begin(), z.end());
  for (tg::grid const g : {tg::grid(0), tg::grid(2, 0), tg::grid(3, 1, 0)}) {
    tg::launch(g, doubled, x.cview(), y.view(), z.view());
    EXPECT_TRUE(std::equal(y.begin(), y.end(), y0.begin()));
    auto const t = tg::jvp(g, doubled, tg::tangent_in("x", x, u), tg::tangent_out("y", y),
                           tg::tangent_out("z", z));
    auto const r = tg::vjp(g, doubled, tg::in("x", x), tg::out("y", y, dy), tg::inout("z", z, dz));
    for (std::int64_t i = 0; i < 6; ++i) {
      EXPECT_EQ(t["y"](i), 0.0);
      EXPECT_EQ(r["x"](i), 0.0);
      EXPECT_EQ(r["z"](i), dz(i)) << "an element no program stores passes its cotangent on";
    }
    EXPECT_TRUE(std::equal(y.begin(), y.end(), y0.begin()));
    EXPECT_TRUE(std::equal(z.begin(), z.end(), z0.begin()));
  }
  // A negative extent is an error in all three.
  EXPECT_THROW((tg::launch(-1, doubled, x.cview(), y.view(), z.view())), std::invalid_argument);
  EXPECT_THROW((void)tg::jvp(tg::grid(2, -1), doubled, tg::tangent_in("x", x, u),
                             tg::tangent_out("y", y), tg::tangent_out("z", z)),
               std::invalid_argument);
  EXPECT_THROW((void)tg::vjp(tg::grid(-2, -3), doubled, tg::in("x", x), tg::out("y", y, dy),
                             tg::inout("z", z, dz)),
               std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// One element-type rule in every mode
// ---------------------------------------------------------------------------------------------

static_assert(std::is_same_v<tg::promote_t<float, double>, double>);
static_assert(std::is_same_v<tg::promote_t<tg::adjoint<float>, double>, tg::adjoint<double>>);
static_assert(std::is_same_v<tg::promote_t<double, tg::dual<float, 2>>, tg::dual<double, 2>>);
static_assert(std::is_same_v<tg::promote_t<tg::adjoint<float>, float>, tg::adjoint<float>>);
static_assert(std::is_same_v<tg::promote_t<tg::adjoint<double>, float>, tg::adjoint<double>>);
static_assert(std::is_same_v<tg::promote_t<tg::adjoint<float>, std::int64_t>, tg::adjoint<float>>);

// y = max(x * c + x * x, m) with c a double tile of 0.1 (not a float): the sum is fp64 in every
// mode; m = full<fp32<T>>(-INFINITY) is a rank-0 tile in every mode.
template <int BR, int BC>
constexpr auto with_double_tile =
    []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
      auto const rows = p.program_id(0) * BR + tg::arange<0, BR>();
      auto const cols = tg::arange<0, BC>();
      auto const mask = (tg::col(rows) < x.size(0)) & (tg::row(cols) < x.size(1));
      tg::tile<tg::fp32<T>, BR, BC> const a =
          tg::load(x + (tg::col(rows) * x.stride(0) + tg::row(cols)), mask);
      // (The double tile enters as a temporary, held by the expression: a plain tile variable would
      // be read by the reverse sweep after the kernel returned.)
      auto const s = a * tg::full<double, BR, BC>(0.1) + a * a;
      static_assert(std::is_same_v<tg::value_of_t<decltype(s)>, tg::fp64<T>>);
      auto const m = tg::full<tg::fp32<T>>(-INFINITY);
      tg::tile<tg::fp64<T>, BR, BC> const out = tg::maximum(s, m);
      tg::store(y + (tg::col(rows) * y.stride(0) + tg::row(cols)), out, mask);
    };

TEST(OneRuleInEveryMode, DoubleTilesWidenAndFullTakesNumbers) {
  check_gradients<4>(with_double_tile<4, 8>, 6, 10);
}

} // namespace

} // namespace test_scalars_and_offsets
