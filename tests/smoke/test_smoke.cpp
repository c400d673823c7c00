// Smoke test: the test machinery works and the configuration macros reach the compiler.
#if __has_include(<tilegrad/tilegrad.hpp>)
#include <tilegrad/tilegrad.hpp>
#endif

#include <gtest/gtest.h>

#if !defined(TILEGRAD_USE_XSIMD) || !defined(TILEGRAD_USE_TBB) || !defined(TILEGRAD_USE_OPENMP)
#error "tilegrad::tilegrad must define TILEGRAD_USE_XSIMD, TILEGRAD_USE_TBB and TILEGRAD_USE_OPENMP"
#endif

TEST(Smoke, ConfigMacrosAreBooleans) {
  EXPECT_TRUE(TILEGRAD_USE_XSIMD == 0 || TILEGRAD_USE_XSIMD == 1);
  EXPECT_TRUE(TILEGRAD_USE_TBB == 0 || TILEGRAD_USE_TBB == 1);
  EXPECT_TRUE(TILEGRAD_USE_OPENMP == 0 || TILEGRAD_USE_OPENMP == 1);
}

TEST(Smoke, OpenMPModeMatchesConfig) {
#if defined(_OPENMP)
  constexpr bool openmp_mode = true;
#else
  constexpr bool openmp_mode = false;
#endif
  EXPECT_EQ(openmp_mode, TILEGRAD_USE_OPENMP == 1);
}

// The snippets of docs/ops.md's memory and grid sections, as written there, each checked
// against a plain loop or the value the page states.
#if __has_include(<tilegrad/tilegrad.hpp>)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace tg = tilegrad;

namespace {

// Masked loads with and without `other`, and a masked store: y[i, :] = x[i, :] + shift, where
// the lanes past the row end are masked; the row sum uses other = 0, the row max other = -inf.
constexpr auto row_kernel = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                        tg::tensor<T> y, tg::tensor<T> stats) {
  auto const cols = tg::arange<0, 16>();
  auto const mask = cols < x.size(1);
  std::int64_t const r = p.program_id(0);
  auto const ptrs = x + r * x.stride(0) + cols;
  tg::tile<T, 16> const v = tg::load(ptrs, mask);                      // masked lanes: 0
  tg::tile<T, 16> const m = tg::load(ptrs, mask, -INFINITY);           // masked lanes: -inf
  tg::tile<T, 16> const fb = tg::load(ptrs, mask, tg::full<T, 16>(7)); // a tile as other
  tg::store(y + r * y.stride(0) + cols, v + 1.0f, mask);
  tg::store(stats + r * stats.stride(0) + tg::arange<0, 3>(),
            tg::where(tg::arange<0, 3>() == 0, tg::sum(v),
                      tg::where(tg::arange<0, 3>() == 1, tg::max(m), tg::sum(fb))));
};

} // namespace

TEST(DocSnippets, PointerTileLoadsAndStores) {
  std::int64_t const rows = 5, n = 11; // 11 of 16 lanes on
  tg::owned_tensor<float> x({rows, n}, "x"), y({rows, n}, "y"), stats({rows, 3}, "stats");
  for (std::int64_t i = 0; i < x.numel(); ++i)
    x.data()[i] = float(i % 7) - 3;
  tg::launch(static_cast<int>(rows), row_kernel, x.cview(), y.view(), stats.view());
  for (std::int64_t i = 0; i < rows; ++i) {
    float sum = 0, mx = -INFINITY;
    for (std::int64_t j = 0; j < n; ++j) {
      EXPECT_EQ(y(i, j), x(i, j) + 1);
      sum += x(i, j);
      mx = std::max(mx, x(i, j));
    }
    EXPECT_FLOAT_EQ(stats(i, 0), sum);
    EXPECT_EQ(stats(i, 1), mx);
    EXPECT_FLOAT_EQ(stats(i, 2), sum + 7 * (16 - n)); // the 5 masked lanes read 7
  }
}

