// Locks in checked launches: the Triton layer-norm tutorial's backward, whose programs add their
// rows' dw and db into per-group partial sums inside a spin lock (atomic_cas to take it,
// atomic_xchg to give it back), passes check_backward: accesses that programs make holding the
// same lock do not race. Broken variants still fail with a race naming the partial sums and the
// line: a store after the lock is given back, the wrong lock for the group, a ticket taken with
// atomic_cas and never given back (not a lock), a read of the partial sums before the lock is
// taken. Sums made under a lock change with the order the programs take it; when two runs differ
// so, the determinism check says why and how to accept it.
#include <tilegrad/check/gtest.hpp>
#include <tilegrad/kernels/layer_norm.hpp>
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <string>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_locks {

namespace tg = tilegrad;

namespace {

constexpr int BlockN = 128, Groups = 8, BG = 4;
constexpr double eps = 1e-5;

enum class bug {
  none,
  store_after_release, // the lock given back before the partial sums are stored
  wrong_lock,          // rows r and r + 1 share a partial row but not a lock
  ticket,              // a ticket taken by atomic_cas (never given back) instead of a lock
  read_before_lock,    // the partial sums loaded before the lock is taken
  ignored_try,         // atomic_cas's result ignored: the lock is held only when it was free
  inverted_wait,       // the spin loop's condition the wrong way round: it stops when it fails
};

int const bwd_first_line = __LINE__;
// _layer_norm_bwd_dx_fused of the tutorial: one row per program (BlockN >= N); `locks` holds
// `groups` locks and then `groups` counts (0: the group's partial row not written yet). `order`
// walks the rows backwards when 1, so that the partial sums get their rows in another order.
constexpr auto tutorial_bwd = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                          tg::tensor<T const> w, tg::tensor<T const> mean,
                                          tg::tensor<T const> rstd, tg::tensor<T const> dy,
                                          tg::tensor<T> dx, tg::tensor<T> partial_dw,
                                          tg::tensor<T> partial_db, tg::tensor<int> locks,
                                          int which, int order, float extra, int groups) {
  auto const b = static_cast<bug>(which);
  std::int64_t const m = x.size(0), n = x.size(1);
  std::int64_t const row = order ? m - 1 - p.program_id(0) : p.program_id(0);
  auto const cols = tg::arange<0, BlockN>();
  auto const mask = cols < n;
  tg::tile<T, BlockN> const xv = tg::load(x + row * x.stride(0) + cols, mask, 0.0f);
  tg::tile<T, BlockN> const g = tg::load(dy + row * dy.stride(0) + cols, mask, 0.0f);
  tg::tile<T, BlockN> const wv = tg::load(w + cols, mask, 0.0f);
  tg::tile<T> const mu = tg::load(mean + row), rs = tg::load(rstd + row);
  tg::tile<T, BlockN> const xhat = tg::where(mask, (xv - mu) * rs, 0.0f);
  tg::tile<T, BlockN> const wdy = tg::where(mask, wv * g, 0.0f);
  tg::tile<T> const c1 = tg::sum(xhat * wdy) / double(n), c2 = tg::sum(wdy) / double(n);
  tg::store(dx + row * dx.stride(0) + cols, (wdy - (xhat * c1 + c2)) * rs, mask);

  std::int64_t const group = b == bug::wrong_lock ? (row / 2) % groups : row % groups;
  std::int64_t const lock = row % groups, count = groups + lock;
  auto const pdw = partial_dw + group * partial_dw.stride(0) + cols;
  auto const pdb = partial_db + group * partial_db.stride(0) + cols;
  tg::tile<T, BlockN> dw = g * xhat + extra, db = g;
  tg::tile<T, BlockN> early = tg::zeros<T, BlockN>();
  if (b == bug::read_before_lock)
    early = tg::load(pdw, mask, 0.0f);
  if (b == bug::ticket) {
    for (;;) { // takes the next ticket: the count goes up, nothing gives it back
      int const t = tg::load(locks + count).item();
      if (tg::atomic_cas(locks + count, t, t + 1).item() == t)
        break;
    }
  } else if (b == bug::ignored_try) {
    (void)tg::atomic_cas(locks + lock, 0, 1);
  } else {
    while ((tg::atomic_cas(locks + lock, 0, 1).item() == 1) != (b == bug::inverted_wait)) {
    }
  }
  if (b != bug::ticket && tg::load(locks + count).item() == 0) {
    (void)tg::atomic_xchg(locks + count, 1);
  } else {
    dw += b == bug::read_before_lock ? early : tg::load(pdw, mask, 0.0f);
    db += tg::load(pdb, mask, 0.0f);
  }
  if (b == bug::store_after_release)
    (void)tg::atomic_xchg(locks + lock, 0);
  tg::store(pdw, dw, mask);
  tg::store(pdb, db, mask);
  if (b != bug::store_after_release && b != bug::ticket)
    (void)tg::atomic_xchg(locks + lock, 0);
};

// The backward: the tutorial's kernel, then the library's reduction of the partial rows. Calls
// alternate the row order when `alternate` is set (the determinism check runs it twice).
struct tutorial_backward {
  bug b;
  tg::tensor<float const> mean, rstd;
  bool alternate = false;
  int* calls = nullptr;
  bool direct = false;            // one group: dw and db summed under one lock, handed over
  float extra_on_second = 0.0f;   // added to each row's dw on the second call
  int groups = Groups;            // partial rows and locks

  tg::gradient_set operator()(tg::backward_context<float>& ctx) const {
    auto const x = ctx.input("x");
    auto const w = ctx.input("w");
    std::int64_t const m = x.size(0), n = x.size(1);
    tg::owned_tensor<float> dx({m, n}), pdw({groups, n}, "partial_dw"),
        pdb({groups, n}, "partial_db");
    tg::owned_tensor<float> dw({n}), db({n});
    tg::owned_tensor<int> locks({2 * groups}, "locks");
    // (The determinism check's second run takes the programs in reverse order by itself: walking
    // the rows backwards on that call too would give the first call's order back.)
    int const order = 0;
    bool const second = alternate && (*calls)++ % 2 == 1;
    if (direct) { // one group: its partial rows are the gradients
      tg::launch(ctx.options(), m, tutorial_bwd, x, w, mean, rstd, ctx.cotangent("y"), dx.view(),
                 dw.view(), db.view(), locks.view(), static_cast<int>(b), order, 0.0f, 1);
      return {{"x", dx}, {"w", dw}, {"b", db}};
    }
    tg::launch(ctx.options(), m, tutorial_bwd, x, w, mean, rstd, ctx.cotangent("y"), dx.view(),
               pdw.view(), pdb.view(), locks.view(), static_cast<int>(b), order,
               second ? extra_on_second : 0.0f, groups);
    tg::launch(ctx.options(), tg::cdiv(n, BlockN), tg::kernels::layer_norm_reduce_dwdb<BG, BlockN>,
               pdw.cview(), pdb.cview(), dw.view(), db.view());
    return {{"x", dx}, {"w", dw}, {"b", db}};
  }
};

tg::check_report check(tutorial_backward bwd, std::int64_t m, std::int64_t n,
                       tg::check_options o) {
  tg::owned_tensor<float> x({m, n}), w({n}), bias({n}), y({m, n}), mean({m}), rstd({m});
  bwd.mean = mean.cview();
  bwd.rstd = rstd.cview();
  return tg::check_backward(tg::forward(m, tg::kernels::layer_norm_fwd<BlockN>, tg::in("x", x),
                                        tg::in("w", w), tg::in("b", bias), tg::out("y", y),
                                        mean.view(), rstd.view(), eps),
                            bwd, o);
}

} // namespace

