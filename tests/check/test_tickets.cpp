// Tickets in checked launches: "the last program reduces" (CUDA's threadFenceReduction). Each
// program of the backward stores its partial dw row, then draws a ticket with
// atomic_add(counter, 1), and the program that draws the last ticket loads every partial row and
// reduces them. Under acq_rel atomics what a program did before drawing its ticket comes before
// what a program does after drawing a later one, so the pattern passes check_backward on every
// executor. The broken variants are races naming the partial row, both programs and where each
// stands among the tickets: the ticket drawn before the partial row is stored, the last program
// chosen by its id instead of its ticket, the reduction by the second-to-last ticket. A counter
// that does not count up one ticket at a time (reset by a program that did not draw the last
// ticket) cannot order programs, and says so.
#include <tilegrad/check/gtest.hpp>
#include <tilegrad/kernels/matmul.hpp>
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <vector>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_tickets {

namespace tg = tilegrad;

namespace {

constexpr int BlockN = 64, Rows = 8;

// y[r, c] = x[r, c] w[c]: one row per program, in column blocks.
constexpr auto scale_fwd = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                       tg::tensor<T const> w, tg::tensor<T> y) {
  std::int64_t const r = p.program_id(0), n = x.size(1);
  auto const cols = tg::arange<0, BlockN>();
  for (std::int64_t c0 = 0; c0 < n; c0 += BlockN) {
    auto const m = cols < n - c0;
    tg::store(y + r * y.stride(0) + c0 + cols,
              tg::load(x + r * x.stride(0) + c0 + cols, m, 0.0f) * tg::load(w + c0 + cols, m, 0.0f),
              m);
  }
};

enum class bug {
  none,
  reset_by_store, // correct too: the last program resets the counter with a plain store
  one_row,        // correct too: the programs add into one partial row with atomic_add
  ticket_first,   // the ticket drawn before the partial row is stored
  by_id,          // no ticket: the program with the last id reduces, as if it ran last
  second_to_last, // the program that draws the second-to-last ticket reduces
  no_reset,       // the counter is never reset: the next backward finds it where this one left it
  ticket_by_id,   // every program draws a ticket, but the program with the last id reduces
};

int const bwd_first_line = __LINE__;
// dx = dy w, row by row; dw = sum over rows of dy x: each program of Rows rows stores its partial
// row, and the program that draws the last ticket reduces the partial rows in program order.
constexpr auto ticket_bwd = [](tg::program const& p, tg::tensor<float const> x,
                               tg::tensor<float const> w, tg::tensor<float const> dy,
                               tg::tensor<float> dx, tg::tensor<float> partial,
                               tg::tensor<int> counter, tg::tensor<float> dw, int which) {
  auto const b = static_cast<bug>(which);
  std::int64_t const g = p.program_id(0), programs = p.num_programs(0);
  std::int64_t const m = x.size(0), n = x.size(1), r0 = g * Rows;
  auto const cols = tg::arange<0, BlockN>();
  int ticket = -1;
  if (b == bug::ticket_first)
    ticket = tg::atomic_add(counter + 0, 1).item();
  for (std::int64_t c0 = 0; c0 < n; c0 += BlockN) {
    auto const mask = cols < n - c0;
    tg::tile<float, BlockN> const wv = tg::load(w + c0 + cols, mask, 0.0f);
    auto acc = tg::zeros<float, BlockN>();
    for (std::int64_t r = r0; r < std::min(m, r0 + Rows); ++r) {
      tg::tile<float, BlockN> const g_r = tg::load(dy + r * dy.stride(0) + c0 + cols, mask, 0.0f);
      tg::store(dx + r * dx.stride(0) + c0 + cols, g_r * wv, mask);
      acc += g_r * tg::load(x + r * x.stride(0) + c0 + cols, mask, 0.0f);
    }
    if (b == bug::one_row)
      (void)tg::atomic_add(partial + c0 + cols, acc, mask);
    else
      tg::store(partial + g * partial.stride(0) + c0 + cols, acc, mask);
  }
  if (b != bug::ticket_first && b != bug::by_id)
    ticket = tg::atomic_add(counter + 0, 1).item();
  bool const last = b == bug::by_id || b == bug::ticket_by_id ? g == programs - 1
                    : b == bug::second_to_last                ? ticket == programs - 2
                                                              : ticket == programs - 1;
  if (!last)
    return;
  for (std::int64_t c0 = 0; c0 < n; c0 += BlockN) {
    auto const mask = cols < n - c0;
    auto acc = tg::zeros<float, BlockN>();
    for (std::int64_t q = 0; q < (b == bug::one_row ? 1 : programs); ++q)
      acc += tg::load(partial + q * partial.stride(0) + c0 + cols, mask, 0.0f);
    tg::store(dw + c0 + cols, acc, mask);
  }
  if (b == bug::reset_by_store)
    tg::store(counter + 0, 0);
  else if (b != bug::no_reset)
    (void)tg::atomic_xchg(counter + 0, 0);
};

// The backward: one launch; the counter lives as long as the backward object, zeroed once.
struct ticket_backward {
  bug b;
  std::shared_ptr<tg::owned_tensor<int>> counter = [] {
    auto c = std::make_shared<tg::owned_tensor<int>>(std::initializer_list<std::int64_t>{1},
                                                     "counter");
    c->data()[0] = 0;
    return c;
  }();

  tg::gradient_set operator()(tg::backward_context<float>& ctx) const {
    auto const x = ctx.input("x");
    std::int64_t const m = x.size(0), n = x.size(1), programs = tg::cdiv<std::int64_t>(m, Rows);
    tg::owned_tensor<float> dx({m, n}), dw({n}), partial({programs, n}, "partial_dw");
    std::fill_n(partial.data(), programs * n, 0.0f);
    tg::launch(ctx.options(), programs, ticket_bwd, x, ctx.input("w"), ctx.cotangent("y"),
               dx.view(), partial.view(), counter->view(), dw.view(), static_cast<int>(b));
    return {{"x", dx}, {"w", dw}};
  }
};

tg::check_report check(bug b, std::int64_t m, std::int64_t n, tg::check_options o = {}) {
  tg::owned_tensor<float> x({m, n}), w({n}), y({m, n});
  return tg::check_backward(
      tg::forward(m, scale_fwd, tg::in("x", x), tg::in("w", w), tg::out("y", y)),
      ticket_backward{b}, o);
}

std::string at_line(int offset) {
  return "test_tickets.cpp:" + std::to_string(bwd_first_line + offset);
}

} // namespace

