// vjp memory semantics beyond plain loads and stores: atomic_add, inout tensors, reduction ties,
// `while` and early `return`, and races between programs (deliberately racy kernels), each
// against a closed form or the error it must raise.
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include "../support/tensors.hpp"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_vjp_semantics {

namespace tg = tilegrad;
using test_support::fill;

namespace {

constexpr int B = 8; // rows per program

// y[j] += sum over this program's rows i of x[i, j]^2, accumulated with atomic_add.
auto const square_sum_atomic = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                           tg::tensor<T> y) {
  auto const r = p.program_id(0) * std::int64_t{B} + tg::arange<0, B>();
  auto const c = tg::arange<0, 16>();
  auto const m = tg::col(r < x.size(0)) & tg::row(c < x.size(1));
  auto v = tg::load(x + tg::col(r) * x.stride(0) + tg::row(c), m, 0.0f);
  tg::atomic_add(y + c, tg::sum<0>(v * v), c < x.size(1));
};

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// vjp numbers a launch's programs in an int: a grid of 2^31 programs is refused before any runs,
// with its size (the message said "grid too large").
TEST(VjpErrors, AGridPastTheIntRangeNamesItsSize) {
  tg::owned_tensor<float> x({4}, "x"), y({4}, "y"), dy({4}, "dy");
  auto k = []<class T>(tg::program const&, tg::tensor<T const>, tg::tensor<T>) {};
  try {
    (void)tg::vjp(tg::grid(65536, 32768), k, tg::in("x", x), tg::out("y", y, dy));
    FAIL() << "expected std::invalid_argument";
  } catch (std::invalid_argument const& e) {
    EXPECT_NE(std::string(e.what()).find("a grid of 2147483648 programs (65536 x 32768 x 1)"),
              std::string::npos)
        << e.what();
  }
}

TEST(VjpAtomics, EveryAtomicAddContributionReceivesTheCotangent) {
  for (auto [n, d] : {std::pair{1, 1}, {21, 13}, {40, 16}}) {
    tg::owned_tensor<float> x({n, d}, "x"), y({d}, "y"), dy({d}, "dy");
    fill(x, 1);
    fill(dy, 2);
    auto g = tg::vjp(tg::cdiv(n, B), square_sum_atomic, tg::in("x", x), tg::out("y", y, dy));
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < d; ++j) ASSERT_NEAR(g["x"](i, j), 2 * x(i, j) * dy(j), 1e-5) << i << "," << j;
    // The forward ran: y accumulated every program's part (y started at zero).
    for (int j = 0; j < d; ++j) {
      double s = 0;
      for (int i = 0; i < n; ++i) s += double(x(i, j)) * x(i, j);
      ASSERT_NEAR(y(j), s, 1e-4);
    }
  }
}

TEST(VjpAtomics, AtomicAddIntoAnInoutTensorPassesTheCotangentToItsInitialValue) {
  int const n = 19, d = 11;
  tg::owned_tensor<float> x({n, d}, "x"), y({d}, "y"), dy({d}, "dy");
  fill(x, 3);
  fill(y, 4);
  fill(dy, 5);
  auto g = tg::vjp(tg::cdiv(n, B), square_sum_atomic, tg::in("x", x), tg::inout("y", y, dy));
  for (int j = 0; j < d; ++j) EXPECT_EQ(g["y"](j), dy(j)) << j;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < d; ++j) ASSERT_NEAR(g["x"](i, j), 2 * x(i, j) * dy(j), 1e-5);
}

TEST(VjpAtomics, GradientsAreBitwiseIdenticalForAnyThreadCount) {
  int const n = 300, d = 16;
  tg::owned_tensor<float> x({n, d}, "x"), y({d}, "y"), dy({d}, "dy");
  fill(x, 6);
  fill(dy, 7);
  auto run = [&](tg::launch_options o) {
    return tg::vjp(o, tg::cdiv(n, B), square_sum_atomic, tg::in("x", x), tg::out("y", y, dy));
  };
  auto const ref = run({tg::executor::sequential, 1});
  for (int threads : {1, 2, 0}) {
    auto const g = run({tg::default_options().exec, threads});
    for (int i = 0; i < n * d; ++i) ASSERT_TRUE(same_bits(g["x"].data()[i], ref["x"].data()[i])) << i;
  }
}

TEST(VjpAtomics, NonAdditiveAtomicsOnATensorWithACotangentAreRefused) {
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    auto i = tg::arange<0, 4>();
    tg::atomic_max(y + i, tg::load(x + i));
  };
  tg::owned_tensor<float> x({4}, "x"), y({4}, "y"), dy({4}, "dy");
  fill(x, 8);
  try {
    (void)tg::vjp(1, k, tg::in("x", x), tg::out("y", y, dy));
    FAIL() << "atomic_max on an out tensor must throw";
  } catch (std::invalid_argument const& e) {
    EXPECT_NE(std::string(e.what()).find("atomic_max on tensor 'y'"), std::string::npos) << e.what();
  }
  // On a passive tensor it just runs (no gradient flows through it).
  auto g = tg::vjp(1, k, tg::in("x", x), y.view());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(g["x"](i), 0.0f);
}

// y = y * x + 1 on the elements below `limit`; elements at or past it are never stored.
auto const scale_in_place = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                        tg::tensor<T> y, int limit) {
  auto const i = p.program_id(0) * std::int64_t{B} + tg::arange<0, B>();
  auto const m = i < std::min<std::int64_t>(limit, y.size(0));
  auto const v = tg::load(y + i, m);
  tg::store(y + i, v * tg::load(x + i, m) + 1.0f, m);
};