TEST(Locks, TutorialLockedPartialSumsPass) {
  // Rows and columns that Groups and BlockN do not divide; every executor.
  for (auto e : {tg::executor::tbb, tg::executor::openmp, tg::executor::sequential})
    for (int threads : {1, 4}) {
      if (!tg::executor_available(e))
        continue;
      tg::launch_options const lo{e, threads};
    for (auto [m, n] : {std::pair<std::int64_t, std::int64_t>{203, 100}, {9, 1 + BlockN / 2}}) {
      auto const r = check({bug::none, {}, {}}, m, n,
                           {.seeds = 2, .check_determinism = false, .launch = lo});
      EXPECT_BACKWARD_OK(r) << m << " x " << n;
      EXPECT_FALSE(r.mentions("race")) << r;
    }
  }
}

TEST(Locks, BrokenLockingIsARaceOnThePartialSums) {
  // Program 8 shares partial row 0 with program 0 (program 1 too with the wrong lock): the race
  // names both, what each did and where (lines from the kernel's first).
  struct expect {
    bug b;
    char const* mine; // what the later program did, at line `at` ...
    int at;
    char const* theirs; // ... and what program 0 did, at line `other`
    int other;
  };
  int const early_load = 31, locked_load = 47, store = 52;
  for (auto [b, mine, at, theirs, other] :
       {expect{bug::store_after_release, "program (8, 0, 0) loads it", locked_load, "stores it",
               store},
        expect{bug::wrong_lock, "program (1, 0, 0) stores it", store, "stores it too", store},
        expect{bug::ticket, "program (8, 0, 0) loads it", locked_load, "stores it", store},
        expect{bug::read_before_lock, "program (8, 0, 0) loads it", early_load, "stores it",
               store}}) {
    auto const r = check({b, {}, {}}, 203, 100, {.seeds = 1, .check_determinism = false});
    int const k = static_cast<int>(b);
    EXPECT_FALSE(r) << k;
    EXPECT_TRUE(r.mentions("race on tensor 'partial_dw', element (0, 0): ")) << k << r;
    EXPECT_TRUE(r.mentions(mine)) << k << r;
    EXPECT_TRUE(r.mentions("test_locks.cpp:" + std::to_string(bwd_first_line + at) +
                           ", and program (0, 0, 0) " + theirs + " at "))
        << k << r;
    EXPECT_TRUE(r.mentions("test_locks.cpp:" + std::to_string(bwd_first_line + other) + ". "))
        << k << r;
  }
}

TEST(Locks, ASpinLockThatDoesNotWaitRaces) {
  // A try at the lock whose result is ignored, or a spin loop the wrong way round, holds the lock
  // only when no other program does: programs that share a lock may never contend in a check
  // (256 groups: rows r, r + 256 and r + 512 share one, and run in different waves; or every
  // program in one wave on one thread). The probe of locks runs the backward once more, the
  // first tries of each taking of a lock that the first run saw taken and given back finding it
  // held: the broken kernels race on the partial sums, and the report says which try was made to
  // fail; the tutorial's passes.
  struct setup {
    std::int64_t m;
    int groups;
    tg::launch_options lo;
  };
  std::string const when = "race in launch 1 of the backward, run again with the first 256 "
                           "tries of each taking of a lock failing (grid (";
  for (auto const& [m, groups, lo] :
       {setup{600, 256, {}}, setup{600, 256, {tg::executor::sequential, 1}},
        setup{40, 16, {tg::executor::sequential, 1}}}) {
    tutorial_backward ok{bug::none, {}, {}};
    ok.groups = groups;
    auto const fine = check(ok, m, 100, {.seeds = 1, .launch = lo});
    EXPECT_BACKWARD_OK(fine) << m;
    EXPECT_FALSE(fine.mentions("race")) << fine;
    for (bug b : {bug::ignored_try, bug::inverted_wait})
      for (bool det : {false, true}) { // (the probe runs after the structural checks)
        tutorial_backward bwd{b, {}, {}};
        bwd.groups = groups;
        auto const r = check(bwd, m, 100, {.seeds = 1, .check_determinism = det, .launch = lo});
        int const k = static_cast<int>(b) * 2 + det;
        EXPECT_FALSE(r) << k;
        EXPECT_TRUE(r.mentions(when)) << k << r;
        // (On the partial sums, or first on the count read without the lock, which another
        // program set with atomic_xchg.)
        EXPECT_TRUE(r.mentions("race on tensor 'partial_dw', element (") ||
                    r.mentions("race on tensor 'locks', element ("))
            << k << r;
        EXPECT_TRUE(r.mentions("'s atomic_cas on the lock at 'locks', element (")) << k << r;
        int const tried_at = b == bug::ignored_try ? 39 : 41; // the atomic_cas
        EXPECT_TRUE(r.mentions("test_locks.cpp:" + std::to_string(bwd_first_line + tried_at) +
                               ") was made to find it held"))
            << k << r;
      }
  }
}

