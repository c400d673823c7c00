// Checked access (memory/checked.hpp): the checked()/set_checked()/checked_scope switch, and the
// access_error that an out-of-bounds load, store or atomic throws in checked mode, through
// pointer tiles and block pointers. The message must name the program ("program (3, 0, 0)",
// or "host code" outside a launch), the tensor, the element's coordinates, the tensor's shape,
// the operation and the source file and line of the call (compared with a __LINE__ taken on
// the same line). Offsets that fall in the gaps of a strided view, and negative ones, are
// outside. With checking off, in-bounds accesses behave exactly as with it on (no access
// outside is ever performed here with checks off).
#include "memory_test_util.hpp"

#include <tilegrad/memory/block_ptr.hpp>
#include <tilegrad/memory/checked.hpp>
#include <tilegrad/memory/pointer.hpp>
#include <tilegrad/tile/creation.hpp>
#include <tilegrad/tile/elementwise.hpp>
#include <tilegrad/tile/shape_ops.hpp>

#include <cstdint>
#include <initializer_list>
#include <latch>
#include <source_location>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_checked {

namespace {

using namespace tilegrad;
using tg_mem::as_program;
using tg_mem::at;

constexpr int M = 37, N = 70;

// The switch's value before any test ran: the build's default.
bool const initial_checked = checked();

/// Runs f, which must throw access_error; returns it (an empty one, after a failure, if not).
template <class F>
access_error catch_access_error(F&& f) {
  try {
    f();
  } catch (access_error const& e) {
    return e;
  }
  ADD_FAILURE() << "no access_error was thrown";
  return access_error("", "", "", "", std::source_location::current());
}

/// The message holds every piece, and names the call's source line.
void expect_message(access_error const& e, std::initializer_list<std::string> pieces, int line) {
  std::string const what = e.what();
  for (auto const& p : pieces) EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' missing from: " << what;
  std::string const where = std::string(__FILE__) + ":" + std::to_string(line);
  EXPECT_NE(what.find(where), std::string::npos) << "'" << where << "' missing from: " << what;
  EXPECT_EQ(e.where().line(), static_cast<std::uint_least32_t>(line));
  EXPECT_EQ(std::string(e.where().file_name()), std::string(__FILE__));
}

TEST(Checked, DefaultFollowsTheBuild) {
#if defined(TILEGRAD_CHECKED)
  EXPECT_EQ(initial_checked, TILEGRAD_CHECKED != 0);
#elif defined(NDEBUG)
  EXPECT_FALSE(initial_checked) << "release builds check nothing by default";
#else
  EXPECT_TRUE(initial_checked) << "debug builds check by default";
#endif
}

TEST(Checked, ScopesSetAndRestore) {
  bool const orig = checked();
  set_checked(false);
  EXPECT_FALSE(checked());
  {
    checked_scope on; // on by default
    EXPECT_TRUE(checked());
    {
      checked_scope off(false);
      EXPECT_FALSE(checked());
      {
        checked_scope on_again(true);
        EXPECT_TRUE(checked());
      }
      EXPECT_FALSE(checked());
    }
    EXPECT_TRUE(checked());
  }
  EXPECT_FALSE(checked());
  set_checked(true);
  EXPECT_TRUE(checked());
  set_checked(orig);
}

// Scopes of two threads that overlap and end in the order they began: the first one's end
// must leave the second one's checking on (it restored the value from before it began, and the
// other thread's out-of-bounds load went unchecked), and the second one's end the value from
// before both (it restored "on", and checking stayed on for good).
TEST(Checked, ScopesOfTwoThreadsEndingInTheOrderTheyBegan) {
  bool const orig = checked();
  set_checked(false);
  owned_tensor<float> x({4}, "x");
  std::latch b_open(1), a_closed(1);
  bool threw = false;
  std::thread a([&] {
    checked_scope on;
    b_open.wait();
  });
  std::thread b([&] {
    // (a's scope is open before b's: b waits for checked() to turn on)
    while (!checked())
      std::this_thread::yield();
    checked_scope on;
    b_open.count_down();
    a_closed.wait();
    EXPECT_TRUE(checked());
    try {
      as_program(1, 2, [&](program const&) { (void)load(tensor<float const>(x) + 4); });
    } catch (access_error const&) {
      threw = true;
    }
  });
  a.join();
  a_closed.count_down();
  b.join();
  EXPECT_TRUE(threw) << "the load past the end went unchecked inside b's scope";
  EXPECT_FALSE(checked()) << "both scopes ended: the value set before them";
  set_checked(orig);
}

template <class T>
class CheckedAccess : public ::testing::Test {
protected:
  CheckedAccess() : x({M, N}, "x"), v({M}, "v") {
    tg_mem::fill_values(x);
    tg_mem::fill_values(v);
  }
  owned_tensor<T> x, v;
  checked_scope checks{true};
};
TYPED_TEST_SUITE(CheckedAccess, tg_mem::FloatTypes);

// ---------------------------------------------------------------------------------------------
// Pointer tiles
// ---------------------------------------------------------------------------------------------

TYPED_TEST(CheckedAccess, PointerLoadPastTheLastRow) {
  using T = TypeParam;
  tensor<T const> const x = this->x;
  int line = 0;
  // Row 37 of a 37-row tensor, as program 3: a contiguous (vector-path) row.
  auto e = catch_access_error([&] {
    as_program(3, 8, [&](program const&) {
      auto const p = x + M * x.stride(0) + arange<0, 16>();
      line = __LINE__; (void)load(p);
    });
  });
  expect_message(e, {"program (3, 0, 0)", "'x'", "(37, 0)", "(37, 70)", "load"}, line);
  EXPECT_EQ(e.program(), "program (3, 0, 0)");
  EXPECT_EQ(e.tensor(), "x");
  EXPECT_EQ(e.element(), "(37, 0)");

  // The end of the last row, a mask that leaves the outside lanes on: the first lane outside.
  e = catch_access_error([&] {
    as_program(5, 8, [&](program const&) {
      auto const cols = 60 + arange<0, 16>();
      line = __LINE__; (void)load(x + (M - 1) * x.stride(0) + cols, cols < 100);
    });
  });
  expect_message(e, {"program (5, 0, 0)", "(37, 0)", "(37, 70)"}, line);

  // A contiguous run whose very last lane is the first element outside (the vector check's
  // edge: every chunk but the last is inside).
  e = catch_access_error([&] {
    as_program(7, 8, [&](program const&) {
      line = __LINE__; (void)load(x + (M * N - 15) + arange<0, 16>());
    });
  });
  expect_message(e, {"program (7, 0, 0)", "(37, 0)", "offset 2590"}, line);

  // A strided row (lane by lane) running past the end.
  e = catch_access_error([&] {
    as_program(1, 2, [&](program const&) {
      line = __LINE__; (void)load(x + (M - 1) * x.stride(0) + arange<0, 16>() * 7);
    });
  });
  expect_message(e, {"program (1, 0, 0)", "(37, 0)", "load"}, line);
}

TYPED_TEST(CheckedAccess, PointerStoreAndAtomicsOutside) {
  using T = TypeParam;
  tensor<T> const x = this->x;
  auto const past = x + M * x.stride(0) + 2 + arange<0, 13>(); // starts at element (37, 2)
  int line = 0;
  auto e = catch_access_error([&] {
    as_program(3, 4, [&](program const&) { line = __LINE__; store(past, T(1)); });
  });
  expect_message(e, {"program (3, 0, 0)", "'x'", "(37, 2)", "(37, 70)", "store"}, line);
  e = catch_access_error([&] { as_program(3, 4, [&](program const&) { line = __LINE__; (void)atomic_add(past, T(1)); }); });
  expect_message(e, {"program (3, 0, 0)", "(37, 2)", "atomic_add"}, line);
  e = catch_access_error([&] { as_program(3, 4, [&](program const&) { line = __LINE__; (void)atomic_max(past, T(1)); }); });
  expect_message(e, {"(37, 2)", "atomic_max"}, line);
  e = catch_access_error([&] { as_program(3, 4, [&](program const&) { line = __LINE__; (void)atomic_min(past, T(1)); }); });
  expect_message(e, {"(37, 2)", "atomic_min"}, line);
  e = catch_access_error([&] { as_program(3, 4, [&](program const&) { line = __LINE__; (void)atomic_xchg(past, T(1)); }); });
  expect_message(e, {"(37, 2)", "atomic_xchg"}, line);
  e = catch_access_error([&] { as_program(3, 4, [&](program const&) { line = __LINE__; (void)atomic_cas(past, T(0), T(1)); }); });
  expect_message(e, {"(37, 2)", "atomic_cas"}, line);
  // A masked atomic whose mask leaves an outside lane on.
  e = catch_access_error([&] {
    line = __LINE__; (void)atomic_add(x + (arange<0, 16>() + (M * N - 3)), T(1), arange<0, 16>() != 0);
  });
  expect_message(e, {"host code", "(37, 0)", "atomic_add"}, line);
}

TYPED_TEST(CheckedAccess, NegativeOffsets) {
  using T = TypeParam;
  tensor<T const> const x = this->x, v = this->v;
  int line = 0;
  auto e = catch_access_error([&] { line = __LINE__; (void)load(v + (arange<0, 8>() - 1)); });
  expect_message(e, {"'v'", "(-1)", "(37)"}, line);
  EXPECT_EQ(e.element(), "(-1)");
  e = catch_access_error([&] { line = __LINE__; (void)load(x + (arange<0, 16>() - 1)); });
  expect_message(e, {"'x'", "(0, -1)", "(37, 70)"}, line); // column -1 of row 0, as written
  e = catch_access_error([&] { line = __LINE__; (void)load(x + (-70) + arange<0, 16>()); });
  expect_message(e, {"(-1, 0)"}, line);
}

TYPED_TEST(CheckedAccess, GatherOutside) {
  using T = TypeParam;
  tensor<T const> const x = this->x;
  tile<std::int32_t, 13> idx;
  for (int c = 0; c < 13; ++c) idx(c) = c == 5 ? M : c; // row 37 at lane 5
  int line = 0;
  auto e = catch_access_error([&] {
    as_program(2, 3, [&](program const&) { line = __LINE__; (void)load(x + idx * x.stride(0) + 3); });
  });
  expect_message(e, {"program (2, 0, 0)", "(37, 3)", "(37, 70)"}, line);
}

// Offsets inside the span of a strided view but in one of its gaps are outside.
TYPED_TEST(CheckedAccess, StridedViewGaps) {
  using T = TypeParam;
  std::vector<T> buf(50);
  for (int i = 0; i < 50; ++i) buf[i] = T(i);
  tensor<T> const g(buf.data(), {5, 7}, {10, 1}, "g");
  int line = 0;
  auto e = catch_access_error([&] { line = __LINE__; (void)load(g + arange<0, 8>()); });
  expect_message(e, {"'g'", "(0, 7)", "(5, 7)"}, line);
  e = catch_access_error([&] { line = __LINE__; store(g + 8 + arange<0, 1>(), T(0)); });
  expect_message(e, {"(0, 8)", "store"}, line);
  // Every element of the view is inside, row by row (contiguous rows of a non-contiguous view).
  tile<T, 5, 7> const all = load(g + (col(arange<0, 5>()) * 10 + row(arange<0, 7>())));
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 7; ++j) ASSERT_EQ(all(i, j), T(10 * i + j)) << at(i, j);
  // The transpose of a contiguous buffer: its whole span is inside; one past it is not.
  tensor<T const> const t(this->x.data(), {N, M}, {1, N}, "t");
  tile<T, 16> const ok = load(t + (M * N - 16) + arange<0, 16>());
  for (int c = 0; c < 16; ++c) ASSERT_EQ(ok(c), this->x.data()[M * N - 16 + c]) << at(c);
  e = catch_access_error([&] { line = __LINE__; (void)load(t + (M * N - 15) + arange<0, 16>()); });
  expect_message(e, {"'t'", "(0, 37)", "(70, 37)"}, line);
  // An offset not multiplied by its stride: offset 1 of a view of stride 2 lies between elements
  // (0) and (1), which the message says rather than naming element (0).
  tensor<T> const even(buf.data(), {25}, {2}, "even");
  e = catch_access_error([&] { line = __LINE__; store(even + arange<0, 4>(), T(0)); });
  expect_message(e, {"'even'", "strides (2)", "offset 1 lies between its elements",
                     "after element (0)", "not multiplied by its stride"}, line);
  EXPECT_EQ(e.element(), "(0)");
}

