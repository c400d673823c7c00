// check_backward where the float32 reference takes a branch the float64 one does not: a relu whose
// pre-activation rounds to exactly 0 in float, a maximum whose two largest candidates tie only
// after rounding. There the fp32 reference is off by a whole term of the gradient, about 1 / u
// units; taken as the measure of what rounding does to the band of rows around it, it raised k to
// tens of millions for every element of the band and let any bug there pass. Such an element is
// judged alone, and the rest of its band by what the rest shows.
#include <tilegrad/check/gtest.hpp>
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_branch_flips {

namespace tg = tilegrad;

namespace {

void fill(tg::owned_tensor<float>& t, unsigned seed, float lo = -1, float hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  for (float& v : t)
    v = d(rng);
}

// y = relu(c @ w + b) for c (M, K), w (K, N), b (N): a matmul with a bias-and-relu epilogue, one
// program per BM rows (N and K in one tile each); a leaky relu where `slope` is not 0.
constexpr int BM = 16, BN = 128, BK = 32;
constexpr auto linear_relu_fwd = []<class T>(tg::program const& p, tg::tensor<T const> c,
                                             tg::tensor<T const> w, tg::tensor<T const> b,
                                             tg::tensor<T> y, float slope) {
  int const M = static_cast<int>(c.size(0)), K = static_cast<int>(c.size(1));
  int const N = static_cast<int>(w.size(1));
  auto const rows = p.program_id(0) * BM + tg::arange<0, BM>();
  auto const ks = tg::arange<0, BK>();
  auto const cols = tg::arange<0, BN>();
  auto const c_tile = tg::load(c + (tg::col(rows) * K + tg::row(ks)),
                               (tg::col(rows) < M) & (tg::row(ks) < K), 0.0f);
  auto const w_tile = tg::load(w + (tg::col(ks) * N + tg::row(cols)),
                               (tg::col(ks) < K) & (tg::row(cols) < N), 0.0f);
  auto const bias = tg::load(b + cols, cols < N, 0.0f);
  auto const z = tg::dot(c_tile, w_tile) + tg::row(bias);
  tg::store(y + (tg::col(rows) * N + tg::row(cols)), tg::where(z > 0.0f, z, z * slope),
            (tg::col(rows) < M) & (tg::row(cols) < N));
};

// Bugs planted in the epilogue's backward.
struct epilogue_bugs {
  int db_column = -1;      // db of this column times (1 + db_off)
  double db_off = 0;
  double dc_off = 0;       // dc at (flip_row + 1, 3) times (1 + dc_off)
  int dw_element = -1;     // dw at this flat index times 1.01
};

constexpr std::int64_t M = 50, N = 96, K = 24;
constexpr std::int64_t flip_row = 3, flip_col = 5;

// check_backward of the epilogue with c, w and b given, planted so that z at (flip_row, flip_col)
// is 0.900000036f * 0.333333343f - 0.300000012f: exactly 0 in float, 7.5e-9 in double. The
// backward runs on the host in float, taking relu's branch where the forward's float z does.
tg::check_report check_epilogue(epilogue_bugs bugs, float slope = 0) {
  tg::owned_tensor<float> c({M, K}, "c"), w({K, N}, "w"), b({N}, "b"), y({M, N}, "y");
  fill(c, 1);
  fill(w, 2);
  fill(b, 3);
  for (std::int64_t k = 0; k < K; ++k)
    c(flip_row, k) = 0;
  c(flip_row, 0) = 0.900000036f;
  w(0, flip_col) = 0.333333343f;
  b(flip_col) = -0.300000012f;
  return tg::check_backward(
      tg::forward(static_cast<int>(tg::cdiv<std::int64_t>(M, BM)), linear_relu_fwd, tg::in("c", c),
                  tg::in("w", w), tg::in("b", b), tg::out("y", y), slope),
      [bugs, slope](tg::backward_context<float>& ctx) {
        auto const ci = ctx.input("c"), wi = ctx.input("w"), bi = ctx.input("b");
        auto const dy = ctx.cotangent("y");
        tg::owned_tensor<float> dc({M, K}), dw({K, N}), db({N});
        std::vector<float> dz(static_cast<std::size_t>(M * N));
        for (std::int64_t i = 0; i < M; ++i)
          for (std::int64_t j = 0; j < N; ++j) {
            float z = 0;
            for (std::int64_t k = 0; k < K; ++k)
              z += ci(i, k) * wi(k, j);
            z += bi(j);
            dz[static_cast<std::size_t>(i * N + j)] = z > 0 ? dy(i, j) : dy(i, j) * slope;
          }
        for (std::int64_t i = 0; i < M; ++i)
          for (std::int64_t k = 0; k < K; ++k) {
            float s = 0;
            for (std::int64_t j = 0; j < N; ++j)
              s += dz[static_cast<std::size_t>(i * N + j)] * wi(k, j);
            dc(i, k) = s;
          }
        for (std::int64_t k = 0; k < K; ++k)
          for (std::int64_t j = 0; j < N; ++j) {
            float s = 0;
            for (std::int64_t i = 0; i < M; ++i)
              s += ci(i, k) * dz[static_cast<std::size_t>(i * N + j)];
            dw(k, j) = s;
          }
        for (std::int64_t j = 0; j < N; ++j) {
          float s = 0;
          for (std::int64_t i = 0; i < M; ++i)
            s += dz[static_cast<std::size_t>(i * N + j)];
          db(j) = s;
        }
        if (bugs.db_column >= 0)
          db(bugs.db_column) *= static_cast<float>(1 + bugs.db_off);
        dc(flip_row + 1, 3) *= static_cast<float>(1 + bugs.dc_off);
        if (bugs.dw_element >= 0)
          dw.data()[bugs.dw_element] *= 1.01f;
        return tg::gradient_set{{"c", dc}, {"w", dw}, {"b", db}};
      },
      {.seeds = 2, .given = {"c", "w", "b"}});
}

// y[r] = max_j x[r, j] * s[0] for x (Rows, Cols), s one element.
constexpr std::int64_t Rows = 50, Cols = 100;
constexpr int Tile = 128;
constexpr auto scaled_rowmax_fwd = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                               tg::tensor<T const> s, tg::tensor<T> y) {
  int const r = p.program_id(0);
  auto const cols = tg::arange<0, Tile>();
  auto const v = tg::load(x + r * Cols + cols, cols < Cols, -INFINITY);
  tg::tile<T> const scale = tg::load(s + 0);
  tg::store(y + r, tg::max(v * scale));
};

constexpr std::int64_t tie_row = 7;

// The row maximum with x(7, 10) = 0.899999976f and x(7, 11) = 0.900000036f, s = 0.333333343f:
// both products round to 0.300000012f (the first wins in float), the second is larger in double.
// The backward (host, float) sends dy to the first largest product, drops the gradient of row
// `dropped_row` (-1: none), and scales that of the tied row by `tie_scale` (1: correct).
tg::check_report check_near_tie(std::int64_t dropped_row, float tie_scale = 1,
                                double k_saved = 2) {
  tg::owned_tensor<float> x({Rows, Cols}, "x"), s({1}, "s"), y({Rows}, "y");
  fill(x, 4);
  for (std::int64_t j = 0; j < Cols; ++j)
    x(tie_row, j) = std::min(x(tie_row, j), 0.5f);
  x(tie_row, 10) = 0.899999976f;
  x(tie_row, 11) = 0.900000036f;
  s(0) = 0.333333343f;
  return tg::check_backward(
      tg::forward(static_cast<int>(Rows), scaled_rowmax_fwd, tg::in("x", x), tg::in("s", s),
                  tg::out("y", y)),
      [dropped_row, tie_scale](tg::backward_context<float>& ctx) {
        auto const xi = ctx.input("x"), si = ctx.input("s");
        auto const dy = ctx.cotangent("y");
        tg::owned_tensor<float> dx({Rows, Cols}), ds({1});
        float ds_sum = 0;
        for (std::int64_t r = 0; r < Rows; ++r) {
          std::int64_t arg = 0;
          for (std::int64_t j = 1; j < Cols; ++j)
            if (xi(r, j) * si(0) > xi(r, arg) * si(0))
              arg = j;
          for (std::int64_t j = 0; j < Cols; ++j)
            dx(r, j) = j == arg && r != dropped_row ? dy(r) * si(0) : 0.0f;
          ds_sum += dy(r) * xi(r, arg);
          if (r == tie_row)
            dx(r, arg) *= tie_scale;
        }
        ds(0) = ds_sum;
        return tg::gradient_set{{"x", dx}, {"s", ds}};
      },
      {.seeds = 2, .k_saved = k_saved, .given = {"x", "s"}});
}

// The row maximum over inputs in quarters (exact ties in most rows, in both precisions); the
// backward sends dy to the first largest element, or with `last` to the last one.
tg::check_report check_exact_ties(bool last) {
  tg::owned_tensor<float> x({Rows, Cols}, "x"), s({1}, "s"), y({Rows}, "y");
  fill(x, 5);
  for (float& v : x)
    v = std::round(v * 4) / 4;
  s(0) = 1;
  return tg::check_backward(
      tg::forward(static_cast<int>(Rows), scaled_rowmax_fwd, tg::in("x", x), tg::in("s", s),
                  tg::out("y", y)),
      [last](tg::backward_context<float>& ctx) {
        auto const xi = ctx.input("x");
        auto const dy = ctx.cotangent("y");
        tg::owned_tensor<float> dx({Rows, Cols}), ds({1});
        float ds_sum = 0;
        for (std::int64_t r = 0; r < Rows; ++r) {
          std::int64_t arg = 0;
          for (std::int64_t j = 1; j < Cols; ++j)
            if (last ? xi(r, j) >= xi(r, arg) : xi(r, j) > xi(r, arg))
              arg = j;
          for (std::int64_t j = 0; j < Cols; ++j)
            dx(r, j) = j == arg ? dy(r) : 0.0f;
          ds_sum += dy(r) * xi(r, arg);
        }
        ds(0) = ds_sum;
        return tg::gradient_set{{"x", dx}, {"s", ds}};
      },
      {.seeds = 1, .given = {"x", "s"}});
}

} // namespace

