// vjp of whole kernels: the example kernels against closed-form gradients (float and double,
// shapes that do not divide the tiles), the memory semantics one by one, determinism across
// thread counts, and the errors and flags for bad input.
#include <tilegrad/kernels/flash_attention.hpp>
#include <tilegrad/kernels/matmul.hpp>
#include <tilegrad/kernels/softmax.hpp>
#include <tilegrad/kernels/weighted_sum.hpp>
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include "../support/tensors.hpp"

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_vjp {

namespace tg = tilegrad;
using test_support::fill;
using test_support::tol;

template <class T>
class Vjp : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Vjp, Types);

TYPED_TEST(Vjp, WeightedSumMatchesClosedForm) {
  using T = TypeParam;
  for (auto [n, d] : {std::pair{1, 1}, {37, 70}, {50, 129}}) {
    tg::owned_tensor<T> x({n, d}, "x"), w({d}, "w"), y({n}, "y"), dy({n}, "dy");
    fill(x, 1);
    fill(w, 2);
    fill(dy, 3);
    auto g = tg::vjp(tg::cdiv(n, 16), tg::kernels::weighted_sum_fwd<16, 32>, tg::in("x", x),
                     tg::in("w", w), tg::out("y", y, dy));
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < d; ++j)
        ASSERT_NEAR(g["x"](i, j), double(dy(i)) * w(j), tol<T>()) << "dx(" << i << ", " << j << ")";
    for (int j = 0; j < d; ++j) {
      double r = 0;
      for (int i = 0; i < n; ++i)
        r += double(dy(i)) * x(i, j);
      ASSERT_NEAR(g["w"](j), r, tol<T>() * n) << "dw(" << j << ") n=" << n << " d=" << d;
    }
    // The forward ran too: y holds x @ w.
    for (int i = 0; i < n; ++i) {
      double r = 0;
      for (int j = 0; j < d; ++j)
        r += double(x(i, j)) * w(j);
      ASSERT_NEAR(y(i), r, tol<T>() * d);
    }
  }
}

TYPED_TEST(Vjp, SoftmaxMatchesClosedForm) {
  using T = TypeParam;
  for (auto [n, d] : {std::pair{1, 1}, {9, 37}, {20, 128}}) {
    tg::owned_tensor<T> x({n, d}, "x"), y({n, d}, "y"), dy({n, d}, "dy");
    fill(x, 4);
    fill(dy, 5);
    auto g = tg::vjp(n, tg::kernels::softmax_fwd<128>, tg::in("x", x), tg::out("y", y, dy));
    for (int i = 0; i < n; ++i) {
      double s = 0;
      for (int j = 0; j < d; ++j)
        s += double(dy(i, j)) * y(i, j);
      for (int j = 0; j < d; ++j)
        ASSERT_NEAR(g["x"](i, j), y(i, j) * (dy(i, j) - s), tol<T>())
            << "dx(" << i << ", " << j << ") n=" << n << " d=" << d;
    }
  }
}

TYPED_TEST(Vjp, MatmulMatchesClosedForm) {
  using T = TypeParam;
  struct dims {
    int m, k, n;
  };
  for (auto [M, K, N] : {dims{1, 1, 1}, dims{33, 17, 45}, dims{64, 40, 32}}) {
    tg::owned_tensor<T> a({M, K}, "a"), b({K, N}, "b"), c({M, N}, "c"), dc({M, N}, "dc");
    fill(a, 6);
    fill(b, 7);
    fill(dc, 8);
    auto g = tg::vjp(tg::cdiv(M, 32) * tg::cdiv(N, 32), tg::kernels::matmul_fwd<32, 32, 16, 2>,
                     tg::in("a", a), tg::in("b", b), tg::out("c", c, dc));
    for (int i = 0; i < M; ++i)
      for (int k = 0; k < K; ++k) {
        double r = 0;
        for (int j = 0; j < N; ++j)
          r += double(dc(i, j)) * b(k, j);
        ASSERT_NEAR(g["a"](i, k), r, tol<T>() * N) << "da(" << i << ", " << k << ")";
      }
    for (int k = 0; k < K; ++k)
      for (int j = 0; j < N; ++j) {
        double r = 0;
        for (int i = 0; i < M; ++i)
          r += double(a(i, k)) * dc(i, j);
        ASSERT_NEAR(g["b"](k, j), r, tol<T>() * M) << "db(" << k << ", " << j << ")";
      }
  }
}

TEST(VjpDeterminism, BitwiseIdenticalForAnyThreadCount) {
  // Every program adds into all of dw: the accumulation order must not depend on threads.
  int const n = 300, d = 70;
  tg::owned_tensor<float> x({n, d}, "x"), w({d}, "w"), y({n}, "y"), dy({n}, "dy");
  fill(x, 1);
  fill(w, 2);
  fill(dy, 3);
  auto run = [&](tg::executor e, int threads) {
    auto g = tg::vjp({e, threads}, tg::cdiv(n, 16), tg::kernels::weighted_sum_fwd<16, 32>,
                     tg::in("x", x), tg::in("w", w), tg::out("y", y, dy));
    return tg::owned_tensor<float>(g["w"]);
  };
  auto const ref = run(tg::executor::sequential, 1);
  std::vector<std::pair<tg::executor, int>> configs{{tg::executor::sequential, 1}};
  if (tg::executor_available(tg::executor::tbb))
    configs.insert(configs.end(),
                   {{tg::executor::tbb, 1}, {tg::executor::tbb, 2}, {tg::executor::tbb, 0}});
  if (tg::executor_available(tg::executor::openmp))
    configs.push_back({tg::executor::openmp, 2});
  for (auto [e, t] : configs)
    for (int rep = 0; rep < 2; ++rep) {
      auto const got = run(e, t);
      EXPECT_EQ(std::memcmp(got.data(), ref.data(), sizeof(float) * d), 0)
          << tg::to_string(e) << " threads " << t;
    }
}