TYPED_TEST(CheckedAccess, ProgramNames) {
  using T = TypeParam;
  tensor<T const> const x = this->x;
  auto const past = x + M * N + arange<0, 4>();
  int line = 0;
  // Outside any program.
  auto e = catch_access_error([&] { line = __LINE__; (void)load(past); });
  expect_message(e, {"host code"}, line);
  EXPECT_EQ(e.program(), "host code");
  // A 3-D grid position; nested scopes restore the outer program.
  program outer({6, 0, 0}, {8, 1, 1});
  detail::program_scope so(outer);
  {
    program inner({1, 2, 3}, {4, 4, 4});
    detail::program_scope si(inner);
    e = catch_access_error([&] { line = __LINE__; (void)load(past); });
    expect_message(e, {"program (1, 2, 3)"}, line);
  }
  e = catch_access_error([&] { line = __LINE__; (void)load(past); });
  expect_message(e, {"program (6, 0, 0)"}, line);
  // An unnamed tensor.
  tensor<T const> const anon(this->x.data(), {M, N});
  e = catch_access_error([&] { line = __LINE__; (void)load(anon + M * N); });
  expect_message(e, {"(unnamed)", "(37, 0)"}, line);
}

// ---------------------------------------------------------------------------------------------
// Block pointers: an unchecked axis hanging over
// ---------------------------------------------------------------------------------------------