TEST(Tickets, TheLastProgramReducingPassesOnEveryExecutor) {
  // Shapes off the tiles (rows Rows does not divide, columns BlockN does not); grids of one wave
  // and of several; the counter reset with atomic_xchg or a plain store after the last ticket;
  // partial rows stored, or added into one row atomically (the determinism check takes the
  // order of those additions, and the program that reduces, from the run).
  for (auto e : {tg::executor::tbb, tg::executor::openmp, tg::executor::sequential})
    for (int threads : {1, 4}) {
      if (!tg::executor_available(e))
        continue;
      tg::launch_options const lo{e, threads};
      for (auto [m, n] : {std::pair<std::int64_t, std::int64_t>{203, 100}, {2049, 1 + BlockN}})
        for (bug b : {bug::none, bug::reset_by_store, bug::one_row}) {
          auto const r = check(b, m, n, {.seeds = 2, .launch = lo});
          EXPECT_BACKWARD_OK(r) << m << " x " << n << ", reset " << static_cast<int>(b);
          EXPECT_FALSE(r.mentions("race")) << r;
        }
    }
}

TEST(Tickets, AReductionTheTicketsDoNotOrderIsARace) {
  // Sequentially program g draws ticket g. Each race names the partial row of program 0, the
  // last program's load and program 0's store, and where each stands among the tickets.
  struct expect {
    bug b;
    char const* loader; // the program whose load races
    char const* tickets; // what the message says of the tickets ("": nothing, none were drawn)
  };
  tg::launch_options const seq{tg::executor::sequential, 1};
  int const load = 39, store = 26;
  for (auto [b, loader, tickets] :
       {expect{bug::ticket_first, "program (25, 0, 0)",
               "Here program (25, 0, 0) draws ticket 25 before its load and none after it; "
               "program (0, 0, 0) draws ticket 0 before its access and none after it."},
        expect{bug::by_id, "program (25, 0, 0)", ""},
        // (The program that reduces resets the counter before the last ticket is drawn.)
        expect{bug::second_to_last, "program (24, 0, 0)",
               "do not order programs here: ticket 0 was drawn twice (the counter went back)."}}) {
    int const k = static_cast<int>(b);
    for (tg::launch_options lo : {seq, tg::launch_options{}}) {
      auto const r = check(b, 203, 100, {.seeds = 1, .check_determinism = false, .launch = lo});
      EXPECT_FALSE(r) << k;
      EXPECT_TRUE(r.mentions("race on tensor 'partial_dw', element (")) << k << r;
      if (lo.exec != tg::executor::sequential)
        continue; // which program draws which ticket depends on the run
      EXPECT_TRUE(r.mentions("race on tensor 'partial_dw', element (0, 0): " +
                             std::string(loader) + " loads it at "))
          << k << r;
      EXPECT_TRUE(r.mentions(at_line(load) + ", and program (0, 0, 0) stores it at ")) << k << r;
      EXPECT_TRUE(r.mentions(at_line(store) + ".")) << k << r;
      if (b == bug::ticket_first)
        EXPECT_TRUE(r.mentions(at_line(13) +
                               "): what a program does before drawing a ticket comes before what "
                               "a program does after drawing a later one. " +
                               std::string(tickets)))
            << k << r;
      else if (*tickets)
        EXPECT_TRUE(r.mentions(at_line(29) + ") " + tickets)) << k << r;
      else
        EXPECT_FALSE(r.mentions("drawn")) << k << r;
      EXPECT_EQ(r.mentions("Programs draw tickets from tensor 'counter', element (0) (atomic_add "
                           "at "),
                b == bug::ticket_first)
          << k << r;
    }
  }
}