TEST(VjpDeterminism, GradientsLargerThanTheCachesAreWrittenPastIt) {
  // dx of 2100 x 1030 floats (8.6 MB) is large enough that its first writes stream past the
  // cache; rows of 1030 elements make runs that cover some 64-element words whole (streamed)
  // and split others between two programs (written by one, added to by the next).
  int const n = 2100, d = 1030;
  tg::owned_tensor<float> x({n, d}, "x"), w({d}, "w"), y({n}, "y"), dy({n}, "dy");
  fill(x, 4);
  fill(w, 5);
  fill(dy, 6);
  auto run = [&](tg::launch_options o) {
    return tg::vjp(o, tg::cdiv(n, 16), tg::kernels::weighted_sum_fwd<16, 64>, tg::in("x", x),
                   tg::in("w", w), tg::out("y", y, dy));
  };
  auto const ref = run({tg::executor::sequential, 1});
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < d; ++j)
      ASSERT_EQ(ref["x"](i, j), dy(i) * w(j)) << "dx(" << i << ", " << j << ")";
  if (!tg::executor_available(tg::executor::tbb))
    return;
  for (int threads : {2, 0}) {
    auto const got = run({tg::executor::tbb, threads});
    for (char const* name : {"x", "w"})
      EXPECT_EQ(std::memcmp(got[name].data(), ref[name].data(), sizeof(float) * got[name].numel()),
                0)
          << name << ", threads " << threads;
  }
}

TEST(VjpDeterminism, OverlappingContributionsAreWrittenThenAddedInProgramOrder) {
  // Program p reads a window of 13 elements at 5p (windows overlap, and straddle the 64-element
  // words of the gradient's bookkeeping) and 4 elements 70 apart from p: every element's first
  // contribution is written, the later ones added; elements no program reads are zero.
  auto k = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y,
                       tg::tensor<T> z) {
    auto const i = tg::arange<0, 16>();
    auto const m = i < 13;
    auto const v = tg::load(x + p.program_id(0) * 5 + i, m, 0.0f);
    tg::store(y + p.program_id(0) * 16 + i, v * v, m);
    auto const j = tg::arange<0, 4>();
    tg::store(z + p.program_id(0), tg::sum(tg::load(x + p.program_id(0) + j * 70)));
  };
  int const progs = 150, n = 760; // more than one wave
  tg::owned_tensor<float> x({n}, "x"), y({progs * 16}, "y"), dy({progs * 16}, "dy"), z({progs}, "z"),
      dz({progs}, "dz");
  fill(x, 4);
  fill(dy, 5);
  fill(dz, 6);
  auto run = [&](tg::executor e, int threads) {
    auto g = tg::vjp({e, threads}, progs, k, tg::in("x", x), tg::out("y", y, dy), tg::out("z", z, dz));
    return tg::owned_tensor<float>(g["x"]);
  };
  auto const ref = run(tg::executor::sequential, 1);
  for (int e = 0; e < n; ++e) {
    double want = 0;
    for (int p = 0; p < progs; ++p) {
      if (e >= 5 * p && e < 5 * p + 13) want += 2.0 * x(e) * dy(p * 16 + e - 5 * p);
      if (e >= p && (e - p) % 70 == 0 && (e - p) / 70 < 4) want += dz(p);
    }
    ASSERT_NEAR(ref(e), want, 1e-5) << e;
  }
  EXPECT_EQ(ref(758), 0.0f);
  EXPECT_EQ(ref(759), 0.0f);
  std::vector<std::pair<tg::executor, int>> configs{{tg::executor::sequential, 1}};
  if (tg::executor_available(tg::executor::tbb))
    configs.insert(configs.end(), {{tg::executor::tbb, 1}, {tg::executor::tbb, 2}, {tg::executor::tbb, 0}});
  if (tg::executor_available(tg::executor::openmp)) configs.push_back({tg::executor::openmp, 2});
  for (auto [e, t] : configs)
    for (int rep = 0; rep < 3; ++rep) {
      auto const got = run(e, t);
      EXPECT_EQ(std::memcmp(got.data(), ref.data(), sizeof(float) * n), 0)
          << tg::to_string(e) << " threads " << t;
    }
}

namespace {
/// Sets the contribution budget of vjp calls on this thread while it lives.
struct budget_scope {
  std::size_t saved = tg::ad::contribution_budget();
  explicit budget_scope(std::size_t b) { tg::ad::contribution_budget() = b; }
  ~budget_scope() { tg::ad::contribution_budget() = saved; }
};
} // namespace

TEST(VjpDeterminism, AttentionWhereEveryProgramAddsToAllOfDkAndDv) {
  // Non-causal FlashAttention: every query-tile program of a head adds to every element of dk and
  // dv of that head. 1100 keys (not a multiple of the tiles) x 16 = 17600 elements per head: a
  // program's contributions span more than one block of gradient elements and more than one
  // chunk of held memory; 2 x 69 programs, more than one wave. Sums in another order than the
  // sequential launch's (program order) would change the last bits.
  constexpr int D = 16, BQ = 16, BK = 16;
  int const h = 2, n = 1100;
  tg::owned_tensor<float> q({1, h, n, D}, "q"), k({1, h, n, D}, "k"), v({1, h, n, D}, "v"),
      o({1, h, n, D}, "o"), d_o({1, h, n, D}, "d_o"), lse({1, h, n}, "lse");
  fill(q, 7);
  fill(k, 8);
  fill(v, 9);
  fill(d_o, 10);
  auto const kernel = tg::kernels::flash_attention_fwd<D, BQ, BK, false>;
  auto run = [&](tg::launch_options opts) {
    return tg::vjp(opts, tg::grid(tg::cdiv(n, BQ), h, 1), kernel, tg::in("q", q), tg::in("k", k),
                   tg::in("v", v), tg::out("o", o, d_o), lse.view(), 0.25);
  };
  auto const ref = run({tg::executor::sequential, 1});
  EXPECT_EQ(ref.peak_contribution_bytes(), 0u); // in order: each program adds its own at once
  // The reference itself: dv = P^T do, with P the softmax of 0.25 q k^T (plain loops, double).
  for (int hh = 0; hh < h; ++hh)
    for (int j : {0, 517, n - 1}) {
      double want[D] = {};
      for (int i = 0; i < n; ++i) {
        double m = -1e300, l = 0, sij = 0;
        std::vector<double> s(static_cast<std::size_t>(n));
        for (int jj = 0; jj < n; ++jj) {
          double dotp = 0;
          for (int d = 0; d < D; ++d)
            dotp += double(q(0, hh, i, d)) * double(k(0, hh, jj, d));
          s[static_cast<std::size_t>(jj)] = 0.25 * dotp;
          m = std::max(m, s[static_cast<std::size_t>(jj)]);
        }
        for (int jj = 0; jj < n; ++jj)
          l += std::exp(s[static_cast<std::size_t>(jj)] - m);
        sij = std::exp(s[static_cast<std::size_t>(j)] - m) / l;
        for (int d = 0; d < D; ++d)
          want[d] += sij * double(d_o(0, hh, i, d));
      }
      for (int d = 0; d < D; ++d)
        ASSERT_NEAR(ref["v"](0, hh, j, d), want[d], 1e-4)
            << "dv(" << hh << ", " << j << ", " << d << ")";
    }
  std::vector<tg::launch_options> configs;
  for (int t : {1, 2, 3, 7}) {
    if (tg::executor_available(tg::executor::tbb))
      configs.push_back({tg::executor::tbb, t});
    if (tg::executor_available(tg::executor::openmp))
      configs.push_back({tg::executor::openmp, t});
  }
  if (tg::executor_available(tg::executor::tbb))
    configs.push_back({tg::executor::tbb, 0});
  // Two programs per thread begun and not added, each added alone (budget of 1 byte), and as
  // many as the wave.
  for (std::size_t budget : {std::size_t{1}, std::size_t{64} << 20}) {
    budget_scope const scope(budget);
    for (auto const& c : configs) {
      auto const got = run(c);
      for (char const* name : {"q", "k", "v"})
        EXPECT_EQ(
            std::memcmp(got[name].data(), ref[name].data(), sizeof(float) * got[name].numel()), 0)
            << "d" << name << ", " << tg::to_string(c.exec) << " threads " << c.num_threads
            << ", budget " << budget;
    }
  }
}

