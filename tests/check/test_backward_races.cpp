// Races, determinism and checked mode in check_backward and in launches that check for races.
// The kernels: a linear attention o = (q kᵀ) v, whose backward has FlashAttention's shape (one
// program per key tile computes dK and dV and adds each query tile's share of dQ). Adding dQ with
// load + add + store instead of atomic_add is a race that check_backward must report, naming both
// programs, the tensor, the element and the line, on every run, whatever the thread count; the
// atomic version passes, and run-to-run differences from the order of its additions are noted,
// not failed. Out-of-bounds accesses are failures with tilegrad's message, never crashes, even
// with checking switched off; a backward that throws or returns NaN still gets a full report.
#include <tilegrad/check/gtest.hpp>
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_backward_races {

namespace tg = tilegrad;

namespace {

constexpr int B = 16, D = 16;

// Forward: o = (q kᵀ) v, one program per query tile of B rows.
constexpr auto lin_fwd = []<class T>(tg::program const& p, tg::tensor<T const> q,
                                     tg::tensor<T const> k, tg::tensor<T const> v,
                                     tg::tensor<T> o) {
  int const q0 = p.program_id(0) * B, n = static_cast<int>(q.size(0));
  auto const qi = tg::load(tg::make_block_ptr<B, D>(q, {q0, 0}), tg::bounds<0>);
  auto acc = tg::zeros<T, B, D>();
  for (int k0 = 0; k0 < n; k0 += B) {
    auto const kj = tg::load(tg::make_block_ptr<B, D>(k, {k0, 0}), tg::bounds<0>);
    auto const vj = tg::load(tg::make_block_ptr<B, D>(v, {k0, 0}), tg::bounds<0>);
    acc = tg::dot(tg::dot(qi, tg::trans(kj)), vj, std::move(acc));
  }
  tg::store(tg::make_block_ptr<B, D>(o, {q0, 0}), acc, tg::bounds<0>);
};

enum class dq_by {
  atomic_add,     // correct
  load_add_store, // a race between the key-tile programs
};

int const bwd_first_line = __LINE__;
// Backward: program p takes key tile p (or, with `reversed`, the key tiles in reverse order, so
// that dQ receives the same additions in another order) and adds its share of dQ.
template <dq_by How>
constexpr auto lin_bwd = []<class T>(tg::program const& p, tg::tensor<T const> q,
                                     tg::tensor<T const> k, tg::tensor<T const> v,
                                     tg::tensor<T const> d_o, tg::tensor<T> dq, tg::tensor<T> dk,
                                     tg::tensor<T> dv, bool reversed) {
  int const n = static_cast<int>(q.size(0));
  int const tile = reversed ? p.num_programs(0) - 1 - p.program_id(0) : p.program_id(0);
  int const k0 = tile * B;
  auto const kj = tg::load(tg::make_block_ptr<B, D>(k, {k0, 0}), tg::bounds<0>);
  auto const vj = tg::load(tg::make_block_ptr<B, D>(v, {k0, 0}), tg::bounds<0>);
  auto dk_acc = tg::zeros<T, B, D>();
  auto dv_acc = tg::zeros<T, B, D>();
  for (int q0 = 0; q0 < n; q0 += B) {
    auto const qi = tg::load(tg::make_block_ptr<B, D>(q, {q0, 0}), tg::bounds<0>);
    auto const doi = tg::load(tg::make_block_ptr<B, D>(d_o, {q0, 0}), tg::bounds<0>);
    tg::tile<T, B, B> const s = tg::dot(qi, tg::trans(kj));
    tg::tile<T, B, B> const ds = tg::dot(doi, tg::trans(vj));
    dv_acc = tg::dot(tg::trans(s), doi, std::move(dv_acc));
    dk_acc = tg::dot(tg::trans(ds), qi, std::move(dk_acc));
    auto const rows = q0 + tg::arange<0, B>();
    auto const at = dq + (tg::col(rows) * dq.stride(0) + tg::row(tg::arange<0, D>()));
    if constexpr (How == dq_by::atomic_add)
      tg::atomic_add(at, tg::dot(ds, kj), tg::col(rows) < n);
    else
      tg::store(at, tg::load(at, tg::col(rows) < n) + tg::dot(ds, kj), tg::col(rows) < n);
  }
  tg::store(tg::make_block_ptr<B, D>(dk, {k0, 0}), dk_acc, tg::bounds<0>);
  tg::store(tg::make_block_ptr<B, D>(dv, {k0, 0}), dv_acc, tg::bounds<0>);
};

int const bwd_last_line = __LINE__;

struct backward_options {
  float extra_on_second = 0; // the second call adds this to dq(0, 0) atomically
  // dq added into a buffer, then copied: by tg::copy, by hand, by a launch that loads the
  // buffer and stores dq (FlashAttention-2's dq_accum and its postprocess kernel), or by two
  // launches (one that unscales the buffer into a second one, one that stores dq from it)
  enum { none, with_copy, by_hand, by_launch, by_two_launches } accumulator = none;
};

constexpr auto finish_dq = [](tg::program const& p, tg::tensor<float const> acc,
                              tg::tensor<float> dq) {
  auto const i = p.program_id(0) * 64 + tg::arange<0, 64>();
  auto const in = i < acc.numel();
  tg::store(dq + i, tg::load(acc + i, in, 0.0f), in);
};

// The hand-written backward: zeroed gradients, one launch, named tensors.
template <dq_by How>
auto backward(backward_options bo = {}) {
  return [bo, calls = 0](tg::backward_context<float>& ctx) mutable {
    auto const q = ctx.input("q"), k = ctx.input("k"), v = ctx.input("v");
    auto const d_o = ctx.cotangent("o");
    std::int64_t const n = q.size(0);
    tg::owned_tensor<float> dq({n, D}, "dq"), dk({n, D}, "dk"), dv({n, D}, "dv");
    tg::owned_tensor<float> acc({n, D}, "dq accumulator");
    auto const into = bo.accumulator == backward_options::none ? dq.view() : acc.view();
    // (The determinism check's second run takes the programs, and so the key tiles, in reverse
    // order: dQ receives the same additions in another order.)
    tg::launch(ctx.options(), tg::cdiv<int>(int(n), B), lin_bwd<How>, q, k, v, d_o, into, dk.view(),
               dv.view(), false);
    if (bo.extra_on_second != 0 && calls == 1)
      tg::launch(
          ctx.options(), 1,
          [x = bo.extra_on_second](tg::program const&, tg::tensor<float> g) {
            tg::atomic_add(g + tg::arange<0, 1>(), x);
          },
          into);
    if (bo.accumulator == backward_options::with_copy)
      tg::copy(acc.cview(), dq.view());
    else if (bo.accumulator == backward_options::by_hand)
      std::copy(acc.begin(), acc.end(), dq.begin());
    else if (bo.accumulator == backward_options::by_launch)
      tg::launch(ctx.options(), tg::cdiv(acc.numel(), 64), finish_dq, acc.cview(), dq.view());
    else if (bo.accumulator == backward_options::by_two_launches) {
      tg::owned_tensor<float> unscaled({n, D}, "unscaled dq");
      tg::launch(ctx.options(), tg::cdiv(acc.numel(), 64), finish_dq, acc.cview(),
                 unscaled.view());
      tg::launch(ctx.options(), tg::cdiv(acc.numel(), 64), finish_dq, unscaled.cview(),
                 dq.view());
    }
    ++calls;
    ctx.set_gradient("q", dq);
    ctx.set_gradient("k", dk);
    ctx.set_gradient("v", dv);
  };
}

template <class Backward>
tg::check_report check(Backward&& bwd, std::int64_t n, tg::launch_options lo = {}, int seeds = 1) {
  tg::owned_tensor<float> q({n, D}), k({n, D}), v({n, D}), o({n, D});
  return tg::check_backward(tg::forward(tg::cdiv<int>(int(n), B), lin_fwd, tg::in("q", q),
                                        tg::in("k", k), tg::in("v", v), tg::out("o", o)),
                            std::forward<Backward>(bwd), {.seeds = seeds, .launch = lo});
}

std::vector<tg::launch_options> launch_cases() {
  std::vector<tg::launch_options> out;
  for (auto e : {tg::executor::tbb, tg::executor::openmp, tg::executor::sequential})
    if (tg::executor_available(e))
      for (int threads : {1, 2, 4})
        out.push_back({e, threads});
  return out;
}

// The problem line of the report that names a race ("" if none).
std::string race_line(tg::check_report const& r) {
  for (auto const& p : r.problems())
    if (p.find("race in launch") != std::string::npos)
      return p;
  return "";
}

} // namespace

TEST(BackwardRaces, LoadAddStoreIntoDqFailsNamingBothProgramsOnEveryRun) {
  std::string first;
  for (auto const& lo : launch_cases())
    for (int run = 0; run < 2; ++run) {
      auto const r = check(backward<dq_by::load_add_store>(), 40, lo);
      ASSERT_FALSE(r) << r;
      std::string const line = race_line(r);
      ASSERT_FALSE(line.empty()) << r;
      // Program 1's first dQ tile is the first access, in program order, that meets another
      // program's: it loads what program 0 stored.
      for (char const* piece :
           {"race in launch 1 of the backward (grid (3)): ", "race on tensor 'dq', element (0, 0)",
            "program (1, 0, 0) loads it at ", "program (0, 0, 0) stores it at ",
            "test_backward_races.cpp:"})
        EXPECT_NE(line.find(piece), std::string::npos) << piece << "\n" << line;
      if (first.empty())
        first = line;
      EXPECT_EQ(line, first) << "executor " << tg::to_string(lo.exec) << ", " << lo.num_threads
                             << " threads";
      // Everything else is still compared: dK and dV are right.
      EXPECT_TRUE(r.gradient("k")->ok) << r;
      EXPECT_TRUE(r.gradient("v")->ok) << r;
    }
}

TEST(BackwardRaces, RaceMessageNamesTheLineOfTheUpdate) {
  auto const r = check(backward<dq_by::load_add_store>(), 40);
  std::string const line = race_line(r);
  // Both accesses are the one statement `tg::store(at, tg::load(at, ...) + ...)` above.
  auto const at = line.find("test_backward_races.cpp:");
  ASSERT_NE(at, std::string::npos) << line;
  int const l = std::stoi(line.substr(at + std::string("test_backward_races.cpp:").size()));
  EXPECT_GT(l, bwd_first_line);
  EXPECT_LT(l, bwd_last_line);
  EXPECT_NE(line.find("test_backward_races.cpp:" + std::to_string(l), at + 1), std::string::npos)
      << line;
}

TEST(BackwardRaces, AtomicDqBackwardPasses) {
  for (auto const& lo : launch_cases())
    EXPECT_BACKWARD_OK(check(backward<dq_by::atomic_add>(), 40, lo, 2));
}

// y = x * w + bias over rows, one program per 32 rows; its backward adds each program's share of
// dw with atomic_add (correct) and of dbias with load + add + store (a race). The tracing of a run
// stops at its first race, so dw's additions after it went uncounted, and the report called the
// correct dw "not deterministic ... (n = 2 additions)" beside the race. The race fails the check;
// dw's differences are a note that says why they are not judged. The race names the unnamed db
// by the gradient it is handed back as.
TEST(BackwardDeterminism, AfterARaceOtherGradientsAreNotCalledNonDeterministic) {
  constexpr int R = 32, C = 64;
  auto const fwd = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T const> w,
                               tg::tensor<T const> bias, tg::tensor<T> y) {
    auto const rows = p.program_id(0) * std::int64_t{R} + tg::arange<0, R>();
    auto const cols = tg::arange<0, C>();
    auto const cm = cols < x.size(1);
    auto const m = tg::col(rows < x.size(0)) & tg::row(cm);
    auto const xv = tg::load(x + tg::col(rows) * x.stride(0) + tg::row(cols), m, 0.0f);
    auto const wv = tg::load(w + cols, cm, 0.0f);
    auto const bv = tg::load(bias + cols, cm, 0.0f);
    tg::store(y + tg::col(rows) * y.stride(0) + tg::row(cols), xv * tg::row(wv) + tg::row(bv), m);
  };
  auto const bwd = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T const> w,
                               tg::tensor<T const> dy, tg::tensor<T> dx, tg::tensor<T> dw,
                               tg::tensor<T> db) {
    auto const rows = p.program_id(0) * std::int64_t{R} + tg::arange<0, R>();
    auto const cols = tg::arange<0, C>();
    auto const cm = cols < x.size(1);
    auto const m = tg::col(rows < x.size(0)) & tg::row(cm);
    auto const xv = tg::load(x + tg::col(rows) * x.stride(0) + tg::row(cols), m, 0.0f);
    auto const g = tg::load(dy + tg::col(rows) * dy.stride(0) + tg::row(cols), m, 0.0f);
    auto const wv = tg::load(w + cols, cm, 0.0f);
    tg::store(dx + tg::col(rows) * dx.stride(0) + tg::row(cols), g * tg::row(wv), m);
    tg::atomic_add(dw + cols, tg::sum<0>(xv * g), cm);
    tg::store(db + cols, tg::load(db + cols, cm, 0.0f) + tg::sum<0>(g), cm);
  };
  std::int64_t const n = 1000, d = 48;
  tg::owned_tensor<float> x({n, d}, "x"), w({d}, "w"), bias({d}, "bias"), y({n, d}, "y");
  auto const r =
      tg::check_backward(tg::forward(tg::cdiv(n, R), fwd, tg::in("x", x), tg::in("w", w),
                                     tg::in("bias", bias), tg::out("y", y)),
                         [&](tg::backward_context<float>& ctx) {
                           auto const xi = ctx.input("x");
                           tg::owned_tensor<float> dx({n, d}), dw({d}),
                               db({d}); // unnamed, as usual
                           tg::launch(ctx.options(), tg::cdiv(n, R), bwd, xi, ctx.input("w"),
                                      ctx.cotangent("y"), dx.view(), dw.view(), db.view());
                           return tg::gradient_set{{"x", dx}, {"w", dw}, {"bias", db}};
                         });
  ASSERT_FALSE(r);
  // db has no name: the race names it by its argument, and the gradient it is handed back as.
  EXPECT_TRUE(r.mentions("race on tensor (unnamed: the kernel's argument 6 after the program)"))
      << r;
  EXPECT_TRUE(r.mentions("That tensor is the memory of the gradient 'bias' the backward hands "
                         "back."))
      << r;
  for (auto const& p : r.problems())
    EXPECT_EQ(p.find("'w'"), std::string::npos) << p << "\n" << r;
  EXPECT_TRUE(r.gradient("w")->ok) << r;
}