TEST(VjpInout, ElementsReadBeforeAStoreAreInputsAndUnstoredElementsPassTheirCotangent) {
  int const n = 29, limit = 20;
  tg::owned_tensor<float> x({n}, "x"), y({n}, "y"), y0({n}, "y0"), dy({n}, "dy");
  fill(x, 9);
  fill(y, 10);
  fill(dy, 11);
  std::memcpy(y0.data(), y.data(), sizeof(float) * n);
  auto g = tg::vjp(tg::cdiv(n, B), scale_in_place, tg::in("x", x), tg::inout("y", y, dy), limit);
  for (int i = 0; i < n; ++i) {
    if (i < limit) {
      EXPECT_NEAR(g["y"](i), dy(i) * x(i), 1e-6) << i;
      EXPECT_NEAR(g["x"](i), dy(i) * y0(i), 1e-6) << i;
      EXPECT_NEAR(y(i), y0(i) * x(i) + 1, 1e-6) << i;
    } else {
      EXPECT_EQ(g["y"](i), dy(i)) << i;
      EXPECT_EQ(g["x"](i), 0.0f) << i;
      EXPECT_EQ(y(i), y0(i)) << i;
    }
  }
}

// An expression is evaluated where it is assigned to a tile, and reads its tiles then: the fast
// path and forward mode compute e below from w's new values, where Triton computed it where it
// was written. Reverse mode read the old ones (its leaves kept the values they were made from),
// so vjp differentiated another function than the launch ran, silently; it now refuses, naming
// the program. (Triton's online softmax reordered, `alpha = exp(m - m_new); m = m_new; acc *
// alpha`, is this kernel's shape.)
auto const reassigned_before_use = []<class T>(tg::program const&, tg::tensor<T const> x,
                                               tg::tensor<T> y) {
  using F = tg::fp32<T>;
  auto const i = tg::arange<0, 4>();
  tg::tile<F, 4> w = tg::load(x + i);
  auto const e = w * w;
  w = w + 1.0f;
  tg::tile<F, 4> const t = e;
  tg::store(y + i, t + w);
};
// The same values used where they were meant: e evaluated before w changes, w reassigned from an
// expression of itself (evaluated before the assignment takes effect).
auto const evaluated_in_time = []<class T>(tg::program const&, tg::tensor<T const> x,
                                           tg::tensor<T> y) {
  using F = tg::fp32<T>;
  auto const i = tg::arange<0, 4>();
  tg::tile<F, 4> w = tg::load(x + i);
  auto const e = w * w;
  tg::tile<F, 4> const t = e;
  w = w + 1.0f;
  w = w * w + w;
  tg::store(y + i, t + w);
};

TEST(VjpLazyExpressions, ATileAssignedAgainBeforeItsExpressionIsEvaluatedIsRefused) {
  tg::owned_tensor<double> x({4}, "x"), y({4}, "y"), dy({4}, "dy"), u({4}, "u");
  for (int j = 0; j < 4; ++j) {
    x(j) = 0.5 + j;
    dy(j) = 1.5 - 0.25 * j;
    u(j) = j - 1.5;
  }
  tg::launch(1, reassigned_before_use, x.cview(), y.view());
  EXPECT_EQ(y(1), 2.5 * 2.5 + 2.5) << "the fast path reads w when e is evaluated";
  tg::owned_tensor<double> yt({4}, "y");
  auto const t =
      tg::jvp(1, reassigned_before_use, tg::tangent_in("x", x, u), tg::tangent_out("y", yt));
  EXPECT_EQ(t["y"](1), (2 * 2.5 + 1) * u(1)) << "forward mode differentiates what the launch ran";
  try {
    tg::vjp(1, reassigned_before_use, tg::in("x", x), tg::out("y", y, dy));
    ADD_FAILURE() << "vjp differentiated a function the launch did not run";
  } catch (std::invalid_argument const& e) {
    std::string const m = e.what();
    EXPECT_NE(m.find("assigned again after the expression was made"), std::string::npos) << m;
    EXPECT_NE(m.find("program (0"), std::string::npos) << m;
  }
}

TEST(VjpLazyExpressions, ExpressionsEvaluatedBeforeTheirTilesChangeDifferentiateAsWritten) {
  tg::owned_tensor<double> x({4}, "x"), y({4}, "y"), dy({4}, "dy");
  for (int j = 0; j < 4; ++j) {
    x(j) = 0.5 + j;
    dy(j) = 1.5 - 0.25 * j;
  }
  tg::launch(1, evaluated_in_time, x.cview(), y.view());
  auto const g = tg::vjp(1, evaluated_in_time, tg::in("x", x), tg::out("y", y, dy));
  for (int j = 0; j < 4; ++j) {
    double const v = x(j), w = v + 1;
    EXPECT_EQ(y(j), v * v + (w * w + w)) << j;
    EXPECT_DOUBLE_EQ(g["x"](j), dy(j) * (2 * v + 2 * w + 1)) << j;
  }
}

TEST(VjpReduce, MaxTiesGiveTheWholeAdjointToTheFirstMaximum) {
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y,
                       tg::tensor<std::int32_t> at) {
    auto v = tg::load(x + tg::arange<0, 6>());
    tg::store(y + tg::arange<0, 1>(), tg::reshape<1>(tg::max(v) * 2.0f));
    tg::store(at + tg::arange<0, 1>(), tg::reshape<1>(tg::argmax<0>(v)));
  };
  tg::owned_tensor<float> x({6}, "x"), y({1}, "y"), dy({1}, "dy");
  tg::owned_tensor<std::int32_t> at({1}, "at");
  float const vals[6] = {1, 3, -2, 3, 0.5f, 3};
  std::memcpy(x.data(), vals, sizeof vals);
  dy(0) = 0.75f;
  auto g = tg::vjp(1, k, tg::in("x", x), tg::out("y", y, dy), at.view());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(g["x"](i), i == 1 ? 1.5f : 0.0f) << i;
  EXPECT_EQ(at(0), 1);
}