TEST(VjpMemoryBound, ContributionsHeldStayWithinTheBudgetWhateverTheGrid) {
  // Each program adds to all of dk and dv of its head: 2 x 1100 x 16 floats, plus its own rows
  // of dq. With a budget of one byte at most two programs per thread are begun and not added,
  // and the memory held is at most that many programs' chunks, for 2 heads as for 6.
  constexpr int D = 16, BQ = 16, BK = 16;
  int const n = 1100;
  auto const kernel = tg::kernels::flash_attention_fwd<D, BQ, BK, false>;
  auto peak = [&](int h, tg::launch_options opts) {
    tg::owned_tensor<float> q({1, h, n, D}, "q"), k({1, h, n, D}, "k"), v({1, h, n, D}, "v"),
        o({1, h, n, D}, "o"), d_o({1, h, n, D}, "d_o"), lse({1, h, n}, "lse");
    fill(q, 1);
    fill(k, 2);
    fill(v, 3);
    fill(d_o, 4);
    return tg::vjp(opts, tg::grid(tg::cdiv(n, BQ), h, 1), kernel, tg::in("q", q), tg::in("k", k),
                   tg::in("v", v), tg::out("o", o, d_o), lse.view(), 0.25)
        .peak_contribution_bytes();
  };
  std::size_t const chunk = tg::ad::contribution_pool::chunk_bytes;
  std::size_t const per_program = sizeof(float) * (2 * n * D + BQ * D);
  std::size_t const chunks_per_program = (per_program + chunk - 1) / chunk;
  budget_scope const scope(1);
  for (auto e : {tg::executor::tbb, tg::executor::openmp}) {
    if (!tg::executor_available(e))
      continue;
    for (int t : {2, 3}) {
      // Whether a program holds anything depends on the schedule: one that finds every earlier
      // program's contributions added adds its own at once (on a loaded machine they all may).
      // So the bound is checked on every try, and that something was held on one of several.
      bool held = false;
      for (int attempt = 0; attempt < 20 && !held; ++attempt) {
        std::size_t const two = peak(2, {e, t}), six = peak(6, {e, t});
        held = two > 0 || six > 0;
        EXPECT_LE(two, 2 * t * chunks_per_program * chunk) << tg::to_string(e) << " threads " << t;
        EXPECT_LE(six, 2 * t * chunks_per_program * chunk) << tg::to_string(e) << " threads " << t;
      }
      EXPECT_TRUE(held) << tg::to_string(e) << " threads " << t;
    }
  }
  // The budget bounds what is held: 1 MiB, 7 such programs (5 begun, 2 waiting to be added),
  // never a wave.
  budget_scope const mib(std::size_t{1} << 20);
  if (tg::executor_available(tg::executor::tbb)) {
    EXPECT_LE(peak(2, {tg::executor::tbb, 2}), 7 * chunks_per_program * chunk);
  }
}

TEST(VjpAccumulate, PiecesSplitAtBlocksAddEachElementsContributionsInTheirOrder) {
  // Runs of every kind (step 1, a large step, a negative step, one element repeated) across the
  // boundaries of blocks, split by block and added block by block, against adding the runs one
  // after another, bitwise: the split keeps each element's contributions in order.
  namespace ad = tg::ad;
  constexpr std::int64_t B = ad::gradient_blocks::block_elems;
  std::int64_t const numel = 3 * B + 100;
  std::vector<ad::run> const runs{{0, 300, B - 100, 1},          {0, 20, 5, B / 7},
                                  {0, 18, 2 * B + 30, -(B / 9)}, {0, 9, B, 0},
                                  {0, 2, 3 * B + 99, -1},        {0, 1, 0, 1},
                                  {0, 1000, 2 * B - 500, 1},     {0, 20, B - 1, 0},
                                  {0, 9, 3 * B + 99, -(B / 3)}};
  for (auto const& r : runs) // (every element inside the gradient)
    ASSERT_TRUE(r.element(0) >= 0 && r.element(r.count - 1) >= 0 && r.element(0) < numel &&
                r.element(r.count - 1) < numel);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-1, 1);
  ad::contribution_pool pool;
  ad::held_contributions held;
  std::vector<std::vector<float>> values;
  for (auto const& r : runs) {
    auto& v = values.emplace_back(static_cast<std::size_t>(r.count));
    for (float& x : v)
      x = d(rng);
    held.add(pool, 0, r, v.data());
  }
  auto sink_for = [&](std::vector<float>& g, std::vector<std::uint64_t>& w) {
    g.assign(static_cast<std::size_t>(numel), 0.0f);
    w.assign(static_cast<std::size_t>((numel + 63) / 64), 0);
    return ad::gradient_sink{g.data(), w.data(), false};
  };
  std::vector<float> want, got;
  std::vector<std::uint64_t> ww, wg;
  auto const expected = sink_for(want, ww);
  for (std::size_t i = 0; i < runs.size(); ++i)
    expected.add(runs[i], values[i].data());
  expected.fill_unwritten<float>(numel);
  ad::gradient_blocks blocks;
  blocks.add_tensor(numel);
  std::vector<ad::block_piece> pieces;
  ad::split_by_block<float>(held.segments(), blocks, pieces);
  auto const sink = sink_for(got, wg);
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    auto const& pc = pieces[i];
    ASSERT_TRUE(i == 0 || pieces[i - 1].block <= pc.block);
    for (int k = 0; k < pc.s.r.count; ++k) // every lane of a piece falls in its block
      ASSERT_EQ(pc.s.r.element(k) / B, pc.block) << i;
    sink.add(pc.s.r, static_cast<float const*>(pc.s.values));
  }
  sink.fill_unwritten<float>(numel);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), sizeof(float) * static_cast<std::size_t>(numel)),
            0);
}

