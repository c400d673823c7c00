// tg::loop, the loop whose reverse mode keeps only the carried values (a checkpointed scan): the
// same kernel written with tg::loop and with a plain for loop gives bitwise the same forward and
// the same gradients (the sweep replays the very records, in the very order, that the plain
// loop's tape holds); against central differences of the double launch and against jvp; a tape
// that grows by the carried values only; and its refusals (a by-reference capture, a store in
// the body, a replayed load of a tensor stored after the loop).
#include <tilegrad/kernels/flash_attention.hpp>
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include "../support/tensors.hpp"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_loop {

namespace {

namespace tg = tilegrad;
template <class T>
using owned = tg::owned_tensor<T>;

constexpr int R = 8, C = 16; // rows per program, columns per step; the sizes below divide neither

// y[r] = s + sum(acc * acc) after a walk over the first len[program] columns of x and z: masks
// made in the body, a pointer load with a mask, a block pointer carried and advanced, loaded with
// boundary checks, and a captured tile (wv, an active value loaded before the loop) whose
// gradient collects every iteration's. len[program] = 0 runs no iteration.
template <bool Checkpointed>
constexpr auto walk = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                  tg::tensor<T const> z, tg::tensor<T const> w,
                                  tg::tensor<std::int32_t const> len, tg::tensor<T> y) {
  using F = tg::fp32<T>;
  int const pid = p.program_id(0);
  int const r0 = pid * R;
  auto const rows = r0 + tg::arange<0, R>();
  int const n = tg::load(len + tg::arange<0, 1>() + pid)(0); // the trip count comes from data
  auto const wc = tg::arange<0, C>();
  tg::tile<F, C> const wv = tg::load(w + wc, wc < w.size(0), 0.0f) * 0.5f;
  auto acc = tg::zeros<F, R, C>();
  auto s = tg::full<F, R>(F(0.25f));
  auto zb = tg::make_block_ptr<R, C>(z, {r0, 0});
  auto const body = [=](int c0, auto& acc, auto& s, auto& zb) {
    auto const cols = c0 + tg::arange<0, C>();
    auto const mask = tg::col(rows < x.size(0)) & tg::row(cols < n);
    tg::tile<F, R, C> const v =
        tg::load(x + tg::col(rows) * x.stride(0) + tg::row(cols), mask, 0.0f);
    tg::tile<F, R, C> const zv = tg::load(zb, tg::bounds<0, 1>);
    acc = acc * tg::row(wv) + tg::tanh(v) * zv;
    s = s * 0.875f + tg::sum<1>(tg::where(mask, acc * v, 0.0f));
    zb = zb.advance(0, C);
  };
  if constexpr (Checkpointed)
    tg::loop(0, n, C, acc, s, zb, body);
  else
    for (int c0 = 0; c0 < n; c0 += C)
      body(c0, acc, s, zb);
  tg::tile<F, R> const out = s + tg::sum<1>(acc * acc);
  tg::store(y + rows, out, rows < y.size(0));
};

constexpr int NR = 21, NC = 37, P = 3; // P = cdiv(NR, R) programs

template <class T>
struct problem {
  owned<T> x{{NR, NC}, "x"}, z{{NR, NC}, "z"}, w{{C}, "w"}, y{{NR}, "y"}, dy{{NR}, "dy"};
  owned<std::int32_t> len{{P}, "len"};
  explicit problem(std::int32_t const (&lens)[P]) {
    test_support::fill(x, 1);
    test_support::fill(z, 2);
    test_support::fill(w, 3);
    test_support::fill(dy, 4);
    for (int i = 0; i < P; ++i)
      len(i) = lens[i];
  }
  template <class K>
  auto grads(K const& k, tg::launch_options o = tg::default_options()) {
    return tg::vjp(o, P, k, tg::in("x", x), tg::in("z", z), tg::in("w", w), len.cview(),
                   tg::out("y", y, dy));
  }
};

bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

/// While it lives, reverse mode checkpoints every tg::loop, however small its tape (by default a
/// loop whose records fit a few MiB records them as a plain loop).
struct checkpoint_every_loop {
  std::size_t saved = tg::set_loop_record_budget(0);
  ~checkpoint_every_loop() { tg::set_loop_record_budget(saved); }
};

// Lengths: a whole walk, none (zero iterations), one partial tile short of the end.
constexpr std::int32_t lens[P] = {NC, 0, 20};

TEST(Loop, FastPathIsThePlainLoopBitwise) {
  problem<float> a(lens), b(lens);
  tg::launch(P, walk<true>, a.x.cview(), a.z.cview(), a.w.cview(), a.len.cview(), a.y.view());
  tg::launch(P, walk<false>, b.x.cview(), b.z.cview(), b.w.cview(), b.len.cview(), b.y.view());
  for (int i = 0; i < NR; ++i)
    ASSERT_TRUE(same_bits(a.y(i), b.y(i))) << i;
}

TEST(Loop, GradientsAreThoseOfThePlainLoopBitwise) {
  checkpoint_every_loop const checkpointed;
  // The sweep runs the records of each iteration, rebuilt from the same values, in the order
  // the plain loop's tape holds them; the adjoint an iteration hands back is the sum the plain
  // loop forms, started from zero. So every gradient is the same float.
  problem<float> a(lens), b(lens);
  auto const ga = a.grads(walk<true>);
  auto const gb = b.grads(walk<false>);
  for (int i = 0; i < NR; ++i)
    ASSERT_TRUE(same_bits(a.y(i), b.y(i))) << "y " << i;
  for (char const* t : {"x", "z", "w"}) {
    auto const& u = ga[t];
    auto const& v = gb[t];
    bool nonzero = false;
    for (std::int64_t i = 0; i < u.numel(); ++i) {
      ASSERT_TRUE(same_bits(u.data()[i], v.data()[i]))
          << t << " " << i << ": " << u.data()[i] << " vs " << v.data()[i];
      nonzero |= u.data()[i] != 0;
    }
    EXPECT_TRUE(nonzero) << t;
  }
  // Program 1 ran no iteration: its rows of x get nothing; rows of the other two do.
  for (int r = R; r < 2 * R; ++r)
    for (int c = 0; c < NC; ++c)
      ASSERT_EQ(ga["x"](r, c), 0.0f) << r << "," << c;
  // Program 2 walked 20 columns: the mask made in the body stops x (and so z, which multiplies
  // tanh(x)) at column 20; program 0 reaches the last column, read with boundary checks.
  EXPECT_NE(ga["x"](2 * R, 19), 0.0f);
  EXPECT_EQ(ga["x"](2 * R, 20), 0.0f);
  EXPECT_NE(ga["z"](2 * R + 4, 19), 0.0f);
  EXPECT_EQ(ga["z"](2 * R + 4, 20), 0.0f);
  EXPECT_NE(ga["z"](R - 1, NC - 1), 0.0f);
  // Bitwise for any thread count, as every vjp.
  problem<float> c(lens);
  auto const gc = c.grads(walk<true>, {tg::executor::sequential, 1});
  for (std::int64_t i = 0; i < ga["w"].numel(); ++i)
    ASSERT_TRUE(same_bits(gc["w"].data()[i], ga["w"].data()[i])) << i;
}

TEST(Loop, MatchesCentralDifferencesAndJvp) {
  checkpoint_every_loop const checkpointed;
  problem<double> pr(lens);
  auto const g = pr.grads(walk<true>);
  auto forward = [&](owned<double> const& x, owned<double> const& z, owned<double> const& w) {
    owned<double> y({NR}, "y");
    tg::launch(P, walk<true>, x.cview(), z.cview(), w.cview(), pr.len.cview(), y.view());
    double s = 0;
    for (int i = 0; i < NR; ++i)
      s += pr.dy(i) * y(i);
    return s;
  };
  double const h = 1e-6;
  auto check = [&](char const* name, owned<double>& t) {
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      double const v = t.data()[i];
      t.data()[i] = v + h;
      double const fp = forward(pr.x, pr.z, pr.w);
      t.data()[i] = v - h;
      double const fm = forward(pr.x, pr.z, pr.w);
      t.data()[i] = v;
      double const want = (fp - fm) / (2 * h);
      ASSERT_NEAR(g[name].data()[i], want, 1e-7 * (1 + std::abs(want))) << name << " " << i;
    }
  };
  check("x", pr.x);
  check("z", pr.z);
  check("w", pr.w);

  // Forward mode along random directions against reverse mode along dy.
  owned<double> ux({NR, NC}, "ux"), uz({NR, NC}, "uz"), uw({C}, "uw"), yt({NR}, "y");
  test_support::fill(ux, 5);
  test_support::fill(uz, 6);
  test_support::fill(uw, 7);
  auto const t =
      tg::jvp(P, walk<true>, tg::tangent_in("x", pr.x, ux), tg::tangent_in("z", pr.z, uz),
              tg::tangent_in("w", pr.w, uw), pr.len.cview(), tg::tangent_out("y", yt));
  double jv = 0, vj = 0;
  for (int i = 0; i < NR; ++i)
    jv += t["y"](i) * pr.dy(i);
  for (std::int64_t i = 0; i < ux.numel(); ++i)
    vj += ux.data()[i] * g["x"].data()[i] + uz.data()[i] * g["z"].data()[i];
  for (int i = 0; i < C; ++i)
    vj += uw(i) * g["w"](i);
  EXPECT_NEAR(jv, vj, 1e-12 * (1 + std::abs(jv)));
}