// Two inputs over one buffer (x and its transpose, tied weights) are refused before anything
// runs, with advice for inputs: the advice spoke of output buffers only.
TEST(BadInput, TwoInputsOverOneBufferAreRefusedWithAdviceForInputs) {
  auto const k = []<class T>(tg::program const&, tg::tensor<T const> a, tg::tensor<T const> b,
                             tg::tensor<T> y) {
    auto const i = tg::arange<0, 4>();
    tg::store(y + i, tg::load(a + i * a.stride(0)) * tg::load(b + i * b.stride(1)));
  };
  tg::owned_tensor<float> x({4, 4}, "x"), y({4}, "y");
  auto const r = tg::check_backward(
      tg::forward(1, k, tg::in("x", x),
                  tg::in("xt", tg::tensor<float>(x.data(), {4, 4}, {1, 4}, "xt")), tg::out("y", y)),
      [&](tg::backward_context<float>&) {
        tg::owned_tensor<float> dx({4, 4}), dxt({4, 4});
        return tg::gradient_set{{"x", dx}, {"xt", dxt}};
      });
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.mentions("tied weights: a tensor and its transposed view")) << r;
  EXPECT_TRUE(r.mentions("'xt'")) << r;
}

TEST(BackwardDeterminism, AtomicReorderingIsANoteNotAFailure) {
  // Each call adds the key tiles' shares of dQ in the other order: dQ differs in its last bits.
  auto const r = check(backward<dq_by::atomic_add>({}), 40, {tg::executor::sequential, 1});
  EXPECT_BACKWARD_OK(r);
  EXPECT_TRUE(r.mentions("'q' differs between two runs in ")) << r;
  EXPECT_TRUE(r.mentions("each written by atomic_add alone (up to 3 additions)")) << r;
  EXPECT_TRUE(r.mentions("of its bound 2 n u (|g| + 2 sum|v|)")) << r;
  EXPECT_NE(r.str().find("  note: seed 0: 'q' differs"), std::string::npos) << r;
}