/// sum, max and min of exp(x) (a tile on the tape, not an expression) over each axis of a
/// (3, 5, 20) block: the reductions over axes 0 and 1 walk the tile row by row, the last axis
/// along each row. x holds ties along every axis.
constexpr auto reduce_each_axis = []<class T>(tg::program const&, tg::tensor<T const> x,
                                              tg::tensor<T> s0, tg::tensor<T> s1, tg::tensor<T> s2,
                                              tg::tensor<T> m0, tg::tensor<T> m1, tg::tensor<T> m2) {
  using F = tg::fp32<T>;
  tg::tile<F, 3, 5, 20> const e = tg::exp(tg::load(tg::make_block_ptr<3, 5, 20>(x, {0, 0, 0})));
  tg::store(tg::make_block_ptr<5, 20>(s0, {0, 0}), tg::sum<0>(e));
  tg::store(tg::make_block_ptr<3, 20>(s1, {0, 0}), tg::sum<1>(e));
  tg::store(tg::make_block_ptr<3, 5>(s2, {0, 0}), tg::sum<2>(e));
  tg::store(tg::make_block_ptr<5, 20>(m0, {0, 0}), tg::max<0>(e));
  tg::store(tg::make_block_ptr<3, 20>(m1, {0, 0}), tg::min<1>(e));
  tg::store(tg::make_block_ptr<3, 5>(m2, {0, 0}), tg::max<2>(e));
};

TYPED_TEST(Vjp, ReductionsOfTilesOverEachAxisWithTies) {
  // Closed form: each sum sends its cotangent to every element it summed, each max and min to
  // the first element (along its axis) equal to it; all times exp(x).
  using T = TypeParam;
  tg::owned_tensor<T> x({3, 5, 20}, "x"), s0({5, 20}), s1({3, 20}), s2({3, 5}), m0({5, 20}),
      m1({3, 20}), m2({3, 5}), d_s0({5, 20}), d_s1({3, 20}), d_s2({3, 5}), d_m0({5, 20}),
      d_m1({3, 20}), d_m2({3, 5});
  // Values from a set of 4, so that every axis has ties (and lanes where all are equal).
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 5; ++b)
      for (int c = 0; c < 20; ++c) x(a, b, c) = T((a * 7 + b * 3 + c * (c % 3)) % 4) * T(0.25);
  for (int b = 0; b < 5; ++b) x(1, b, 7) = x(0, b, 7) = x(2, b, 7); // a lane equal down axis 0
  fill(d_s0, 41);
  fill(d_s1, 42);
  fill(d_s2, 43);
  fill(d_m0, 44);
  fill(d_m1, 45);
  fill(d_m2, 46);
  auto const g = tg::vjp(1, reduce_each_axis, tg::in("x", x), tg::out("s0", s0, d_s0),
                         tg::out("s1", s1, d_s1), tg::out("s2", s2, d_s2),
                         tg::out("m0", m0, d_m0), tg::out("m1", m1, d_m1), tg::out("m2", m2, d_m2));
  std::vector<double> want(3 * 5 * 20, 0.0);
  auto at = [](int a, int b, int c) { return (a * 5 + b) * 20 + c; };
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 5; ++b)
      for (int c = 0; c < 20; ++c)
        want[at(a, b, c)] += double(d_s0(b, c)) + double(d_s1(a, c)) + double(d_s2(a, b));
  // The index along `axis` of the first largest (smallest) element of the line of x through
  // (a, b, c) along that axis.
  auto first_extreme = [&](int axis, int a, int b, int c, bool largest) {
    int const n = axis == 0 ? 3 : axis == 1 ? 5 : 20;
    auto along = [&](int k) {
      int i[3] = {a, b, c};
      i[axis] = k;
      return x(i[0], i[1], i[2]);
    };
    int best = 0;
    for (int k = 1; k < n; ++k)
      if (largest ? along(k) > along(best) : along(k) < along(best))
        best = k;
    return best;
  };
  for (int b = 0; b < 5; ++b)
    for (int c = 0; c < 20; ++c) // max over a
      want[at(first_extreme(0, 0, b, c, true), b, c)] += double(d_m0(b, c));
  for (int a = 0; a < 3; ++a)
    for (int c = 0; c < 20; ++c) // min over b
      want[at(a, first_extreme(1, a, 0, c, false), c)] += double(d_m1(a, c));
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 5; ++b) // max over c
      want[at(a, b, first_extreme(2, a, b, 0, true))] += double(d_m2(a, b));
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 5; ++b)
      for (int c = 0; c < 20; ++c)
        ASSERT_NEAR(g["x"](a, b, c), want[at(a, b, c)] * std::exp(double(x(a, b, c))), tol<T>() * 8)
            << "dx(" << a << ", " << b << ", " << c << ")";
}