TEST(BranchFlips, AReluWhosePreActivationRoundsToZeroIsJudgedAlone) {
  // A relu, whose other branch drops the term (the counts of terms differ), and a leaky relu,
  // whose branches both count one (the whole term is off all the same).
  for (float slope : {0.0f, 0.01f}) {
    // The correct backward passes: at the flipped elements it takes float's branch, as the fp32
    // reference does.
    auto const ok = check_epilogue({}, slope);
    EXPECT_BACKWARD_OK(ok) << slope;
    EXPECT_NE(ok.str().find("judged alone (another branch in the fp32 reference): (3, 0) kernel"),
              std::string::npos)
        << ok;
    // Bugs in the same bands as the flipped elements fail, each naming its gradient.
    auto const db_bug = check_epilogue({.db_column = flip_col + 7, .db_off = 1e-3}, slope);
    auto const dc_bug = check_epilogue({.dc_off = 1e-3}, slope);
    auto const dw_bug = check_epilogue({.dw_element = 2 * static_cast<int>(N) + flip_col}, slope);
    for (auto const& [report, name] :
         {std::pair{&db_bug, "b"}, std::pair{&dc_bug, "c"}, std::pair{&dw_bug, "w"}}) {
      EXPECT_FALSE(report->ok()) << slope << " " << name << "\n" << *report;
      ASSERT_FALSE(report->seeds.empty());
      for (auto const& g : report->seeds[0].gradients)
        EXPECT_EQ(g.ok, g.name != name) << slope << " " << g.name << "\n" << *report;
    }
  }
}