TEST(Loop, TheTapeGrowsByTheCarriedValuesOnly) {
  // One program walking 64 and then 16 column tiles: the plain loop's tape grows with every
  // iteration's records, tg::loop's by the carried values (acc: R x C floats, s: R floats).
  // Under the default budget, a loop this small records its iterations as a plain loop does.
  auto peak = [](auto const& k, int cols, std::size_t budget = 0) {
    std::size_t const saved = tg::set_loop_record_budget(budget);
    owned<float> x({R, cols}, "x"), z({R, cols}, "z"), w({C}, "w"), y({R}, "y"), dy({R}, "dy");
    owned<std::int32_t> len({1}, "len");
    test_support::fill(x, 1);
    test_support::fill(z, 2);
    test_support::fill(w, 3);
    test_support::fill(dy, 4);
    len(0) = cols;
    auto const g = tg::vjp(1, k, tg::in("x", x), tg::in("z", z), tg::in("w", w), len.cview(),
                           tg::out("y", y, dy));
    tg::set_loop_record_budget(saved);
    return static_cast<double>(g.peak_tape_bytes());
  };
  double const loop_long = peak(walk<true>, 64 * C), loop_short = peak(walk<true>, 16 * C);
  double const plain_long = peak(walk<false>, 64 * C), plain_short = peak(walk<false>, 16 * C);
  auto const on_tape = [](double bytes) { return std::ceil(bytes / 64) * 64; }; // 64-byte blocks
  double const carried = on_tape(R * C * sizeof(float)) + on_tape(R * sizeof(float));
  EXPECT_LE(loop_long - loop_short, 48 * carried) << loop_short << " -> " << loop_long;
  EXPECT_GT(plain_long - plain_short, 4 * (loop_long - loop_short))
      << plain_short << " -> " << plain_long;
  EXPECT_LT(loop_long, plain_long / 4);
  // The budget: a loop whose records fit it is recorded whole, one that does not is checkpointed.
  EXPECT_EQ(peak(walk<true>, 64 * C, std::size_t{8} << 20), plain_long);
  EXPECT_EQ(peak(walk<true>, 64 * C, std::size_t(plain_long / 2)), loop_long);
}

TEST(Loop, FlashAttentionGradientsAreTheSameCheckpointedOrNot) {
  // The library's forward kernel (its key walk is a tg::loop), causal, with N not a multiple of
  // the tiles: checkpointed, and recorded whole under an unlimited budget.
  constexpr int Dh = 16, Bq = 16, Bk = 16, H = 2, N = 45;
  owned<float> q({1, H, N, Dh}, "q"), k({1, H, N, Dh}, "k"), v({1, H, N, Dh}, "v"),
      o({1, H, N, Dh}, "o"), d_o({1, H, N, Dh}, "d_o"), lse({1, H, N}, "lse");
  test_support::fill(q, 1);
  test_support::fill(k, 2);
  test_support::fill(v, 3);
  test_support::fill(d_o, 4);
  // sweep 1 and 2: the sweeps check_backward's error bound takes (every rule's |contribution|,
  // or its square for bf16).
  auto run = [&](std::size_t budget, int sweep_kind) {
    std::size_t const saved = tg::set_loop_record_budget(budget);
    tg::ad::magnitude_scope const sweep(sweep_kind > 0, sweep_kind == 2
                                                            ? tg::ad::magnitude_kind::squares
                                                            : tg::ad::magnitude_kind::absolute);
    auto g = tg::vjp(tg::grid(tg::cdiv(N, Bq), H, 1),
                     tilegrad::kernels::flash_attention_fwd<Dh, Bq, Bk, true>, tg::in("q", q),
                     tg::in("k", k), tg::in("v", v), tg::out("o", o, d_o), lse.view(), 0.25);
    tg::set_loop_record_budget(saved);
    return g;
  };
  for (int sweep_kind : {0, 1, 2}) {
    auto const a = run(0, sweep_kind), b = run(~std::size_t{0}, sweep_kind);
    for (char const* t : {"q", "k", "v"}) {
      bool nonzero = false;
      for (std::int64_t i = 0; i < a[t].numel(); ++i) {
        ASSERT_TRUE(same_bits(a[t].data()[i], b[t].data()[i]))
            << t << " " << i << ": " << a[t].data()[i] << " vs " << b[t].data()[i];
        nonzero |= a[t].data()[i] != 0;
      }
      EXPECT_TRUE(nonzero) << t;
    }
    EXPECT_LT(a.peak_tape_bytes(), b.peak_tape_bytes());
  }
}