TEST(Tickets, ACounterLeftWhereTheLastBackwardLeftItFails) {
  // Never reset: the determinism check's second run draws tickets from 26 on, and no program
  // reduces.
  auto const r = check(bug::no_reset, 203, 100, {.seeds = 1});
  EXPECT_FALSE(r);
  EXPECT_FALSE(r.mentions("race")) << r;
  EXPECT_TRUE(r.mentions("not deterministic")) << r;
}

TEST(Tickets, ACounterResetBeforeTheLastTicketCannotOrderProgramsAndSaysSo) {
  // Program 10, which draws ticket 10 (sequentially), reduces the partial rows of the tickets
  // before it: ordered by the tickets. Program 150, in a later wave, sets the counter back: the
  // tickets after it are drawn again, so they no longer say which program ran first.
  constexpr auto k = [](tg::program const& p, tg::tensor<float> partial, tg::tensor<int> counter,
                        int reset) {
    std::int64_t const g = p.program_id(0);
    tg::store(partial + g, tg::full<float>(1.0f));
    int const ticket = tg::atomic_add(counter + 0, 1).item();
    if (ticket == 10) {
      auto acc = tg::zeros<float>();
      for (std::int64_t q = 0; q < 10; ++q)
        acc += tg::load(partial + q);
      tg::store(partial + g, acc);
    }
    if (reset && g == 150)
      (void)tg::atomic_xchg(counter + 0, 100);
  };
  for (int reset : {0, 1}) {
    tg::owned_tensor<float> partial({200}, "partial");
    tg::owned_tensor<int> counter({1}, "counter");
    counter.data()[0] = 0;
    tg::launch_options const o{.exec = tg::executor::sequential, .num_threads = 1,
                               .check_races = true};
    if (!reset) {
      EXPECT_NO_THROW(tg::launch(o, 200, k, partial.view(), counter.view(), reset));
      continue;
    }
    try {
      tg::launch(o, 200, k, partial.view(), counter.view(), reset);
      ADD_FAILURE() << "no error";
    } catch (tg::race_error const& e) {
      std::string const what = e.what();
      EXPECT_NE(what.find("tilegrad::launch: tickets drawn from tensor 'counter', element (0) "
                          "(atomic_add at "),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("ordered what programs did, but they cannot: "), std::string::npos)
          << what;
      EXPECT_NE(what.find("was drawn twice"), std::string::npos) << what;
    }
  }
}

// Tickets drawn, but the program with the last id reduces: ordered only in runs where it draws
// the last ticket. With one wave the second run (programs in reverse order) has it draw the
// first one, and its loads race; where it sat alone in the last wave (65 programs, waves of 64),
// it drew the last ticket in both runs, and the check passed it. The second run now takes the
// waves in reverse order too.
TEST(Tickets, AReductionByTheLastIdThatDrawsATicketFailsPastOneWave) {
  for (auto e : {tg::executor::sequential, tg::executor::tbb, tg::executor::openmp}) {
    if (!tg::executor_available(e))
      continue;
    for (std::int64_t programs : {40, 65, 257}) {
      auto const r = check(bug::ticket_by_id, programs * Rows, 29, {.seeds = 1, .launch = {e, 2}});
      EXPECT_FALSE(r) << programs << " programs\n" << r;
      EXPECT_TRUE(r.mentions("race on tensor 'partial_dw'")) << r;
    }
    EXPECT_BACKWARD_OK(check(bug::none, 65 * Rows, 29, {.seeds = 1, .launch = {e, 2}}));
  }
}