TEST(BackwardDeterminism, AtomicDifferenceBeyondReorderingFails) {
  auto const r = check(backward<dq_by::atomic_add>({.extra_on_second = 1e-3f}), 40,
                       {tg::executor::sequential, 1});
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.mentions("not deterministic: two runs on the same data differ in 1 of 640 "
                         "elements of 'q' that atomic_add alone wrote, by more than reordering "
                         "the additions can: at (0, 0)"))
      << r;
}

TEST(BackwardDeterminism, AtomicReorderingIsFollowedThroughACopy) {
  // dQ added into a buffer with atomic_add, then copied into the gradient on the host (as the
  // bf16 attention backward rounds its fp32 accumulator into dq): with tg::copy the determinism
  // check follows each element back to its additions; a copy it cannot see is a failure.
  using bo = backward_options;
  auto const traced = check(backward<dq_by::atomic_add>({.accumulator = bo::with_copy}), 40,
                            {tg::executor::sequential, 1});
  EXPECT_BACKWARD_OK(traced);
  EXPECT_TRUE(traced.mentions("each written by atomic_add alone")) << traced;
  auto const unseen = check(backward<dq_by::atomic_add>({.accumulator = bo::by_hand}), 40,
                            {tg::executor::sequential, 1});
  ASSERT_FALSE(unseen);
  EXPECT_TRUE(unseen.mentions("not deterministic: two runs on the same data differ in ")) << unseen;
  // A difference beyond what reordering explains still fails through the copy.
  auto const extra = check(backward<dq_by::atomic_add>({.extra_on_second = 1e-3f,
                                                        .accumulator = bo::with_copy}),
                           40, {tg::executor::sequential, 1});
  ASSERT_FALSE(extra);
  EXPECT_TRUE(extra.mentions("that atomic_add alone wrote, by more than reordering the additions "
                             "can: at (0, 0)"))
      << extra;
}

TEST(BackwardDeterminism, AtomicReorderingIsFollowedThroughALaunchThatStoresTheSums) {
  // FlashAttention-2's dq_accum: dQ added into an fp32 buffer with atomic_add, then a launch
  // loads the buffer and stores dq. The differences it passes on from the order of the additions
  // are a note; before, a correct backward failed as not deterministic.
  using bo = backward_options;
  auto const passed_on = check(backward<dq_by::atomic_add>({.accumulator = bo::by_launch}), 40,
                               {tg::executor::sequential, 1});
  EXPECT_BACKWARD_OK(passed_on);
  EXPECT_TRUE(passed_on.mentions("elements (the first at (0, 0), by ")) << passed_on;
  EXPECT_TRUE(passed_on.mentions(") stored by launch 2 of the backward, which takes 'dq "
                                 "accumulator', made by atomic_add or under a lock in an "
                                 "earlier launch: the order of those additions, passed on"))
      << passed_on;
  // More than the first look allows there still fails.
  auto const extra = check(
      backward<dq_by::atomic_add>({.extra_on_second = 1e-3f, .accumulator = bo::by_launch}), 40,
      {tg::executor::sequential, 1});
  ASSERT_FALSE(extra);
  // (The second run's extra launch moves the launches after it, whose differences the reversed
  // order makes then trace to none: they are counted too.)
  EXPECT_TRUE(extra.mentions("not deterministic: two runs on the same data differ in ")) << extra;
  EXPECT_TRUE(extra.mentions(" of 640 elements of 'q', the first at (0, 0)")) << extra;
}