// A nested tg::loop, against the same nesting of plain loops: the inner loop is recorded while
// the outer one runs forward and while its iterations are replayed. The outer one counts down.
template <bool Checkpointed>
constexpr auto nested = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                    tg::tensor<T const> z, tg::tensor<T const> w,
                                    tg::tensor<std::int32_t const> len, tg::tensor<T> y) {
  using F = tg::fp32<T>;
  int const r0 = p.program_id(0) * R;
  auto const rows = r0 + tg::arange<0, R>();
  int const n = tg::load(len + tg::arange<0, 1>() + p.program_id(0))(0);
  tg::tile<F, R> const zr = tg::load(z + rows * z.stride(0), rows < z.size(0), 0.0f);
  auto s = tg::zeros<F, R>();
  auto const inner = [=](int c0, auto& t) {
    auto const cols = c0 + tg::arange<0, C>();
    auto const mask = tg::col(rows < x.size(0)) & tg::row(cols < n);
    tg::tile<F, R, C> const v =
        tg::load(x + tg::col(rows) * x.stride(0) + tg::row(cols), mask, 0.0f);
    t = t * tg::sigmoid(zr) + tg::sum<1>(v * v * tg::row(tg::load(w + tg::arange<0, C>())));
  };
  auto const outer = [=](int k, auto& s) {
    tg::tile<F, R> t = s * 0.5f + float(k);
    if constexpr (Checkpointed)
      tg::loop(k * C, n, 2 * C, t, inner);
    else
      for (int c0 = k * C; c0 < n; c0 += 2 * C)
        inner(c0, t);
    s = s + tg::exp(t * 0.125f);
  };
  if constexpr (Checkpointed) // a negative step: k = 1, then 0
    tg::loop(1, -1, -1, s, outer);
  else
    for (int k = 1; k > -1; --k)
      outer(k, s);
  tg::store(y + rows, s, rows < y.size(0));
};

TEST(Loop, NestedLoopsGiveThePlainLoopsGradients) {
  // Every loop checkpointed, then budgets under which the inner loops' records fit and the
  // outer loop's do not, and larger ones: recorded and checkpointed loops nest either way.
  for (std::size_t budget : {0, 512, 1 << 10, 2 << 10, 4 << 10, 8 << 10, 16 << 10}) {
    std::size_t const saved = tg::set_loop_record_budget(budget);
    problem<float> a(lens), b(lens);
    auto const ga = a.grads(nested<true>);
    auto const gb = b.grads(nested<false>);
    tg::set_loop_record_budget(saved);
    for (char const* t : {"x", "z", "w"}) {
      bool nonzero = false;
      for (std::int64_t i = 0; i < ga[t].numel(); ++i) {
        ASSERT_TRUE(same_bits(ga[t].data()[i], gb[t].data()[i]))
            << t << " " << i << ": " << ga[t].data()[i] << " vs " << gb[t].data()[i]
            << ", budget " << budget;
        nonzero |= ga[t].data()[i] != 0;
      }
      EXPECT_TRUE(nonzero) << t;
    }
  }
}

// ---- refusals -----------------------------------------------------------------------------

template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (std::invalid_argument const& e) {
    return e.what();
  }
  return "";
}

TEST(Loop, ABodyCapturingByReferenceIsRefused) {
  // The sweep runs the body after the kernel returned: `a` would be gone.
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const i = tg::arange<0, 8>();
    tg::tile<tg::fp32<T>, 8> const a = tg::load(x + i, i < x.size(0), 0.0f);
    auto acc = tg::zeros<tg::fp32<T>, 8>();
    tg::loop(0, 3, 1, acc, [&](int, auto& acc) { acc = acc + a * a; });
    tg::store(y + i, acc, i < y.size(0));
  };
  owned<float> x({5}, "x"), y({5}, "y"), dy({5}, "dy");
  test_support::fill(x, 1);
  test_support::fill(dy, 2);
  // The fast path runs it (the body is called while `a` lives).
  tg::launch(1, k, x.cview(), y.view());
  EXPECT_FLOAT_EQ(y(2), 3 * x(2) * x(2));
  std::string const m = message_of([&] { tg::vjp(1, k, tg::in("x", x), tg::out("y", y, dy)); });
  EXPECT_NE(m.find("holds the address of a local variable of the kernel"), std::string::npos) << m;
  EXPECT_NE(m.find("test_loop.cpp"), std::string::npos) << m;
  EXPECT_NE(m.find("program (0"), std::string::npos) << m;
  // The same beside a tile on the heap captured by value (a body that cannot be cleared of
  // padding as a whole: its members are read one by one).
  auto heap = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const i = tg::arange<0, 8>();
    tg::tile<tg::fp32<T>, 8> const a = tg::load(x + i, i < x.size(0), 0.0f);
    tg::tile<std::int32_t, 32, 32> const big = tg::zeros<std::int32_t, 32, 32>();
    auto acc = tg::zeros<tg::fp32<T>, 8>();
    tg::loop(0, 3, 1, acc, [=, &a](int, auto& acc) { acc = acc + a * a + float(big(1, 1)); });
    tg::store(y + i, acc, i < y.size(0));
  };
  std::string const mh =
      message_of([&] { tg::vjp(1, heap, tg::in("x", x), tg::out("y", y, dy)); });
  EXPECT_NE(mh.find("captures a local by reference"), std::string::npos) << mh;
  // A mask made once before the loop and captured by value, as Triton kernels make it: the
  // expression keeps a reference to the offsets tile on the kernel's stack. The message said to
  // capture by value, which the body did; it now names such expressions too.
  auto lazy = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    tg::tile<std::int32_t, 8> const offs = tg::arange<0, 8>();
    auto const mask = offs < x.size(0);
    auto acc = tg::zeros<tg::fp32<T>, 8>();
    tg::loop(0, 3, 1, acc, [=](int, auto& acc) {
      tg::tile<tg::fp32<T>, 8> const a = tg::load(x + offs, mask, 0.0f);
      acc = acc + a * a;
    });
    tg::store(y + offs, acc, offs < y.size(0));
  };
  tg::launch(1, lazy, x.cview(), y.view());
  EXPECT_FLOAT_EQ(y(2), 3 * x(2) * x(2));
  std::string const ml = message_of([&] { tg::vjp(1, lazy, tg::in("x", x), tg::out("y", y, dy)); });
  EXPECT_NE(ml.find("an unevaluated expression that refers to a local tile"), std::string::npos)
      << ml;
  // The same of a tile of the kernel's float type: in reverse mode the expression kept the
  // values the tile held when it was made, and ran; it now refers to the tile, as the fast path's
  // does, and is refused the same way.
  auto adjoint_lazy = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const i = tg::arange<0, 8>();
    tg::tile<tg::fp32<T>, 8> const a = tg::load(x + i, i < x.size(0), 0.0f);
    auto const sq = a * a;
    auto acc = tg::zeros<tg::fp32<T>, 8>();
    tg::loop(0, 3, 1, acc, [=](int, auto& acc) { acc = acc + sq; });
    tg::store(y + i, acc, i < y.size(0));
  };
  tg::launch(1, adjoint_lazy, x.cview(), y.view());
  EXPECT_FLOAT_EQ(y(2), 3 * x(2) * x(2));
  std::string const ma =
      message_of([&] { tg::vjp(1, adjoint_lazy, tg::in("x", x), tg::out("y", y, dy)); });
  EXPECT_NE(ma.find("an unevaluated expression that refers to a local tile"), std::string::npos)
      << ma;
}

