// Cache hints (memory/hints.hpp): a block store with cache_modifier::cs or
// eviction_policy::evict_first writes rows covering whole 64-byte lines with non-temporal
// stores on AVX-512 targets, and every other store as before. Whatever the path, the values
// must be exactly those of the store without the hint: rows of 1024 floats (streamed), rows of
// 960 in blocks of 1024 (cut short, streamed), rows of 1000 (lines shared by two rows: plain),
// rows starting one float off a line (plain), blocks of several rows, doubles, host code, every
// executor; nothing past a cut row is written. In reverse and forward mode a hint changes
// nothing: gradients and tangents equal those of the unhinted kernel and the closed form.
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

namespace test_cache_hints {

namespace {

namespace tg = tilegrad;

/// y[r, :] = 2 x[r, :] + 1 - x[r, :]^2 / 8, one row per program, through (1, Block) block
/// pointers of the rows; the store takes hint H.
template <int Block, tg::cache_hints H>
constexpr auto row_map = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                     tg::tensor<T> y) {
  auto const r = p.program_id(0);
  auto const xv = tg::load(tg::make_block_ptr<1, Block>(x, {r, 0}), tg::bounds<1>,
                           tg::padding::zero, H);
  tg::store(tg::make_block_ptr<1, Block>(y, {r, 0}), xv * 2.0f + 1.0f - xv * xv * 0.125f,
            tg::bounds<1>, H);
};

constexpr tg::cache_hints none{};
constexpr tg::cache_hints cs{tg::cache_modifier::cs};
constexpr tg::cache_hints first{tg::eviction_policy::evict_first};

template <class T>
T reference(T v) {
  return v * T(2) + T(1) - v * v * T(0.125);
}

template <class T>
void fill(std::vector<T>& v, int seed) {
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = T(((static_cast<int>(i) * 37 + seed * 11) % 101) - 50) / T(16);
}

/// Runs row_map<Block, H> over an (m, n) view with row stride ld into a buffer of sentinels, at
/// element offset `off` of both buffers, and returns the whole output buffer.
template <class T, int Block, tg::cache_hints H>
std::vector<T> run(tg::launch_options const& o, int m, int n, int ld, int off) {
  std::vector<T> xs(static_cast<std::size_t>(m) * ld + off + 64);
  std::vector<T> ys(xs.size(), T(-777));
  fill(xs, 1);
  // 64-byte aligned storage, so that the aligned cases do take the streaming path.
  T* xa = static_cast<T*>(::operator new(xs.size() * sizeof(T), std::align_val_t{64}));
  T* ya = static_cast<T*>(::operator new(ys.size() * sizeof(T), std::align_val_t{64}));
  std::memcpy(xa, xs.data(), xs.size() * sizeof(T));
  std::memcpy(ya, ys.data(), ys.size() * sizeof(T));
  tg::tensor<T const> x(xa + off, {m, n}, {ld, 1}, "x");
  tg::tensor<T> y(ya + off, {m, n}, {ld, 1}, "y");
  tg::launch(o, m, row_map<Block, H>, x, y);
  std::memcpy(ys.data(), ya, ys.size() * sizeof(T));
  ::operator delete(xa, std::align_val_t{64});
  ::operator delete(ya, std::align_val_t{64});
  // Against the scalar reference: the view's elements mapped, everything else untouched.
  for (int r = 0; r < m; ++r)
    for (int c = 0; c < ld; ++c) {
      std::size_t const i = static_cast<std::size_t>(off) + static_cast<std::size_t>(r) * ld + c;
      T const want = c < n ? reference(xs[i]) : T(-777);
      EXPECT_EQ(ys[i], want) << "row " << r << " column " << c;
    }
  return ys;
}

struct shape_case {
  int m, n, ld, off;
};

template <class T>
void same_with_and_without_hints(tg::launch_options const& o) {
  // Streamed: rows of 1024 on lines; cut rows of 960 (whole lines) of a buffer 1024 wide.
  // Plain: rows of 1000 (two rows share a line), rows one element off a line.
  for (shape_case const s : {shape_case{9, 1024, 1024, 0}, shape_case{7, 960, 1024, 0},
                             shape_case{6, 1000, 1000, 0}, shape_case{5, 1024, 1024, 1},
                             shape_case{4, 333, 1024, 0}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << s.m << " x " << s.n << ", stride " << s.ld
                                      << ", offset " << s.off);
    auto const plain = run<T, 1024, none>(o, s.m, s.n, s.ld, s.off);
    EXPECT_EQ(plain, (run<T, 1024, cs>(o, s.m, s.n, s.ld, s.off)));
    EXPECT_EQ(plain, (run<T, 1024, first>(o, s.m, s.n, s.ld, s.off)));
  }
}

TEST(CacheHints, StoresGiveTheValuesOfPlainStoresOnEveryExecutor) {
  same_with_and_without_hints<float>({.exec = tg::executor::sequential});
  same_with_and_without_hints<double>({.exec = tg::executor::sequential});
#if TILEGRAD_USE_TBB
  same_with_and_without_hints<float>({.exec = tg::executor::tbb, .num_threads = 2});
  same_with_and_without_hints<double>({.exec = tg::executor::tbb, .num_threads = 2});
#endif
#if TILEGRAD_USE_OPENMP
  same_with_and_without_hints<float>({.exec = tg::executor::openmp, .num_threads = 2});
#endif
}

TEST(CacheHints, BlocksOfSeveralRowsAndStoresFromHostCode) {
  // A (4, 64) block of a contiguous (10, 64) tensor: several rows of whole lines at once; the
  // last block hangs over the end (bounds<0>) and is stored row by row.
  // (Aligned storage: each row of 64 floats is a whole line, streamed.)
  struct alignas(64) rows {
    float v[10 * 64];
  };
  std::vector<float> x(10 * 64), want(10 * 64);
  auto const yb = std::make_unique<rows>();
  float* const y = yb->v;
  std::fill(y, y + 10 * 64, -1.0f);
  fill(x, 3);
  for (std::size_t i = 0; i < x.size(); ++i) want[i] = reference(x[i]);
  auto const blocks = [](tg::program const& p, tg::tensor<float const> xt, tg::tensor<float> yt) {
    auto const r0 = p.program_id(0) * 4;
    auto const v = tg::load(tg::make_block_ptr<4, 64>(xt, {r0, 0}), tg::bounds<0>);
    tg::store(tg::make_block_ptr<4, 64>(yt, {r0, 0}), v * 2.0f + 1.0f - v * v * 0.125f,
              tg::bounds<0>, tg::eviction_policy::evict_first);
  };
  tg::launch(3, blocks, tg::tensor<float const>(x.data(), {10, 64}),
             tg::tensor<float>(y, {10, 64}));
  EXPECT_EQ(std::vector<float>(y, y + 10 * 64), want);

  // Outside a launch the store fences at once.
  float* const z = y; // (a row of whole lines)
  tg::tensor<float> zt(z, {1, 64});
  auto const ones = tg::full<float, 1, 64>(1.5f);
  tg::store(tg::make_block_ptr<1, 64>(zt, {0, 0}), ones + 0.0f, tg::bounds<1>,
            tg::cache_modifier::cs);
  EXPECT_EQ(std::vector<float>(z, z + 64), std::vector<float>(64, 1.5f));
}

TEST(CacheHints, GradientsAndTangentsAreThoseOfTheUnhintedKernel) {
  int const m = 5, n = 1000;
  tg::owned_tensor<float> x({m, n}, "x"), y({m, n}, "y"), dy({m, n}, "dy"), u({m, n}, "u");
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    x.data()[i] = static_cast<float>((i * 29) % 97 - 48) / 8.0f;
    dy.data()[i] = static_cast<float>((i * 13) % 89 - 44) / 16.0f;
    u.data()[i] = static_cast<float>((i * 7) % 83 - 41) / 32.0f;
  }
  auto const g_plain = tg::vjp(m, row_map<1024, none>, tg::in("x", x), tg::out("y", y, dy));
  auto const g_cs = tg::vjp(m, row_map<1024, cs>, tg::in("x", x), tg::out("y", y, dy));
  auto const g_first = tg::vjp(m, row_map<1024, first>, tg::in("x", x), tg::out("y", y, dy));
  auto const t_plain = tg::jvp(m, row_map<1024, none>, tg::tangent_in("x", x, u),
                               tg::tangent_out("y", y));
  auto const t_first = tg::jvp(m, row_map<1024, first>, tg::tangent_in("x", x, u),
                               tg::tangent_out("y", y));
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    float const d = 2.0f - x.data()[i] * 0.25f; // dy/dx
    ASSERT_EQ(g_cs["x"].data()[i], g_plain["x"].data()[i]) << i;
    ASSERT_EQ(g_first["x"].data()[i], g_plain["x"].data()[i]) << i;
    ASSERT_NEAR(g_plain["x"].data()[i], dy.data()[i] * d, 1e-5f) << i;
    ASSERT_EQ(t_first["y"].data()[i], t_plain["y"].data()[i]) << i;
    ASSERT_NEAR(t_plain["y"].data()[i], u.data()[i] * d, 1e-5f) << i;
  }
}