TEST(BackwardDeterminism, AtomicReorderingIsFollowedThroughSeveralLaunches) {
  // The buffer of atomic sums goes through two launches before it is dq: the second launch takes
  // what the first stored from the sums, and passes their order on as much.
  using bo = backward_options;
  auto const passed_on = check(backward<dq_by::atomic_add>({.accumulator = bo::by_two_launches}),
                               40, {tg::executor::sequential, 1});
  EXPECT_BACKWARD_OK(passed_on);
  EXPECT_TRUE(passed_on.mentions(") stored by launch 3 of the backward, which takes 'unscaled "
                                 "dq', made by atomic_add or under a lock in an earlier launch"))
      << passed_on;
  auto const extra = check(
      backward<dq_by::atomic_add>({.extra_on_second = 1e-3f, .accumulator = bo::by_two_launches}),
      40, {tg::executor::sequential, 1});
  ASSERT_FALSE(extra);
  // (The second run's extra launch moves the launches after it, whose differences the reversed
  // order makes then trace to none: they are counted too.)
  EXPECT_TRUE(extra.mentions("not deterministic: two runs on the same data differ in ")) << extra;
  EXPECT_TRUE(extra.mentions(" of 640 elements of 'q', the first at (0, 0)")) << extra;
}

TEST(Copy, ConvertsRoundsAndRefusesAnotherShape) {
  tg::owned_tensor<float> f({2, 3}, "f");
  for (int i = 0; i < 6; ++i)
    f.data()[i] = 1.0f + static_cast<float>(i) * 0x1p-9f; // between bf16 neighbours
  tg::owned_tensor<tg::bf16> h({3, 2}, "h");
  tg::owned_tensor<tg::bf16> g({2, 3}, "g");
  tg::copy(f.cview(), g.view());
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(static_cast<float>(g.data()[i]), static_cast<float>(tg::bf16(f.data()[i]))) << i;
  // Into a transposed view: element (i, j) of the source lands at (i, j) of the view.
  tg::owned_tensor<float> t({3, 2}, "t");
  tg::tensor<float> tt(t.data(), {2, 3}, {1, 2}, "t transposed");
  tg::copy(f.cview(), tt);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      EXPECT_EQ(t.data()[j * 2 + i], f.data()[i * 3 + j]);
  try {
    tg::copy(f.cview(), h.view());
    ADD_FAILURE() << "no throw";
  } catch (std::invalid_argument const& e) {
    EXPECT_STREQ(e.what(), "tilegrad::copy: the source 'f' has shape (2, 3), the destination 'h' "
                           "(3, 2)");
  }
}

TEST(BackwardDeterminism, StoredDifferencesStillFail) {
  // The racy dQ update taken in another order: the differences come from stores.
  auto const r = check(backward<dq_by::load_add_store>({}), 40, {tg::executor::sequential, 1});
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.mentions("not deterministic: two runs on the same data differ in ")) << r;
  EXPECT_TRUE(r.mentions("elements of 'q', the first at")) << r;
}

TEST(LaunchRaces, AViewOverTwoWritableTensorsIsCheckedInBoth) {
  // A workspace passed as two writable halves and as one const view of the whole: program r
  // stores row r of the second half and reads row r - 1 of it through the whole. The lanes past
  // the first half were dropped (the view was found as the first half's), and the race passed.
  constexpr int R = 6, C = 8;
  auto kernel = [](tg::program const& p, tg::tensor<float> a, tg::tensor<float> b,
                   tg::tensor<float const> whole) {
    int const r = p.program_id(0);
    auto const c = tg::arange<0, C>();
    tg::store(b + r * C + c, tg::full<float, C>(float(r)));
    if (r > 0)
      tg::store(a + r * C + c, tg::load(whole + (R + r - 1) * C + c));
  };
  tg::owned_tensor<float> ws({2 * R * C}, "ws");
  tg::tensor<float> const a(ws.data(), {R * C}, "ws_a"), b(ws.data() + R * C, {R * C}, "ws_b");
  for (auto lo : launch_cases()) {
    lo.check_races = true;
    try {
      tg::launch(lo, R, kernel, a, b, ws.cview());
      ADD_FAILURE() << "no race reported";
    } catch (tg::race_error const& e) {
      EXPECT_EQ(e.tensor(), "ws_b") << e.what();
      EXPECT_EQ(e.element(), "(0)") << e.what();
      EXPECT_EQ(e.program(), "program (1, 0, 0)") << e.what();
    }
  }
}

TEST(LaunchRaces, WritableTensorsOfTwoElementSizesInOneBufferAreRefused) {
  // An fp32 buffer converted to bf16 in place, the bf16 view passed beside it: the check follows
  // elements of one size, and a program's bf16 store over another's fp32 load passed unseen.
  auto convert = [](tg::program const& p, tg::tensor<float> acc, tg::tensor<tg::bf16> out) {
    auto const i = p.program_id(0) * 16 + tg::arange<0, 16>();
    tg::store(out + i, tg::to<tg::bf16>(tg::load(acc + i)));
  };
  tg::owned_tensor<float> acc({64}, "acc");
  tg::tensor<tg::bf16> const out(reinterpret_cast<tg::bf16*>(acc.data()), {64}, "acc as bf16");
  tg::launch_options lo;
  lo.check_races = true;
  try {
    tg::launch(lo, 4, convert, acc.view(), out);
    ADD_FAILURE() << "not refused";
  } catch (std::invalid_argument const& e) {
    EXPECT_STREQ(e.what(), "tilegrad::launch: tensors 'acc' (4-byte elements) and 'acc as bf16' "
                           "(2-byte elements) share memory: the race check follows elements, and "
                           "cannot tell whether a store to one meets another program's access to "
                           "the other. Write the converted values into a buffer of their own.");
  }
  tg::launch(4, convert, acc.view(), out); // (a plain launch checks nothing and runs it)
}