// Writes `address` into every word of `body` that is padding only, as a stack slot reused for
// the closure may hold it; returns how many (-1: the compiler cannot tell padding from members).
template <class Body>
int poison_padding(Body& body, void const* address) {
#if defined(__has_builtin)
#if __has_builtin(__builtin_clear_padding)
  alignas(Body) unsigned char probe[sizeof(Body)];
  std::memset(probe, 0xFF, sizeof probe);
  __builtin_clear_padding(reinterpret_cast<Body*>(probe));
  auto const a = reinterpret_cast<std::uintptr_t>(address);
  int words = 0;
  for (std::size_t off = 0; off + sizeof a <= sizeof(Body); off += sizeof a) {
    bool padding = true;
    for (std::size_t b = off; b < off + sizeof a; ++b)
      padding &= probe[b] == 0;
    if (padding) {
      std::memcpy(reinterpret_cast<unsigned char*>(&body) + off, &a, sizeof a);
      ++words;
    }
  }
  return words;
#endif
#endif
  return -1;
}

int poisoned_words = 0;

TEST(Loop, AStackAddressLeftInTheBodysPaddingIsNoCapture) {
  // A plain tile is 64-byte aligned: a body capturing a number and an offset tile has 60 bytes
  // of padding, which hold whatever the kernel's stack held there; here the address of one of
  // the kernel's locals. The check reads the members only.
  checkpoint_every_loop const checkpointed;
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    int const n = static_cast<int>(x.size(0));
    tg::tile<std::int32_t, 8> const i = tg::arange<0, 8>();
    auto acc = tg::zeros<tg::fp32<T>, 8>();
    auto body = [n, i, x](int j, auto& acc) {
      acc = acc + float(j + 1) * tg::load(x + i, i < n, 0.0f);
    };
    poisoned_words = poison_padding(body, &acc);
    tg::loop(0, 3, 1, acc, body);
    tg::store(y + i, acc, i < y.size(0));
  };
  owned<float> x({5}, "x"), y({5}, "y"), dy({5}, "dy");
  test_support::fill(x, 1);
  test_support::fill(dy, 2);
  std::string failure;
  tg::gradients<float> g;
  try {
    g = tg::vjp(1, k, tg::in("x", x), tg::out("y", y, dy));
  } catch (std::exception const& e) {
    failure = e.what();
  }
  ASSERT_EQ(failure, "");
  if (poisoned_words < 0)
    GTEST_SKIP() << "this compiler cannot tell a closure's padding from its members";
  ASSERT_GT(poisoned_words, 0) << "the closure has no padding word: the test tests nothing";
  for (int e = 0; e < 5; ++e) {
    EXPECT_FLOAT_EQ(y(e), 6 * x(e));
    EXPECT_FLOAT_EQ(g["x"](e), 6 * dy(e));
  }
}

// What a deeper call leaves on the stack: addresses of its own frame, where the kernel's frames
// come next.
[[gnu::noinline]] void leave_stack_addresses() {
  std::uintptr_t volatile words[512];
  for (int i = 0; i < 512; ++i)
    words[i] = reinterpret_cast<std::uintptr_t>(&words[i]);
}

template <class T>
[[gnu::noinline]] void triton_like_walk(tg::program const& p, tg::tensor<T const> x,
                                        tg::tensor<T> y) {
  using F = tg::fp32<T>;
  auto const rows = p.program_id(0) * 16 + tg::arange<0, 16>();
  // Offsets made once before the loop (4 KiB: a tile on the heap, so the body cannot be cleared
  // of padding as a whole) and a row mask (16 bytes).
  tg::tile<std::int64_t, 16, 32> const offs =
      tg::col(rows) * x.stride(0) + tg::row(tg::arange<0, 32>());
  tg::tile<bool, 16> const row_mask = rows < x.size(0);
  auto acc = tg::zeros<F, 16>();
  tg::loop(0, static_cast<int>(x.size(1)), 32, acc, [=](int k0, auto& acc) {
    auto const cols = k0 + tg::arange<0, 32>() < x.size(1);
    tg::tile<F, 16, 32> const v = tg::load(x + offs + k0, tg::col(row_mask) & tg::row(cols), 0.0f);
    acc = acc + tg::sum<1>(v * v);
  });
  tg::store(y + rows, acc, rows < y.size(0));
}

TEST(Loop, ABodyWithATileOnTheHeapIsReadByItsMembersOnly) {
  // Its padding holds what the stack held, here addresses in the kernel's own frames: a small
  // tile's padding (copied with the tile) and the words its copy leaves unwritten were taken for
  // by-reference captures, and the correct kernel was refused.
  auto k = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
    leave_stack_addresses();
    triton_like_walk(p, x, y);
  };
  owned<float> x({20, 70}, "x"), y({20}, "y"), dy({20}, "dy");
  test_support::fill(x, 3);
  test_support::fill(dy, 4);
  for (std::size_t budget : {std::size_t{0}, std::size_t{8} << 20}) {
    std::size_t const saved = tg::set_loop_record_budget(budget);
    std::string failure;
    tg::gradients<float> g;
    try {
      g = tg::vjp(2, k, tg::in("x", x), tg::out("y", y, dy));
    } catch (std::exception const& e) {
      failure = e.what();
    }
    tg::set_loop_record_budget(saved);
    ASSERT_EQ(failure, "") << "budget " << budget;
    for (int i = 0; i < 20; ++i)
      for (int j = 0; j < 70; ++j)
        ASSERT_FLOAT_EQ(g["x"](i, j), 2 * x(i, j) * dy(i)) << i << ", " << j;
  }
}

TEST(Loop, AStoreInTheBodyIsRefusedInReverseMode) {
  checkpoint_every_loop const checkpointed;
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const i = tg::arange<0, 8>();
    auto acc = tg::zeros<tg::fp32<T>, 8>();
    tg::loop(0, 2, 1, acc, [=](int j, auto& acc) {
      acc = acc + tg::load(x + i, i < x.size(0), 0.0f);
      tg::store(y + i, acc * float(j), i < y.size(0));
    });
  };
  owned<float> x({5}, "x"), y({5}, "y"), dy({5}, "dy");
  std::string const m = message_of([&] { tg::vjp(1, k, tg::in("x", x), tg::out("y", y, dy)); });
  EXPECT_NE(m.find("store by program (0"), std::string::npos) << m;
  EXPECT_NE(m.find("may load but not store"), std::string::npos) << m;
}