TEST(VjpControlFlow, WhileLoopOnDataAndEarlyReturn) {
  // Program p: returns at once when counts[p] is negative; otherwise multiplies its block by 1.5
  // while the block's sum stays below a bound loaded from `limits`, at most counts[p] times.
  auto k = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y,
                       tg::tensor<std::int32_t const> counts, tg::tensor<T const> limits) {
    int const pid = p.program_id(0);
    int const count = tg::load(counts + tg::arange<0, 1>() + pid)(0);
    if (count < 0) return;
    auto const i = pid * std::int64_t{4} + tg::arange<0, 4>();
    auto v = tg::load(x + i);
    float const bound = float(tg::load(limits + tg::arange<0, 1>() + pid)(0));
    int steps = 0;
    while (steps < count && float(tg::sum(v).item()) < bound) {
      v = v * 1.5f;
      ++steps;
    }
    tg::store(y + i, v);
  };
  int const progs = 5;
  tg::owned_tensor<float> x({4 * progs}, "x"), y({4 * progs}, "y"), dy({4 * progs}, "dy");
  tg::owned_tensor<std::int32_t> counts({progs}, "counts");
  tg::owned_tensor<float> limits({progs}, "limits");
  for (int i = 0; i < 4 * progs; ++i) x(i) = 0.25f + 0.125f * (i % 5);
  fill(dy, 12);
  int const cnt[progs] = {3, -1, 10, 0, 2};
  float const lim[progs] = {100, 100, 6, 100, 1};
  for (int q = 0; q < progs; ++q) {
    counts(q) = cnt[q];
    limits(q) = lim[q];
  }
  auto g = tg::vjp(progs, k, tg::in("x", x), tg::out("y", y, dy), counts.cview(), limits.cview());
  for (int q = 0; q < progs; ++q) {
    // The reference: the same loop in plain C++.
    double s = 0;
    for (int l = 0; l < 4; ++l) s += x(4 * q + l);
    int steps = 0;
    double f = 1;
    while (cnt[q] >= 0 && steps < cnt[q] && s * f < lim[q]) {
      f *= 1.5;
      ++steps;
    }
    for (int l = 0; l < 4; ++l) {
      double const want = cnt[q] < 0 ? 0.0 : dy(4 * q + l) * f;
      EXPECT_NEAR(g["x"](4 * q + l), want, 1e-5) << "program " << q << " lane " << l;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Races: deliberately racy kernels.
// ---------------------------------------------------------------------------------------------

template <class F>
tg::race_error expect_race(F&& f) {
  try {
    f();
  } catch (tg::race_error const& e) {
    return e;
  }
  ADD_FAILURE() << "no race reported";
  return tg::race_error("", "", "", "", "", std::source_location::current());
}

TEST(VjpMisuse, ElementAccessInAKernelThrowsInsteadOfGivingZeroGradients) {
  // y(i) = x(i) * x(i) by element access: vjp cannot differentiate it (its gradient was a silent
  // zero); vjp and jvp refuse it, naming the program, the tensor, the element and the line.
  auto const k = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
    int const i = p.program_id(0);
    y(i) = x(i) * x(i);
  };
  unsigned const line = __LINE__ - 2;
  tg::owned_tensor<float> x({5}, "x"), y({5}, "y"), dy({5}, "dy"), u({5}, "u");
  fill(x, 41);
  fill(dy, 42);
  fill(u, 43);
  auto const expect_refused = [&](auto&& run) {
    try {
      run();
      ADD_FAILURE() << "no error";
    } catch (tg::access_error const& e) {
      std::string const what = e.what();
      EXPECT_EQ(e.tensor(), "x");
      EXPECT_EQ(e.element(), "(0)");
      EXPECT_EQ(e.where().line(), line);
      EXPECT_NE(what.find("by program (0, 0, 0)"), std::string::npos) << what;
      EXPECT_NE(what.find("vjp does not differentiate it"), std::string::npos) << what;
    }
  };
  expect_refused([&] {
    (void)tg::vjp({tg::executor::sequential}, 5, k, tg::in("x", x), tg::out("y", y, dy));
  });
  expect_refused([&] {
    (void)tg::jvp({tg::executor::sequential}, 5, k, tg::tangent_in("x", x, u),
                  tg::tangent_out("y", y));
  });
  // Written with load and store, the same kernel differentiates.
  auto const loads = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const i = p.program_id(0) + tg::arange<0, 1>();
    auto const v = tg::load(x + i);
    tg::store(y + i, v * v);
  };
  auto const g = tg::vjp(5, loads, tg::in("x", x), tg::out("y", y, dy));
  for (int i = 0; i < 5; ++i)
    EXPECT_FLOAT_EQ(g["x"](i), 2 * x(i) * dy(i)) << i;
}

TEST(VjpRaces, ALastProgramReducingSaysToReduceInASecondLaunch) {
  // The forward sums x in per-program partials; the program that draws the last ticket adds them
  // up. check_backward's race check accepts this in a backward; vjp's reverse sweep does not, and
  // says what to write instead.
  auto k = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> partial,
                       tg::tensor<int> counter, tg::tensor<T> y) {
    auto const i = p.program_id(0) * std::int64_t{4} + tg::arange<0, 4>();
    tg::store(partial + p.program_id(0) + tg::arange<0, 1>(), tg::sum<0>(tg::load(x + i)));
    if (tg::atomic_add(counter + 0, 1).item() != p.num_programs(0) - 1)
      return;
    auto const all = tg::arange<0, 8>();
    tg::store(y + tg::arange<0, 1>(), tg::sum<0>(tg::load(partial + all, all < p.num_programs(0),
                                                          0.0f)));
  };
  tg::owned_tensor<float> x({24}, "x"), partial({6}, "partial"), y({1}, "y"), dy({1}, "dy");
  tg::owned_tensor<int> counter({1}, "counter");
  fill(x, 3);
  fill(dy, 4);
  counter(0) = 0;
  auto const e = expect_race([&] {
    (void)tg::vjp(6, k, tg::in("x", x), partial.view(), counter.view(), tg::out("y", y, dy));
  });
  std::string const what = e.what();
  EXPECT_NE(what.find("race on tensor 'partial'"), std::string::npos) << what;
  EXPECT_NE(what.find("vjp orders programs by neither locks nor tickets"), std::string::npos)
      << what;
  EXPECT_NE(what.find("reduces what its programs wrote in a second launch"), std::string::npos)
      << what;
}