namespace {

// The forward of the lock tests below: y = x * w, a row per program, rows of at most 32.
constexpr auto rows_times_w = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                          tg::tensor<T const> w, tg::tensor<T> y) {
  auto const cols = tg::arange<0, 32>();
  auto const mask = cols < x.size(1);
  std::int64_t const r = p.program_id(0);
  tg::store(y + r * y.stride(0) + cols,
            tg::load(x + r * x.stride(0) + cols, mask, 0.0f) * tg::load(w + cols, mask, 0.0f),
            mask);
};

// The backward of rows_times_w for row r: stores the row's dx and returns its share of dw.
constexpr int row_width = 32;
inline tg::tile<float, row_width> dx_and_row_dw(std::int64_t r, tg::tensor<float const> x,
                                                tg::tensor<float const> w,
                                                tg::tensor<float const> dy, tg::tensor<float> dx) {
  auto const cols = tg::arange<0, row_width>();
  auto const mask = cols < x.size(1);
  tg::tile<float, row_width> const g = tg::load(dy + r * dy.stride(0) + cols, mask, 0.0f);
  tg::store(dx + r * dx.stride(0) + cols, g * tg::load(w + cols, mask, 0.0f), mask);
  return g * tg::load(x + r * x.stride(0) + cols, mask, 0.0f);
}

enum class taking {
  spin,          // while (atomic_cas(lock, 0, 1) == 1) {}
  wait_for_turn, // a failed try waits until the holder moves the lock's turn number on
  bounded,       // gives up after two tries, and goes on without the lock
  twice,         // takes the lock twice: with a spin, then with a try whose result is ignored
  // Test-and-set locks: atomic_xchg(lock, 1) takes the lock where it returns 0.
  test_and_set,      // while (atomic_xchg(lock, 1) == 1) {}
  test_test_and_set, // spins on plain loads of the lock while it is held, then tries
  bounded_xchg,      // gives up after two tries, and goes on without the lock
  twice_xchg,        // takes the lock twice: with a spin, then with a try whose result is ignored
  test_and_set_id,   // while (atomic_xchg(lock, row + 1) != 0) {}: the word names its holder
};

// y = x * w by rows; the backward adds each row's dw into the partial row of its group (row %
// groups) under the group's lock, and the host adds the partial rows up. `locks` holds `groups`
// locks, then a turn number per lock. `how` is a `taking`, plus release_by_cas where the lock is
// given back with atomic_cas(lock, 1, 0) rather than atomic_xchg(lock, 0).
constexpr int release_by_cas = 16;
constexpr auto grouped_dw = [](tg::program const& p, tg::tensor<float const> x,
                               tg::tensor<float const> w, tg::tensor<float const> dy,
                               tg::tensor<float> dx, tg::tensor<float> part, tg::tensor<int> locks,
                               int how, int groups) {
  std::int64_t const r = p.program_id(0);
  auto const cols = tg::arange<0, row_width>();
  auto const mask = cols < x.size(1);
  tg::tile<float, row_width> const d = dx_and_row_dw(r, x, w, dy, dx);
  int const k = static_cast<int>(r % groups);
  auto const lock = locks + k, turn = locks + (groups + k);
  auto const row = part + k * part.stride(0) + cols;
  auto const take = [&](taking t) {
    if (t == taking::spin) {
      while (tg::atomic_cas(lock, 0, 1).item() == 1) {
      }
    } else if (t == taking::wait_for_turn) {
      for (;;) {
        int const seen = tg::atomic_cas(turn, -1, -1).item(); // reads the turn
        if (tg::atomic_cas(lock, 0, 1).item() == 0)
          break;
        while (tg::atomic_cas(turn, -1, -1).item() == seen) { // until the holder gives it back
        }
      }
    } else if (t == taking::bounded) {
      for (int tries = 0; tries < 2; ++tries)
        if (tg::atomic_cas(lock, 0, 1).item() == 0)
          break;
    } else if (t == taking::test_and_set) {
      while (tg::atomic_xchg(lock, 1).item() == 1) {
      }
    } else if (t == taking::test_test_and_set) {
      do {
        while (tg::load(lock).item() == 1) {
        }
      } while (tg::atomic_xchg(lock, 1).item() == 1);
    } else if (t == taking::bounded_xchg) {
      for (int tries = 0; tries < 2; ++tries)
        if (tg::atomic_xchg(lock, 1).item() == 0)
          break;
    } else if (t == taking::twice_xchg) {
      (void)tg::atomic_xchg(lock, 1);
    } else if (t == taking::test_and_set_id) {
      while (tg::atomic_xchg(lock, static_cast<int>(r) + 1).item() != 0) {
      }
    } else {
      (void)tg::atomic_cas(lock, 0, 1);
    }
  };
  auto const give_back = [&] {
    (void)tg::atomic_xchg(turn, tg::atomic_cas(turn, -1, -1).item() + 1);
    if (how & release_by_cas)
      (void)tg::atomic_cas(lock, 1, 0);
    else
      (void)tg::atomic_xchg(lock, 0);
  };
  auto const t = static_cast<taking>(how & ~release_by_cas);
  take(t == taking::twice ? taking::spin : t == taking::twice_xchg ? taking::test_and_set : t);
  tg::store(row, tg::load(row, mask, 0.0f) + d * 0.5f, mask);
  give_back();
  take(t);
  tg::store(row, tg::load(row, mask, 0.0f) + d * 0.5f, mask);
  give_back();
};