TEST(VjpReduce, SumsOfExpressionsOverEachAxisOfARank3Tile) {
  // y0 = sum over axis 0, y1 over axis 1 (keeping it), y2 over axis 2 of x * w + x, with w a
  // broadcast (4, 8) tile: the sums of a cheap expression go through it without materialising it.
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T const> w,
                       tg::tensor<T> y0, tg::tensor<T> y1, tg::tensor<T> y2) {
    auto const xv = tg::load(tg::make_block_ptr<2, 4, 8>(x, {0, 0, 0}));
    auto const wv = tg::load(tg::make_block_ptr<4, 8>(w, {0, 0}));
    auto const e = xv * tg::expand_dims<0>(wv) + xv;
    tg::store(tg::make_block_ptr<4, 8>(y0, {0, 0}), tg::sum<0>(e));
    tg::store(tg::make_block_ptr<2, 1, 8>(y1, {0, 0, 0}), tg::sum<1>(e, tg::keep_dims));
    tg::store(tg::make_block_ptr<2, 4>(y2, {0, 0}), tg::sum<2>(e));
  };
  tg::owned_tensor<double> x({2, 4, 8}, "x"), w({4, 8}, "w"), y0({4, 8}, "y0"), y1({2, 1, 8}, "y1"),
      y2({2, 4}, "y2"), d0({4, 8}, "d0"), d1({2, 1, 8}, "d1"), d2({2, 4}, "d2");
  fill(x, 7);
  fill(w, 8);
  fill(d0, 9);
  fill(d1, 10);
  fill(d2, 11);
  auto g = tg::vjp(1, k, tg::in("x", x), tg::in("w", w), tg::out("y0", y0, d0), tg::out("y1", y1, d1),
                   tg::out("y2", y2, d2));
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j)
      for (int c = 0; c < 8; ++c) {
        double const dy = d0(j, c) + d1(i, 0, c) + d2(i, j);
        EXPECT_NEAR(g["x"](i, j, c), dy * (w(j, c) + 1), 1e-12) << i << j << c;
      }
  for (int j = 0; j < 4; ++j)
    for (int c = 0; c < 8; ++c) {
      double want = 0;
      for (int i = 0; i < 2; ++i) want += (d0(j, c) + d1(i, 0, c) + d2(i, j)) * x(i, j, c);
      EXPECT_NEAR(g["w"](j, c), want, 1e-12) << j << c;
    }
  for (int j = 0; j < 4; ++j)
    for (int c = 0; c < 8; ++c)
      EXPECT_NEAR(y0(j, c), x(0, j, c) * (w(j, c) + 1) + x(1, j, c) * (w(j, c) + 1), 1e-12);
}

/// y = tanh(dot(trans(x), trans(w), c)) for x (K, M), w (N, K), c (M, N), each transpose read in
/// place (InPlaceX, InPlaceW: as attention's dot(trans(p), v) and dot(q, trans(k))) or made a
/// tile first.
template <bool InPlaceX, bool InPlaceW, int M = 33, int K = 17, int N = 19>
constexpr auto transposed_dot = []<class T>(tg::program const&, tg::tensor<T const> x,
                                            tg::tensor<T const> w, tg::tensor<T const> c,
                                            tg::tensor<T> y) {
  using F = tg::fp32<T>;
  auto const xv = tg::load(tg::make_block_ptr<K, M>(x, {0, 0}));
  auto const wv = tg::load(tg::make_block_ptr<N, K>(w, {0, 0}));
  auto const cv = tg::load(tg::make_block_ptr<M, N>(c, {0, 0}));
  auto const a = [&] {
    if constexpr (InPlaceX)
      return tg::trans(xv);
    else
      return tg::tile<F, M, K>(tg::trans(xv));
  }();
  auto const b = [&] {
    if constexpr (InPlaceW)
      return tg::trans(wv);
    else
      return tg::tile<F, K, N>(tg::trans(wv));
  }();
  tg::store(tg::make_block_ptr<M, N>(y, {0, 0}), tg::tanh(tg::dot(a, b, cv)));
};

/// The gradients of dot(trans(x), trans(w), c) with either transpose read in place must be those
/// of the same product with the transposes made tiles first (other records), and of central
/// differences of the double forward.
template <class T, int M, int K, int N>
void check_transposed_dot() {
  tg::owned_tensor<T> x({K, M}, "x"), w({N, K}, "w"), c({M, N}, "c"), y({M, N}, "y"),
      dy({M, N}, "dy");
  fill(x, 21);
  fill(w, 22);
  fill(c, 23);
  fill(dy, 24);
  auto grads = [&](auto kernel) {
    return tg::vjp(1, kernel, tg::in("x", x), tg::in("w", w), tg::in("c", c), tg::out("y", y, dy));
  };
  auto const want = grads(transposed_dot<false, false, M, K, N>);
  auto const both = grads(transposed_dot<true, true, M, K, N>);
  auto const only_x = grads(transposed_dot<true, false, M, K, N>);
  auto const only_w = grads(transposed_dot<false, true, M, K, N>);
  for (auto [got, variant] : {std::pair{&both, "both in place"}, std::pair{&only_x, "x in place"},
                              std::pair{&only_w, "w in place"}})
    for (char const* name : {"x", "w", "c"})
      for (std::int64_t i = 0; i < want[name].numel(); ++i)
        ASSERT_NEAR((*got)[name].data()[i], want[name].data()[i], tol<T>() * K)
            << "d" << name << " element " << i << ", " << variant;
  // Central differences in double, on a few elements of each input.
  tg::owned_tensor<double> xd({K, M}), wd({N, K}), cd({M, N}), yd({M, N});
  std::copy(x.begin(), x.end(), xd.begin());
  std::copy(w.begin(), w.end(), wd.begin());
  std::copy(c.begin(), c.end(), cd.begin());
  auto loss = [&] {
    tg::launch(1, transposed_dot<true, true, M, K, N>, xd.cview(), wd.cview(), cd.cview(),
               yd.view());
    double l = 0;
    for (std::int64_t i = 0; i < yd.numel(); ++i) l += yd.data()[i] * double(dy.data()[i]);
    return l;
  };
  for (auto [t, name] : {std::pair{&xd, "x"}, std::pair{&wd, "w"}, std::pair{&cd, "c"}})
    for (std::int64_t i : {std::int64_t{0}, t->numel() / 2 + 3, t->numel() - 1}) {
      double const keep = t->data()[i], h = 1e-6;
      t->data()[i] = keep + h;
      double const up = loss();
      t->data()[i] = keep - h;
      double const down = loss();
      t->data()[i] = keep;
      EXPECT_NEAR(both[name].data()[i], (up - down) / (2 * h), tol<T>() * K + 1e-7)
          << "d" << name << " element " << i;
    }
}

TYPED_TEST(Vjp, DotOfTransposesReadInPlace) {
  // Extents that are not multiples of 16, and ones that are (the transposed copies of the
  // backward then go by 16 x 16 blocks on vector registers, where the target has them).
  check_transposed_dot<TypeParam, 33, 17, 19>();
  check_transposed_dot<TypeParam, 48, 32, 64>();
}

template <class T, int R, int C>
void check_transpose_into() {
  std::vector<T> src(R * C), dst(R * C, T(-1));
  for (int i = 0; i < R * C; ++i) src[i] = T(i) * T(0.5) - T(7);
  tg::ad::transpose_into<T, R, C>(dst.data(), src.data());
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j)
      ASSERT_EQ(dst[j * R + i], src[i * C + j]) << R << "x" << C << " at (" << i << ", " << j << ")";
}