TEST(Loop, LoadsOfOwnEarlierStoresReplayAndALaterStoreIsRefused) {
  checkpoint_every_loop const checkpointed;
  // y is inout: the program stores into it before the loop (a load in the body sees that value,
  // in the forward run and in the replay alike), and, when `after` is set, once more after the
  // loop: a replayed load can no longer tell which store it saw, and is refused.
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y, int after) {
    auto const i = tg::arange<0, 8>();
    auto const m = i < x.size(0);
    tg::store(y + i, tg::load(x + i, m, 0.0f) * 2.0f, m);
    auto acc = tg::zeros<tg::fp32<T>, 8>();
    tg::loop(0, 3, 1, acc, [=](int, auto& acc) { acc = acc * 0.5f + tg::load(y + i, m, 0.0f); });
    if (after)
      tg::store(y + i, acc, m);
    else
      tg::store(y + i + 8, acc, m);
  };
  auto plain = [](owned<float> const& x, owned<float> const& dy) {
    // y[i] = 2 x[i]; y[i + 8] = (0.25 + 0.5 + 1) * 2 x[i]: dx[i] = 2 dy[i] + 3.5 dy[i + 8].
    owned<float> want({5}, "want");
    for (int i = 0; i < 5; ++i)
      want(i) = 2 * dy(i) + 3.5f * dy(i + 8);
    (void)x;
    return want;
  };
  owned<float> x({5}, "x"), y({13}, "y"), dy({13}, "dy");
  test_support::fill(x, 1);
  test_support::fill(dy, 2);
  auto const g = tg::vjp(1, k, tg::in("x", x), tg::inout("y", y, dy), 0);
  auto const want = plain(x, dy);
  for (int i = 0; i < 5; ++i)
    EXPECT_NEAR(g["x"](i), want(i), 1e-6) << i;
  std::string const m =
      message_of([&] { tg::vjp(1, k, tg::in("x", x), tg::inout("y", y, dy), 1); });
  EXPECT_NE(m.find("loads tensor 'y', element (0), inside the body of tg::loop"), std::string::npos)
      << m;
  EXPECT_NE(m.find("writes that element after the loop"), std::string::npos) << m;
}

// Integer tensors take the plain path of loads and stores in every mode; in reverse mode they
// are tracked as a launch that checks races tracks them. A counter bumped with atomic_add inside
// the body (the forward run of a checkpointed loop, the rerun of its first iteration and the
// replays would each bump it again) is refused as a float store is.
TEST(Loop, AnIntegerWriteInTheBodyIsRefusedInReverseMode) {
  auto k = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y,
                       tg::tensor<std::int32_t> count) {
    auto const i = tg::arange<0, 8>();
    auto acc = tg::zeros<tg::fp32<T>, 8>();
    tg::loop(0, 3, 1, acc, [=](int, auto& acc) {
      acc = acc * 0.5f + tg::load(x + i, i < x.size(0), 0.0f);
      tg::atomic_add(count + p.program_id(0) + tg::arange<0, 1>(), 1);
    });
    tg::store(y + i, acc, i < y.size(0));
  };
  owned<float> x({5}, "x"), y({5}, "y"), dy({5}, "dy");
  owned<std::int32_t> count({2}, "count");
  std::size_t const whole = tg::set_loop_record_budget(0); // the default: recorded whole
  for (std::size_t budget : {std::size_t{0}, whole}) {
    tg::set_loop_record_budget(budget);
    std::string const m = message_of(
        [&] { tg::vjp(2, k, tg::in("x", x), tg::out("y", y, dy), count.view()); });
    // (Which program throws first depends on the threads.)
    EXPECT_NE(m.find("atomic_add by program ("), std::string::npos) << m;
    EXPECT_NE(m.find("inside the body of tg::loop"), std::string::npos) << m;
  }
  tg::launch(2, k, x.cview(), y.view(), count.view()); // the fast path counts
  EXPECT_EQ(count(0), 3);
  EXPECT_EQ(count(1), 3);
}

// A work list in an integer tensor: the body loads the next column block from it, and the
// program marks its list consumed (zeros) after the loop. Replayed, the body would read the
// zeros and differentiate the wrong blocks (a gradient off by 24 where it is 3 x^2); that load is
// refused. Marking another column of the list (the program's "done" flag) is fine, and gives the
// plain loop's gradients bitwise.
template <bool Checkpointed>
constexpr auto work_list = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                       tg::tensor<T> y, tg::tensor<std::int32_t> order,
                                       int consume) {
  using F = tg::fp32<T>;
  int const pid = p.program_id(0);
  auto const rows = pid * R + tg::arange<0, R>();
  int const blocks = static_cast<int>(order.size(1)) - 1; // the last column: a "done" flag
  auto const body = [=](int t, auto& acc) {
    int const cb = tg::load(order + pid * order.stride(0) + t + tg::arange<0, 1>())(0);
    auto const cols = cb * C + tg::arange<0, C>();
    tg::tile<F, R, C> const v = tg::load(x + tg::col(rows) * x.stride(0) + tg::row(cols),
                                         tg::col(rows < x.size(0)) & tg::row(cols < x.size(1)),
                                         0.0f);
    acc = acc + tg::sum<1>(v * v * v);
  };
  auto acc = tg::zeros<F, R>();
  if constexpr (Checkpointed)
    tg::loop(0, blocks, 1, acc, body);
  else
    for (int t = 0; t < blocks; ++t)
      body(t, acc);
  tg::store(y + rows, acc, rows < y.size(0));
  auto const j = tg::arange<0, 8>();
  auto const row = order + pid * order.stride(0);
  if (consume == 1) // the list itself
    tg::store(row + j, 0, j < blocks);
  else if (consume == 2) // the list claimed the atomic way: exchange returns what was there
    (void)tg::atomic_xchg(row + j, 0, j < blocks);
  else if (consume == 3) // every entry bumped (a rotated list)
    (void)tg::atomic_add(row + j, 1, j < blocks);
  else if (consume == 4) { // the first entries cleared by compare-and-swap
    auto const head = row + tg::arange<0, 4>();
    (void)tg::atomic_cas(head, tg::load(head), tg::zeros<std::int32_t, 4>());
  } else // its flag
    tg::store(row + blocks + tg::arange<0, 1>(), 1);
};

TEST(Loop, AReplayedIntegerLoadOfAnElementWrittenAfterTheLoopIsRefused) {
  checkpoint_every_loop const checkpointed;
  int const n = 2 * R + 3, blocks = 5, d = blocks * C;
  owned<float> x({n, d}, "x"), y({n}, "y"), dy({n}, "dy");
  test_support::fill(x, 7);
  test_support::fill(dy, 8);
  owned<std::int32_t> order({3, blocks + 1}, "order");
  auto reset = [&] {
    for (int q = 0; q < 3; ++q) {
      for (int t = 0; t < blocks; ++t)
        order(q, t) = (3 * t + q) % blocks;
      order(q, blocks) = 0;
    }
  };
  // A store after the loop, and each atomic: they are no races between programs, but the
  // replay would read what they left (the atomics once went unseen: the replays read the new
  // entries and the gradient landed on the wrong columns).
  for (int consume = 1; consume <= 4; ++consume) {
    reset();
    std::string const m = message_of([&] {
      tg::vjp(3, work_list<true>, tg::in("x", x), tg::out("y", y, dy), order.view(), consume);
    });
    EXPECT_NE(m.find("loads tensor 'order', element ("), std::string::npos) << consume << m;
    EXPECT_NE(m.find("writes that element after the loop"), std::string::npos) << consume << m;
  }
  reset();
  auto const g = tg::vjp(3, work_list<true>, tg::in("x", x), tg::out("y", y, dy), order.view(), 0);
  reset();
  auto const want =
      tg::vjp(3, work_list<false>, tg::in("x", x), tg::out("y", y, dy), order.view(), 0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < d; ++j) {
      ASSERT_EQ(g["x"](i, j), want["x"](i, j)) << i << ", " << j;
      ASSERT_NEAR(g["x"](i, j), 3.0 * x(i, j) * x(i, j) * dy(i), 1e-5) << i << ", " << j;
    }
}