TEST(BranchFlips, AMaximumThatTiesOnlyInFloatIsJudgedAlone) {
  auto const ok = check_near_tie(-1);
  EXPECT_BACKWARD_OK(ok);
  // A row dropped in the band of the tie (rows 6-11) fails, as one elsewhere does.
  for (std::int64_t row : {9, 30}) {
    auto const bad = check_near_tie(row);
    EXPECT_FALSE(bad.ok()) << row << "\n" << bad;
  }
  // The tied elements are judged alone and the report names them: either branch passes (the
  // float64 one: dy to the second), a gradient there 1 % off both fails. (Without the second look:
  // moving the inputs by an ulp moves the kernel's tie by its whole size, and that look allows
  // k_saved times the move.)
  EXPECT_NE(ok.str().find("judged alone (another branch in the fp32 reference): (7, 10) kernel"),
            std::string::npos)
      << ok;
  EXPECT_BACKWARD_OK(check_near_tie(-1, 1, 0));
  auto const off = check_near_tie(-1, 1.01f, 0);
  EXPECT_FALSE(off.ok()) << off;
}

TEST(BranchFlips, ExactTiesBrokenAnotherWayAreNamedInAHint) {
  // Exact ties are no flip (both references send dy to the first element): a backward that picks
  // the last one fails where nothing reaches in the reference, and the hint says what that means.
  auto const first = check_exact_ties(false);
  EXPECT_BACKWARD_OK(first);
  auto const last = check_exact_ties(true);
  EXPECT_FALSE(last.ok()) << last;
  EXPECT_TRUE(last.mentions("the mismatches of 'x' are at elements nothing reaches")) << last;
  // A bug elsewhere too: no such hint.
  auto const dropped = check_near_tie(30);
  EXPECT_FALSE(dropped.mentions("nothing reaches")) << dropped;
}

} // namespace test_branch_flips