TEST(DocSnippets, TensorsAndViews) {
  std::vector<float> buf(2 * 3 * 4);
  for (std::size_t i = 0; i < buf.size(); ++i)
    buf[i] = float(i);
  tg::tensor<float> t(buf.data(), {2, 3, 4}, "t");
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_THROW(t.size(3), std::out_of_range);
  tg::tensor<float> const m = t[1]; // the (3, 4) matrix of index 1
  EXPECT_EQ(m.rank(), 2);
  EXPECT_EQ(m(2, 3), t(1, 2, 3));
  EXPECT_STREQ(m.name(), "t");
  EXPECT_THROW(t[2], std::out_of_range);
  EXPECT_THROW(t[1][0][0], std::invalid_argument); // rank 1 has no t[i]
  // A transposed view of a (3, 4) matrix: strides {1, 4}.
  tg::tensor<float const> const tr(buf.data(), {4, 3}, {1, 4}, "tr");
  EXPECT_EQ(tr(3, 2), buf[2 * 4 + 3]);
  EXPECT_FALSE(tr.is_contiguous());
  EXPECT_EQ(tr.shape_string(), "(4, 3)");
  EXPECT_THROW(tg::tensor<float>(buf.data(), {4, 3}, {-1, 4}), std::invalid_argument);
  EXPECT_STREQ(t.named("u").name(), "u");

  tg::owned_tensor<float> x({3, 5}, "x");
  EXPECT_TRUE(std::all_of(x.begin(), x.end(), [](float v) { return v == 0; }));
  tg::tensor<float> const v = x.view();
  tg::tensor<float const> const cv = x.cview();
  v(1, 2) = 4;
  EXPECT_EQ(cv(1, 2), 4);
  tg::owned_tensor<float> copy = x; // a deep copy
  copy(1, 2) = 5;
  EXPECT_EQ(x(1, 2), 4);

  tg::bf16 const b(1.0f + 0x1p-8f); // a tie: rounds to even, 1
  EXPECT_EQ(float(b), 1.0f);
  EXPECT_EQ(float(tg::bf16(1.0f + 0x1p-7f)), 1.0f + 0x1p-7f);
}

TEST(DocSnippets, Bf16TensorsLoadAsBf16AndStoreRounded) {
  tg::owned_tensor<tg::bf16> x({8}), y({8});
  for (int i = 0; i < 8; ++i)
    x(i) = tg::bf16(float(i) / 3);
  tg::launch(1, []<class T>(tg::program const&, tg::tensor<T const> a, tg::tensor<T> b) {
    auto const i = tg::arange<0, 8>();
    tg::tile<T, 8> const raw = tg::load(a + i); // bf16 tiles
    tg::tile<tg::fp32<T>, 8> const f = tg::to<tg::fp32<T>>(raw);
    tg::store(b + i, f * 3.0f); // rounds to bf16
  }, x.cview(), y.view());
  for (int i = 0; i < 8; ++i)
    EXPECT_EQ(float(y(i)), float(tg::bf16(float(x(i)) * 3.0f)));
}

TEST(DocSnippets, BlockPointersBoundsAndPadding) {
  std::int64_t const m = 5, n = 6;
  tg::owned_tensor<float> x({m, n}, "x"), out({2, 4, 4}, "out");
  for (std::int64_t i = 0; i < x.numel(); ++i)
    x.data()[i] = float(i + 1);
  tg::launch(1, []<class T>(tg::program const&, tg::tensor<T const> a, tg::tensor<T> o) {
    // The 4 x 4 block at (3, 4): rows 3-4 and columns 4-5 are inside.
    auto const bp = tg::make_block_ptr<4, 4>(a, {3, 4});
    tg::store(tg::make_block_ptr<4, 4>(o[0], {0, 0}), tg::load(bp, tg::bounds<0, 1>));
    // The full form, with a bound of 4 columns that is not a's, then advanced one row down.
    auto full = tg::make_block_ptr<4, 4>(a, {a.size(0), 4}, {a.stride(0), a.stride(1)}, {0, 2},
                                         {1, 0});
    full = full.advance(1, 0);
    tg::store(tg::make_block_ptr<4, 4>(o[1], {0, 0}),
              tg::load(full, tg::bounds<0, 1>, tg::padding::nan));
  }, x.cview(), out.view());
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      bool const inside = 3 + i < m && 4 + j < n;
      EXPECT_EQ(out(0, i, j), inside ? x(3 + i, 4 + j) : 0.0f) << i << " " << j;
      bool const inside_full = 1 + i < m && 2 + j < 4;
      if (inside_full)
        EXPECT_EQ(out(1, i, j), x(1 + i, 2 + j)) << i << " " << j;
      else
        EXPECT_TRUE(std::isnan(out(1, i, j))) << i << " " << j;
    }
  // An integer tensor pads with 0 where NaN is asked for; an unchecked axis that leaves the
  // tensor throws in checked mode.
  tg::owned_tensor<std::int32_t> k({3}), kout({4});
  std::fill(k.begin(), k.end(), 9);
  tg::launch(1, [](tg::program const&, tg::tensor<std::int32_t const> a,
                   tg::tensor<std::int32_t> o) {
    tg::store(tg::make_block_ptr<4>(o, {0}),
              tg::load(tg::make_block_ptr<4>(a, {0}), tg::bounds<0>, tg::padding::nan));
  }, k.cview(), kout.view());
  EXPECT_EQ(kout(3), 0);
  EXPECT_EQ(kout(0), 9);
  tg::checked_scope const on(true);
  EXPECT_THROW(tg::launch(1, [](tg::program const&, tg::tensor<float const> a) {
    (void)tg::load(tg::make_block_ptr<4, 4>(a, {3, 4}), tg::bounds<0>);
  }, x.cview()), tg::access_error);
}