// Two programs storing one element of an integer tensor: reverse mode reports the race, as a
// launch that checks races does (it ran the kernel and let the last program win).
TEST(Loop, RacesOnIntegerTensorsAreReportedInReverseMode) {
  auto k = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y,
                       tg::tensor<std::int32_t> flag, int shared) {
    auto const i = p.program_id(0) * 4 + tg::arange<0, 4>();
    tg::store(y + i, tg::load(x + i, i < x.size(0), 0.0f) * 2.0f, i < y.size(0));
    tg::store(flag + (shared ? 0 : p.program_id(0)) + tg::arange<0, 1>(), p.program_id(0) + 1);
  };
  owned<float> x({7}, "x"), y({7}, "y"), dy({7}, "dy");
  owned<std::int32_t> flag({2}, "flag");
  try {
    (void)tg::vjp(2, k, tg::in("x", x), tg::out("y", y, dy), flag.view(), 1);
    ADD_FAILURE() << "a race on an integer tensor passed";
  } catch (tg::race_error const& e) {
    EXPECT_NE(std::string(e.what()).find("tilegrad::vjp: race on tensor 'flag', element (0)"), std::string::npos)
        << e.what();
  }
  auto const g = tg::vjp(2, k, tg::in("x", x), tg::out("y", y, dy), flag.view(), 0);
  EXPECT_EQ(flag(0), 1);
  EXPECT_EQ(flag(1), 2);
  EXPECT_EQ(g["x"](6), 2 * dy(6));
}

// What is not a race on integer tensors in reverse mode: atomics of any kind (a claim flag
// exchanged by every program, a lock, a counter: they synchronise programs), and writes through a
// view the kernel captures (not tracked, as before integer tensors were). Both were refused
// once vjp tracked integer tensors, the second only when the kernel also took one.
TEST(Loop, IntegerAtomicsAndCapturedWritesAreNoRacesInReverseMode) {
  owned<std::int32_t> captured({4}, "captured");
  tg::tensor<std::int32_t> const cap = captured.view();
  auto k = [cap]<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y,
                          tg::tensor<std::int32_t> flag) {
    auto const i = p.program_id(0) * 4 + tg::arange<0, 4>();
    tg::store(y + i, tg::load(x + i, i < x.size(0), 0.0f) * 3.0f, i < y.size(0));
    (void)tg::atomic_xchg(flag + tg::arange<0, 1>(), p.program_id(0));
    (void)tg::atomic_max(flag + 1 + tg::arange<0, 1>(), p.program_id(0));
    tg::store(cap + p.program_id(0) + tg::arange<0, 1>(), 7);
  };
  owned<float> x({7}, "x"), y({7}, "y"), dy({7}, "dy");
  test_support::fill(dy, 9);
  owned<std::int32_t> flag({2}, "flag");
  auto const g = tg::vjp(2, k, tg::in("x", x), tg::out("y", y, dy), flag.view());
  for (int i = 0; i < 7; ++i)
    EXPECT_EQ(g["x"](i), 3 * dy(i));
  EXPECT_EQ(flag(1), 1);
  EXPECT_EQ(captured(0), 7);
  EXPECT_EQ(captured(1), 7);
}

// Another program's atomic on a counter a tg::loop body reads, landing between the loop's first
// run and its replay in the sweep: the replay reads the new count and would differentiate other
// columns (program 1's dx went to the columns of count 1 where y read those of count 0, with no
// error). The replay is refused, naming the loop and the iteration. Two programs on two OpenMP
// threads, made to meet in that order by host flags (each wait gives up after 10 s: a machine
// that cannot run both at once checks nothing, and says so).
TEST(Loop, AReplayThatReadsAnotherProgramsAtomicIsRefused) {
  if (!tg::executor_available(tg::executor::openmp))
    GTEST_SKIP() << "needs two programs running at once (OpenMP)";
  checkpoint_every_loop const checkpointed;
  std::atomic<int> stage{0};
  bool waited_out = false;
  auto wait_for = [&](int s) {
    auto const until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (stage.load() < s)
      if (std::chrono::steady_clock::now() > until) {
        waited_out = true;
        return;
      }
  };
  auto k = [&]<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y,
                        tg::tensor<std::int32_t> count) {
    using F = tg::fp32<T>;
    auto const one = tg::arange<0, 1>();
    if (p.program_id(0) == 0) { // bumps the count once program 1 has run its loop
      wait_for(1);
      (void)tg::atomic_add(count + one, 1);
      stage.store(2);
      return;
    }
    auto acc = tg::zeros<F, C>();
    auto const body = [=](int t, auto& acc) {
      int const c = tg::load(count + one)(0); // which block of columns: 0, or 1 once bumped
      auto const cols = (t + c) * C + tg::arange<0, C>();
      tg::tile<F, C> const v = tg::load(x + cols, cols < x.size(0), 0.0f);
      acc = acc + v * v;
    };
    tg::loop(0, 2, 1, acc, body);
    stage.store(1);
    wait_for(2);
    tg::store(y + tg::arange<0, C>(), acc);
  };
  owned<float> x({3 * C}, "x"), y({C}, "y"), dy({C}, "dy");
  test_support::fill(x, 3);
  test_support::fill(dy, 4);
  owned<std::int32_t> count({1}, "count");
  count(0) = 0;
  std::string const m = message_of([&] {
    (void)tg::vjp({tg::executor::openmp, 2}, tg::grid(2), k, tg::in("x", x), tg::out("y", y, dy),
                  count.view());
  });
  if (waited_out)
    GTEST_SKIP() << "the two programs did not run at once";
  EXPECT_NE(m.find("program (1, 0, 0)"), std::string::npos) << m;
  EXPECT_NE(m.find("the body of tg::loop (at "), std::string::npos) << m;
  EXPECT_NE(m.find("iteration 1, read other values"), std::string::npos) << m;
  EXPECT_EQ(count(0), 1);
}

// One variable passed twice as carried values: each keeps its own copies and adjoints, so once
// the loop was checkpointed one's share of the gradient was lost (x's gradient 1.21 where central
// differences give 1.32); under the default budget it was right. Refused either way, naming the
// loop; two variables that start as copies of one tile are the way to write it.
TEST(Loop, OneVariableCarriedTwiceIsRefused) {
  int const line = __LINE__ + 6;
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    using F = tg::fp32<T>;
    auto const i = tg::arange<0, 4>();
    tg::tile<F, 4> const v = tg::load(x + i);
    tg::tile<F, 4> acc = v;
    tg::loop(0, 3, 1, acc, acc, [=](int, auto& a1, auto& a2) {
      a1 = tg::sin(a1 * v);
      a2 = a2 * v + 0.5f;
    });
    tg::store(y + i, acc);
  };
  owned<double> x({4}, "x"), y({4}, "y"), dy({4}, "dy");
  test_support::fill(x, 1);
  test_support::fill(dy, 2);
  for (std::size_t budget : {std::size_t{0}, std::size_t{8} << 20}) {
    std::size_t const saved = tg::set_loop_record_budget(budget);
    std::string const m =
        message_of([&] { tg::vjp(1, k, tg::in("x", x), tg::out("y", y, dy)); });
    tg::set_loop_record_budget(saved);
    EXPECT_NE(m.find("tilegrad::vjp: tg::loop at "), std::string::npos) << m;
    EXPECT_NE(m.find("test_loop.cpp:" + std::to_string(line)), std::string::npos) << m;
    EXPECT_NE(m.find("carries one variable twice (carried values 1 and 2)"), std::string::npos)
        << m;
  }
  // The fast path runs it as the plain loop it is.
  tg::launch(1, k, x.cview(), y.view());
  double want = x(0); // (a1 and a2 are acc)
  for (int t = 0; t < 3; ++t)
    want = std::sin(want * x(0)) * x(0) + 0.5;
  EXPECT_NEAR(y(0), want, 1e-12);
}

