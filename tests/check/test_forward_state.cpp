// What each run of the forward starts from, and a forward that makes NaN. Every run of the
// forward under check_backward (each seed's float forward, each reference) starts with the
// outputs zeroed and the unmarked tensors it writes as the caller gave them: a forward that adds
// into its output atomically (Triton's split-N sum) hands every seed's backward the forward's
// own value, and one that takes tickets from an integer counter finds it at 0 in the references
// too. A forward that makes NaN is named as the cause, before the NaN gradients it leads to. And
// the linearity check excuses what the order of atomic additions explains, as the determinism
// check does, so a wrong element whose reference is 0 is not also called "not linear".
#include <tilegrad/check/gtest.hpp>
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_forward_state {

namespace tg = tilegrad;

namespace {

constexpr int BN = 32;

// y[r] = sum_j x[r, j]^2, two programs per row (columns split in halves), each adding its part
// with atomic_add into y, which the host zeroes first in Triton.
constexpr auto split_sum = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                       tg::tensor<T> y) {
  std::int64_t const r = p.program_id(0), n = x.size(1), half = (n + 1) / 2;
  std::int64_t const c0 = p.program_id(1) * half, c1 = std::min(n, c0 + half);
  auto acc = tg::zeros<T>();
  for (std::int64_t c = c0; c < c1; c += BN) {
    auto const cols = c + tg::arange<0, BN>();
    tg::tile<T, BN> const v = tg::load(x + r * x.stride(0) + cols, cols < c1, 0.0f);
    acc += tg::sum(v * v);
  }
  (void)tg::atomic_add(y + r, acc);
};

// dx = 2 x dy * (y / sum x^2): the forward's y read back, 1 when it is this seed's.
constexpr auto split_sum_bwd = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                           tg::tensor<T const> y, tg::tensor<T const> dy,
                                           tg::tensor<T> dx) {
  std::int64_t const r = p.program_id(0), n = x.size(1);
  auto s = tg::zeros<T>();
  for (std::int64_t c = 0; c < n; c += BN) {
    auto const cols = c + tg::arange<0, BN>();
    tg::tile<T, BN> const v = tg::load(x + r * x.stride(0) + cols, cols < n, 0.0f);
    s += tg::sum(v * v);
  }
  tg::tile<T> const scale = 2.0f * tg::load(dy + r) * tg::load(y + r) / s;
  for (std::int64_t c = 0; c < n; c += BN) {
    auto const cols = c + tg::arange<0, BN>();
    auto const mask = cols < n;
    tg::store(dx + r * dx.stride(0) + cols,
              tg::load(x + r * x.stride(0) + cols, mask, 0.0f) * scale, mask);
  }
};

// y[t, :] = x[t, :]^2 for the row t of the ticket each program takes from `counter`.
constexpr auto ticket_square = []<class T>(tg::program const&, tg::tensor<T const> x,
                                           tg::tensor<T> y, tg::tensor<int> counter) {
  std::int64_t const t = tg::atomic_add(counter + 0, 1).item(), n = x.size(1);
  for (std::int64_t c = 0; c < n; c += BN) {
    auto const cols = c + tg::arange<0, BN>();
    auto const mask = cols < n;
    tg::tile<T, BN> const v = tg::load(x + t * x.stride(0) + cols, mask, 0.0f);
    tg::store(y + t * y.stride(0) + cols, v * v, mask);
  }
};

// y = x log(x), unguarded: NaN where x < 0, and so is its derivative log(x) + 1; with
// `plain_log`, y = log(x), whose derivative 1 / x is finite everywhere.
constexpr auto log_rows = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                      tg::tensor<T> y, int plain_log) {
  auto const i = p.program_id(0) * std::int64_t{BN} + tg::arange<0, BN>();
  auto const mask = i < x.size(0);
  tg::tile<T, BN> const v = tg::load(x + i, mask, 1.0f);
  tg::tile<T, BN> const l = tg::log(v);
  tg::store(y + i, plain_log ? l : tg::tile<T, BN>(v * l), mask);
};