TYPED_TEST(CheckedAccess, BlockPointerUncheckedAxisHangingOver) {
  using T = TypeParam;
  tensor<T> const x = this->x;
  int line = 0;
  // Rows 32..47 with only the column axis checked: row 37 is outside.
  auto e = catch_access_error([&] {
    as_program(3, 4, [&](program const&) {
      auto const bp = make_block_ptr<16, 16>(x, {32, 0});
      line = __LINE__; (void)load(bp, bounds<1>);
    });
  });
  expect_message(e, {"program (3, 0, 0)", "'x'", "(37, 0)", "(37, 70)", "axis 0", "load"}, line);
  EXPECT_EQ(e.element(), "(37, 0)");
  // Columns 64..79 with only the row axis checked: column 70 is outside.
  e = catch_access_error([&] {
    as_program(3, 4, [&](program const&) { line = __LINE__; (void)load(make_block_ptr<16, 16>(x, {0, 64}), bounds<0>); });
  });
  expect_message(e, {"program (3, 0, 0)", "(0, 70)", "(37, 70)", "axis 1"}, line);
  // Negative offsets, nothing checked.
  e = catch_access_error([&] { line = __LINE__; (void)load(make_block_ptr<4, 4>(x, {-2, 5})); });
  expect_message(e, {"host code", "(-2, 5)", "axis 0"}, line);
  e = catch_access_error([&] { line = __LINE__; (void)load(make_block_ptr<4, 4>(x, {5, -3}), bounds<0>); });
  expect_message(e, {"(5, -3)", "axis 1"}, line);
  // Stores, and a 1-D block.
  tile<T, 16, 16> const z{};
  e = catch_access_error([&] { line = __LINE__; store(make_block_ptr<16, 16>(x, {30, 0}), z, bounds<1>); });
  expect_message(e, {"(37, 0)", "store"}, line);
  e = catch_access_error([&] { line = __LINE__; (void)load(make_block_ptr<16>(tensor<T>(this->v), {30})); });
  expect_message(e, {"'v'", "(37)", "load"}, line);
  // The same blocks with the axis checked access nothing outside: no throw.
  EXPECT_NO_THROW(((void)load(make_block_ptr<16, 16>(x, {32, 64}), bounds<0, 1>)));
  EXPECT_NO_THROW((store(make_block_ptr<16, 16>(x, {-8, -8}), z, bounds<0, 1>)));
}