tg::check_report check_grouped(taking how, std::int64_t m, int groups, tg::launch_options lo,
                               bool cas_release = false) {
  std::int64_t const n = 29;
  tg::owned_tensor<float> x({m, n}), w({n}), y({m, n});
  auto const bwd = [=](tg::backward_context<float>& ctx) -> tg::gradient_set {
    tg::owned_tensor<float> dx({m, n}), part({groups, n}, "partial_dw"), dw({n});
    tg::owned_tensor<int> locks({2 * groups}, "locks");
    tg::launch(ctx.options(), m, grouped_dw, ctx.input("x"), ctx.input("w"), ctx.cotangent("y"),
               dx.view(), part.view(), locks.view(),
               static_cast<int>(how) | (cas_release ? release_by_cas : 0), groups);
    for (int k = 0; k < groups; ++k)
      for (std::int64_t j = 0; j < n; ++j)
        dw.data()[j] += part.data()[k * n + j];
    return {{"x", dx}, {"w", dw}};
  };
  return tg::check_backward(
      tg::forward(m, rows_times_w, tg::in("x", x), tg::in("w", w), tg::out("y", y)), bwd,
      {.seeds = 1, .check_determinism = false, .launch = lo});
}

} // namespace

namespace {

// check_grouped with each taking in `fine` (which passes, with no race and the probe not
// stopped) and in `broken` (which races on the partial rows; on one thread, where the first run
// never meets contention, the report names the try the probe made fail, an `op`), on every
// executor, in several waves and in one, with locks given back by atomic_xchg and atomic_cas.
void expect_takings(std::initializer_list<taking> fine, std::initializer_list<taking> broken,
                    std::string const& op) {
  for (auto e : {tg::executor::tbb, tg::executor::openmp, tg::executor::sequential}) {
    if (!tg::executor_available(e))
      continue;
    for (auto [m, groups] : {std::pair<std::int64_t, int>{600, 256}, {40, 16}})
      for (bool cas_release : {false, true}) {
        tg::launch_options const lo{e, 2};
        for (taking how : fine) {
          if (how == taking::test_and_set_id && cas_release)
            continue; // (atomic_cas(lock, 1, 0) gives back only a lock that holds 1)
          auto const r = check_grouped(how, m, groups, lo, cas_release);
          EXPECT_BACKWARD_OK(r) << static_cast<int>(how) << " " << cas_release;
          EXPECT_FALSE(r.mentions("race")) << r;
          EXPECT_FALSE(r.mentions("probe of locks stopped")) << r;
        }
        for (taking how : broken) {
          auto const r = check_grouped(how, m, groups, lo, cas_release);
          EXPECT_FALSE(r) << static_cast<int>(how) << " " << cas_release;
          EXPECT_TRUE(r.mentions("race on tensor 'partial_dw', element (")) << r;
          // (Two threads may meet at a lock in the first run, which then fails by itself.)
          if (e == tg::executor::sequential) {
            EXPECT_TRUE(r.mentions("'s " + op + " on the lock at 'locks', element (")) << r;
            EXPECT_TRUE(r.mentions("was made to find it held")) << r;
          }
        }
      }
  }
}

} // namespace

TEST(Locks, TheProbeMakesEveryTakingOfALockWaitAWhile) {
  // A spin lock that gives up after two tries, and a program whose second taking of its lock
  // ignores the try (its first one spins): in the check neither ever finds its lock held, and
  // both pass unless the probe makes the first tries of every taking fail. They race on the
  // partial rows (named as the probe's finding on one thread); the spin lock passes, on every
  // executor, in several waves and in one. Locks given back by atomic_cas(lock, 1, 0) too: the
  // probe made those releases fail (a try at a known lock), the lock stayed held, the next taking
  // waited until the probe stopped, and the first run's pass stood.
  expect_takings({taking::spin}, {taking::bounded, taking::twice}, "atomic_cas");
}

TEST(Locks, TestAndSetLocksAreLocks) {
  // A lock taken by atomic_xchg(lock, 1) where it returns 0 (spinning on the exchange, or on plain
  // loads of the lock first) and given back by the same program is a lock: its accesses do not
  // race, on every executor, in several waves and in one. Both failed with a race on the partial
  // rows. A lock whose word holds its holder's id (the exchanges of a spin find other programs'
  // ids, and only the last finds it free) failed in the probe of locks, the first exchange taken
  // for the taking. The probe makes the first exchanges of each taking find it held: a lock that
  // gives up after two tries, or whose second taking ignores the exchange, races.
  expect_takings({taking::test_and_set, taking::test_test_and_set, taking::test_and_set_id},
                 {taking::bounded_xchg, taking::twice_xchg}, "atomic_xchg");
}

TEST(Locks, ALockThatWaitsForItsTurnStopsTheProbeAndPasses) {
  // A correct lock whose failed try waits until the holder moves the lock's turn number on: a try
  // the probe made fail finds no holder to move it, and would wait for ever. The program's
  // accesses after the try are counted; past launch_tracker::probe_patience the probe stops
  // (every program of the launch throws at its next access), and the check passes with a note.
  auto const r = check_grouped(taking::wait_for_turn, 40, 16, {tg::executor::sequential, 1});
  EXPECT_BACKWARD_OK(r);
  EXPECT_TRUE(r.mentions("the probe of locks stopped: program (0, 0, 0) made 65536 accesses "
                         "after its try at the lock at 'locks', element (0) ("))
      << r;
  auto const threads = check_grouped(taking::wait_for_turn, 600, 256, {});
  EXPECT_BACKWARD_OK(threads);
  EXPECT_TRUE(threads.mentions("the probe of locks stopped: ")) << threads;
}