TEST(VjpRaces, TwoProgramsStoringOneElement) {
  // Program p stores its block, and program `culprit` also stores element 0.
  auto k = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y, int culprit) {
    auto const i = p.program_id(0) * std::int64_t{4} + tg::arange<0, 4>();
    tg::store(y + i, tg::load(x + i) * 2.0f);
    if (p.program_id(0) == culprit) tg::store(y + tg::arange<0, 1>(), tg::load(x + tg::arange<0, 1>()));
  };
  int const progs = 300; // more than one wave: the culprit runs in the same or a later wave
  tg::owned_tensor<float> x({4 * progs}, "x"), y({4 * progs}, "y"), dy({4 * progs}, "dy");
  fill(x, 13);
  fill(dy, 14);
  for (int culprit : {1, 299})
    for (int threads : {1, 2}) {
      auto e = expect_race([&] {
        (void)tg::vjp({tg::default_options().exec, threads}, progs, k, tg::in("x", x),
                      tg::out("y", y, dy), culprit);
      });
      std::string const what = e.what();
      std::string const other = "program (" + std::to_string(culprit) + ", 0, 0)";
      EXPECT_NE(what.find("program (0, 0, 0)"), std::string::npos) << what;
      EXPECT_NE(what.find(other), std::string::npos) << what;
      EXPECT_NE(what.find("tensor 'y', element (0)"), std::string::npos) << what;
      EXPECT_NE(what.find("test_vjp_semantics.cpp"), std::string::npos) << what;
      EXPECT_EQ(e.tensor(), "y");
      EXPECT_EQ(e.element(), "(0)");
    }
}

TEST(VjpRaces, AProgramLoadingWhatAnotherStores) {
  // Program p loads y[4p + 4] (its right neighbour's first element), then stores its block.
  auto k = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const i = p.program_id(0) * std::int64_t{4} + tg::arange<0, 4>();
    auto const next = tg::load(y + (i + 4), i + 4 < y.size(0), 0.0f);
    tg::store(y + i, tg::load(x + i) + next);
  };
  for (int progs : {2, 200}) {
    tg::owned_tensor<float> x({4 * progs}, "x"), y({4 * progs}, "y"), dy({4 * progs}, "dy");
    fill(x, 15);
    fill(dy, 16);
    auto e = expect_race([&] { (void)tg::vjp(progs, k, tg::in("x", x), tg::out("y", y, dy)); });
    std::string const what = e.what();
    EXPECT_NE(what.find("loads it"), std::string::npos) << what;
    EXPECT_NE(what.find("program (0, 0, 0)"), std::string::npos) << what;
    EXPECT_NE(what.find("program (1, 0, 0)"), std::string::npos) << what;
    EXPECT_NE(what.find("element (4)"), std::string::npos) << what;
  }
}

TEST(VjpRaces, StoreAndAtomicOnOneElement) {
  // Program 0 stores y[0..3]; every program also atomically adds into y[0].
  auto k = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const i = tg::arange<0, 4>();
    if (p.program_id(0) == 0) tg::store(y + i, tg::load(x + i));
    tg::atomic_add(y + tg::arange<0, 1>(), tg::load(x + tg::arange<0, 1>()));
  };
  tg::owned_tensor<float> x({4}, "x"), y({4}, "y"), dy({4}, "dy");
  fill(x, 17);
  auto e = expect_race([&] { (void)tg::vjp(3, k, tg::in("x", x), tg::out("y", y, dy)); });
  EXPECT_NE(std::string(e.what()).find("atomic"), std::string::npos) << e.what();
  EXPECT_EQ(e.element(), "(0)");
}

TEST(VjpRaces, ReadingAnAtomicallyUpdatedElement) {
  auto k = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> acc,
                       tg::tensor<T> y) {
    auto const one = tg::arange<0, 1>();
    tg::atomic_add(acc + one, tg::load(x + one + p.program_id(0)));
    tg::store(y + one + p.program_id(0), tg::load(acc + one));
  };
  tg::owned_tensor<float> x({3}, "x"), acc({1}, "acc"), dacc({1}, "dacc"), y({3}, "y"), dy({3}, "dy");
  auto e = expect_race([&] {
    (void)tg::vjp(3, k, tg::in("x", x), tg::out("acc", acc, dacc), tg::out("y", y, dy));
  });
  EXPECT_NE(std::string(e.what()).find("loads it"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("updates it atomically"), std::string::npos) << e.what();
}

// One program that adds into its own elements atomically and then loads them back (a grid of
// one program, so no other program is involved): refused, and the message says the program does
// both itself, not that it races with "the same program" (what it said) under a rule of
// programs reading what others write, which the kernel does not break.
TEST(VjpRaces, AProgramReadingBackItsOwnAtomicUpdateIsNamedAsSuch) {
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> acc,
                       tg::tensor<T> y) {
    auto const i = tg::arange<0, 4>();
    tg::atomic_add(acc + i, tg::load(x + i));
    tg::store(y + i, tg::load(acc + i) * 2.0f);
  };
  tg::owned_tensor<float> x({4}, "x"), acc({4}, "acc"), dacc({4}, "dacc"), y({4}, "y"),
      dy({4}, "dy");
  fill(x, 18);
  auto e = expect_race(
      [&] { (void)tg::vjp(1, k, tg::in("x", x), tg::out("acc", acc, dacc), tg::out("y", y, dy)); });
  std::string const what = e.what();
  EXPECT_NE(what.find("program (0, 0, 0) loads it at"), std::string::npos) << what;
  EXPECT_NE(what.find("and updates it atomically itself"), std::string::npos) << what;
  EXPECT_NE(what.find("vjp takes no element that one launch both updates atomically and loads "
                      "or stores, even within one program"),
            std::string::npos)
      << what;
  EXPECT_EQ(what.find("the same program"), std::string::npos) << what;
  EXPECT_EQ(what.find("race on"), std::string::npos) << what;
}