TYPED_TEST(Vjp, TransposeIntoMatchesAPlainLoop) {
  // Multiples of 16 (blocks on vector registers where the target has them) and not.
  check_transpose_into<TypeParam, 64, 64>();
  check_transpose_into<TypeParam, 16, 48>();
  check_transpose_into<TypeParam, 48, 32>();
  check_transpose_into<TypeParam, 17, 33>();
  check_transpose_into<TypeParam, 1, 16>();
}

/// y = x_block * x_block + 3 * x_block over row blocks of 16 x 32 of x (40 x 32): blocks 0 and 1
/// lie inside x, block 2 crosses its end (bounds<0>, padding).
constexpr auto square_rows = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                         tg::tensor<T> y) {
  int const r0 = p.program_id(0) * 16;
  auto const v = tg::load(tg::make_block_ptr<16, 32>(x, {r0, 0}), tg::bounds<0>);
  tg::store(tg::make_block_ptr<16, 32>(y, {r0, 0}), v * v + v * 3.0f, tg::bounds<0>);
};

TYPED_TEST(Vjp, BlockLoadsOfDenseAndPaddedLayoutsAgree) {
  // The same values in a dense tensor and in a padded layout (rows 33 apart), blocks inside it
  // and one crossing its end: the same gradients, 2x + 3 times the cotangent.
  using T = TypeParam;
  tg::owned_tensor<T> x({40, 32}, "x"), y({40, 32}, "y"), dy({40, 32}, "dy");
  fill(x, 31);
  fill(dy, 32);
  std::vector<T> padded(40 * 33, T(99));
  for (int i = 0; i < 40; ++i)
    for (int j = 0; j < 32; ++j) padded[i * 33 + j] = x(i, j);
  tg::tensor<T> const xp(padded.data(), {40, 32}, {33, 1}, "x");
  auto const dense = tg::vjp(3, square_rows, tg::in("x", x), tg::out("y", y, dy));
  auto const strided = tg::vjp(3, square_rows, tg::in("x", xp), tg::out("y", y, dy));
  for (int i = 0; i < 40; ++i)
    for (int j = 0; j < 32; ++j) {
      double const want = double(dy(i, j)) * (2.0 * double(x(i, j)) + 3.0);
      ASSERT_NEAR(dense["x"](i, j), want, tol<T>() * 4) << "dense, (" << i << ", " << j << ")";
      ASSERT_EQ(strided["x"](i, j), dense["x"](i, j)) << "padded, (" << i << ", " << j << ")";
    }
}

// --- memory semantics, each with a kernel written for it ----------------------------------

TEST(VjpMemory, MaskedLanesAndOtherGetNoGradient) {
  // y[i] = load(x[i], mask i < 5, other 7) * 2 over a block of 8: x has 8 elements, only 5 read.
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    auto i = tg::arange<0, 8>();
    auto v = tg::load(x + i, i < 5, 7.0f);
    tg::store(y + i, v * 2.0f);
  };
  tg::owned_tensor<float> x({8}, "x"), y({8}, "y"), dy({8}, "dy");
  fill(x, 1);
  for (int i = 0; i < 8; ++i)
    dy(i) = 1.0f + i;
  auto g = tg::vjp(1, k, tg::in("x", x), tg::out("y", y, dy));
  for (int i = 0; i < 8; ++i)
    EXPECT_EQ(g["x"](i), i < 5 ? 2.0f * (1 + i) : 0.0f) << i;
  EXPECT_EQ(y(6), 14.0f);
}

TEST(VjpMemory, PaddingOfBlockLoadsGetsNoGradient) {
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    auto v = tg::load(tg::make_block_ptr<8>(x, {-2}), tg::bounds<0>); // lanes 0, 1 pad
    tg::store(tg::make_block_ptr<8>(y, {0}), v * v, tg::bounds<0>);
  };
  tg::owned_tensor<float> x({5}, "x"), y({8}, "y"), dy({8}, "dy");
  for (int i = 0; i < 5; ++i)
    x(i) = 1.0f + i;
  for (int i = 0; i < 8; ++i)
    dy(i) = 1.0f;
  auto g = tg::vjp(1, k, tg::in("x", x), tg::out("y", y, dy));
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(g["x"](i), 2.0f * x(i)) << i; // y[i + 2] = x[i]^2
}

// y[r] = sum_c (a * a' * w + exp(a))[r, c], a and a' two loads of one (8, 16) block of x.
// Passed `in`, a block inside x (programs 0 and 1) is read where it is, not copied to the tape;
// program 2's block runs past x's last row and is copied (rows 20-23 padding). The same kernel
// with x writable (`inout`, cotangent zero) copies every block.
struct twice_loaded {
  template <class X, class W, class Y>
  void operator()(tg::program const& p, X x, W w, Y y) const {
    auto const xb = tg::make_block_ptr<8, 16>(x, {p.program_id(0) * 8, 0});
    auto const a = tg::load(xb, tg::bounds<0, 1>);
    auto const a2 = tg::load(xb, tg::bounds<0, 1>);
    auto const wv = tg::load(tg::make_block_ptr<16>(w, {0}), tg::bounds<0>);
    tg::store(tg::make_block_ptr<8>(y, {p.program_id(0) * 8}),
              tg::sum<1>(a * a2 * tg::row(wv) + tg::exp(a)), tg::bounds<0>);
  }
};

TYPED_TEST(Vjp, BlocksOfReadOnlyTensorsAreReadInPlace) {
  using T = TypeParam;
  auto const read_only = []<class U>(tg::program const& p, tg::tensor<U const> x,
                                     tg::tensor<U const> w, tg::tensor<U> y) {
    twice_loaded{}(p, x, w, y);
  };
  auto const writable = []<class U>(tg::program const& p, tg::tensor<U> x, tg::tensor<U const> w,
                                    tg::tensor<U> y) { twice_loaded{}(p, x, w, y); };
  for (int const n : {20, 16})
    for (auto ex : {tg::executor::sequential, tg::executor::tbb}) {
      if (!tg::executor_available(ex))
        continue;
      tg::owned_tensor<T> x({n, 16}, "x"), w({16}, "w"), y({n}, "y"), dy({n}, "dy"),
          dx0({n, 16}, "dx0");
      fill(x, 6);
      fill(w, 7);
      fill(dy, 8);
      tg::launch_options const o{ex, 2};
      int const grid = tg::cdiv(n, 8);
      auto const g =
          tg::vjp(o, grid, read_only, tg::in("x", x), tg::in("w", w), tg::out("y", y, dy));
      auto const h = tg::vjp(o, grid, writable, tg::inout("x", x.view(), dx0.cview()),
                             tg::in("w", w), tg::out("y", y, dy));
      for (int r = 0; r < n; ++r)
        for (int c = 0; c < 16; ++c) {
          double const xv = x(r, c);
          ASSERT_NEAR(g["x"](r, c), dy(r) * (2 * xv * w(c) + std::exp(xv)), 4 * tol<T>())
              << r << ", " << c;
          ASSERT_EQ(g["x"](r, c), h["x"](r, c)) << r << ", " << c; // bitwise
        }
      for (int c = 0; c < 16; ++c) {
        double s = 0;
        for (int r = 0; r < n; ++r)
          s += double(dy(r)) * x(r, c) * x(r, c);
        ASSERT_NEAR(g["w"](c), s, n * tol<T>()) << c;
        ASSERT_EQ(g["w"](c), h["w"](c)) << c;
      }
      if (n == 16) { // every block inside: two (8, 16) blocks fewer on each program's tape
        EXPECT_LE(g.peak_tape_bytes() + 2 * 8 * 16 * sizeof(T), h.peak_tape_bytes());
      }
    }
}