TEST(Locks, MoreLocksThanSixteenBitsCanNumber) {
  // An embedding backward with a lock per row of a table of 66,000 rows (each taken by two
  // programs): locks past the 65,535th were not told apart, and the correct kernel failed with a
  // race at row 65,535. A try whose result is ignored still races.
  static constexpr int D = 4;
  std::int64_t const V = 66000, M = 2 * V;
  auto const fwd = []<class T>(tg::program const& p, tg::tensor<int const> idx,
                               tg::tensor<T const> table, tg::tensor<T> y) {
    std::int64_t const r = p.program_id(0);
    int const i = tg::load(idx + r).item();
    auto const cols = tg::arange<0, D>();
    tg::store(y + r * y.stride(0) + cols, tg::load(table + i * table.stride(0) + cols));
  };
  auto const add_rows = [](tg::program const& p, tg::tensor<int const> idx,
                           tg::tensor<float const> dy, tg::tensor<float> dtable,
                           tg::tensor<int> locks, int ignored) {
    std::int64_t const r = p.program_id(0);
    int const i = tg::load(idx + r).item();
    auto const cols = tg::arange<0, D>();
    if (ignored)
      (void)tg::atomic_cas(locks + i, 0, 1);
    else
      while (tg::atomic_cas(locks + i, 0, 1).item() == 1) {
      }
    auto const dst = dtable + i * dtable.stride(0) + cols;
    tg::store(dst, tg::load(dst) + tg::load(dy + r * dy.stride(0) + cols));
    (void)tg::atomic_xchg(locks + i, 0);
  };
  tg::owned_tensor<int> idx({M}, "idx");
  for (std::int64_t r = 0; r < M; ++r)
    idx.data()[r] = static_cast<int>(r % V);
  tg::owned_tensor<float> table({V, D}), y({M, D});
  for (int ignored : {0, 1}) {
    auto const bwd = [&](tg::backward_context<float>& ctx) -> tg::gradient_set {
      tg::owned_tensor<float> dtable({V, D}, "dtable");
      tg::owned_tensor<int> locks({V}, "locks");
      tg::launch(ctx.options(), static_cast<int>(M), add_rows, idx.cview(), ctx.cotangent("y"),
                 dtable.view(), locks.view(), ignored);
      return {{"table", dtable}};
    };
    auto const r = tg::check_backward(
        tg::forward(static_cast<int>(M), fwd, idx.cview(), tg::in("table", table), tg::out("y", y)),
        bwd, {.seeds = 1, .check_determinism = false});
    if (ignored) {
      EXPECT_FALSE(r);
      EXPECT_TRUE(r.mentions("race on tensor 'dtable'")) << r;
    } else {
      EXPECT_BACKWARD_OK(r);
    }
  }
}

TEST(Locks, ALockTakenWhileAnotherIsHeldIsNamedInTheRace) {
  // dw by groups of row % 8 under their locks, db by groups of row % 5 under theirs, taken while
  // holding the first: correct, but the check follows the first lock a program took (documented),
  // so programs 0 and 5 race on db's partial row 0, and the message says why.
  constexpr int C = 16;
  auto const kernel = [](tg::program const& p, tg::tensor<float const> g, tg::tensor<float> pdw,
                         tg::tensor<float> pdb, tg::tensor<int> locks) {
    int const r = p.program_id(0);
    auto const cols = tg::arange<0, C>();
    tg::tile<float, C> const v = tg::load(g + r * C + cols);
    auto const a = locks + r % 8, b = locks + (8 + r % 5);
    while (tg::atomic_cas(a, 0, 1).item() == 1) {
    }
    while (tg::atomic_cas(b, 0, 1).item() == 1) {
    }
    auto const rw = pdw + (r % 8) * C + cols, rb = pdb + (r % 5) * C + cols;
    tg::store(rw, tg::load(rw) + v);
    tg::store(rb, tg::load(rb) + v);
    (void)tg::atomic_xchg(b, 0);
    (void)tg::atomic_xchg(a, 0);
  };
  tg::owned_tensor<float> g({40, C}), pdw({8, C}, "partial_dw"), pdb({5, C}, "partial_db");
  tg::owned_tensor<int> locks({13}, "locks");
  tg::launch_options lo{tg::executor::sequential, 1};
  lo.check_races = true;
  try {
    tg::launch(lo, 40, kernel, g.cview(), pdw.view(), pdb.view(), locks.view());
    ADD_FAILURE() << "no race reported";
  } catch (tg::race_error const& e) {
    std::string const what = e.what();
    EXPECT_NE(what.find("race on tensor 'partial_db', element (0, 0): program (5, 0, 0)"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("program (5, 0, 0) held 2 locks at its access: a lock taken while another "
                        "is held is not followed (the check counts the first the program took)"),
              std::string::npos)
        << what;
  }
}

namespace {

// Takes the lock at lock[0], which holds its holder's id + 1 (`me`): a program that finds its own
// id there holds it already, as a reentrant lock does.
void take_named(tg::tensor<int> lock, int me) {
  for (;;) {
    int const old = tg::atomic_cas(lock + 0, 0, me).item();
    if (old == 0 || old == me)
      break;
  }
}

} // namespace

TEST(Locks, ALockThatNamesItsHolderIsFoundHeldByAnother) {
  // Each program adds its row into one shared row under one lock, which holds the id + 1 of the
  // program holding it; a program that finds its own id there holds the lock already (as a
  // reentrant lock does). In the probe of locks, a try made to fail returns what another program
  // wrote to take the lock, not the program's own id, so the program waits and the sum is whole
  // (program 0, which took the lock first in the first run, is probed too).
  static constexpr int C = 24;
  auto const kernel = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> acc,
                                  tg::tensor<int> lock) {
    int const me = p.program_id(0) + 1;
    take_named(lock, me);
    auto const cols = tg::arange<0, C>();
    tg::tile<T, C> const row = tg::load(x + p.program_id(0) * C + cols);
    tg::store(acc + cols, tg::load(acc + cols) + row);
    (void)tg::atomic_xchg(lock + 0, 0);
  };
  std::int64_t const m = 200;
  tg::owned_tensor<float> x({m, C}), acc({C}, "acc");
  tg::owned_tensor<int> lock({1}, "lock");
  for (std::int64_t i = 0; i < x.numel(); ++i)
    x.data()[i] = static_cast<float>(i % 7);
  for (auto e : {tg::executor::tbb, tg::executor::sequential}) {
    if (!tg::executor_available(e))
      continue;
    std::fill(acc.begin(), acc.end(), 0.0f);
    tg::launch_options lo{e};
    lo.check_races = true;
    EXPECT_NO_THROW(tg::launch(lo, m, kernel, x.cview(), acc.view(), lock.view()));
    for (int c = 0; c < C; ++c) {
      float want = 0;
      for (std::int64_t r = 0; r < m; ++r)
        want += static_cast<float>((r * C + c) % 7);
      EXPECT_EQ(acc.data()[c], want) << c;
    }
  }
  // As a backward: d(sum of rows)/dx is dy for every row, summed under the lock in the kernel.
  auto const fwd = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const cols = tg::arange<0, C>();
    (void)tg::atomic_add(y + cols, tg::load(x + p.program_id(0) * C + cols));
  };
  tg::owned_tensor<float> y({C});
  auto const bwd = [&](tg::backward_context<float>& ctx) -> tg::gradient_set {
    tg::owned_tensor<float> dx({m, C});
    tg::owned_tensor<float> sum({C}, "sum");
    tg::owned_tensor<int> lk({1}, "lock");
    auto const copy = []<class T>(tg::program const& p, tg::tensor<T const> dy, tg::tensor<T> dx,
                                  tg::tensor<T> s, tg::tensor<int> lock) {
      int const me = p.program_id(0) + 1;
      take_named(lock, me);
      auto const cols = tg::arange<0, C>();
      tg::store(s + cols, tg::load(s + cols) + 1.0f); // programs counted under the lock
      (void)tg::atomic_xchg(lock + 0, 0);
      tg::store(dx + p.program_id(0) * C + cols, tg::load(dy + cols));
    };
    tg::launch(ctx.options(), m, copy, ctx.cotangent("y"), dx.view(), sum.view(), lk.view());
    EXPECT_EQ(sum.data()[0], static_cast<float>(m));
    return {{"x", dx}};
  };
  for (bool det : {false, true}) {
    auto const r = tg::check_backward(tg::forward(m, fwd, tg::in("x", x), tg::out("y", y)), bwd,
                                      {.seeds = 1, .check_determinism = det});
    EXPECT_BACKWARD_OK(r);
    EXPECT_FALSE(r.mentions("race")) << r;
  }
}