TEST(VjpAtomics, OldValuesThatReachAnOutputAreRefusedNotDropped) {
  // y = old * z with old what atomic_add returned: d y / d acc0 = z, which reverse mode (taking
  // old values as constants) would silently drop. The sweep refuses it, naming the atomic; a
  // program that discards the old values, or uses them only where no cotangent reaches, is fine.
  auto k = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T const> z,
                       tg::tensor<T> acc, tg::tensor<T> y, bool use_old) {
    auto const o = p.program_id(0) + tg::arange<0, 1>();
    auto const old = tg::atomic_add(acc + o, tg::load(x + o));
    if (use_old)
      tg::store(y + o, old * tg::load(z + o));
    else // a comparison with an old value carries no derivative
      tg::store(y + o, tg::where(old > 1e30, tg::load(z + o) * 2.0, tg::load(z + o)));
  };
  tg::owned_tensor<double> x({3}, "x"), z({3}, "z"), acc({3}, "acc"), y({3}, "y"), wa({3}, "wa"),
      wy({3}, "wy");
  fill(x, 21);
  fill(z, 22);
  fill(wa, 23);
  fill(wy, 24);
  for (bool use_old : {false, true}) {
    fill(acc, 25);
    auto run = [&] {
      return tg::vjp(3, k, tg::in("x", x), tg::in("z", z), tg::inout("acc", acc, wa),
                     tg::out("y", y, wy), use_old);
    };
    if (!use_old) {
      auto g = run();
      for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(g["acc"](i), wa(i)) << i;
        EXPECT_EQ(g["z"](i), wy(i)) << i;
      }
      continue;
    }
    try {
      (void)run();
      ADD_FAILURE() << "vjp dropped the old values' share of the gradient";
    } catch (std::invalid_argument const& e) {
      std::string const what = e.what();
      EXPECT_NE(what.find("uses the old values atomic_add returned (tensor 'acc'"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("test_vjp_semantics.cpp"), std::string::npos) << what;
    }
  }
}

TEST(VjpRaces, ManyReadersOfAnUnwrittenTensorAndRepeatedOwnStoresAreNotRaces) {
  auto k = []<class T>(tg::program const& p, tg::tensor<T> shared, tg::tensor<T const> x,
                       tg::tensor<T> y) {
    auto const i = p.program_id(0) * std::int64_t{4} + tg::arange<0, 4>();
    auto const s = tg::load(shared + tg::arange<0, 4>()); // every program reads it
    tg::store(y + i, tg::load(x + i));
    tg::store(y + i, tg::load(y + i) * s); // stores twice, reading its own store in between
  };
  int const progs = 150;
  tg::owned_tensor<float> shared({4}, "shared"), x({4 * progs}, "x"), y({4 * progs}, "y"),
      dy({4 * progs}, "dy");
  fill(shared, 18);
  fill(x, 19);
  fill(dy, 20);
  auto g = tg::vjp(progs, k, shared.view(), tg::in("x", x), tg::out("y", y, dy));
  for (int i = 0; i < 4 * progs; ++i) ASSERT_NEAR(g["x"](i), dy(i) * shared(i % 4), 1e-6) << i;
}

// --- a program's own stores: which one a load sees, which one gets the cotangent ---------------

// y[r, :] = sum over i of x[r, i*C : (i+1)*C] * w[i, :], accumulated in y itself: each step loads
// back what the program stored the step before (blocks of R x C, larger than one small table).
constexpr int R = 16, C = 128, S = 3;
auto const accumulate_in_output = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                              tg::tensor<T const> w, tg::tensor<T> y) {
  auto const r = p.program_id(0) * std::int64_t{R} + tg::arange<0, R>();
  auto const c = tg::arange<0, C>();
  auto const m = tg::col(r < x.size(0)) & tg::row(c < C);
  auto const yp = y + tg::col(r) * y.stride(0) + tg::row(c);
  for (int i = 0; i < S; ++i) {
    auto const xi = tg::load(x + tg::col(r) * x.stride(0) + tg::row(i * C + c), m, 0.0f);
    auto const wi = tg::load(w + i * C + c);
    if (i == 0)
      tg::store(yp, xi * tg::row(wi), m);
    else
      tg::store(yp, tg::load(yp, m, 0.0f) + xi * tg::row(wi), m);
  }
};

TEST(VjpOwnStores, AccumulatingInTheOutputGivesTheClosedFormForAnyThreadCount) {
  int const n = 70; // 5 programs, the last one partly masked
  tg::owned_tensor<float> x({n, S * C}, "x"), w({S, C}, "w"), y({n, C}, "y"), dy({n, C}, "dy");
  fill(x, 30);
  fill(w, 31);
  fill(dy, 32);
  auto run = [&](int threads) {
    return tg::vjp({tg::default_options().exec, threads}, tg::cdiv(n, R), accumulate_in_output,
                   tg::in("x", x), tg::in("w", w), tg::out("y", y, dy));
  };
  auto const g = run(1);
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < S; ++i)
      for (int j = 0; j < C; ++j)
        ASSERT_NEAR(g["x"](r, i * C + j), dy(r, j) * w(i, j), 1e-6) << r << " " << i << " " << j;
  for (int i = 0; i < S; ++i)
    for (int j = 0; j < C; ++j) {
      double ref = 0;
      for (int r = 0; r < n; ++r) ref += double(dy(r, j)) * x(r, i * C + j);
      ASSERT_NEAR(g["w"](i, j), ref, 1e-4) << i << " " << j;
    }
  for (int threads : {2, 0}) {
    auto const h = run(threads);
    for (char const* name : {"x", "w"})
      EXPECT_EQ(std::memcmp(h[name].data(), g[name].data(), sizeof(float) * g[name].numel()), 0)
          << name << " threads " << threads;
  }
}

TEST(VjpOwnStores, EveryLaneStoringOneElementLeavesTheLastLanesValue) {
  // All 8 lanes store to y[0]: the last lane's value stays, and only it receives the cotangent.
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const i = tg::arange<0, 8>();
    tg::store(y + i * 0, tg::load(x + i) * 2.0f);
  };
  tg::owned_tensor<float> x({8}, "x"), y({1}, "y"), dy({1}, "dy");
  fill(x, 33);
  dy(0) = 3.0f;
  auto g = tg::vjp(1, k, tg::in("x", x), tg::out("y", y, dy));
  EXPECT_EQ(y(0), 2.0f * x(7));
  for (int i = 0; i < 8; ++i) EXPECT_EQ(g["x"](i), i == 7 ? 6.0f : 0.0f) << i;
}