TEST(VjpMemory, LoadSeesTheValueThisProgramStoredAndItsGradientFlowsBack) {
  // y = 3 * x stored, then z = load(y)^2: dz/dx = 2 * (3x) * 3 through the stored value.
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y,
                       tg::tensor<T> z) {
    auto i = tg::arange<0, 4>();
    tg::store(y + i, tg::load(x + i) * 3.0f);
    auto v = tg::load(y + i);
    tg::store(z + i, v * v);
  };
  tg::owned_tensor<float> x({4}, "x"), y({4}, "y"), z({4}, "z"), dz({4}, "dz"), dy({4}, "dy");
  for (int i = 0; i < 4; ++i) {
    x(i) = 0.5f + i;
    dz(i) = 1.0f;
  }
  auto g = tg::vjp(1, k, tg::in("x", x), tg::out("y", y, dy), tg::out("z", z, dz));
  for (int i = 0; i < 4; ++i)
    EXPECT_NEAR(g["x"](i), 18.0f * x(i), 1e-5) << i;
}

TEST(VjpMemory, OnlyTheLastOfSeveralStoresReceivesTheCotangent) {
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    auto i = tg::arange<0, 4>();
    auto v = tg::load(x + i);
    tg::store(y + i, v * 5.0f); // overwritten below: gets nothing
    tg::store(y + i, v * 2.0f);
  };
  tg::owned_tensor<float> x({4}, "x"), y({4}, "y"), dy({4}, "dy");
  fill(x, 2);
  for (int i = 0; i < 4; ++i)
    dy(i) = 1.0f;
  auto g = tg::vjp(1, k, tg::in("x", x), tg::out("y", y, dy));
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(g["x"](i), 2.0f) << i;
}

TEST(VjpControlFlow, LoopBoundsFromProgramIdAndFromAnIntegerTensor) {
  // Program p sums the first lens[p] blocks of 4 of x: loop bounds read from memory, early
  // exit with break, a data-dependent if.
  auto k = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<int const> lens,
                       tg::tensor<T> y) {
    int const pid = p.program_id(0);
    auto i = tg::arange<0, 4>();
    auto acc = tg::zeros<tg::fp32<T>, 4>();
    int const n = tg::load(lens + pid).item();
    for (int b = 0;; ++b) {
      if (b >= n)
        break;
      auto v = tg::load(x + b * 4 + i);
      if (tg::sum(v).item() > T(1000))
        continue; // never true: data-dependent branch
      acc = acc + v * static_cast<float>(pid + 1);
    }
    tg::store(y + pid * 4 + i, acc);
  };
  tg::owned_tensor<float> x({12}, "x"), y({8}, "y"), dy({8}, "dy");
  tg::owned_tensor<int> lens({2}, "lens");
  lens(0) = 1;
  lens(1) = 3;
  fill(x, 3);
  for (int i = 0; i < 8; ++i)
    dy(i) = 1.0f;
  auto g = tg::vjp(2, k, tg::in("x", x), lens, tg::out("y", y, dy));
  for (int e = 0; e < 12; ++e)
    EXPECT_EQ(g["x"](e), e < 4 ? 3.0f : 2.0f) << e;
}

// --- bad input ---------------------------------------------------------------------------

TEST(VjpErrors, CotangentShapeNameTwiceAndUnreadInput) {
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T const> w,
                       tg::tensor<T> y) {
    (void)w; // w is never read: a capture-instead-of-argument bug
    auto i = tg::arange<0, 4>();
    tg::store(y + i, tg::load(x + i));
  };
  tg::owned_tensor<float> x({4}, "x"), w({4}, "w"), y({4}, "y"), dy({4}, "dy"), bad({5}, "bad");
  EXPECT_THROW(tg::vjp(1, k, tg::in("x", x), tg::in("w", w), tg::out("y", y, bad)),
               std::invalid_argument);
  EXPECT_THROW(tg::vjp(1, k, tg::in("x", x), tg::in("x", w), tg::out("y", y, dy)),
               std::invalid_argument);
  auto g = tg::vjp(1, k, tg::in("x", x), tg::in("w", w), tg::out("y", y, dy));
  ASSERT_EQ(g.unread().size(), 1u);
  EXPECT_EQ(g.unread()[0], "w");
  EXPECT_THROW(g["y"], std::out_of_range); // no gradient asked for y
}

TEST(VjpMemoryBound, TapeDoesNotGrowWithTheGrid) {
  auto peak = [](int n) {
    tg::owned_tensor<float> x({n, 64}, "x"), w({64}, "w"), y({n}, "y"), dy({n}, "dy");
    return tg::vjp({tg::executor::sequential, 1}, tg::cdiv(n, 16),
                   tg::kernels::weighted_sum_fwd<16, 32>, tg::in("x", x), tg::in("w", w),
                   tg::out("y", y, dy))
        .peak_tape_bytes();
  };
  EXPECT_EQ(peak(64), peak(64 * 50));
}