TEST(LaunchRaces, ForwardKernelRaceCheckedThroughTheLaunchOption) {
  // Program p stores rows [2p, 2p + 4) of y: each overlaps the next program's first two rows.
  auto overlapping = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const rows = 2 * p.program_id(0) + tg::arange<0, 4>();
    auto const m = rows < y.size(0);
    tg::store(y + rows, tg::load(x + rows, m) * 2.0f, m);
  };
  tg::owned_tensor<float> x({20}, "x"), y({20}, "y");
  std::string first;
  for (auto lo : launch_cases()) {
    lo.check_races = true;
    try {
      tg::launch(lo, 10, overlapping, x.cview(), y.view());
      ADD_FAILURE() << "no race reported";
    } catch (tg::race_error const& e) {
      std::string const what = e.what();
      EXPECT_EQ(e.tensor(), "y");
      EXPECT_EQ(e.element(), "(2)");
      EXPECT_EQ(e.program(), "program (1, 0, 0)");
      EXPECT_EQ(e.other_program(), "program (0, 0, 0)");
      EXPECT_NE(what.find("program (1, 0, 0) stores it at "), std::string::npos) << what;
      EXPECT_NE(what.find("program (0, 0, 0) stores it too at "), std::string::npos) << what;
      EXPECT_NE(what.find("test_backward_races.cpp:"), std::string::npos) << what;
      if (first.empty())
        first = what;
      EXPECT_EQ(what, first);
    }
  }
  // Reading what another program stores (the neighbour's first element) is a race too.
  auto reads_next = []<class T>(tg::program const& p, tg::tensor<T> y) {
    auto const i = p.program_id(0) + tg::arange<0, 1>();
    tg::store(y + i, tg::load(y + (i + 1), i + 1 < y.size(0)) + 1.0f);
  };
  try {
    tg::launch({.check_races = true}, 20, reads_next, y.view());
    ADD_FAILURE() << "no race reported";
  } catch (tg::race_error const& e) {
    EXPECT_NE(std::string(e.what()).find("program (1, 0, 0) stores it at"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("program (0, 0, 0) loads it at"), std::string::npos)
        << e.what();
  }
}

TEST(LaunchRaces, AtomicsOfOneKindCommuteOfTwoKindsOrExchangesDoNot) {
  // Program p applies `first` to y[0..3] if p is even, `second` if odd: max then add is not add
  // then max, and of two exchanges the later one wins.
  enum kind { add, max, min, xchg };
  auto apply = [](kind k, auto ptrs, auto v) {
    if (k == add)
      (void)tg::atomic_add(ptrs, v);
    else if (k == max)
      (void)tg::atomic_max(ptrs, v);
    else if (k == min)
      (void)tg::atomic_min(ptrs, v);
    else
      (void)tg::atomic_xchg(ptrs, v);
  };
  auto run = [&](kind first, kind second, int programs) {
    tg::owned_tensor<float> y({4}, "y");
    auto const k = [=]<class T>(tg::program const& p, tg::tensor<T> out) {
      auto const i = tg::arange<0, 4>();
      apply(p.program_id(0) % 2 == 0 ? first : second, out + i,
            tg::full<float, 4>(float(p.program_id(0) + 1)));
    };
    std::string what;
    for (auto lo : launch_cases()) {
      lo.check_races = true;
      try {
        tg::launch(lo, programs, k, y.view());
      } catch (tg::race_error const& e) {
        what = e.what();
        EXPECT_EQ(e.tensor(), "y");
        EXPECT_EQ(e.element(), "(0)");
        EXPECT_EQ(e.program(), "program (1, 0, 0)");
        EXPECT_EQ(e.other_program(), "program (0, 0, 0)");
      }
    }
    return what;
  };
  for (kind k : {add, max, min})
    EXPECT_EQ(run(k, k, 7), "") << k;
  EXPECT_EQ(run(xchg, xchg, 1), ""); // one program alone
  for (auto [a, b] : {std::pair{max, add}, {add, min}, {min, max}, {xchg, xchg}, {add, xchg}}) {
    std::string const what = run(a, b, 7);
    EXPECT_NE(what.find("program (1, 0, 0) atomically updates"), std::string::npos)
        << a << " " << b << ": " << what;
    EXPECT_NE(what.find("program (0, 0, 0) updates it with another atomic"), std::string::npos)
        << a << " " << b << ": " << what;
  }
}

TEST(LaunchRaces, ViewsOfOneBufferAreTrackedByElement) {
  // One buffer of 2 x 32 floats passed as several views; program 0 stores buf[32..64) through
  // the view `w`, program 1 then reaches the same elements through another view.
  std::int64_t const n = 32;
  enum how { store_through_whole, load_through_const, load_straddling, interleaved };
  auto run = [&](how h) {
    tg::owned_tensor<float> buf({2 * n}, "buf"), out({n}, "out");
    tg::tensor<float> whole(buf.data(), {2 * n}, "whole"), w(buf.data() + n, {n}, "w");
    // The even and the odd elements: two writable views whose memory interleaves.
    tg::tensor<float> even(buf.data(), {n}, {2}, "even"), odd(buf.data() + 1, {n}, {2}, "odd");
    auto const k = [h]<class T>(tg::program const& p, tg::tensor<T const> all, tg::tensor<T> w,
                                tg::tensor<T> whole, tg::tensor<T> even, tg::tensor<T> odd,
                                tg::tensor<T> out) {
      auto const i = tg::arange<0, 32>();
      if (h == interleaved) { // each program its own elements: no race
        tg::store((p.program_id(0) == 0 ? even : odd) + i * 2, 1.0f);
        return;
      }
      if (p.program_id(0) == 0)
        tg::store(w + i, 1.0f);
      else if (h == store_through_whole)
        tg::store(whole + (32 + i), 2.0f);
      else if (h == load_through_const)
        tg::store(out + i, tg::load(all + (32 + i)));
      else // elements 33..64 of a view one element longer than buf's: past w's end
        tg::store(out + i, tg::load(all + (33 + i), i < 31, 0.0f));
    };
    tg::tensor<float const> all(buf.data(), {2 * n}, "all");
    try {
      tg::launch({.check_races = true}, 2, k, all, w, whole, even, odd, out.view());
    } catch (tg::race_error const& e) {
      EXPECT_EQ(e.program(), "program (1, 0, 0)");
      EXPECT_EQ(e.other_program(), "program (0, 0, 0)");
      return std::string(e.what());
    }
    return std::string();
  };
  std::string const a = run(store_through_whole);
  EXPECT_NE(a.find("program (1, 0, 0) stores it"), std::string::npos) << a;
  EXPECT_NE(a.find("program (0, 0, 0) stores it too"), std::string::npos) << a;
  // The stores went through two views of one memory: the message names the element in each
  // view that holds it (it named only the first view, whose element the racing store did not
  // name).
  EXPECT_NE(a.find("race on tensor 'w', element (0) (the same memory as element (32) of "
                   "'whole', element (16) of 'even')"),
            std::string::npos)
      << a;
  std::string const b = run(load_through_const);
  EXPECT_NE(b.find("program (1, 0, 0) loads it"), std::string::npos) << b;
  std::string const c = run(load_straddling);
  EXPECT_NE(c.find("program (1, 0, 0) loads it"), std::string::npos) << c;
  EXPECT_EQ(run(interleaved), "");
}