// Sizes come as int64: a bound past the int range of the body's index is refused, naming the
// loop, where it was silently cut to int (a trip count of 1 for 17).
TEST(Loop, ABoundPastTheIntRangeIsRefused) {
  std::int64_t volatile const size = (std::int64_t{1} << 32) + (std::int64_t{1} << 28);
  std::int64_t const end = size; // a size known at run time, as x.size(1)
  int trips = 0;
  std::string const m = message_of([&] {
    tg::loop(std::int64_t{0}, end, std::int64_t{1} << 28, trips, [](int, int& t) { ++t; });
  });
  EXPECT_NE(m.find("tilegrad::loop at "), std::string::npos) << m;
  EXPECT_NE(m.find("end 4563402752 is outside the int range"), std::string::npos) << m;
  EXPECT_EQ(trips, 0);
  // int64 bounds inside the range run as int ones, to the last index before the end.
  std::int64_t const big_end = std::numeric_limits<int>::max();
  int last = 0;
  tg::loop(std::numeric_limits<int>::max() - 10, big_end, std::int64_t{4}, last,
           [](int i, int& l) { l = i; });
  EXPECT_EQ(last, std::numeric_limits<int>::max() - 2);
}

// A step of 0 never ends: refused naming the loop's line, on the fast path and in reverse mode.
TEST(Loop, AStepOfZeroIsRefusedNamingTheLoop) {
  int const line = __LINE__ + 5;
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y, int step) {
    auto const i = tg::arange<0, 4>();
    tg::tile<tg::fp32<T>, 4> const v = tg::load(x + i);
    tg::tile<tg::fp32<T>, 4> acc = v;
    tg::loop(0, 3, step, acc, [=](int, auto& a) { a = a * v; });
    tg::store(y + i, acc);
  };
  owned<double> x({4}, "x"), y({4}, "y"), dy({4}, "dy");
  test_support::fill(x, 1);
  test_support::fill(dy, 2);
  std::string const where = "test_loop.cpp:" + std::to_string(line) + ": the step is 0";
  std::string const fast = message_of([&] { tg::launch(1, k, x.cview(), y.view(), 0); });
  EXPECT_NE(fast.find(where), std::string::npos) << fast;
  std::string const rev =
      message_of([&] { tg::vjp(1, k, tg::in("x", x), tg::out("y", y, dy), 0); });
  EXPECT_NE(rev.find(where), std::string::npos) << rev;
  tg::launch(1, k, x.cview(), y.view(), 1); // the same kernel with a step runs
  EXPECT_NEAR(y(0), x(0) * x(0) * x(0) * x(0), 1e-12);
}

// A plain tile of more than 512 bytes (its values on the heap) carried through the loop in
// reverse mode, beside an adjoint one: the same gradients as the plain loop.
TEST(Loop, ALargePlainTileIsCarriedInReverseMode) {
  checkpoint_every_loop const checkpointed;
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const i = tg::arange<0, 16>();
    auto acc = tg::zeros<tg::fp32<T>, 16>();
    auto seen = tg::zeros<std::int32_t, 16, 16>(); // 1 KiB
    tg::loop(0, 5, 1, acc, seen, [=](int t, auto& acc, auto& seen) {
      seen = seen + 1;
      acc = acc * 0.5f + tg::load(x + i, i < x.size(0), 0.0f) * float(t + seen(0, 0));
    });
    tg::store(y + i, acc, i < y.size(0));
  };
  owned<float> x({13}, "x"), y({13}, "y"), dy({13}, "dy");
  test_support::fill(x, 3);
  test_support::fill(dy, 4);
  auto const g = tg::vjp(1, k, tg::in("x", x), tg::out("y", y, dy));
  // y = sum_t 0.5^(4 - t) (2 t + 1) x: dx = dy * (1/16 + 3/8 + 5/4 + 7/2 + 9) = 14.1875 dy.
  for (int i = 0; i < 13; ++i)
    EXPECT_FLOAT_EQ(g["x"](i), 14.1875f * dy(i)) << i;
}

// A body that reads state it changes but the loop does not carry, through a pointer it captures
// (a count of its calls, kept outside the kernel): the capture check cannot see it (the address
// is on the heap), and the sweep's replays read other counts than the first runs did, so the
// gradient would be that of another function. A replay that does not carry on what its first
// run carried on is refused, naming the loop and the iteration; a body whose pointer reads
// state that does not change, and the plain loop, run.
TEST(Loop, ABodyReadingStateItChangesButDoesNotCarryIsRefused) {
  checkpoint_every_loop const checkpointed;
  int const line = __LINE__ + 7;
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y,
                       std::shared_ptr<int> calls, int change) {
    auto const i = tg::arange<0, 8>();
    tg::tile<tg::fp32<T>, 8> const v = tg::load(x + i, i < x.size(0), 0.0f);
    auto acc = tg::zeros<tg::fp32<T>, 8>();
    auto n = 0.5;
    tg::loop(0, 4, 1, n, acc, [=](int, auto& n, auto& acc) {
      acc = acc * v + float(*calls);
      *calls += change;
      n = n + 1;
    });
    tg::store(y + i, acc * float(n), i < y.size(0));
  };
  owned<float> x({5}, "x"), y({5}, "y"), dy({5}, "dy");
  test_support::fill(x, 1);
  test_support::fill(dy, 2);
  std::string const refused = message_of(
      [&] { tg::vjp(1, k, tg::in("x", x), tg::out("y", y, dy), std::make_shared<int>(1), 1); });
  for (std::string const& piece : std::vector<std::string>{
           "program (0, 0, 0): the body of tg::loop (at ",
           "test_loop.cpp:" + std::to_string(line) +
               "), iteration 3, gave "
               "carried value 1 (counting from 0) other values when the reverse "
               "sweep ran it again"})
    EXPECT_NE(refused.find(piece), std::string::npos) << piece << "\n" << refused;
  // State that does not change: the gradient of acc = ((v + 1) v + 1) v + 1 times 4.5.
  auto const g = tg::vjp(1, k, tg::in("x", x), tg::out("y", y, dy), std::make_shared<int>(1), 0);
  for (int i = 0; i < 5; ++i) {
    float const a = x(i);
    EXPECT_NEAR(g["x"](i), 4.5f * dy(i) * (3 * a * a + 2 * a + 1),
                1e-4f * (1 + std::abs(g["x"](i))))
        << i;
  }
}