TEST(Locks, SumsMadeUnderALockInAnotherOrderAreANote) {
  // The second run of the backward (the determinism check's, which takes the programs in
  // reverse order) takes the rows in reverse order: the partial sums differ in their last bits,
  // and so does what the reduction launch makes of them. Both are the order the
  // programs took the lock in, within the first look's bound: a note naming both, and a pass.
  int calls = 0;
  auto const r = check({bug::none, {}, {}, true, &calls}, 203, 100, {.seeds = 1});
  EXPECT_BACKWARD_OK(r);
  EXPECT_FALSE(r.mentions("not deterministic")) << r;
  EXPECT_TRUE(r.mentions("differs between two runs in ")) << r;
  // The reduction launch takes both buffers of partial sums: the note on either gradient names
  // both (it named the first, 'partial_dw', on the gradient of b too).
  EXPECT_TRUE(r.mentions("stored by launch 2 of the backward, which takes 'partial_dw' and "
                         "'partial_db', made by atomic_add or under a lock in an earlier launch"))
      << r;
  // Sums a lock leaves in the order the programs took it: stored, under the lock, as gradients.
  calls = 0;
  auto const direct = check({bug::none, {}, {}, true, &calls, true}, 203, 100, {.seeds = 1});
  EXPECT_TRUE(direct.mentions("'w' differs between two runs in ")) << direct;
  EXPECT_BACKWARD_OK(direct);
  EXPECT_TRUE(direct.mentions("stored holding a lock: programs take a lock in the order their "
                              "threads reach it"))
      << direct;
  // A second run that differs by more than the order can (1e-3 added to each partial row on it)
  // still fails, and says where the lock is and how to accept the difference.
  calls = 0;
  auto const more = check({bug::none, {}, {}, true, &calls, false, 1e-3f}, 203, 100, {.seeds = 1});
  EXPECT_FALSE(more);
  EXPECT_TRUE(more.mentions("not deterministic")) << more;
  EXPECT_TRUE(more.mentions("writes tensor 'partial_dw' holding a lock")) << more;
  EXPECT_TRUE(more.mentions("check_determinism = false")) << more;
  EXPECT_FALSE(more.mentions("race")) << more;
}

TEST(Locks, ARaceOnAnUnnamedTensorNamesItsArgument) {
  // The kernel's third argument after the program: every program stores element 0.
  tg::owned_tensor<float> a({4}), b({4}), c({4});
  auto const k = []<class T>(tg::program const&, tg::tensor<T>, tg::tensor<T>, tg::tensor<T> z) {
    tg::store(z + 0, tg::full<T>(1.0f));
  };
  try {
    tg::launch({.check_races = true}, 3, k, a.view(), b.view(), c.view());
    ADD_FAILURE() << "no race reported";
  } catch (tg::race_error const& e) {
    EXPECT_NE(std::string(e.what()).find("(unnamed: the kernel's argument 3 after the program)"),
              std::string::npos)
        << e.what();
  }
}

// dw summed under one lock into a partial row, which the program that runs last copies into dw,
// still holding the lock: `by_count` takes the program that counts the partial row full, as it
// should; otherwise the program with the last id, which assumes it runs last. A lock excludes,
// it does not order: the last id's copy misses the rows of programs that run after it, which the
// threads make happen now and then (5-12 runs in 300 on two threads), and the check passed it
// whenever they did not. The determinism check's second run takes the programs in reverse order.
constexpr auto last_copies = [](tg::program const& p, tg::tensor<float const> x,
                                tg::tensor<float const> w, tg::tensor<float const> dy,
                                tg::tensor<float> dx, tg::tensor<float> part, tg::tensor<float> dw,
                                tg::tensor<int> locks, int by_count) {
  std::int64_t const r = p.program_id(0), programs = p.num_programs(0);
  auto const cols = tg::arange<0, row_width>();
  auto const mask = cols < x.size(1);
  tg::tile<float, row_width> const d = dx_and_row_dw(r, x, w, dy, dx);
  while (tg::atomic_cas(locks + 0, 0, 1).item() == 1) {
  }
  tg::tile<float, row_width> const sum = tg::load(part + cols, mask, 0.0f) + d;
  tg::store(part + cols, sum, mask);
  int const count = tg::load(locks + 1).item() + 1;
  tg::store(locks + 1, tg::full<int>(count));
  if (by_count ? count == programs : r == programs - 1)
    tg::store(dw + cols, sum, mask);
  (void)tg::atomic_xchg(locks + 0, 0);
};