// Embedding lookup y[t, :] = w[ids[t], :]; ids[t] = 0 is padding, which reads zeros.
constexpr int D = 16;
constexpr auto embed = []<class T>(tg::program const& p, tg::tensor<int const> ids,
                                   tg::tensor<T const> w, tg::tensor<T> y) {
  std::int64_t const t = p.program_id(0);
  int const id = tg::load(ids + t).item();
  auto const cols = tg::arange<0, D>();
  tg::store(y + t * D + cols, tg::load(w + id * D + cols, cols < (id != 0 ? D : 0), 0.0f));
};

// Its backward with the padding mask forgotten: the pad row gets gradient, where the reference
// is 0. Calls after the first take the tokens in reverse order, so the run on doubled
// cotangents adds the pad row's contributions in another order than the first.
struct embed_backward_no_pad_mask {
  tg::tensor<int const> ids;
  int* calls;
  tg::gradient_set operator()(tg::backward_context<float>& ctx) const {
    auto const dy = ctx.cotangent("y");
    std::int64_t const m = ids.size(0);
    tg::owned_tensor<float> dw({ctx.input("w").size(0), D}, "dw");
    int const reversed = (*calls)++ > 0;
    tg::launch(ctx.options(), m,
               []<class T>(tg::program const& p, tg::tensor<int const> id, tg::tensor<T const> g,
                           tg::tensor<T> out, int rev) {
                 std::int64_t const t = rev ? id.size(0) - 1 - p.program_id(0) : p.program_id(0);
                 auto const cols = tg::arange<0, D>();
                 (void)tg::atomic_add(out + tg::load(id + t).item() * D + cols,
                                      tg::load(g + t * D + cols));
               },
               ids, dy, dw.view(), reversed);
    return {{"w", dw}};
  }
};

} // namespace

TEST(ForwardState, AnOutputAddedAtomicallyIsTheForwardsOwnOnEverySeed) {
  std::int64_t const m = 37, n = 101;
  tg::owned_tensor<float> x({m, n}), y({m});
  int calls = 0, stale = 0; // backward calls, and those that found y off the row's sum
  auto const bwd = [&](tg::backward_context<float>& ctx) -> tg::gradient_set {
    ++calls;
    auto const xs = ctx.input("x");
    double s = 0;
    for (std::int64_t j = 0; j < n; ++j)
      s += double(xs(0, j)) * xs(0, j);
    stale += !(std::abs(ctx.output("y")(0) - s) <= 1e-5 * s);
    tg::owned_tensor<float> dx({m, n});
    tg::launch(ctx.options(), m, split_sum_bwd, ctx.input("x"), ctx.output("y"),
               ctx.cotangent("y"), dx.view());
    return {{"x", dx}};
  };
  auto const r = tg::check_backward(
      tg::forward(tg::grid{int(m), 2}, split_sum, tg::in("x", x), tg::out("y", y)), bwd,
      {.seeds = 3});
  EXPECT_BACKWARD_OK(r);
  EXPECT_GE(calls, 3);
  EXPECT_EQ(stale, 0);
}

TEST(ForwardState, TicketsFromAnIntegerCounterStartAtZeroInEveryRun) {
  std::int64_t const m = 45, n = 70;
  tg::owned_tensor<float> x({m, n}), y({m, n});
  tg::owned_tensor<int> counter({1}, "counter");
  auto const bwd = [&](tg::backward_context<float>& ctx) -> tg::gradient_set {
    tg::owned_tensor<float> dx({m, n});
    auto const xs = ctx.input("x");
    auto const dy = ctx.cotangent("y");
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j)
        dx(i, j) = 2 * xs(i, j) * dy(i, j);
    return {{"x", dx}};
  };
  auto const r = tg::check_backward(
      tg::forward(m, ticket_square, tg::in("x", x), tg::out("y", y), counter.view()), bwd,
      {.seeds = 2});
  EXPECT_BACKWARD_OK(r);
  EXPECT_EQ(counter.data()[0], m); // as the last forward left it, starting from 0
}