TEST(LaunchRaces, AWriteThroughACapturedViewIsRefused) {
  // Every program adds its row into dw with load + add + store through a view the kernel
  // captures: lost updates the race check cannot see, as dw is not an argument of the launch.
  tg::owned_tensor<float> x({12, 16}, "x"), dw({16}, "dw"), y({12, 16}, "y");
  tg::tensor<float> dwv = dw.view();
  auto const k = [dwv]<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const c = tg::arange<0, 16>();
    auto const row = tg::load(x + (p.program_id(0) * x.stride(0) + c));
    tg::store(y + (p.program_id(0) * y.stride(0) + c), row);
    if constexpr (std::is_same_v<T, float>)
      tg::store(dwv + c, tg::load(dwv + c) + row);
  };
  int const line = __LINE__ - 2; // the store into dwv
  for (auto lo : launch_cases()) {
    lo.check_races = true;
    try {
      tg::launch(lo, 12, k, x.cview(), y.view());
      ADD_FAILURE() << "no error";
    } catch (tg::access_error const& e) {
      std::string const what = e.what();
      EXPECT_EQ(e.tensor(), "dw");
      EXPECT_NE(what.find(") writes tensor 'dw' at "), std::string::npos) << what; // some program
      EXPECT_NE(what.find("test_backward_races.cpp:" + std::to_string(line)), std::string::npos)
          << what;
      EXPECT_NE(what.find("does not take as an argument"), std::string::npos) << what;
    }
  }
  // Reading through a captured view, and launches that do not check races, are left alone.
  auto const reads = [dwv]<class T>(tg::program const& p, tg::tensor<T> y) {
    auto const c = tg::arange<0, 16>();
    tg::store(y + (p.program_id(0) * y.stride(0) + c), tg::load(dwv + c));
  };
  EXPECT_NO_THROW(tg::launch({.check_races = true}, 12, reads, y.view()));
  EXPECT_NO_THROW(tg::launch(tg::launch_options{.exec = tg::executor::sequential}, 12, k,
                             x.cview(), y.view()));
}

TEST(LaunchRaces, AWriteThroughACapturedViewIsRefusedWhenTheLaunchTakesNothingWritable) {
  // The same lost updates, in a launch whose arguments are all const (dw captured, or inside a
  // struct): it tracked no tensor, checked bounds only, and the write went through unseen.
  tg::owned_tensor<float> x({12, 16}, "x"), dw({16}, "dw");
  tg::tensor<float> dwv = dw.view();
  auto const k = [dwv](tg::program const& p, tg::tensor<float const> x) {
    auto const c = tg::arange<0, 16>();
    tg::store(dwv + c, tg::load(dwv + c) + tg::load(x + (p.program_id(0) * x.stride(0) + c)));
  };
  int const line = __LINE__ - 2; // the store into dwv
  struct grads {
    tg::tensor<float> dw;
  };
  auto const in_struct = [](tg::program const& p, tg::tensor<float const> x, grads g) {
    auto const c = tg::arange<0, 16>();
    tg::store(g.dw + c, tg::load(g.dw + c) + tg::load(x + (p.program_id(0) * x.stride(0) + c)));
  };
  for (auto lo : launch_cases()) {
    lo.check_races = true;
    for (bool by_struct : {false, true}) {
      try {
        if (by_struct)
          tg::launch(lo, 12, in_struct, x.cview(), grads{dw.view()});
        else
          tg::launch(lo, 12, k, x.cview());
        ADD_FAILURE() << "no error";
      } catch (tg::access_error const& e) {
        std::string const what = e.what();
        EXPECT_EQ(e.tensor(), "dw");
        EXPECT_NE(what.find(") writes tensor 'dw' at "), std::string::npos) << what;
        EXPECT_NE(
            what.find("test_backward_races.cpp:" + std::to_string(line + (by_struct ? 8 : 0))),
            std::string::npos)
            << what;
        EXPECT_NE(what.find("inside a struct or a container"), std::string::npos) << what;
      }
    }
  }
  EXPECT_NO_THROW(tg::launch({.exec = tg::executor::sequential}, 12, k, x.cview()));
}

TEST(LaunchRaces, ALoadThroughAViewOfAnotherElementSizeIsRefused) {
  // Program r stores row r of a float workspace; program r + 1 reads row r back through a const
  // view of doubles over the same memory. The race check follows elements of the tracked size:
  // the loads were dropped as reads of untracked memory, and the race passed unseen (through a
  // view of ints, 4 bytes like the floats, it was reported).
  constexpr int C = 16, P = 4;
  tg::owned_tensor<float> ws({P * C}, "ws"), out({P * C}, "out");
  tg::tensor<double const> const as_double(reinterpret_cast<double const*>(ws.data()), {P * C / 2},
                                           "ws as double");
  auto const k = [](tg::program const& p, tg::tensor<float> ws, tg::tensor<double const> d,
                    tg::tensor<float> out) {
    int const r = p.program_id(0);
    tg::store(ws + r * C + tg::arange<0, C>(), tg::full<float, C>(float(r + 1)));
    if (r > 0)
      tg::store(out + r * C + tg::arange<0, C / 2>(),
                tg::to<float>(tg::load(d + (r - 1) * C / 2 + tg::arange<0, C / 2>())));
  };
  int const line = __LINE__ - 2; // the load through d
  for (auto lo : launch_cases()) {
    lo.check_races = true;
    try {
      tg::launch(lo, P, k, ws.view(), as_double, out.view());
      ADD_FAILURE() << "no error";
    } catch (tg::access_error const& e) {
      std::string const what = e.what();
      EXPECT_EQ(e.tensor(), "ws");
      EXPECT_NE(what.find("loads bytes of element ("), std::string::npos) << what;
      EXPECT_NE(what.find("of tensor 'ws' at "), std::string::npos) << what;
      EXPECT_NE(what.find("test_backward_races.cpp:" + std::to_string(line)), std::string::npos)
          << what;
      EXPECT_NE(what.find("'ws as double' of 8-byte elements, where the tensor's are 4 bytes"),
                std::string::npos)
          << what;
    }
  }
  // Doubles beside the workspace in one allocation, read through such a view: no byte of it.
  std::vector<double> both(P * C / 2 + 8);
  tg::tensor<float> const ws2(reinterpret_cast<float*>(both.data()), {P * C}, "ws2");
  // (its span covers the workspace's last 8 doubles' worth of floats; the loads read past them)
  tg::tensor<double const> const after(both.data() + P * C / 2 - 8, {16}, "after");
  auto const beside = [](tg::program const& p, tg::tensor<float> ws, tg::tensor<double const> d,
                         tg::tensor<float> out) {
    int const r = p.program_id(0);
    tg::store(ws + r * C + tg::arange<0, C>(), tg::full<float, C>(float(r + 1)));
    tg::store(out + r * C + tg::arange<0, 8>(),
              tg::to<float>(tg::load(d + (d.numel() - 8) + tg::arange<0, 8>())));
  };
  EXPECT_NO_THROW(tg::launch({.check_races = true}, P, beside, ws2, after, out.view()));
  EXPECT_NO_THROW(
      tg::launch({.exec = tg::executor::sequential}, P, k, ws.view(), as_double, out.view()));
}