// Without the determinism check, the second run (programs in reverse order) still looks for
// races: on one thread the first run draws the tickets in program order, so the program with the
// last id always drew the last ticket and the race never showed (the check passed every time).
TEST(Tickets, ARaceOrderedByTicketsIsFoundWithoutTheDeterminismCheck) {
  for (auto e : {tg::executor::sequential, tg::executor::tbb}) {
    if (!tg::executor_available(e))
      continue;
    tg::check_options o{.seeds = 1, .launch = {e, 1}};
    o.check_determinism = false;
    auto const r = check(bug::ticket_by_id, 40 * Rows, 29, o);
    EXPECT_FALSE(r) << r;
    EXPECT_TRUE(r.mentions("race in launch 1 of the backward run a second time (the programs of "
                           "each launch in reverse order)"))
        << r;
    EXPECT_TRUE(r.mentions("race on tensor 'partial_dw'")) << r;
    EXPECT_BACKWARD_OK(check(bug::none, 40 * Rows, 29, o));
  }
}

TEST(Tickets, ASweepOfShapesAndExecutorsGivesEveryRunItsVerdict) {
  // TILEGRAD_SWEEP_RUNS runs (10 unless set; the long sweep's variable), rows log-uniform up to
  // TILEGRAD_SWEEP_MAX_N (160 unless set), columns up to three blocks, a random executor and
  // thread count, a fresh seed: the correct variants pass every run, and with two
  // programs or more the ticket drawn too early and the reduction by program id fail every run.
  char const* r = std::getenv("TILEGRAD_SWEEP_RUNS");
  char const* mx = std::getenv("TILEGRAD_SWEEP_MAX_N");
  int const runs = r ? std::atoi(r) : 10;
  double const max_rows = mx ? std::atof(mx) : 160;
  std::mt19937_64 rng(20261129);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<tg::executor> executors;
  for (auto e : {tg::executor::tbb, tg::executor::openmp, tg::executor::sequential})
    if (tg::executor_available(e))
      executors.push_back(e);
  int passed = 0, caught = 0;
  for (int run = 0; run < runs; ++run) {
    auto const m = static_cast<std::int64_t>(std::exp(u(rng) * std::log(max_rows))) + 1;
    auto const n = static_cast<std::int64_t>(1 + u(rng) * 3 * BlockN);
    tg::launch_options const lo{executors[rng() % executors.size()],
                                static_cast<int>(1 + rng() % 4)};
    auto const seed = static_cast<unsigned>(rng() % 100000);
    std::string const where = std::to_string(m) + " x " + std::to_string(n) + ", seed " +
                              std::to_string(seed);
    for (bug b : {bug::none, bug::reset_by_store, bug::one_row}) {
      auto const ok = check(b, m, n, {.seeds = 1, .first_seed = seed, .launch = lo});
      EXPECT_BACKWARD_OK(ok) << where << ", variant " << static_cast<int>(b);
      passed += ok.ok();
    }
    if (tg::cdiv(m, std::int64_t{Rows}) < 2)
      continue; // one program: nothing to race with
    for (bug b : {bug::ticket_first, bug::by_id}) {
      auto const off = check(b, m, n, {.seeds = 1, .first_seed = seed, .check_determinism = false,
                                       .launch = lo});
      EXPECT_FALSE(off) << where << ", variant " << static_cast<int>(b);
      EXPECT_TRUE(off.mentions("race on tensor 'partial_dw'")) << where << off;
      caught += !off.ok();
    }
  }
  std::printf("tickets sweep: %d runs, %d correct checks passed, %d broken ones failed\n", runs,
              passed, caught);
}