tg::check_report check_last_copies(int by_count, tg::launch_options lo, std::int64_t m = 300) {
  std::int64_t const n = 29;
  tg::owned_tensor<float> x({m, n}), w({n}), y({m, n});
  auto const bwd = [=](tg::backward_context<float>& ctx) -> tg::gradient_set {
    tg::owned_tensor<float> dx({m, n}), part({n}, "partial_dw"), dw({n}, "dw");
    tg::owned_tensor<int> locks({2}, "locks");
    tg::launch(ctx.options(), m, last_copies, ctx.input("x"), ctx.input("w"), ctx.cotangent("y"),
               dx.view(), part.view(), dw.view(), locks.view(), by_count);
    return {{"x", dx}, {"w", dw}};
  };
  return tg::check_backward(
      tg::forward(m, rows_times_w, tg::in("x", x), tg::in("w", w), tg::out("y", y)), bwd,
      {.seeds = 1, .launch = lo});
}

TEST(Locks, AReductionByTheLastIdUnderALockIsNotDeterministic) {
  for (auto e : {tg::executor::sequential, tg::executor::tbb, tg::executor::openmp}) {
    if (!tg::executor_available(e))
      continue;
    tg::launch_options const lo{e, 2};
    auto const fine = check_last_copies(1, lo);
    EXPECT_BACKWARD_OK(fine);
    auto const r = check_last_copies(0, lo);
    EXPECT_FALSE(r) << r;
    EXPECT_TRUE(r.mentions("not deterministic")) << r;
    EXPECT_TRUE(r.mentions("the second run took the programs of each launch in reverse order"))
        << r;
  }
}

// The same reduction on grids whose last program is alone in the last wave of the race check
// (waves of 64 programs at two threads, of 256 by default): the second run reversed the programs
// of each wave but not the waves, so the last id ran last in both runs, and the check passed a
// backward that loses rows now and then (3 runs in 300 at 65 rows, 31 at 257, on two threads).
// The second run now takes the waves in reverse order too.
TEST(Locks, AReductionByTheLastIdAloneInTheLastWaveIsNotDeterministic) {
  for (auto e : {tg::executor::sequential, tg::executor::tbb, tg::executor::openmp}) {
    if (!tg::executor_available(e))
      continue;
    for (std::int64_t m : {65, 129, 257}) {
      auto const r = check_last_copies(0, {e, 2}, m);
      EXPECT_FALSE(r) << m << " rows\n" << r;
      EXPECT_TRUE(r.mentions("not deterministic")) << r;
    }
    EXPECT_FALSE(check_last_copies(0, {e, 0}, 257)); // waves of 256
    EXPECT_BACKWARD_OK(check_last_copies(1, {e, 2}, 257));
  }
}

// The tutorial's "partial row written yet?" count read before the lock is taken, not under it:
// two programs of a group may both find it 0 and both store their row over the partial row (one
// row lost in 6-12 plain runs in 300 on two threads). Every access to the partial rows holds the
// lock, so only the count shows it: a plain load of an element another program exchanges
// atomically, neither holding one lock, is a race. Read under the lock, it passes.
constexpr auto counted_rows = [](tg::program const& p, tg::tensor<float const> x,
                                 tg::tensor<float const> w, tg::tensor<float const> dy,
                                 tg::tensor<float> dx, tg::tensor<float> part,
                                 tg::tensor<int> locks, int early, int groups) {
  std::int64_t const r = p.program_id(0);
  auto const cols = tg::arange<0, row_width>();
  auto const mask = cols < x.size(1);
  tg::tile<float, row_width> d = dx_and_row_dw(r, x, w, dy, dx);
  int const k = static_cast<int>(r % groups);
  auto const lock = locks + k, count = locks + (groups + k);
  auto const row = part + k * part.stride(0) + cols;
  int const seen_early = early ? tg::load(count).item() : 0;
  while (tg::atomic_cas(lock, 0, 1).item() == 1) {
  }
  int const seen = early ? seen_early : tg::load(count).item();
  if (seen == 0)
    (void)tg::atomic_xchg(count, 1);
  else
    d += tg::load(row, mask, 0.0f);
  tg::store(row, d, mask);
  (void)tg::atomic_xchg(lock, 0);
};

TEST(Locks, ACountReadOutsideItsLockRaces) {
  std::int64_t const m = 200, n = 29;
  int const groups = 8;
  tg::owned_tensor<float> x({m, n}), w({n}), y({m, n});
  for (auto e : {tg::executor::sequential, tg::executor::tbb, tg::executor::openmp}) {
    if (!tg::executor_available(e))
      continue;
    for (int early : {0, 1}) {
      auto const bwd = [=](tg::backward_context<float>& ctx) -> tg::gradient_set {
        tg::owned_tensor<float> dx({m, n}), part({groups, n}, "partial_dw"), dw({n});
        tg::owned_tensor<int> locks({2 * groups}, "locks");
        tg::launch(ctx.options(), m, counted_rows, ctx.input("x"), ctx.input("w"),
                   ctx.cotangent("y"), dx.view(), part.view(), locks.view(), early, groups);
        for (int k = 0; k < groups; ++k)
          for (std::int64_t j = 0; j < n; ++j)
            dw.data()[j] += part.data()[k * n + j];
        return {{"x", dx}, {"w", dw}};
      };
      auto const r = tg::check_backward(
          tg::forward(m, rows_times_w, tg::in("x", x), tg::in("w", w), tg::out("y", y)), bwd,
          {.seeds = 1, .check_determinism = false, .launch = {e, 2}});
      if (!early) {
        EXPECT_BACKWARD_OK(r);
        continue;
      }
      EXPECT_FALSE(r) << r;
      // The count of group 0 (element 8): which program of the group exchanges it, the first to
      // take the lock, and so which pair is named, depends on the threads (program 0, or 32 on
      // the other thread of the first wave); that a plain load of it races does not.
      EXPECT_TRUE(r.mentions("race on tensor 'locks', element (8): program (")) << r;
      EXPECT_TRUE(r.mentions("loads it at ")) << r;
      EXPECT_TRUE(r.mentions("exchanges it atomically (atomic_xchg or atomic_cas) at ") ||
                  r.mentions("atomically exchanges it at "))
          << r;
      EXPECT_TRUE(r.mentions("read it with an atomic, or under the lock")) << r;
    }
  }
}