TEST(LaunchRaces, ElementAccessInsideACheckedLaunchIsRefusedNotPassed) {
  // A backward whose programs each add their row into dw through element access,
  // dw(c) += x(r, c) * dy(r, c): lost updates no race check can see (it lost 2 runs in 50 on two
  // threads), and a check that passed it. In a checked launch element access throws, naming the
  // program, the tensor, the element and the line; outside one it is host code, left alone.
  constexpr int R = 300, C = 16;
  constexpr auto fwd = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                   tg::tensor<T const> w, tg::tensor<T> y) {
    auto const o = p.program_id(0) * C + tg::arange<0, C>();
    tg::store(y + o, tg::load(x + o) * tg::load(w + tg::arange<0, C>()));
  };
  constexpr auto dx_of = [](tg::program const& p, tg::tensor<float const> w,
                            tg::tensor<float const> dy, tg::tensor<float> dx) {
    auto const o = p.program_id(0) * C + tg::arange<0, C>();
    tg::store(dx + o, tg::load(dy + o) * tg::load(w + tg::arange<0, C>()));
  };
  constexpr auto dw_by_elements = [](tg::program const& p, tg::tensor<float const> x,
                                     tg::tensor<float const> dy, tg::tensor<float> dw) {
    int const r = p.program_id(0);
    for (int c = 0; c < C; ++c)
      dw(c) += x(r, c) * dy(r, c);
  };
  int const line = __LINE__ - 2;
  tg::owned_tensor<float> x({R, C}, "x"), w({C}, "w"), y({R, C}, "y");
  auto const rep = tg::check_backward(
      tg::forward(R, fwd, tg::in("x", x), tg::in("w", w), tg::out("y", y)),
      [&](tg::backward_context<float>& ctx) {
        tg::owned_tensor<float> dx({R, C}), dw({C}, "dw");
        tg::launch(ctx.options(), R, dx_of, ctx.input("w"), ctx.cotangent("y"), dx.view());
        tg::launch(ctx.options(), R, dw_by_elements, ctx.input("x"), ctx.cotangent("y"),
                   dw.view());
        return tg::gradient_set{{"x", dx}, {"w", dw}};
      });
  EXPECT_FALSE(rep.ok()) << rep.str();
  std::string const s = rep.str();
  EXPECT_NE(s.find("element access 'x'(0, 0) by program (0, 0, 0)"), std::string::npos) << s;
  EXPECT_NE(s.find("test_backward_races.cpp:" + std::to_string(line)), std::string::npos) << s;
  EXPECT_NE(s.find("use tg::load, tg::store or tg::atomic_add"), std::string::npos) << s;

  // A launch that checks for races says the same; a plain launch runs it as host code would.
  tg::owned_tensor<float> dy({R, C}, "dy"), dw({C}, "dw");
  std::fill(x.begin(), x.end(), 1.0f);
  std::fill(dy.begin(), dy.end(), 0.5f);
  try {
    tg::launch({.check_races = true}, R, dw_by_elements, x.cview(), dy.cview(), dw.view());
    ADD_FAILURE() << "no error";
  } catch (tg::access_error const& e) {
    EXPECT_EQ(e.tensor(), "x");
    EXPECT_EQ(e.element(), "(0, 0)");
    EXPECT_EQ(e.where().line(), static_cast<unsigned>(line));
  }
  std::fill(dw.begin(), dw.end(), 0.0f);
  tg::launch({.exec = tg::executor::sequential}, R, dw_by_elements, x.cview(), dy.cview(),
             dw.view());
  for (int c = 0; c < C; ++c)
    EXPECT_EQ(dw(c), 0.5f * R) << c;
}

TEST(LaunchRaces, CorrectKernelsPassAndComputeTheSame) {
  std::int64_t const n = 40;
  tg::owned_tensor<float> q({n, D}), k({n, D}), v({n, D}), o1({n, D}), o2({n, D}), dq({n, D}),
      dk({n, D}), dv({n, D});
  for (std::int64_t i = 0; i < n * D; ++i) {
    q.data()[i] = std::sin(0.1f * float(i));
    k.data()[i] = std::cos(0.07f * float(i));
    v.data()[i] = std::sin(0.05f * float(i) + 1);
  }
  tg::launch(4, lin_fwd, q.cview(), k.cview(), v.cview(), o1.view());
  tg::launch({.check_races = true}, 4, lin_fwd, q.cview(), k.cview(), v.cview(), o2.view());
  for (std::int64_t i = 0; i < n * D; ++i)
    ASSERT_EQ(o1.data()[i], o2.data()[i]) << i;
  // Many programs adding into one element atomically, and reading tensors they do not write.
  EXPECT_NO_THROW(tg::launch({.check_races = true}, 3, lin_bwd<dq_by::atomic_add>, q.cview(),
                             k.cview(), v.cview(), o1.cview(), dq.view(), dk.view(), dv.view(),
                             false));
}

TEST(CheckedMode, OutOfBoundsInTheBackwardIsAFailureNotACrash) {
  tg::checked_scope const off(false); // as in a release build
  auto oob = [](tg::backward_context<float>& ctx) {
    auto const q = ctx.input("q");
    tg::owned_tensor<float> dq({q.size(0), D}, "dq"), dk({q.size(0), D}, "dk");
    ctx.set_gradient("k", dk); // handed over before the launch that fails
    // One program too many, and no mask: its block lies past the end of dq.
    tg::launch(
        ctx.options(), tg::cdiv<int>(int(q.size(0)), B) + 1,
        []<class T>(tg::program const& p, tg::tensor<T> g) {
          tg::store(tg::make_block_ptr<B, D>(g, {p.program_id(0) * B, 0}), tg::zeros<T, B, D>());
        },
        dq.view());
    ctx.set_gradient("q", dq);
  };
  auto const r = check(oob, 32);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.mentions("the backward threw: tilegrad: out-of-bounds block store by program "
                         "(2, 0, 0): tensor 'dq' has shape (32, 16)"))
      << r;
  EXPECT_TRUE(r.mentions("no gradient 'q': the backward threw before handing it over")) << r;
  EXPECT_TRUE(r.mentions("no gradient 'v': the backward threw before handing it over")) << r;
  ASSERT_NE(r.gradient("k"), nullptr) << r; // what it handed over is still compared
  EXPECT_FALSE(r.gradient("k")->ok);        // (zeros: wrong)
}