TEST(DocSnippets, AtomicsReturnTheOldValues) {
  tg::owned_tensor<float> acc({4}), old_add({4});
  tg::owned_tensor<std::int32_t> best({1}), lock({1}), seen({8});
  tg::launch(8, []<class T>(tg::program const& p, tg::tensor<T> a, tg::tensor<T> olds,
                            tg::tensor<std::int32_t> mx, tg::tensor<std::int32_t> lk,
                            tg::tensor<std::int32_t> got) {
    auto const i = tg::arange<0, 4>();
    // Every program adds 1 to the first 3 elements (the mask leaves the last alone).
    auto const old = tg::atomic_add(a + i, 1.0f, i < 3);
    if (p.program_id(0) == 0)
      tg::store(olds + i, old); // masked-off lane: old value 0
    tg::atomic_max(mx + 0, p.program_id(0) * 10);
    // One program takes the lock (0 -> 1); the old value says who.
    tg::store(got + p.program_id(0), tg::atomic_cas(lk + 0, 0, 1));
  }, acc.view(), old_add.view(), best.view(), lock.view(), seen.view());
  EXPECT_EQ(acc(0), 8);
  EXPECT_EQ(acc(2), 8);
  EXPECT_EQ(acc(3), 0);
  EXPECT_EQ(old_add(3), 0);
  EXPECT_EQ(best(0), 70);
  EXPECT_EQ(lock(0), 1);
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 0), 1);
}

TEST(DocSnippets, GridsAndLaunchOptions) {
  tg::owned_tensor<std::int32_t> order({2 * 3}), dims({3});
  // Sequential: linear order, axis 0 fastest.
  tg::launch(tg::launch_options{.exec = tg::executor::sequential}, tg::grid(2, 3),
             [n = 0](tg::program const& p, tg::tensor<std::int32_t> o,
                     tg::tensor<std::int32_t> d) mutable {
               tg::store(o + p.linear_id(), n++);
               if (p.linear_id() == 0)
                 tg::store(d + tg::arange<0, 3>(),
                           tg::where(tg::arange<0, 3>() == 0, p.num_programs(0),
                                     tg::where(tg::arange<0, 3>() == 1, p.num_programs(1),
                                               p.num_programs(2))));
             },
             order.view(), dims.view());
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(order(i), i);
  EXPECT_EQ(dims(0), 2);
  EXPECT_EQ(dims(1), 3);
  EXPECT_EQ(dims(2), 1);
  int runs = 0;
  auto count = [&runs](tg::program const&) { ++runs; };
  tg::launch(tg::launch_options{.exec = tg::executor::sequential}, 0, count); // no program
  EXPECT_EQ(runs, 0);
  EXPECT_THROW(tg::launch(-1, count), std::invalid_argument);
  EXPECT_THROW(tg::launch(tg::launch_options{.num_threads = -1}, 1, count), std::invalid_argument);
  // Process-wide defaults, taken by launch_options{} when it is made.
  tg::set_default_executor(tg::executor::sequential);
  EXPECT_EQ(tg::launch_options{}.exec, tg::executor::sequential);
  EXPECT_EQ(tg::default_options().exec, tg::executor::sequential);
  tg::set_default_executor(tg::detail::compiled_default_executor);
  tg::set_num_threads(2);
  EXPECT_EQ(tg::launch_options{}.num_threads, 2);
  tg::set_num_threads(0);
  EXPECT_TRUE(tg::executor_available(tg::executor::sequential));
  // Bounds checked for one launch, whatever checked() says.
  tg::checked_scope const off(false);
  tg::owned_tensor<float> small({3});
  EXPECT_THROW(tg::launch(tg::launch_options{.check_bounds = true}, 1,
                          [](tg::program const&, tg::tensor<float const> a) {
                            (void)tg::load(a + tg::arange<0, 4>());
                          },
                          small.cview()),
               tg::access_error);
  EXPECT_EQ(tg::load(small.cview() + 1).item(), 0.0f);
}
#endif