// A program that waits for another program to get somewhere (a flag set by a later program, a
// lock never given back) waits for ever where that program never runs beside it: on the
// sequential executor, or in a later wave of a checked launch. It throws, naming itself, the
// tensor, the element and the line, once its tries have failed for set_wait_limit's seconds.
struct wait_limit_scope {
  explicit wait_limit_scope(double s) { tg::set_wait_limit(s); }
  ~wait_limit_scope() { tg::set_wait_limit(10); }
};

int const wait_line = __LINE__ + 11; // the line of the test-and-set wait below
// Program 0 reduces the rows the others store, waiting for each one's flag (split-K and
// stream-K kernels written for GPUs whose programs all run at once); with `xchg`, the programs
// after 0 take a test-and-set lock that none gives back instead.
constexpr auto waiting_kernel = [](tg::program const& p, tg::tensor<float> part,
                                   tg::tensor<int> flags, tg::tensor<float> out, int xchg) {
  int const r = p.program_id(0), programs = p.num_programs(0);
  auto const cols = tg::arange<0, 16>();
  tg::store(part + r * 16 + cols, tg::full<float, 16>(float(r)));
  if (xchg) { // every program but 0 takes the lock, none gives it back
    if (r > 0)
      while (tg::atomic_xchg(flags + 0, 1).item() == 1) {
      }
    return;
  }
  (void)tg::atomic_xchg(flags + r, 1);
  if (r == 0) {
    auto acc = tg::zeros<float, 16>();
    for (int q = 1; q < programs; ++q) {
      while (tg::atomic_cas(flags + q, 1, 1).item() != 1) {
      }
      acc += tg::load(part + q * 16 + cols);
    }
    tg::store(out + cols, acc);
  }
};

// `program`: the program that waits (empty: any but program 0).
void expect_wait_error(tg::launch_options o, int programs, int xchg, std::string const& program,
                       char const* element) {
  tg::owned_tensor<float> part({programs, 16}, "part"), out({16}, "out");
  tg::owned_tensor<int> flags({programs}, "flags");
  auto const t0 = std::chrono::steady_clock::now();
  try {
    tg::launch(o, programs, waiting_kernel, part.view(), flags.view(), out.view(), xchg);
    ADD_FAILURE() << "the launch returned";
  } catch (tg::access_error const& e) {
    std::string const what = e.what();
    if (program.empty())
      EXPECT_NE(e.program(), "program (0, 0, 0)") << what;
    else
      EXPECT_EQ(e.program(), program) << what;
    EXPECT_EQ(e.tensor(), "flags") << what;
    EXPECT_EQ(e.element(), element) << what;
    EXPECT_EQ(e.where().line(), static_cast<unsigned>(wait_line + (xchg ? 0 : 8))) << what;
    EXPECT_NE(what.find(xchg ? "its atomic_xchg on tensor 'flags'"
                             : "its atomic_cas on tensor "
                               "'flags'"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("not for another program to start or to get somewhere"), std::string::npos)
        << what;
  }
  double const s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 60.0); // (the limit is 0.3 s: not a hang)
}

TEST(Waits, AProgramWaitingForOneThatNeverRunsBesideItThrows) {
  wait_limit_scope const limit(0.3);
  // One thread: program 0 waits for program 1, which runs after it.
  expect_wait_error({tg::executor::sequential, 1}, 8, 0, "program (0, 0, 0)", "(1)");
  // A checked launch runs programs in waves: program 64 is in the second.
  if (tg::executor_available(tg::executor::tbb)) {
    tg::launch_options o{tg::executor::tbb, 2};
    o.check_races = true;
    expect_wait_error(o, 200, 0, "program (0, 0, 0)", "(64)");
  }
  // A test-and-set lock that its holder never gives back, on every executor.
  for (tg::executor e : {tg::executor::sequential, tg::executor::tbb, tg::executor::openmp}) {
    if (!tg::executor_available(e))
      continue;
    tg::launch_options o{e, 2};
    std::string const waiter = e == tg::executor::sequential ? "program (2, 0, 0)" : "";
    expect_wait_error(o, 4, 1, waiter, "(0)");
    o.check_races = true;
    expect_wait_error(o, 4, 1, waiter, "(0)");
  }
  EXPECT_THROW(tg::set_wait_limit(-1), std::invalid_argument);
}

TEST(Waits, SpinLocksUnderContentionDoNotTrip) {
  // The tutorial's lock, every row on one lock, four threads: waits are short.
  wait_limit_scope const limit(0.5);
  for (tg::executor e : {tg::executor::tbb, tg::executor::openmp}) {
    if (!tg::executor_available(e))
      continue;
    tg::owned_tensor<float> x({4000}, "x"), sum({1}, "sum");
    tg::owned_tensor<int> lock({1}, "lock");
    for (int i = 0; i < 4000; ++i)
      x.view()(i) = 1.0f;
    tg::launch(
        {e, 4}, 4000,
        [](tg::program const& p, tg::tensor<float const> xs, tg::tensor<float> s,
           tg::tensor<int> l) {
          tg::tile<float> const v = tg::load(xs + p.program_id(0));
          while (tg::atomic_cas(l + 0, 0, 1).item() == 1) {
          }
          tg::store(s + 0, tg::load(s + 0) + v);
          (void)tg::atomic_xchg(l + 0, 0);
        },
        x.cview(), sum.view(), lock.view());
    EXPECT_EQ(sum.view()(0), 4000.0f);
  }
}

} // namespace test_locks