// A tile held behind a pointer the body captures, made before the loop and assigned in the body,
// or made in the body and kept past its iteration in a captured container: once the loop was
// checkpointed, such a tile pointed at values the loop had rewound (the next iteration's took
// their place), and where the replay repeated the loss the gradient was wrong with no error.
// Refused where it is read, naming the loop; under the record budget (no rewind) such a kernel
// works as the plain loop, and its gradient is that of the same kernel with the tile carried.
TEST(Loop, ATileKeptThroughAPointerPastARewindIsRefused) {
  static int line = 0, escape_line = 0;
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y, bool carry,
                       bool copy) {
    using F = tg::fp32<T>;
    auto const i = tg::arange<0, 8>();
    tg::tile<F, 8> const v = tg::load(x + i, i < x.size(0), 0.0f);
    auto acc = tg::zeros<F, 8>();
    if (carry) {
      tg::tile<F, 8> h = v;
      tg::loop(0, 3, 1, acc, h, [=](int, auto& acc, auto& h) {
        h = h * v;
        acc = acc + h;
      });
      tg::store(y + i, acc + h, i < y.size(0));
      return;
    }
    auto const held = std::make_shared<tg::tile<F, 8>>(v);
    line = __LINE__ + 1;
    tg::loop(0, 3, 1, acc, [=](int, auto& acc) {
      if (copy) {
        tg::tile<F, 8> const next = *held * v;
        *held = next; // a copy of a tile of the iteration
      } else {
        *held = *held * v;
      }
      acc = acc + *held;
    });
    tg::store(y + i, acc + *held, i < y.size(0));
  };
  auto escapes = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    using F = tg::fp32<T>;
    auto const i = tg::arange<0, 8>();
    tg::tile<F, 8> const v = tg::load(x + i, i < x.size(0), 0.0f);
    auto acc = tg::zeros<F, 8>();
    auto const kept = std::make_shared<std::vector<tg::tile<F, 8>>>();
    escape_line = __LINE__ + 1;
    tg::loop(0, 3, 1, acc, [=](int, auto& acc) {
      acc = acc * v + 1.0f;
      kept->push_back(acc * v);
    });
    tg::store(y + i, acc + kept->back(), i < y.size(0));
  };
  owned<double> x({5}, "x"), y({5}, "y"), dy({5}, "dy");
  test_support::fill(x, 1);
  test_support::fill(dy, 2);
  // Carried: y = v^2 + v^3 + 2 v^4. Kept: y = (v^2 + v + 1)(1 + v).
  auto const carried = tg::vjp(1, k, tg::in("x", x), tg::out("y", y, dy), true, false);
  for (int j = 0; j < 5; ++j) {
    double const a = x(j);
    EXPECT_NEAR(carried["x"](j), dy(j) * (2 * a + 3 * a * a + 8 * a * a * a), 1e-12) << j;
  }
  {
    checkpoint_every_loop const checkpointed;
    for (bool copy : {false, true}) {
      std::string const refused = message_of(
          [&] { (void)tg::vjp(1, k, tg::in("x", x), tg::out("y", y, dy), false, copy); });
      EXPECT_NE(refused.find("program (0, 0, 0): a tile made or assigned in the body of tg::loop "
                             "(at "),
                std::string::npos)
          << refused;
      EXPECT_NE(
          refused.find("test_loop.cpp:" + std::to_string(line) + ") is read after its iteration"),
          std::string::npos)
          << refused;
    }
    std::string const stale =
        message_of([&] { (void)tg::vjp(1, escapes, tg::in("x", x), tg::out("y", y, dy)); });
    EXPECT_NE(stale.find("test_loop.cpp:" + std::to_string(escape_line) +
                         ") is read after its iteration"),
              std::string::npos)
        << stale;
    // Carried, the checkpointed loop's gradient is the recorded one's, bitwise.
    auto const again = tg::vjp(1, k, tg::in("x", x), tg::out("y", y, dy), true, false);
    for (int j = 0; j < 5; ++j)
      EXPECT_EQ(again["x"](j), carried["x"](j)) << j;
  }
  for (bool copy : {false, true}) {
    auto const g = tg::vjp(1, k, tg::in("x", x), tg::out("y", y, dy), false, copy);
    for (int j = 0; j < 5; ++j)
      EXPECT_NEAR(g["x"](j), carried["x"](j), 1e-12) << j;
  }
  auto const ge = tg::vjp(1, escapes, tg::in("x", x), tg::out("y", y, dy));
  for (int j = 0; j < 5; ++j) {
    double const a = x(j);
    EXPECT_NEAR(ge["x"](j), dy(j) * ((2 * a + 1) * (1 + a) + a * a + a + 1), 1e-12) << j;
  }
  // The fast path runs the plain loop, pointer and all.
  owned<float> xf({5}, "x"), yf({5}, "y");
  test_support::fill(xf, 1);
  tg::launch(1, k, xf.cview(), yf.view(), false, false);
  for (int j = 0; j < 5; ++j) {
    float const a = xf(j);
    EXPECT_NEAR(yf(j), a * a + a * a * a + 2 * a * a * a * a, 1e-5f) << j;
  }
}

// The replay check above, under check_backward's rounding jitter with whole moves: an inner
// loop that fits the record budget is recorded whole in the outer loop's replay but checkpointed
// in its first run (which records nothing), so a captured value's move is drawn once in one and
// per iteration in the other. The replays move values a little otherwise, which the estimate
// allows; they must not be refused (at budgets of 2-8 KiB they were).
TEST(Loop, NestedLoopsUnderWholeMovesOfTheJitterAreNotRefused) {
  auto const nest = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
    using F = tg::fp32<T>;
    auto const i = p.program_id(0) * 16 + tg::arange<0, 16>();
    tg::tile<F, 16> const v = tg::exp(tg::load(x + i, i < x.size(0), 0.0f) * 0.5f);
    auto acc = tg::zeros<F, 16>();
    tg::loop(0, 4, 1, acc, [=](int, auto& acc) {
      tg::tile<F, 16> const w = tg::sin(acc) + v;
      auto in = tg::zeros<F, 16>();
      tg::loop(0, 3, 1, in, [=](int, auto& in) { in = in * v + w * 0.25f; });
      acc = acc * 0.5f + in;
    });
    tg::store(y + i, acc, i < y.size(0));
  };
  owned<double> x({40}, "x"), y({40}, "y"), dy({40}, "dy");
  test_support::fill(x, 1);
  test_support::fill(dy, 2);
  std::size_t const saved = tg::set_loop_record_budget(0);
  for (bool whole : {false, true})
    for (std::size_t kib : {0, 1, 2, 4, 8, 16, 8192}) {
      tg::set_loop_record_budget(kib << 10);
      tg::ad::jitter_scope const jitter({0x1234567ull, 0x1p-24, 1.0, whole});
      EXPECT_NO_THROW(
          (void)tg::vjp({tg::executor::sequential}, 3, nest, tg::in("x", x), tg::out("y", y, dy)))
          << "whole moves " << whole << ", budget " << kib << " KiB";
    }
  tg::set_loop_record_budget(saved);
}

} // namespace

} // namespace test_loop