// The full form takes the block's shape and strides as given: a shape larger than the tensor
// passes the per-axis checks and is caught against the tensor's memory instead.
TYPED_TEST(CheckedAccess, BlockPointerFullFormPastTheTensorsMemory) {
  using T = TypeParam;
  tensor<T> const x = this->x; // (37, 70), contiguous: offsets 0 to 2589
  int line = 0;
  // Rows 35..38 of a (40, 70) shape: rows 37 and 38 lie past x's memory.
  auto e = catch_access_error([&] {
    as_program(2, 4, [&](program const&) {
      auto const bp = make_block_ptr<4, 8>(x, {M + 3, N}, {N, 1}, {M - 2, 0}, {1, 0});
      line = __LINE__; (void)load(bp, bounds<0, 1>);
    });
  });
  expect_message(e, {"program (2, 0, 0)", "'x'", "(37, 0)", "offset 2590", "outside the memory",
                     "offsets 0 to 2589", "load"},
                 line);
  EXPECT_EQ(e.element(), "(37, 0)");
  // A row stride that walks off the end: element (3, 5) of a (4, 8) block with stride 1000.
  tile<T, 4, 8> const z{};
  e = catch_access_error([&] {
    line = __LINE__; store(make_block_ptr<4, 8>(x, {4, 8}, {1000, 1}, {0, 0}, {1, 0}), z);
  });
  expect_message(e, {"host code", "(3, 0)", "offset 3000", "store"}, line);
  // A negative stride that walks off the front: row 1 of the block lies at offset -70.
  e = catch_access_error([&] {
    line = __LINE__; (void)load(make_block_ptr<2, 8>(x, {M, N}, {-N, 1}, {0, 0}, {1, 0}));
  });
  expect_message(e, {"(1, 0)", "offset -70", "load"}, line);
  // Inside the memory (rows of x read as a (74, 35) matrix): no throw, and the values are x's.
  tile<T, 4, 8> a{};
  EXPECT_NO_THROW((a = load(make_block_ptr<4, 8>(x, {2 * M, N / 2}, {N / 2, 1}, {70, 0}, {1, 0}))));
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 8; ++c)
      EXPECT_EQ(a(r, c), this->x(M - 2 + (r * (N / 2) + c) / N, (r * (N / 2) + c) % N));
}