/// The Triton tutorial's way: pointer tiles under a column mask, every load and store hinted.
constexpr auto masked_rows = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                         tg::tensor<T> y) {
  auto const r = p.program_id(0);
  auto const cols = tg::arange<0, 128>();
  auto const mask = cols < static_cast<int>(x.size(1));
  auto const xv = tg::load(x + r * x.stride(0) + cols, mask, 0.0f,
                           tg::eviction_policy::evict_last);
  auto const w = tg::load(x + r * x.stride(0) + cols, mask, tg::cache_modifier::ca);
  tg::store(y + r * y.stride(0) + cols, xv * 2.0f + 1.0f - w * w * 0.125f, mask,
            tg::cache_hints{tg::cache_modifier::cs, tg::eviction_policy::evict_first});
};

TEST(CacheHints, PointerTileLoadsAndStoresTakeHintsAndChangeNothing) {
  int const m = 3, n = 100; // rows shorter than the tile's 128 lanes
  tg::owned_tensor<float> x({m, n}, "x"), y({m, n}, "y"), dy({m, n}, "dy");
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    x.data()[i] = static_cast<float>((i * 31) % 73 - 36) / 8.0f;
    dy.data()[i] = static_cast<float>((i * 17) % 61 - 30) / 16.0f;
  }
  tg::launch(m, masked_rows, x.cview(), y.view());
  for (std::int64_t i = 0; i < x.numel(); ++i)
    ASSERT_EQ(y.data()[i], reference(x.data()[i])) << i;
  auto const g = tg::vjp(m, masked_rows, tg::in("x", x), tg::out("y", y, dy));
  for (std::int64_t i = 0; i < x.numel(); ++i)
    ASSERT_NEAR(g["x"].data()[i], dy.data()[i] * (2.0f - x.data()[i] * 0.25f), 1e-5f) << i;
}

} // namespace

} // namespace test_cache_hints