namespace {

// Split-K, the way a Triton user writes it: db = aᵀ @ dc over M split in `splits` parts, one
// program per (K tile, N tile, split). Each stores its partial tile to a workspace, draws a ticket
// from its output tile's counter, and the program that draws the tile's last ticket adds the
// partial tiles up and resets the counter. One counter per output tile: tickets of one counter
// order only the programs of that tile.
constexpr int TK = 16, TN = 32, TM = 32;
enum class split_bug { none, reduce_never, ticket_first };

constexpr auto split_k_db = [](tg::program const& p, tg::tensor<float const> a,
                               tg::tensor<float const> dc, tg::tensor<float> ws,
                               tg::tensor<int> counters, tg::tensor<float> db, int which) {
  auto const b = static_cast<split_bug>(which);
  std::int64_t const M = a.size(0), K = a.size(1), N = dc.size(1);
  int const tk = p.program_id(0), tn = p.program_id(1), split = p.program_id(2);
  int const splits = p.num_programs(2);
  std::int64_t const per = tg::cdiv(tg::cdiv(M, std::int64_t{TM}), std::int64_t{splits}) * TM;
  auto const offs_k = tk * TK + tg::arange<0, TK>();
  auto const offs_n = tn * TN + tg::arange<0, TN>();
  auto const out = tg::col(offs_k < K) & tg::row(offs_n < N);
  auto const tile = counters + (tk * p.num_programs(1) + tn);
  int ticket = -1;
  if (b == split_bug::ticket_first)
    ticket = tg::atomic_add(tile, 1).item();
  auto acc = tg::zeros<float, TK, TN>();
  for (std::int64_t m0 = split * per; m0 < std::min(M, (split + 1) * per); m0 += TM) {
    auto const offs_m = m0 + tg::arange<0, TM>();
    auto const in_m = tg::col(offs_m < std::min(M, (split + 1) * per));
    auto const at = tg::load(a + tg::col(offs_m) * a.stride(0) + tg::row(offs_k), in_m &
                             tg::row(offs_k < K), 0.0f);
    auto const dct = tg::load(dc + tg::col(offs_m) * dc.stride(0) + tg::row(offs_n), in_m &
                              tg::row(offs_n < N), 0.0f);
    acc = tg::dot(tg::trans(at), dct, std::move(acc));
  }
  auto const part = ws + split * ws.stride(0) + tg::col(offs_k) * ws.stride(1) + tg::row(offs_n);
  tg::store(part, acc, out);
  if (b != split_bug::ticket_first)
    ticket = tg::atomic_add(tile, 1).item();
  if (ticket != (b == split_bug::reduce_never ? splits : splits - 1))
    return;
  auto sum = tg::zeros<float, TK, TN>();
  for (int q = 0; q < splits; ++q)
    sum += tg::load(ws + q * ws.stride(0) + tg::col(offs_k) * ws.stride(1) + tg::row(offs_n), out,
                    0.0f);
  tg::store(db + tg::col(offs_k) * db.stride(0) + tg::row(offs_n), sum, out);
  (void)tg::atomic_xchg(tile, 0);
};

struct split_k_backward {
  split_bug b;
  int splits;
  tg::gradient_set operator()(tg::backward_context<float>& ctx) const {
    auto const a = ctx.input("a");
    auto const bm = ctx.input("b");
    auto const dc = ctx.cotangent("c");
    std::int64_t const M = a.size(0), K = a.size(1), N = bm.size(1);
    tg::owned_tensor<float> da({M, K}), db({K, N}), ws({splits, K, N}, "workspace");
    std::int64_t const tiles_k = tg::cdiv(K, std::int64_t{TK}), tiles_n = tg::cdiv(N, std::int64_t{TN});
    tg::owned_tensor<int> counters({tiles_k * tiles_n}, "tile_counters");
    std::fill_n(counters.data(), tiles_k * tiles_n, 0);
    std::fill_n(db.data(), K * N, 0.0f);
    tg::launch(ctx.options(), tg::grid(tg::cdiv(M, std::int64_t{32}), tg::cdiv(K, std::int64_t{16})),
               tg::kernels::matmul_bwd_da<32, 16, 32>, dc, bm, da.view());
    tg::launch(ctx.options(), tg::grid(tiles_k, tiles_n, splits), split_k_db, a, dc, ws.view(),
               counters.view(), db.view(), static_cast<int>(b));
    return {{"a", da}, {"b", db}};
  }
};

tg::check_report check_split_k(split_bug b, int splits, tg::check_options o = {}) {
  std::int64_t const M = 300, K = 70, N = 90;
  tg::owned_tensor<float> a({M, K}), bm({K, N}), c({M, N});
  return tg::check_backward(
      tg::forward(static_cast<int>(tg::cdiv(M, std::int64_t{32}) * tg::cdiv(N, std::int64_t{32})),
                  tg::kernels::matmul_fwd<32, 32, 16>, tg::in("a", a), tg::in("b", bm),
                  tg::out("c", c)),
      split_k_backward{b, splits}, o);
}

} // namespace