// ---------------------------------------------------------------------------------------------
// Checks off: in-bounds behaviour unchanged
// ---------------------------------------------------------------------------------------------

TYPED_TEST(CheckedAccess, OffChangesNothingInBounds) {
  using T = TypeParam;
  tensor<T const> const x = this->x;
  auto run = [&](tensor<T> out) {
    // masked pointer loads and stores, a gather, a block load and store, an atomic
    for (int r = 0; r < M; ++r) {
      auto const cols = arange<0, 64>() + 16;
      tile<T, 64> const row = load(x + r * N + cols, cols < N, T(-1));
      store(out + r * N + arange<0, 64>(), row, cols < N);
    }
    auto const bp = make_block_ptr<8, 16>(x, {33, 60});
    store(make_block_ptr<8, 16>(out, {0, 60}), load(bp, bounds<0, 1>, padding::zero), bounds<0, 1>);
    atomic_add(out + arange<0, 7>() * 3, T(1));
  };
  owned_tensor<T> on({M, N}, "on"), off({M, N}, "off");
  {
    checked_scope c(true);
    run(on);
  }
  {
    checked_scope c(false);
    EXPECT_FALSE(checked());
    run(off);
  }
  EXPECT_TRUE(checked()) << "the scope restored the fixture's setting";
  for (std::int64_t i = 0; i < M * N; ++i) ASSERT_EQ(on.data()[i], off.data()[i]) << at(i / N, i % N);
  EXPECT_EQ(on(0, 0), T(x(0, 16) + T(1))); // the atomic landed on the copied row
}

} // namespace

} // namespace test_checked