TEST(VjpOwnStores, ALoadSeesTheLastStoreOfEachElementAcrossTensors) {
  // Two output tensors, each stored twice with partly overlapping blocks, one store a constant;
  // the loads in between and at the end see, element by element, the store that came last.
  auto k = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> a,
                       tg::tensor<T> b, tg::tensor<T> z) {
    auto const i = p.program_id(0) * std::int64_t{8} + tg::arange<0, 8>();
    auto const lo = i < p.program_id(0) * 8 + 4; // first half of the block
    auto const v = tg::load(x + i);
    tg::store(a + i, v * 2.0f);            // a = 2x
    tg::store(b + i, 1.0f);                // b = 1 (a constant)
    tg::store(a + i, v * 3.0f, lo);        // first half: a = 3x
    tg::store(b + i, tg::load(a + i) * v); // b = a * x: 3x^2 (first half), 2x^2 (second)
    tg::store(z + i, tg::load(b + i) + tg::load(a + i));
  };
  int const progs = 3;
  tg::owned_tensor<float> x({8 * progs}, "x"), a({8 * progs}, "a"), b({8 * progs}, "b"),
      z({8 * progs}, "z"), da({8 * progs}, "da"), db({8 * progs}, "db"), dz({8 * progs}, "dz");
  fill(x, 34);
  fill(da, 35);
  fill(db, 36);
  fill(dz, 37);
  auto g = tg::vjp(progs, k, tg::in("x", x), tg::out("a", a, da), tg::out("b", b, db),
                   tg::out("z", z, dz));
  for (int e = 0; e < 8 * progs; ++e) {
    double const c = e % 8 < 4 ? 3 : 2; // a = c x, b = c x^2, z = c x^2 + c x
    EXPECT_NEAR(a(e), c * x(e), 1e-6) << e;
    EXPECT_NEAR(b(e), c * x(e) * x(e), 1e-6) << e;
    double const dx = da(e) * c + db(e) * 2 * c * x(e) + dz(e) * (2 * c * x(e) + c);
    EXPECT_NEAR(g["x"](e), dx, 1e-5) << e;
  }
}

// A vjp called inside a program of another vjp ran its programs on the outer program's state
// (the thread's tape and records): the outer program then wrote through freed records (a
// segfault, or an AddressSanitizer report). It is refused, naming the outer program; a vjp
// inside a plain launch's program, and the outer vjp after the refusal, still work.
TEST(VjpNesting, AVjpInsideAProgramOfAVjpIsRefused) {
  auto const square = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const c = p.program_id(0) * 16 + tg::arange<0, 16>();
    tg::store(y + c, tg::load(x + c) * tg::load(x + c));
  };
  tg::owned_tensor<float> a({32}, "a"), b({32}, "b"), db({32}, "db");
  tg::owned_tensor<float> x({32}, "x"), y({32}, "y"), dy({32}, "dy");
  fill(a, 1);
  fill(x, 2);
  fill(dy, 3);
  fill(db, 4);
  for (auto exec : {tg::executor::sequential, tg::executor::tbb}) {
    if (!tg::executor_available(exec))
      continue;
    std::string message;
    try {
      (void)tg::vjp(
          {exec}, 2,
          [&]<class T>(tg::program const& p, tg::tensor<T const> a_, tg::tensor<T> b_) {
            auto const c = p.program_id(0) * 16 + tg::arange<0, 16>();
            auto const v = tg::load(a_ + c);
            (void)tg::vjp({exec}, 2, square, tg::in("x", x), tg::out("y", y, dy));
            tg::store(b_ + c, v * v);
          },
          tg::in("a", a), tg::out("b", b, db));
    } catch (std::logic_error const& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("called inside program ("), std::string::npos) << message;
    EXPECT_NE(message.find("of another vjp"), std::string::npos) << message;

    // Inside a plain launch's program it runs, and gives 2 x dy.
    float got = 0;
    tg::launch({exec}, 1, [&](tg::program const&) {
      got = tg::vjp({exec}, 2, square, tg::in("x", x), tg::out("y", y, dy))["x"].data()[5];
    });
    EXPECT_EQ(got, 2 * x.data()[5] * dy.data()[5]);
    // And the outer vjp alone, after the refusal.
    auto const g = tg::vjp({exec}, 2, square, tg::in("x", a), tg::out("y", b, db));
    EXPECT_EQ(g["x"].data()[7], 2 * a.data()[7] * db.data()[7]);
  }
}

} // namespace

// Reads through a view the kernel captures. A kernel that reads an input x through its argument
// and again through a captured view of x's buffer (a residual) is instantiated with adjoint
// tensors while the captured view stays a float view: its loads are constants, and dx missed
// the residual's term with no error. vjp and jvp refuse such a load, naming the program, the
// tensor, the element and the line; captured views of memory that is not differentiated (a
// table, the other half of a buffer) are read as before.
namespace captured_views {

constexpr int C = 16;
std::int64_t const n = 37;

// y = tanh(x) + r, with r read through `res`, a float view the kernel captures.
auto residual_fwd(tg::tensor<float const> res) {
  return [res]<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const i = p.program_id(0) * C + tg::arange<0, C>();
    auto const m = i < x.numel();
    tg::tile<T, C> const v = tg::load(x + i * x.stride(0), m, 0.0f);
    tg::store(y + i, tg::tanh(v) + tg::load(res + i * res.stride(0), m, 0.0f), m);
  };
}
int const residual_line = __LINE__ - 3; // the load through res