TEST(VjpMemory, ViewsIntoATensorAddressItsOwnElements) {
  // y[b] = 2 * x[b] * x[b] through the per-batch views x[b], y[b]: gradients and the cotangent
  // land on the elements of the whole tensors (program b writes row b only).
  auto k = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
    int const b = p.program_id(0);
    auto const xb = x[b];
    auto const yb = y[b];
    auto const i = tg::arange<0, 8>();
    auto const v = tg::load(xb + i, i < xb.size(0), 0.0f);
    tg::store(tg::make_block_ptr<8>(yb, {0}), v * v * 2.0f, tg::bounds<0>);
  };
  tg::owned_tensor<float> x({3, 5}, "x"), y({3, 5}, "y"), dy({3, 5}, "dy");
  fill(x, 4);
  fill(dy, 5);
  auto g = tg::vjp(3, k, tg::in("x", x), tg::out("y", y, dy));
  for (int b = 0; b < 3; ++b)
    for (int j = 0; j < 5; ++j) {
      EXPECT_FLOAT_EQ(y(b, j), 2 * x(b, j) * x(b, j));
      EXPECT_NEAR(g["x"](b, j), 4 * x(b, j) * dy(b, j), 1e-5) << b << ", " << j;
    }
}

/// Numbers of a row broadcast across it, six times in one expression (more than a record sums
/// per row before it walks each one's tree separately), one of them a rank-0 sum, some of them
/// expressions of other rows' numbers: y = x col(s) + exp(x - col(m)) col(1 / (s^2 + 1)) +
/// col(z) x + col(z s) + sum(x) (every element of the block, padding included) and
/// y2 = sum<1>(x col(z) + col(m)), the sum of an expression walked without materialising it.
/// Rows of 100 columns in blocks of 128: whole vectors and single lanes in each row.
constexpr auto row_broadcasts = []<class T>(tg::program const&, tg::tensor<T const> x,
                                            tg::tensor<T const> z, tg::tensor<T> y,
                                            tg::tensor<T> y2) {
  auto const xv = tg::load(tg::make_block_ptr<8, 128>(x, {0, 0}), tg::bounds<0, 1>);
  auto const zv = tg::load(tg::make_block_ptr<8>(z, {0}), tg::bounds<0>);
  auto const s = tg::sum<1>(xv);
  auto const m = tg::max<1>(xv);
  auto const all = tg::sum(xv);
  auto const out = xv * tg::col(s) + tg::exp(xv - tg::col(m)) * tg::col(1.0 / (s * s + 1.0)) +
                   tg::col(zv) * xv + tg::col(zv * s) + all;
  tg::store(tg::make_block_ptr<8, 128>(y, {0, 0}), out, tg::bounds<0, 1>);
  tg::store(tg::make_block_ptr<8>(y2, {0}), tg::sum<1>(xv * tg::col(zv) + tg::col(m)),
            tg::bounds<0>);
};

TEST(VjpBroadcast, NumbersOfARowBroadcastAcrossItAgainstDifferencesAndJvp) {
  constexpr int R = 5, C = 100;
  tg::owned_tensor<double> x({R, C}, "x"), z({R}, "z"), y({R, C}, "y"), y2({R}, "y2"),
      w({R, C}, "w"), w2({R}, "w2");
  fill(x, 31);
  fill(z, 32);
  fill(w, 33);
  fill(w2, 34);
  auto const g = tg::vjp(1, row_broadcasts, tg::in("x", x), tg::in("z", z), tg::out("y", y, w),
                         tg::out("y2", y2, w2));
  auto loss = [&](tg::owned_tensor<double> const& xs, tg::owned_tensor<double> const& zs) {
    tg::owned_tensor<double> ys({R, C}), y2s({R});
    tg::launch(1, row_broadcasts, xs.cview(), zs.cview(), ys.view(), y2s.view());
    double l = 0;
    for (std::int64_t i = 0; i < ys.numel(); ++i) l += ys.data()[i] * w.data()[i];
    for (std::int64_t i = 0; i < y2s.numel(); ++i) l += y2s.data()[i] * w2.data()[i];
    return l;
  };
  auto difference = [&](tg::owned_tensor<double>& t, std::int64_t i) {
    double const keep = t.data()[i], h = 1e-6;
    t.data()[i] = keep + h;
    double const up = loss(x, z);
    t.data()[i] = keep - h;
    double const down = loss(x, z);
    t.data()[i] = keep;
    return (up - down) / (2 * h);
  };
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    double const want = difference(x, i);
    ASSERT_NEAR(g["x"].data()[i], want, 1e-6 * (1 + std::abs(want))) << "dx element " << i;
  }
  for (std::int64_t i = 0; i < z.numel(); ++i) {
    double const want = difference(z, i);
    ASSERT_NEAR(g["z"].data()[i], want, 1e-6 * (1 + std::abs(want))) << "dz element " << i;
  }
  // Forward mode along (ux, uz) against reverse mode along (w, w2).
  tg::owned_tensor<double> ux({R, C}, "ux"), uz({R}, "uz"), yt({R, C}, "y"), y2t({R}, "y2");
  fill(ux, 35);
  fill(uz, 36);
  auto const t = tg::jvp(1, row_broadcasts, tg::tangent_in("x", x, ux), tg::tangent_in("z", z, uz),
                         tg::tangent_out("y", yt), tg::tangent_out("y2", y2t));
  double jvp_side = 0, vjp_side = 0;
  for (std::int64_t i = 0; i < yt.numel(); ++i) jvp_side += t["y"].data()[i] * w.data()[i];
  for (std::int64_t i = 0; i < y2t.numel(); ++i) jvp_side += t["y2"].data()[i] * w2.data()[i];
  for (std::int64_t i = 0; i < x.numel(); ++i) vjp_side += ux.data()[i] * g["x"].data()[i];
  for (std::int64_t i = 0; i < z.numel(); ++i) vjp_side += uz.data()[i] * g["z"].data()[i];
  EXPECT_NEAR(jvp_side, vjp_side, 1e-10 * (1 + std::abs(jvp_side)));
  // The float instantiation.
  tg::owned_tensor<float> xf({R, C}, "x"), zf({R}, "z"), yf({R, C}, "y"), y2f({R}, "y2"),
      wf({R, C}, "w"), w2f({R}, "w2");
  std::copy(x.begin(), x.end(), xf.begin());
  std::copy(z.begin(), z.end(), zf.begin());
  std::copy(w.begin(), w.end(), wf.begin());
  std::copy(w2.begin(), w2.end(), w2f.begin());
  auto const gf = tg::vjp(1, row_broadcasts, tg::in("x", xf), tg::in("z", zf),
                          tg::out("y", yf, wf), tg::out("y2", y2f, w2f));
  for (char const* name : {"x", "z"})
    for (std::int64_t i = 0; i < g[name].numel(); ++i)
      ASSERT_NEAR(gf[name].data()[i], g[name].data()[i], 1e-3 * (1 + std::abs(g[name].data()[i])))
          << "float d" << name << " element " << i;
}

} // namespace test_vjp