TEST(Tickets, SplitKWithACounterPerTilePassesAndItsBugsFail) {
  // Shapes off every tile; 4 and 3 splits of M (the last one short); every executor.
  for (auto e : {tg::executor::tbb, tg::executor::openmp, tg::executor::sequential}) {
    if (!tg::executor_available(e))
      continue;
    for (int splits : {4, 3}) {
      auto const r = check_split_k(split_bug::none, splits, {.seeds = 2, .launch = {e, 4}});
      EXPECT_BACKWARD_OK(r) << splits;
      EXPECT_FALSE(r.mentions("race")) << r;
    }
  }
  // No program draws ticket `splits`: db is never stored (zeros).
  auto const never = check_split_k(split_bug::reduce_never, 4, {.seeds = 1});
  EXPECT_FALSE(never);
  EXPECT_FALSE(never.gradient("b")->ok) << never;
  EXPECT_TRUE(never.gradient("a")->ok) << never;
  // The ticket drawn before the partial tile is stored: a race on the workspace, whose message
  // names the tile's counter.
  auto const early = check_split_k(split_bug::ticket_first, 4,
                                   {.seeds = 1, .check_determinism = false});
  EXPECT_FALSE(early);
  EXPECT_TRUE(early.mentions("race on tensor 'workspace', element (")) << early;
  EXPECT_TRUE(early.mentions("Programs draw tickets from tensor 'tile_counters', element (")) << early;
}

} // namespace test_tickets

namespace test_tickets {

TEST(Tickets, TwoCountersOrderingOneAccessAreNamedInTheRace) {
  // dw and db each reduced by the program that draws its counter's last ticket, each partial row
  // stored before its own counter's ticket: correct under acq_rel atomics, but the check places
  // each access among the tickets of one counter (the last its program drew before it, or else
  // the first after it), and the reduction of dw, after both tickets, is placed by db's counter.
  // Reported as a race whose message names each ticket's counter and says what to write instead.
  constexpr int C = 16;
  auto const kernel = [](tg::program const& p, tg::tensor<float const> g, tg::tensor<float> pdw,
                         tg::tensor<float> pdb, tg::tensor<int> cw, tg::tensor<int> cb,
                         tg::tensor<float> dw, tg::tensor<float> db) {
    int const r = p.program_id(0), programs = p.num_programs(0);
    auto const cols = tg::arange<0, C>();
    tg::tile<float, C> const v = tg::load(g + r * C + cols);
    tg::store(pdw + r * C + cols, v * 2.0f);
    int const tw = tg::atomic_add(cw + 0, 1).item();
    tg::store(pdb + r * C + cols, v);
    int const tb = tg::atomic_add(cb + 0, 1).item();
    auto const reduce = [&](tg::tensor<float> part, tg::tensor<float> out) {
      auto acc = tg::zeros<float, C>();
      for (int q = 0; q < programs; ++q)
        acc += tg::load(part + q * C + cols);
      tg::store(out + cols, acc);
    };
    if (tw == programs - 1)
      reduce(pdw, dw);
    if (tb == programs - 1)
      reduce(pdb, db);
  };
  int const m = 40;
  tg::owned_tensor<float> g({m, C}), pdw({m, C}, "partial_dw"), pdb({m, C}, "partial_db");
  tg::owned_tensor<float> dw({C}, "dw"), db({C}, "db");
  tg::owned_tensor<int> cw({1}, "count_w"), cb({1}, "count_b");
  tg::launch_options lo{tg::executor::sequential, 1};
  lo.check_races = true;
  try {
    tg::launch(lo, m, kernel, g.cview(), pdw.view(), pdb.view(), cw.view(), cb.view(), dw.view(),
               db.view());
    ADD_FAILURE() << "no race reported";
  } catch (tg::race_error const& e) {
    std::string const what = e.what();
    EXPECT_NE(what.find("race on tensor 'partial_dw'"), std::string::npos) << what;
    EXPECT_NE(what.find(" of tensor 'count_b', element (0) ("), std::string::npos) << what;
    EXPECT_NE(what.find(" of tensor 'count_w', element (0) ("), std::string::npos) << what;
    EXPECT_NE(what.find("accesses placed by two counters are not ordered: draw the tickets that "
                        "order these accesses from one counter"),
              std::string::npos)
        << what;
  }
}

} // namespace test_tickets