// y = tanh(x) + x, the residual read through the argument.
auto const residual_by_argument = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                              tg::tensor<T> y) {
  auto const i = p.program_id(0) * C + tg::arange<0, C>();
  auto const m = i < x.numel();
  tg::tile<T, C> const v = tg::load(x + i, m, 0.0f);
  tg::store(y + i, tg::tanh(v) + tg::load(x + i, m, 0.0f), m);
};

std::string message_of(auto&& f, std::string const& tensor = "x") {
  try {
    f();
  } catch (tg::access_error const& e) {
    EXPECT_EQ(e.tensor(), tensor);
    return e.what();
  }
  return "no error";
}

TEST(VjpCaptures, AnInputReadThroughACapturedViewIsRefused) {
  tg::owned_tensor<float> x({n}, "x"), y({n}, "y"), dy({n}, "dy"), u({n}, "u");
  fill(x, 1);
  fill(dy, 2);
  fill(u, 3);
  auto const fwd = residual_fwd(x.cview());
  std::string const at = "test_vjp_semantics.cpp:" + std::to_string(residual_line);
  std::string const m = message_of([&] {
    (void)tg::vjp({tg::executor::sequential}, tg::cdiv<int>(n, C), fwd, tg::in("x", x),
                  tg::out("y", y, dy));
  });
  EXPECT_NE(m.find("tilegrad::vjp: program (0, 0, 0) loads element (0) of 'x' at "),
            std::string::npos)
      << m;
  EXPECT_NE(m.find(at), std::string::npos) << m;
  EXPECT_NE(m.find("not an argument of the launch"), std::string::npos) << m;
  EXPECT_NE(m.find("Pass 'x' to the kernel as an argument"), std::string::npos) << m;
  // Any executor; and vjp_as, which differentiates a copy of x.
  std::string const any = message_of(
      [&] { (void)tg::vjp(tg::cdiv<int>(n, C), fwd, tg::in("x", x), tg::out("y", y, dy)); });
  EXPECT_NE(any.find(at), std::string::npos) << any;
  std::string const as = message_of([&] {
    (void)tg::vjp_as<double>(tg::cdiv<int>(n, C), fwd, tg::in("x", x), tg::out("y", y, dy));
  });
  EXPECT_NE(as.find("a copy of 'x'"), std::string::npos) << as;
  EXPECT_NE(as.find(at), std::string::npos) << as;
  // Forward mode runs the kernel on copies: the captured view reads x itself, with no tangent.
  std::string const fm = message_of([&] {
    (void)tg::jvp({tg::executor::sequential}, tg::cdiv<int>(n, C), fwd, tg::tangent_in("x", x, u),
                  tg::tangent_out("y", y));
  });
  EXPECT_NE(fm.find("tilegrad::jvp: program (0, 0, 0) loads element (0) of 'x' at "),
            std::string::npos)
      << fm;
  EXPECT_NE(fm.find(at), std::string::npos) << fm;
  // An element of x inside a strided view: x is column 0 of a (n, 2) buffer, the kernel reads
  // column 1 (no element of x) through a captured view, and then column 0 (x's elements).
  tg::owned_tensor<float> buf({n, 2}, "buf");
  fill(buf, 4);
  tg::tensor<float const> const xs(buf.data(), {n}, {2}, "x");
  tg::tensor<float const> const other(buf.data() + 1, {n}, {2}, "other");
  auto const g =
      tg::vjp(tg::cdiv<int>(n, C), residual_fwd(other), tg::in("x", xs), tg::out("y", y, dy));
  for (std::int64_t i = 0; i < n; ++i) {
    double const t = std::tanh(double(xs(i)));
    EXPECT_NEAR(g["x"](i), (1 - t * t) * dy(i), 1e-6) << i;
  }
  std::string const col = message_of([&] {
    (void)tg::vjp({tg::executor::sequential}, tg::cdiv<int>(n, C), residual_fwd(xs),
                  tg::in("x", xs), tg::out("y", y, dy));
  });
  EXPECT_NE(col.find("loads element (0) of 'x'"), std::string::npos) << col;
}

TEST(VjpCaptures, ACapturedTableOfConstantsIsReadAsBefore) {
  tg::owned_tensor<float> x({n}, "x"), y({n}, "y"), dy({n}, "dy"), u({n}, "u"), table({n});
  fill(x, 1);
  fill(dy, 2);
  fill(u, 3);
  fill(table, 5);
  auto const fwd = residual_fwd(table.cview());
  auto const g = tg::vjp(tg::cdiv<int>(n, C), fwd, tg::in("x", x), tg::out("y", y, dy));
  auto const t =
      tg::jvp(tg::cdiv<int>(n, C), fwd, tg::tangent_in("x", x, u), tg::tangent_out("y", y));
  for (std::int64_t i = 0; i < n; ++i) {
    double const th = std::tanh(double(x(i)));
    EXPECT_NEAR(y(i), th + table(i), 1e-6) << i;
    EXPECT_NEAR(g["x"](i), (1 - th * th) * dy(i), 1e-6) << i;
    EXPECT_NEAR(t["y"](i), (1 - th * th) * u(i), 1e-6) << i;
  }
  EXPECT_TRUE(g.unread().empty());
}

TEST(VjpCaptures, TheResidualReadThroughTheArgumentGetsItsGradient) {
  tg::owned_tensor<float> x({n}, "x"), y({n}, "y"), dy({n}, "dy"), u({n}, "u");
  fill(x, 1);
  fill(dy, 2);
  fill(u, 3);
  auto const g =
      tg::vjp(tg::cdiv<int>(n, C), residual_by_argument, tg::in("x", x), tg::out("y", y, dy));
  auto const t = tg::jvp(tg::cdiv<int>(n, C), residual_by_argument, tg::tangent_in("x", x, u),
                         tg::tangent_out("y", y));
  for (std::int64_t i = 0; i < n; ++i) {
    double const th = std::tanh(double(x(i)));
    EXPECT_NEAR(g["x"](i), (2 - th * th) * dy(i), 1e-6) << i;
    EXPECT_NEAR(t["y"](i), (2 - th * th) * u(i), 1e-6) << i;
  }
}

