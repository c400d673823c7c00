// launch(): every program runs exactly once with the right ids, on every executor compiled in
// and several thread counts; errors reach the caller; nested launches finish.
#include <tilegrad/core/types.hpp>
#include <tilegrad/grid/launch.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <ostream>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#if TILEGRAD_USE_TBB
#include <tbb/task_group.h>
#endif

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_launch {

namespace tg = tilegrad;

namespace {

std::vector<tg::executor> available_executors() {
  std::vector<tg::executor> out;
  for (auto e : {tg::executor::tbb, tg::executor::openmp, tg::executor::sequential})
    if (tg::executor_available(e))
      out.push_back(e);
  return out;
}

std::int64_t linear_of(tg::program const& p) {
  return p.program_id(0) +
         std::int64_t{p.num_programs(0)} *
             (p.program_id(1) + std::int64_t{p.num_programs(1)} * p.program_id(2));
}

// Runs `f` and returns the message of the std::invalid_argument it throws ("" if none).
template <class F>
std::string invalid_argument_message(F&& f) {
  try {
    f();
  } catch (std::invalid_argument const& e) {
    return e.what();
  }
  return "";
}

// Restores the process-wide launch defaults when a test that changes them ends.
struct defaults_guard {
  tg::launch_options saved = tg::default_options();
  ~defaults_guard() {
    tg::set_default_executor(saved.exec);
    tg::set_num_threads(saved.num_threads);
  }
};

struct launch_case {
  tg::executor exec;
  int threads; // 0 = all hardware threads
};

std::vector<launch_case> all_cases() {
  std::vector<launch_case> out;
  for (auto e : available_executors())
    for (int t : {1, 2, 0})
      out.push_back({e, t});
  return out;
}

void PrintTo(launch_case const& c, std::ostream* os) {
  *os << tg::to_string(c.exec) << ", num_threads " << c.threads;
}

std::string case_name(testing::TestParamInfo<launch_case> const& info) {
  return tg::to_string(info.param.exec) + "_" +
         (info.param.threads == 0 ? std::string("all")
                                  : "threads" + std::to_string(info.param.threads));
}

class Launch : public testing::TestWithParam<launch_case> {
protected:
  tg::launch_options options() const { return {GetParam().exec, GetParam().threads}; }
  /// Program 7's failure: thrown once `late` says a later program threw (waiting up to a second,
  /// where another thread may run that program), so that it comes last in time.
  [[noreturn]] void throw_seven_late(std::atomic<int> const& late) const {
    auto const until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (late.load() == 0 && GetParam().exec != tg::executor::sequential &&
           GetParam().threads != 1 && std::chrono::steady_clock::now() < until)
      std::this_thread::yield();
    throw std::runtime_error("program 7");
  }
};

INSTANTIATE_TEST_SUITE_P(Executors, Launch, testing::ValuesIn(all_cases()), case_name);

// ----- every program id, exactly once, with the right ids ------------------------------------

TEST_P(Launch, VisitsEveryProgramExactlyOnce) {
  for (tg::grid g : {tg::grid(1), tg::grid(7), tg::grid(1000), tg::grid(5, 3), tg::grid(1, 6),
                     tg::grid(3, 4, 5), tg::grid(2, 1, 7)}) {
    SCOPED_TRACE("grid rank " + std::to_string(g.rank) + " size " + std::to_string(g.size()));
    auto const n = static_cast<std::size_t>(g.size());
    std::vector<std::atomic<int>> visits(n);
    // Per linear id: program_id(0..2), num_programs(0..2) as the program saw them.
    std::vector<std::array<std::atomic<int>, 6>> seen(n);
    std::atomic<int> bad_linear_id{0};

    tg::launch(options(), g, [&](tg::program const& p) {
      auto const l = linear_of(p);
      if (l < 0 || l >= static_cast<std::int64_t>(n) || p.linear_id() != l) {
        bad_linear_id.fetch_add(1);
        return;
      }
      visits[static_cast<std::size_t>(l)].fetch_add(1);
      for (int a = 0; a < 3; ++a) {
        seen[static_cast<std::size_t>(l)][static_cast<std::size_t>(a)] = p.program_id(a);
        seen[static_cast<std::size_t>(l)][static_cast<std::size_t>(a + 3)] = p.num_programs(a);
      }
    });

    EXPECT_EQ(bad_linear_id.load(), 0);
    for (std::size_t l = 0; l < n; ++l) {
      ASSERT_EQ(visits[l].load(), 1) << "linear id " << l;
      auto const x = static_cast<int>(l % static_cast<std::size_t>(g.dims[0]));
      auto const y = static_cast<int>(l / static_cast<std::size_t>(g.dims[0]) %
                                      static_cast<std::size_t>(g.dims[1]));
      auto const z = static_cast<int>(l / static_cast<std::size_t>(g.dims[0] * g.dims[1]));
      EXPECT_EQ(seen[l][0].load(), x) << "linear id " << l;
      EXPECT_EQ(seen[l][1].load(), y) << "linear id " << l;
      EXPECT_EQ(seen[l][2].load(), z) << "linear id " << l;
      for (int a = 0; a < 3; ++a)
        EXPECT_EQ(seen[l][static_cast<std::size_t>(a + 3)].load(),
                  g.dims[static_cast<std::size_t>(a)])
            << "num_programs(" << a << "), linear id " << l;
    }
  }
}

TEST_P(Launch, CurrentProgramIsTheRunningProgramAndNullOutside) {
  ASSERT_EQ(tg::detail::current_program(), nullptr);
  std::atomic<int> wrong{0};
  std::atomic<int> calls{0};
  tg::launch(options(), tg::grid(4, 5), [&](tg::program const& p) {
    calls.fetch_add(1);
    auto const* cur = tg::detail::current_program();
    if (cur != &p || cur->linear_id() != p.linear_id())
      wrong.fetch_add(1);
  });
  EXPECT_EQ(calls.load(), 20);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(tg::detail::current_program(), nullptr);
}

// ----- errors ---------------------------------------------------------------------------------

TEST_P(Launch, ExceptionInOneProgramReachesTheCaller) {
  std::atomic<int> calls{0};
  auto kernel = [&](tg::program const& p) {
    calls.fetch_add(1);
    if (p.program_id(0) == 13)
      throw std::runtime_error("program 13 failed");
  };
  try {
    tg::launch(options(), tg::grid(40), kernel);
    ADD_FAILURE() << "launch did not throw";
  } catch (std::runtime_error const& e) {
    EXPECT_STREQ(e.what(), "program 13 failed");
  }
  EXPECT_GE(calls.load(), 1);
  EXPECT_LE(calls.load(), 40);
  EXPECT_EQ(tg::detail::current_program(), nullptr);

  // The exception's own type arrives, not a wrapper.
  struct kernel_error {
    int pid;
  };
  try {
    tg::launch(options(), tg::grid(8, 5), [](tg::program const& p) {
      if (p.linear_id() == 13)
        throw kernel_error{static_cast<int>(p.linear_id())};
    });
    ADD_FAILURE() << "launch did not throw";
  } catch (kernel_error const& e) {
    EXPECT_EQ(e.pid, 13);
  }

  // A failed launch leaves the executor usable.
  std::vector<std::atomic<int>> visits(40);
  tg::launch(options(), tg::grid(40), [&](tg::program const& p) {
    visits[static_cast<std::size_t>(p.program_id(0))].fetch_add(1);
  });
  for (auto const& v : visits)
    EXPECT_EQ(v.load(), 1);
}

TEST_P(Launch, TheFirstFailingProgramInProgramOrderIsReported) {
  // Every fourth program from 101 on throws, and program 7 too, but after a later one has (where
  // another thread runs it within a second): a launch reports program 7's exception on every
  // executor and run, as the sequential one does (before, the first exception a thread caught
  // won: a checked launch named program 128 where it named program 0 on other runs). Programs
  // after the first to throw may be skipped.
  for (int run = 0; run < 3; ++run) {
    std::atomic<int> late{0};
    auto kernel = [&](tg::program const& p) {
      int const i = p.program_id(0);
      if (i == 7)
        throw_seven_late(late);
      if (i >= 101 && i % 4 == 1) {
        late.fetch_add(1);
        throw std::runtime_error("program " + std::to_string(i));
      }
    };
    try {
      tg::launch(options(), tg::grid(400), kernel);
      ADD_FAILURE() << "launch did not throw";
    } catch (std::runtime_error const& e) {
      EXPECT_STREQ(e.what(), "program 7") << "run " << run;
    }
  }
}

TEST_P(Launch, InvalidGridThrowsBeforeAnyProgramRuns) {
  struct bad_grid {
    tg::grid g;
    std::string message;
  };
  auto with_rank = [](int rank) {
    tg::grid g;
    g.rank = rank;
    return g;
  };
  auto trailing = [] {
    tg::grid g(4);
    g.dims[1] = 2; // axis 1 is past the rank
    return g;
  };
  std::vector<bad_grid> const cases = {
      {tg::grid(-1), "grid extent 0 is -1; extents must not be negative"},
      {tg::grid(3, 4, -2), "grid extent 2 is -2; extents must not be negative"},
      {tg::grid(2, -1, 3), "grid extent 1 is -1; extents must not be negative"},
      {with_rank(0), "grid rank is 0; it must be 1, 2 or 3"},
      {with_rank(4), "grid rank is 4; it must be 1, 2 or 3"},
      {trailing(), "extents past the rank must be 1"},
  };
  for (auto const& c : cases) {
    std::atomic<int> calls{0};
    auto const message = invalid_argument_message(
        [&] { tg::launch(options(), c.g, [&](tg::program const&) { calls.fetch_add(1); }); });
    EXPECT_NE(message.find("tilegrad::launch: "), std::string::npos) << message;
    EXPECT_NE(message.find(c.message), std::string::npos)
        << "expected \"" << c.message << "\" in \"" << message << "\"";
    EXPECT_EQ(calls.load(), 0) << c.message;
  }
  std::atomic<int> calls{0};
  auto const message = invalid_argument_message([&] {
    tg::launch({GetParam().exec, -1}, tg::grid(4), [&](tg::program const&) { calls.fetch_add(1); });
  });
  EXPECT_NE(message.find("num_threads is -1"), std::string::npos) << message;
  EXPECT_EQ(calls.load(), 0);
}

// ----- threads ----------------------------------------------------------------------------------

TEST_P(Launch, NumThreadsIsRespected) {
  std::mutex m;
  std::set<std::thread::id> ids;
  std::atomic<int> calls{0};
  tg::launch(options(), tg::grid(200), [&](tg::program const&) {
    calls.fetch_add(1);
    // Programs that take a while, so that every thread the executor may use wakes up and
    // takes some (a check of the limit, not of timing).
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    std::lock_guard lock(m);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(calls.load(), 200);
  ASSERT_GE(ids.size(), 1u);
  if (GetParam().exec == tg::executor::sequential) {
    EXPECT_EQ(ids.size(), 1u);
    EXPECT_EQ(*ids.begin(), std::this_thread::get_id());
  } else if (GetParam().threads > 0) {
    EXPECT_LE(ids.size(), static_cast<std::size_t>(GetParam().threads));
  }
}

// ----- run_ordered: programs in parallel, their `done` in order -----------------------------

TEST_P(Launch, RunOrderedCallsDoneInOrderEachAfterItsProgramWithinTheWindow) {
  // Programs of uneven length (later ones often shorter, as causal attention's are not), so that
  // programs finish out of order; done must still see 0, 1, 2, ... each after its own program,
  // and never more than `window` programs begun and not done.
  constexpr std::int64_t n = 300;
  for (int window : {1, 3, 8}) {
    std::vector<std::atomic<int>> finished(n);
    std::vector<std::int64_t> order;
    std::atomic<int> open{0}, most_open{0};
    std::mutex m;
    std::set<std::thread::id> threads;
    auto run = [&](std::int64_t i) {
      int const now = open.fetch_add(1) + 1;
      int seen = most_open.load();
      while (now > seen && !most_open.compare_exchange_weak(seen, now)) {
      }
      std::this_thread::sleep_for(std::chrono::microseconds(i % 7 == 0 ? 300 : 20));
      finished[static_cast<std::size_t>(i)].store(1);
      std::lock_guard lock(m);
      threads.insert(std::this_thread::get_id());
    };
    auto done = [&](std::int64_t i) {
      EXPECT_EQ(finished[static_cast<std::size_t>(i)].load(), 1) << "done(" << i << ") first";
      order.push_back(i); // one at a time: no lock
      open.fetch_sub(1);
    };
    tg::detail::run_ordered(options(), n, window, tg::detail::program_runner(run),
                            tg::detail::program_runner(done));
    ASSERT_EQ(order.size(), static_cast<std::size_t>(n)) << "window " << window;
    for (std::int64_t i = 0; i < n; ++i)
      ASSERT_EQ(order[static_cast<std::size_t>(i)], i) << "window " << window;
    EXPECT_LE(most_open.load(), window);
    if (GetParam().threads > 0) {
      EXPECT_LE(threads.size(), static_cast<std::size_t>(GetParam().threads));
    }
  }
}

TEST_P(Launch, RunOrderedPassesAProgramsExceptionToTheCaller) {
  std::atomic<int> dones{0};
  auto run = [](std::int64_t i) {
    if (i == 37)
      throw std::runtime_error("program 37 failed");
  };
  auto done = [&](std::int64_t) { dones.fetch_add(1); };
  try {
    tg::detail::run_ordered(options(), 100, 4, tg::detail::program_runner(run),
                            tg::detail::program_runner(done));
    ADD_FAILURE() << "no exception";
  } catch (std::runtime_error const& e) {
    EXPECT_STREQ(e.what(), "program 37 failed");
  }
  EXPECT_LE(dones.load(), 37); // nothing after the failed program is done
}

TEST_P(Launch, RunOrderedPassesTheFirstFailingProgramInProgramOrder) {
  // Program 7 throws after program 9 has (where another thread runs it within a second): vjp,
  // which runs its programs so, named program (1, 0, 0) on some runs where every program threw,
  // where the launch promises the first in program order. Nothing from program 7 on is done.
  for (int round = 0; round < 3; ++round) {
    std::atomic<int> late{0}, dones{0};
    std::atomic<std::int64_t> last_done{-1};
    auto run = [&](std::int64_t i) {
      if (i == 7)
        throw_seven_late(late);
      if (i >= 9) {
        late.fetch_add(1);
        throw std::runtime_error("program " + std::to_string(i));
      }
    };
    auto done = [&](std::int64_t i) {
      dones.fetch_add(1);
      last_done.store(i);
    };
    try {
      tg::detail::run_ordered(options(), 100, 16, tg::detail::program_runner(run),
                              tg::detail::program_runner(done));
      ADD_FAILURE() << "no exception";
    } catch (std::runtime_error const& e) {
      EXPECT_STREQ(e.what(), "program 7") << "round " << round;
    }
    EXPECT_LE(dones.load(), 7) << "round " << round; // (in order: the last is dones - 1)
    EXPECT_EQ(last_done.load(), dones.load() - 1) << "round " << round;
  }
}

// ----- nested launches ----------------------------------------------------------------------

TEST_P(Launch, NestedLaunchFinishes) {
  auto const executors = available_executors();
  constexpr int inner_threads[] = {0, 1, 2};
  constexpr int outer_n = 12;
  tg::grid const inner_grid(4, 3);
  auto const inner_n = inner_grid.size();
  std::vector<std::atomic<int>> visits(static_cast<std::size_t>(outer_n * inner_n));
  std::atomic<int> wrong_current{0};

  tg::launch(options(), tg::grid(outer_n), [&](tg::program const& outer) {
    auto const o = outer.program_id(0);
    // Every inner executor and thread count, from every outer one.
    tg::launch_options const inner{executors[static_cast<std::size_t>(o) % executors.size()],
                                   inner_threads[o % 3]};
    tg::launch(inner, inner_grid, [&](tg::program const& p) {
      if (tg::detail::current_program() != &p)
        wrong_current.fetch_add(1);
      visits[static_cast<std::size_t>(o * inner_n + p.linear_id())].fetch_add(1);
    });
    if (tg::detail::current_program() != &outer)
      wrong_current.fetch_add(1);
  });

  EXPECT_EQ(wrong_current.load(), 0);
  for (std::size_t i = 0; i < visits.size(); ++i)
    EXPECT_EQ(visits[i].load(), 1) << "outer " << i / inner_n << ", inner " << i % inner_n;
  EXPECT_EQ(tg::detail::current_program(), nullptr);
}

// While a program waits for its nested launch, its thread runs only programs of that nested
// launch, never a sibling of the waiting program (TBB would steal one without isolation):
// per-thread state of a running program, and a lock it holds, stay its own.
TEST_P(Launch, NestedLaunchDoesNotRunOuterProgramsInsideAWaitingOne) {
  static thread_local int outer_depth = 0;
  std::atomic<int> interleaved{0};
  std::atomic<int> inner_calls{0};
  tg::launch(options(), tg::grid(32), [&](tg::program const&) {
    if (outer_depth++ > 0)
      interleaved.fetch_add(1);
    tg::launch(options(), tg::grid(16), [&](tg::program const&) {
      inner_calls.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    });
    --outer_depth;
  });
  EXPECT_EQ(inner_calls.load(), 32 * 16);
  EXPECT_EQ(interleaved.load(), 0);
}

TEST_P(Launch, ExceptionInNestedLaunchReachesTheOuterCaller) {
  try {
    tg::launch(options(), tg::grid(6), [&](tg::program const& outer) {
      tg::launch(options(), tg::grid(10), [&](tg::program const& p) {
        if (outer.program_id(0) == 4 && p.program_id(0) == 7)
          throw std::runtime_error("inner 7 of outer 4 failed");
      });
    });
    ADD_FAILURE() << "launch did not throw";
  } catch (std::runtime_error const& e) {
    EXPECT_STREQ(e.what(), "inner 7 of outer 4 failed");
  }
  EXPECT_EQ(tg::detail::current_program(), nullptr);
}

// ----- arguments --------------------------------------------------------------------------------

struct copy_counter {
  std::atomic<int>* copies;
  explicit copy_counter(std::atomic<int>* c) : copies(c) {}
  copy_counter(copy_counter const& o) : copies(o.copies) { copies->fetch_add(1); }
  copy_counter(copy_counter&& o) noexcept : copies(o.copies) { copies->fetch_add(1); }
  copy_counter& operator=(copy_counter const&) = delete;
  copy_counter& operator=(copy_counter&&) = delete;
};

TEST_P(Launch, ArgumentsArriveAsConstCorrectLvaluesWithoutCopies) {
  std::vector<std::atomic<int>> counts(6); // non-const lvalue: the kernel may write through it
  int const scale = 3;                     // const lvalue
  std::atomic<int> copies{0};
  copy_counter const counter(&copies);
  std::atomic<int> wrong{0};

  tg::launch(
      options(), tg::grid(6),
      [&](tg::program const& p, auto& c, auto& s, auto& u, auto& k, auto& t) {
        static_assert(!std::is_const_v<std::remove_reference_t<decltype(c)>>);
        static_assert(std::is_const_v<std::remove_reference_t<decltype(s)>>);
        // Temporaries are shared by every program: they arrive const.
        static_assert(std::is_const_v<std::remove_reference_t<decltype(u)>>);
        static_assert(std::is_const_v<std::remove_reference_t<decltype(t)>>);
        if (&c != &counts || &s != &scale || &k != &counter || !u || *u != 5 || t != 11)
          wrong.fetch_add(1);
        c[static_cast<std::size_t>(p.program_id(0))].fetch_add(s);
      },
      counts, scale, std::make_unique<int>(5), counter, 11);

  EXPECT_EQ(wrong.load(), 0);
  for (auto const& c : counts)
    EXPECT_EQ(c.load(), 3);
  EXPECT_EQ(copies.load(), 0);

  // A temporary argument is neither copied nor moved either.
  tg::launch(
      options(), tg::grid(3), [](tg::program const&, copy_counter const&) {},
      copy_counter(&copies));
  EXPECT_EQ(copies.load(), 0);
}

} // namespace

// A type that reaches kernels as something else, through the kernel_arg hook (found by ADL).
namespace launch_test {
struct view {
  int* data;
};
struct const_view {
  int const* data;
};
struct owner {
  int value = 0;
  int* conversions;
  friend view kernel_arg(owner& o) {
    ++*o.conversions;
    return {&o.value};
  }
  friend const_view kernel_arg(owner const& o) {
    ++*o.conversions;
    return {&o.value};
  }
};
} // namespace launch_test

namespace {

TEST_P(Launch, KernelArgHookConvertsArgumentsOncePerLaunch) {
  int conversions = 0;
  launch_test::owner out{0, &conversions};
  launch_test::owner const in{7, &conversions};
  std::atomic<int> wrong{0};
  std::mutex m;
  tg::launch(
      options(), tg::grid(5),
      [&](tg::program const&, auto& o, auto& i, auto& n) {
        static_assert(std::is_same_v<std::remove_cvref_t<decltype(o)>, launch_test::view>);
        static_assert(std::is_same_v<std::remove_cvref_t<decltype(i)>, launch_test::const_view>);
        static_assert(std::is_same_v<decltype(n), int&>); // other arguments untouched
        if (o.data != &out.value || i.data != &in.value)
          wrong.fetch_add(1);
        std::lock_guard lock(m);
        *o.data += *i.data + n;
      },
      out, in, conversions);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(out.value, 5 * (7 + 2));
  EXPECT_EQ(conversions, 2);
}

// Triton refuses program_id(3); it read past the program's ids and gave num_programs(0). The
// error names the program and the line, as every misuse does.
TEST(LaunchErrors, AnAxisPastTwoThrows) {
  std::string m;
  int line = 0;
  try {
    tg::launch({tg::executor::sequential}, tg::grid(7), [&](tg::program const& p) {
      if (p.program_id() == 4) {
        line = __LINE__ + 1;
        (void)p.program_id(3);
      }
    });
  } catch (std::out_of_range const& e) {
    m = e.what();
  }
  EXPECT_NE(m.find("program_id(3): a grid has axes 0, 1 and 2"), std::string::npos) << m;
  EXPECT_NE(m.find("program (4, 0, 0)"), std::string::npos) << m;
  EXPECT_NE(m.find("test_launch.cpp:" + std::to_string(line)), std::string::npos) << m;
  tg::program const p({1, 2, 3}, {4, 5, 6});
  EXPECT_THROW((void)p.num_programs(-1), std::out_of_range);
  try {
    (void)p.num_programs(-1);
  } catch (std::out_of_range const& e) {
    EXPECT_NE(std::string(e.what()).find("num_programs(-1): a grid has axes 0, 1 and 2 "
                                         "(program (1, 2, 3)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(p.program_id(2), 3);
  EXPECT_EQ(p.num_programs(2), 6);
}

// ----- sequential order, defaults, executor errors --------------------------------------------

TEST(LaunchSequential, RunsProgramsInLinearOrderOnTheCallingThread) {
  std::vector<std::int64_t> order;
  std::vector<std::thread::id> threads;
  tg::launch({tg::executor::sequential}, tg::grid(3, 4, 5), [&](tg::program const& p) {
    order.push_back(p.linear_id());
    threads.push_back(std::this_thread::get_id());
  });
  ASSERT_EQ(order.size(), 60u);
  for (std::size_t i = 0; i < order.size(); ++i)
    EXPECT_EQ(order[i], static_cast<std::int64_t>(i));
  EXPECT_TRUE(std::all_of(threads.begin(), threads.end(),
                          [](auto id) { return id == std::this_thread::get_id(); }));
}

TEST(LaunchOptions, CompiledDefaultPrefersTbbThenOpenMP) {
  auto const expected = TILEGRAD_USE_TBB      ? tg::executor::tbb
                        : TILEGRAD_USE_OPENMP ? tg::executor::openmp
                                              : tg::executor::sequential;
  EXPECT_EQ(tg::detail::compiled_default_executor, expected);
  EXPECT_EQ(tg::default_options().exec, expected);
  EXPECT_EQ(tg::default_options().num_threads, 0);
  EXPECT_EQ(tg::launch_options{}.exec, expected);
}

TEST(LaunchOptions, ProcessDefaultsAreSettable) {
  defaults_guard guard;
  tg::set_default_executor(tg::executor::sequential);
  tg::set_num_threads(3);
  EXPECT_EQ(tg::default_options().exec, tg::executor::sequential);
  EXPECT_EQ(tg::default_options().num_threads, 3);
  tg::launch_options const o{.num_threads = 2};
  EXPECT_EQ(o.exec, tg::executor::sequential);
  EXPECT_EQ(o.num_threads, 2);

  // launch(grid, ...) uses them: sequential means linear order.
  std::vector<std::int64_t> order;
  tg::launch(tg::grid(4, 2), [&](tg::program const& p) { order.push_back(p.linear_id()); });
  EXPECT_EQ(order, (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));

  auto const message = invalid_argument_message([] { tg::set_num_threads(-2); });
  EXPECT_NE(message.find("tilegrad::set_num_threads: num_threads is -2"), std::string::npos)
      << message;
  EXPECT_EQ(tg::default_options().num_threads, 3);
}

TEST(LaunchOptions, SettingDefaultsFromManyThreadsIsSafe) {
  defaults_guard guard;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([t] {
      for (int i = 0; i < 1000; ++i) {
        tg::set_num_threads((t + i) % 3);
        tg::set_default_executor(tg::executor::sequential);
        auto const o = tg::default_options();
        EXPECT_TRUE(o.num_threads >= 0 && o.num_threads <= 2);
      }
    });
  for (auto& th : threads)
    th.join();
  EXPECT_EQ(tg::default_options().exec, tg::executor::sequential);
}

TEST(LaunchOptions, UnknownOrMissingExecutorThrowsNamingIt) {
  std::atomic<int> calls{0};
  auto const kernel = [&](tg::program const&) { calls.fetch_add(1); };

  auto const unknown = static_cast<tg::executor>(42);
  EXPECT_EQ(tg::to_string(unknown), "executor(42)");
  EXPECT_FALSE(tg::executor_available(unknown));
  auto message = invalid_argument_message([&] { tg::launch({unknown}, tg::grid(3), kernel); });
  EXPECT_NE(message.find("tilegrad::launch: unknown executor executor(42)"), std::string::npos)
      << message;
  message = invalid_argument_message([&] { tg::set_default_executor(unknown); });
  EXPECT_NE(message.find("unknown executor executor(42)"), std::string::npos) << message;

  for (auto e : {tg::executor::tbb, tg::executor::openmp}) {
    if (tg::executor_available(e))
      continue;
    message = invalid_argument_message([&] { tg::launch({e}, tg::grid(3), kernel); });
    EXPECT_NE(message.find("executor " + tg::to_string(e) + " is not compiled into this build"),
              std::string::npos)
        << message;
    message = invalid_argument_message([&] { tg::set_default_executor(e); });
    EXPECT_NE(message.find(tg::to_string(e)), std::string::npos) << message;
  }
  EXPECT_EQ(calls.load(), 0);
  EXPECT_TRUE(tg::executor_available(tg::executor::sequential));
  EXPECT_EQ(tg::executor_available(tg::executor::tbb), TILEGRAD_USE_TBB == 1);
  EXPECT_EQ(tg::executor_available(tg::executor::openmp), TILEGRAD_USE_OPENMP == 1);
}

#if TILEGRAD_USE_TBB
TEST(LaunchTbb, CancellationOfAnEnclosingTaskGroupIsNotSilent) {
  tbb::task_group group;
  std::atomic<int> calls{0};
  std::string message;
  group.run([&] {
    try {
      tg::launch({tg::executor::tbb, 0}, tg::grid(1000), [&](tg::program const& p) {
        calls.fetch_add(1);
        if (p.linear_id() == 0)
          group.cancel();
      });
    } catch (std::runtime_error const& e) {
      message = e.what();
    }
  });
  group.wait();
  EXPECT_NE(message.find("cancelled by an enclosing TBB task group"), std::string::npos)
      << "launch returned normally after " << calls.load() << " of 1000 programs";
}
#endif

} // namespace

TEST(Grid, TakesSizesAsTheyComeAndRefusesWhatAnIntCannotHold) {
  // A tensor's sizes are int64: cdiv keeps the type, and a grid takes it without a cast.
  std::int64_t const n = 1000;
  static_assert(std::is_same_v<decltype(tg::cdiv(n, 16)), std::int64_t>);
  static_assert(tg::cdiv(std::int64_t{33}, 16) == 3 && tg::cdiv(33, 16) == 3);
  tg::grid const g{tg::cdiv(n, 16), n / 500, std::size_t{3}};
  EXPECT_EQ(g.rank, 3);
  EXPECT_EQ(g.dims[0], 63);
  EXPECT_EQ(g.dims[1], 2);
  EXPECT_EQ(g.dims[2], 3);
  std::atomic<int> ran{0};
  tg::launch(tg::cdiv(n, 100), [&](tg::program const&) { ++ran; });
  EXPECT_EQ(ran.load(), 10);
  std::int64_t const too_many = std::int64_t{1} << 31;
  try {
    tg::grid const bad{1, too_many};
    ADD_FAILURE() << "no throw";
  } catch (std::invalid_argument const& e) {
    EXPECT_STREQ(e.what(), "tilegrad::grid: extent 1 is 2147483648, outside the int range of a "
                           "grid axis");
  }
  EXPECT_THROW(tg::grid(-too_many - 1), std::invalid_argument);
  // Three extents each within int whose product a 64-bit count cannot hold: size() wrapped to a
  // negative number, and a launch ran no program and returned.
  int const big = std::numeric_limits<int>::max();
  try {
    tg::grid const bad{big, big, 4};
    ADD_FAILURE() << "no throw: " << bad.size();
  } catch (std::invalid_argument const& e) {
    EXPECT_NE(std::string(e.what()).find("(2147483647, 2147483647, 4) programs are more than a "
                                         "64-bit count holds"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ((tg::grid{big, big, 1}.size()), std::int64_t{big} * big);
}

} // namespace test_launch