TEST(ForwardState, AForwardThatMakesNanIsNamedFirst) {
  std::int64_t const n = 77;
  tg::owned_tensor<float> x({n}), y({n});
  auto const bwd_of = [&](int plain_log) {
    return [&, plain_log](tg::backward_context<float>& ctx) -> tg::gradient_set {
      tg::owned_tensor<float> dx({n});
      auto const xs = ctx.input("x");
      auto const dy = ctx.cotangent("y");
      for (std::int64_t i = 0; i < n; ++i)
        dx(i) = plain_log ? dy(i) / xs(i) : dy(i) * (std::log(xs(i)) + 1);
      return {{"x", dx}};
    };
  };
  auto const fwd = [&](int plain_log) {
    return tg::forward(tg::cdiv(n, BN), log_rows, tg::in("x", x), tg::out("y", y), plain_log);
  };
  auto const r = tg::check_backward(fwd(0), bwd_of(0), {.seeds = 1});
  EXPECT_FALSE(r);
  ASSERT_FALSE(r.seeds.empty());
  ASSERT_FALSE(r.seeds[0].problems.empty());
  EXPECT_EQ(r.seeds[0].problems[0].rfind("the forward's output 'y' holds ", 0), 0u) << r;
  EXPECT_FALSE(r.mentions("all zeros")) << r;
  EXPECT_FALSE(r.mentions("not linear")) << r;
  // Gradients that stay finite (of log alone) pass, with the forward's NaN as a warning.
  auto const finite = tg::check_backward(fwd(1), bwd_of(1), {.seeds = 1});
  EXPECT_BACKWARD_OK(finite);
  EXPECT_TRUE(finite.mentions("the forward's output 'y' holds ")) << finite;
  // On positive inputs neither says anything of it.
  auto const ok = tg::check_backward(fwd(0), bwd_of(0), {.seeds = 1, .inputs = tg::uniform(0.5, 2)});
  EXPECT_BACKWARD_OK(ok);
  EXPECT_FALSE(ok.mentions("NaN")) << ok;
}

// An output that holds -inf by design (log of a clamp at 0, as a logsumexp of a row with no
// key), and gradients that stay finite: a warning that names the infinite elements, without
// saying the references and gradients are NaN (they are not, and the check passes).
TEST(ForwardState, InfiniteOutputsAreNotCalledNan) {
  std::int64_t const n = 77;
  tg::owned_tensor<float> x({n}), y({n});
  auto const clamp_log = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const i = p.program_id(0) * std::int64_t{BN} + tg::arange<0, BN>();
    auto const mask = i < x.size(0);
    tg::tile<T, BN> const v = tg::load(x + i, mask, 1.0f);
    tg::store(y + i, tg::log(tg::where(v > 0.0f, v, 0.0f)), mask);
  };
  auto const r =
      tg::check_backward(tg::forward(tg::cdiv(n, BN), clamp_log, tg::in("x", x), tg::out("y", y)),
                         [&](tg::backward_context<float>& ctx) -> tg::gradient_set {
                           tg::owned_tensor<float> dx({n});
                           auto const xs = ctx.input("x");
                           auto const dy = ctx.cotangent("y");
                           for (std::int64_t i = 0; i < n; ++i)
                             dx(i) = xs(i) > 0 ? dy(i) / xs(i) : 0.0f;
                           return {{"x", dx}};
                         },
                         {.seeds = 1});
  EXPECT_BACKWARD_OK(r);
  EXPECT_TRUE(r.mentions("the forward's output 'y' holds ")) << r;
  EXPECT_TRUE(r.mentions(" infinite element(s), the first at (")) << r;
  EXPECT_FALSE(r.mentions("are then NaN")) << r;
}

TEST(ForwardState, AtomicReorderingIsNoNonLinearity) {
  std::int64_t const v = 6, m = 300;
  tg::owned_tensor<int> ids({m}, "ids");
  for (std::int64_t t = 0; t < m; ++t)
    ids.data()[t] = t % 3 == 0 ? 0 : static_cast<int>(1 + t % (v - 1));
  tg::owned_tensor<float> w({v, D}), y({m, D});
  int calls = 0;
  auto const r = tg::check_backward(
      tg::forward(m, embed, ids.cview(), tg::in("w", w), tg::out("y", y)),
      embed_backward_no_pad_mask{ids.cview(), &calls}, {.seeds = 1, .check_determinism = false});
  EXPECT_FALSE(r);
  EXPECT_EQ(r.gradient("w")->mismatches, D) << r; // the pad row only
  EXPECT_FALSE(r.mentions("not linear")) << r;
  EXPECT_GE(calls, 3); // the first run, zero and doubled cotangents (and the second look)
}

} // namespace test_forward_state