// Writes through a captured view. vjp's tensors are the caller's memory, jvp's copies of it: a
// store or an atomic through a float view the kernel captures changed, under vjp, values the
// tape had recorded as something else (y = x * x with y then overwritten gave dx = 2 x where the
// launch's y does not depend on x), and under jvp the caller's memory instead of the copies (the
// forward and its tangent were another function's). Both refuse it, naming program, tensor,
// element and line, for inputs and outputs.
enum class write_kind { store, atomic };

// y = x * x, and then `cap` (a view of x or y the kernel captures) is written at the same lanes:
// before the loads when `before`, after the store otherwise.
auto writing_fwd(tg::tensor<float> cap, write_kind w, bool before) {
  return [cap, w, before]<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const i = p.program_id(0) * C + tg::arange<0, C>();
    auto const m = i < x.numel();
    auto write = [&] {
      if (w == write_kind::store)
        tg::store(cap + i * cap.stride(0), tg::full<float, C>(0.5f), m);
      else
        tg::atomic_add(cap + i * cap.stride(0), tg::full<float, C>(1.0f), m);
    };
    if (before)
      write();
    tg::tile<T, C> const v = tg::load(x + i * x.stride(0), m, 0.0f);
    tg::store(y + i, v * v, m);
    if (!before)
      write();
  };
}
int const writing_line = __LINE__ - 12; // the store through cap

TEST(VjpCaptures, AWriteThroughACapturedViewOfAnInputOrAnOutputIsRefused) {
  for (write_kind w : {write_kind::store, write_kind::atomic})
    for (bool output : {false, true}) {
      SCOPED_TRACE(std::string(w == write_kind::store ? "store" : "atomic_add") + " to " +
                   (output ? "y" : "x"));
      tg::owned_tensor<float> x({n}, "x"), y({n}, "y"), dy({n}, "dy"), u({n}, "u");
      fill(x, 1);
      fill(dy, 2);
      fill(u, 3);
      auto const fwd = writing_fwd(output ? y.view() : x.view(), w, !output);
      char const* const name = output ? "y" : "x";
      std::string const at = "test_vjp_semantics.cpp:" +
                             std::to_string(writing_line + (w == write_kind::store ? 0 : 2));
      std::string const verb = w == write_kind::store ? "stores to" : "writes atomically to";
      std::string const m = message_of(
          [&] {
            (void)tg::vjp({tg::executor::sequential}, tg::cdiv<int>(n, C), fwd, tg::in("x", x),
                          tg::out("y", y, dy));
          },
          name);
      EXPECT_NE(
          m.find("tilegrad::vjp: program (0, 0, 0) " + verb + " element (0) of '" + name + "' at "),
          std::string::npos)
          << m;
      EXPECT_NE(m.find(at), std::string::npos) << m;
      EXPECT_NE(m.find("changes values the launch does not follow"), std::string::npos) << m;
      fill(x, 1);
      std::string const fm = message_of(
          [&] {
            (void)tg::jvp({tg::executor::sequential}, tg::cdiv<int>(n, C), fwd,
                          tg::tangent_in("x", x, u), tg::tangent_out("y", y));
          },
          name);
      EXPECT_NE(fm.find("tilegrad::jvp: program (0, 0, 0) " + verb + " element (0) of '" + name +
                        "' at "),
                std::string::npos)
          << fm;
      EXPECT_NE(fm.find("a copy of '" + std::string(name) + "'"), std::string::npos) << fm;
      fill(x, 1);
      std::string const as = message_of(
          [&] {
            (void)tg::vjp_as<double>(tg::cdiv<int>(n, C), fwd, tg::in("x", x), tg::out("y", y, dy));
          },
          name);
      EXPECT_NE(as.find("a copy of '" + std::string(name) + "'"), std::string::npos) << as;
      EXPECT_NE(as.find(at), std::string::npos) << as;
    }
}

TEST(VjpCaptures, AnOutputReadThroughACapturedViewIsRefused) {
  tg::owned_tensor<float> x({n}, "x"), y({n}, "y"), dy({n}, "dy");
  fill(x, 1);
  fill(dy, 2);
  // y = tanh(x) + y, the second term read through a view of y the kernel captures.
  auto const fwd = residual_fwd(y.cview());
  std::string const m = message_of(
      [&] {
        (void)tg::vjp({tg::executor::sequential}, tg::cdiv<int>(n, C), fwd, tg::in("x", x),
                      tg::out("y", y, dy));
      },
      "y");
  EXPECT_NE(m.find("loads element (0) of 'y' at "), std::string::npos) << m;
  EXPECT_NE(m.find("reads constants"), std::string::npos) << m;
}

// Writes through a captured view of memory the launch does not differentiate (a counter, the
// other half of a buffer) run as before, and the gradients are the launch's.
TEST(VjpCaptures, AWriteThroughACapturedViewOfOtherMemoryRunsAsBefore) {
  tg::owned_tensor<float> x({n}, "x"), y({n}, "y"), dy({n}, "dy"), u({n}, "u"), buf({n, 2});
  fill(x, 1);
  fill(dy, 2);
  fill(u, 3);
  fill(buf, 4);
  tg::tensor<float> const other(buf.data() + 1, {n}, {2}, "other");
  tg::tensor<float const> const xs(buf.data(), {n}, {2}, "x");
  for (write_kind w : {write_kind::store, write_kind::atomic}) {
    auto const fwd = writing_fwd(other, w, true);
    auto const g = tg::vjp(tg::cdiv<int>(n, C), fwd, tg::in("x", xs), tg::out("y", y, dy));
    auto const t =
        tg::jvp(tg::cdiv<int>(n, C), fwd, tg::tangent_in("x", xs, u), tg::tangent_out("y", y));
    for (std::int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(y(i), xs(i) * xs(i)) << i;
      EXPECT_NEAR(g["x"](i), 2 * double(xs(i)) * dy(i), 1e-5) << i;
      EXPECT_NEAR(t["y"](i), 2 * double(xs(i)) * u(i), 1e-5) << i;
    }
  }
}

} // namespace captured_views

} // namespace test_vjp_semantics