TEST(CheckedMode, OutOfBoundsInTheForwardAndInVjpIsAFailureNotACrash) {
  tg::checked_scope const off(false);
  // Reads one row past the end of x: unmasked.
  auto past = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const i = p.program_id(0) * 4 + tg::arange<0, 4>();
    tg::store(y + i, tg::load(x + (i + 1)));
  };
  tg::owned_tensor<float> x({8}, "x"), y({8}, "y"), dy({8}, "dy");
  auto const r = tg::check_backward(tg::forward(2, past, tg::in("x", x), tg::out("y", y)),
                                    [](tg::backward_context<float>&) {});
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.mentions("the forward threw: tilegrad: out-of-bounds load by program (1, 0, 0): "
                         "tensor 'x' has shape (8), element (8)"))
      << r;
  EXPECT_THROW((void)tg::vjp(2, past, tg::in("x", x), tg::out("y", y, dy)), tg::access_error);
}

// A kernel that takes x[b][h] of a (batch, head, rows, cols) tensor inside its programs: an
// access outside the view names the view by its rows ('x[1][2]'), in a launch that checks
// bounds, in vjp, in jvp and in check_backward's forward, through pointer tiles and block
// pointers. (Before, every one said "tensor 'x' has shape (40, 16)": which head was not said.)
TEST(CheckedMode, AnAccessOutsideARowViewNamesItsRows) {
  tg::checked_scope const off(false);
  constexpr int R = 40, C = 16;
  tg::owned_tensor<float> x({2, 3, R, C}, "x"), y({2, 3, R, C}, "y"), dy({2, 3, R, C}, "dy");
  tg::owned_tensor<double> xd({2, 3, R, C}, "x"), yd({2, 3, R, C}, "y"), ud({2, 3, R, C}, "ux");
  // Three programs of 16 rows over 40: the last one's rows 40-47 are outside (no mask), on the
  // head (1, 2), or (0, 1) for the block store.
  auto ptr = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const rows = p.program_id(0) * 16 + tg::arange<0, 16>();
    auto const offs = tg::col(rows * 16) + tg::row(tg::arange<0, 16>());
    auto const v = tg::load(x[1][2] + offs);
    tg::store(y[1][2] + offs, v);
  };
  auto blk = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const v = tg::load(tg::make_block_ptr<16, 16>(x[1][2], {p.program_id(0) * 16, 0}),
                            tg::bounds<0>);
    tg::store(tg::make_block_ptr<16, 16>(y[0][1], {p.program_id(0) * 16, 0}), v);
  };
  auto expect = [](auto&& run, std::string const& piece, std::string const& tensor) {
    try {
      run();
      ADD_FAILURE() << "no access_error for " << piece;
    } catch (tg::access_error const& e) {
      EXPECT_NE(std::string(e.what()).find(piece), std::string::npos) << e.what();
      EXPECT_EQ(e.program(), "program (2, 0, 0)");
      EXPECT_EQ(e.tensor(), tensor);
      EXPECT_EQ(e.element(), "(40, 0)");
    }
  };
  std::string const px = "out-of-bounds load by program (2, 0, 0): tensor 'x[1][2]' has shape "
                         "(40, 16), element (40, 0)";
  std::string const by = "out-of-bounds block store by program (2, 0, 0): tensor 'y[0][1]' has "
                         "shape (40, 16), element (40, 0)";
  expect([&] { tg::launch({.check_bounds = true}, {3}, ptr, x.cview(), y.view()); }, px, "x");
  expect([&] { tg::launch({.check_races = true}, {3}, blk, x.cview(), y.view()); }, by, "y");
  expect([&] { (void)tg::vjp({3}, ptr, tg::in("x", x), tg::out("y", y, dy)); }, px, "x");
  expect([&] { (void)tg::vjp({3}, blk, tg::in("x", x), tg::out("y", y, dy)); }, by, "y");
  expect([&] { (void)tg::jvp({3}, ptr, tg::tangent_in("x", xd, ud), tg::tangent_out("y", yd)); },
         px, "x");
  auto const r = tg::check_backward(tg::forward({3}, blk, tg::in("x", x), tg::out("y", y)),
                                    [](tg::backward_context<float>&) {});
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.mentions("the forward threw: tilegrad: " + by)) << r;
  // A view under a name of its own, or one that is no row of an argument, keeps its own name.
  auto named = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const rows = p.program_id(0) * 16 + tg::arange<0, 16>();
    auto const offs = tg::col(rows * 16) + tg::row(tg::arange<0, 16>());
    tg::store(y[1][2] + offs, tg::load(x[1][2].named("head") + offs));
  };
  expect([&] { tg::launch({.check_bounds = true}, {3}, named, x.cview(), y.view()); },
         "tensor 'head' has shape (40, 16)", "head");
}

TEST(BadInput, ThrowingOrNanBackwardStillGetsAFullReport) {
  auto throws_late = [](tg::backward_context<float>& ctx) {
    auto const q = ctx.input("q");
    tg::owned_tensor<float> dq({q.size(0), D}, "dq"), dk({q.size(0), D}, "dk"),
        dv({q.size(0), D}, "dv");
    tg::launch(ctx.options(), tg::cdiv<int>(int(q.size(0)), B), lin_bwd<dq_by::atomic_add>, q,
               ctx.input("k"), ctx.input("v"), ctx.cotangent("o"), dq.view(), dk.view(), dv.view(),
               false);
    ctx.set_gradient("k", dk);
    ctx.set_gradient("v", dv);
    throw std::runtime_error("out of workspace");
  };
  auto const r = check(throws_late, 40);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.mentions("the backward threw: out of workspace")) << r;
  EXPECT_TRUE(r.gradient("k")->ok) << r;
  EXPECT_TRUE(r.gradient("v")->ok) << r;

  auto nan = [](tg::backward_context<float>& ctx) {
    auto const q = ctx.input("q");
    tg::owned_tensor<float> dq({q.size(0), D}, "dq"), dk({q.size(0), D}, "dk"),
        dv({q.size(0), D}, "dv");
    tg::launch(ctx.options(), tg::cdiv<int>(int(q.size(0)), B), lin_bwd<dq_by::atomic_add>, q,
               ctx.input("k"), ctx.input("v"), ctx.cotangent("o"), dq.view(), dk.view(), dv.view(),
               false);
    dq(3, 5) = std::numeric_limits<float>::quiet_NaN();
    return tg::gradient_set{{"q", dq}, {"k", dk}, {"v", dv}};
  };
  auto const rn = check(nan, 40);
  ASSERT_FALSE(rn);
  EXPECT_TRUE(rn.mentions("gradient 'q' holds 1 NaN/Inf element(s), the first at (3, 5)")) << rn;
  EXPECT_TRUE(rn.gradient("k")->ok) << rn;
  EXPECT_TRUE(rn.gradient("v")->ok) << rn;
}

} // namespace test_backward_races
