// Atomics through pointer tiles (memory/pointer.hpp): atomic_add, atomic_max, atomic_min,
// atomic_xchg with masks, and atomic_cas, on float, double, int32 and int64 tensors. Each call
// is compared with the same update written as a plain scalar loop: the values returned are the
// old ones (0 in masked-off lanes), masked-off elements stay as they were. Several programs on
// several threads updating the same elements give exact totals (values exactly representable,
// so the order of float additions does not matter), and every old value is seen exactly once
// (no update is lost). Checked mode is on: masked-off lanes point outside the tensor.
#include "memory_test_util.hpp"

#include <tilegrad/memory/checked.hpp>
#include <tilegrad/memory/pointer.hpp>
#include <tilegrad/tile/creation.hpp>
#include <tilegrad/tile/elementwise.hpp>
#include <tilegrad/tile/shape_ops.hpp>

#include <algorithm>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_atomic {

namespace {

using namespace tilegrad;
using tg_mem::as_program;
using tg_mem::at;
using tg_mem::value_at;

constexpr int M = 37, N = 70;

template <class T>
class Atomic : public ::testing::Test {
protected:
  Atomic() : v({M}, "v"), x({M, N}, "x") {
    tg_mem::fill_values(v);
    tg_mem::fill_values(x);
  }
  owned_tensor<T> v; // 1-D, 37 elements
  owned_tensor<T> x; // 37 x 70
  checked_scope checks{true};
};
TYPED_TEST_SUITE(Atomic, tg_mem::AllTypes);

// Lanes 0..63 over a tensor of 37: lanes past 36 and every third lane are masked off.
template <int B>
auto lanes_mask() {
  auto const lanes = arange<0, B>();
  return (lanes < M) & (lanes % 3 != 1);
}
inline bool lane_on(int c) { return c < M && c % 3 != 1; }

TYPED_TEST(Atomic, AddReturnsOldValuesAndSkipsMaskedLanes) {
  using T = TypeParam;
  tensor<T> const v = this->v;
  std::vector<T> const before(v.data(), v.data() + M);
  tile<T, 64> val;
  for (int c = 0; c < 64; ++c) val(c) = value_at<T>(500 + c);
  tile<T, 64> const old = atomic_add(v + arange<0, 64>(), val, lanes_mask<64>());
  for (int c = 0; c < 64; ++c) ASSERT_EQ(old(c), lane_on(c) ? before[c] : T(0)) << "old " << at(c);
  for (int c = 0; c < M; ++c)
    ASSERT_EQ(v(c), lane_on(c) ? T(before[c] + val(c)) : before[c]) << "after " << at(c);

  // A number added to every lane, no mask; 13 lanes from element 20.
  std::vector<T> const mid(v.data(), v.data() + M);
  tile<T, 13> const old2 = atomic_add(v + (20 + arange<0, 13>()), T(2));
  for (int c = 0; c < 13; ++c) ASSERT_EQ(old2(c), mid[20 + c]) << "old " << at(c);
  for (int c = 0; c < M; ++c)
    ASSERT_EQ(v(c), c >= 20 && c < 33 ? T(mid[c] + T(2)) : mid[c]) << "after " << at(c);
}

TYPED_TEST(Atomic, AddOverTwoDimensionalBlocks) {
  using T = TypeParam;
  tensor<T> const x = this->x;
  // A 5 x 16 block at the bottom-right corner, masked on both edges; a per-row column value.
  auto const rows = 34 + arange<0, 5>();
  auto const cols = 60 + arange<0, 16>();
  tile<T, 5> per_row;
  for (int i = 0; i < 5; ++i) per_row(i) = T(i + 1);
  tile<T, 5, 16> const old =
      atomic_add(x + (col(rows) * N + row(cols)), col(per_row), (col(rows) < M) & (row(cols) < N));
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 16; ++j) {
      bool const in = 34 + i < M && 60 + j < N;
      ASSERT_EQ(old(i, j), in ? value_at<T>((34 + i) * N + 60 + j) : T(0)) << "old " << at(i, j);
    }
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) {
      T const init = value_at<T>(r * N + c);
      ASSERT_EQ(x(r, c), r >= 34 && c >= 60 ? T(init + T(r - 34 + 1)) : init) << at(r, c);
    }
}

TYPED_TEST(Atomic, AddWithRepeatedAddressesInOneTile) {
  using T = TypeParam;
  owned_tensor<T> cnt({7}, "cnt");
  tensor<T> const c = cnt;
  // 37 lanes onto 7 elements: elements 0 and 1 get 6 lanes, the others 5.
  tile<T, 37> const old = atomic_add(c + arange<0, 37>() % 7, T(1));
  for (int e = 0; e < 7; ++e) ASSERT_EQ(c(e), T(e < 2 ? 6 : 5)) << at(e);
  // The old values one element receives are 0, 1, 2, ... in some order.
  for (int e = 0; e < 7; ++e) {
    std::vector<T> seen;
    for (int l = e; l < 37; l += 7) seen.push_back(old(l));
    std::sort(seen.begin(), seen.end());
    for (std::size_t k = 0; k < seen.size(); ++k) ASSERT_EQ(seen[k], T(k)) << "element " << e << " old #" << k;
  }
}

// Several programs, on several threads, adding into the same elements.
// Runs f(t) as program t of `threads`, each on a thread of its own, and waits for them all.
template <class F>
void on_threads(int threads, F&& f) {
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] { as_program(t, threads, [&](program const&) { f(t); }); });
  for (auto& th : pool) th.join();
}

TYPED_TEST(Atomic, ManyProgramsAddIntoTheSameElements) {
  using T = TypeParam;
  constexpr int threads = 4, iters = 1000;
  owned_tensor<T> cnt({7}, "cnt");
  owned_tensor<T> half({7}, "half");
  tensor<T> const c = cnt, h = half;
  std::vector<std::vector<T>> olds(threads);
  on_threads(threads, [&](int t) {
    for (int i = 0; i < iters; ++i) {
      tile<T, 7> const o = atomic_add(c + arange<0, 7>(), T(1));
      olds[t].insert(olds[t].end(), o.data(), o.data() + 7);
      // 37 lanes onto 7 elements, with a value exact in float (0.5) or 1 for integers
      atomic_add(h + arange<0, 37>() % 7, std::is_floating_point_v<T> ? T(0.5) : T(1));
    }
  });
  T const unit = std::is_floating_point_v<T> ? T(0.5) : T(1);
  for (int e = 0; e < 7; ++e) {
    ASSERT_EQ(c(e), T(threads * iters)) << at(e);
    ASSERT_EQ(h(e), T(threads * iters * (e < 2 ? 6 : 5)) * unit) << at(e);
  }
  // No lost update: element e returned each of 0 .. threads * iters - 1 exactly once.
  for (int e = 0; e < 7; ++e) {
    std::vector<T> seen;
    for (auto const& o : olds)
      for (std::size_t k = static_cast<std::size_t>(e); k < o.size(); k += 7) seen.push_back(o[k]);
    std::sort(seen.begin(), seen.end());
    ASSERT_EQ(seen.size(), static_cast<std::size_t>(threads * iters));
    for (std::size_t k = 0; k < seen.size(); ++k) ASSERT_EQ(seen[k], T(k)) << "element " << e;
  }
}

// 64 lanes a call, in whole vectors: floats and doubles add a run of lanes that lies in one 1 KiB
// stripe of memory as a vector under the stripe's lock, and a run that crosses into the next
// stripe lane by lane. The views start 3 elements into their buffers, so that runs cross stripe
// boundaries. One run of x
// is updated by every call (each of its elements returns each old value once), with atomic_max
// calls that change nothing beside them; runs of y move across the tensor.
TYPED_TEST(Atomic, VectorRunsAcrossPagesFromManyThreads) {
  using T = TypeParam;
  constexpr int threads = 4, iters = 300, n = 8192 / sizeof(T) * 3;
  owned_tensor<T> xbuf({n + 3}, "xbuf"), ybuf({n + 3}, "ybuf");
  tg_mem::fill_with(xbuf, T(0));
  tg_mem::fill_with(ybuf, T(0));
  tensor<T> const x(xbuf.view().data() + 3, {n}, "x"), y(ybuf.view().data() + 3, {n}, "y");
  // The hot run of x starts 5 elements before the second 4 KiB boundary after x's buffer starts
  // (a boundary of stripes too).
  auto const addr = reinterpret_cast<std::uintptr_t>(xbuf.view().data());
  std::int64_t const hot = static_cast<std::int64_t>(((addr >> 12) + 2) * 4096 - addr) /
                               static_cast<std::int64_t>(sizeof(T)) - 3 - 5;
  ASSERT_GT(hot, 0);
  ASSERT_LT(hot + 64, n);
  auto start = [](int t, int i) { return (t * iters + i) * 29 % (n - 64); };
  std::vector<std::int64_t> expect(static_cast<std::size_t>(n), 0);
  for (int t = 0; t < threads; ++t)
    for (int i = 0; i < iters; ++i)
      for (int l = 0; l < 64; ++l) ++expect[static_cast<std::size_t>(start(t, i) + l)];
  std::vector<std::vector<T>> olds(threads);
  on_threads(threads, [&](int t) {
    for (int i = 0; i < iters; ++i) {
      tile<T, 64> const o = atomic_add(x + (hot + arange<0, 64>()), T(1));
      olds[t].insert(olds[t].end(), o.data(), o.data() + 64);
      atomic_max(x + (hot + arange<0, 64>()), T(0));
      atomic_add(y + (start(t, i) + arange<0, 64>()), T(1));
    }
  });
  for (int e = 0; e < n; ++e) {
    ASSERT_EQ(y(e), T(expect[static_cast<std::size_t>(e)])) << at(e);
    ASSERT_EQ(x(e), e >= hot && e < hot + 64 ? T(threads * iters) : T(0)) << at(e);
  }
  for (int l = 0; l < 64; ++l) { // no update of the hot run lost or seen twice
    std::vector<T> seen;
    for (auto const& o : olds)
      for (std::size_t k = static_cast<std::size_t>(l); k < o.size(); k += 64) seen.push_back(o[k]);
    std::sort(seen.begin(), seen.end());
    ASSERT_EQ(seen.size(), static_cast<std::size_t>(threads * iters));
    for (std::size_t k = 0; k < seen.size(); ++k) ASSERT_EQ(seen[k], T(k)) << "lane " << l;
  }
}

TYPED_TEST(Atomic, MaxAndMin) {
  using T = TypeParam;
  tensor<T> const v = this->v; // values in [-2000, 2098] (floats: a quarter of that)
  tile<T, 64> val;
  for (int c = 0; c < 64; ++c) val(c) = value_at<T>(1000 + 3 * c) * T(c % 2 ? -1 : 1);
  std::vector<T> const before(v.data(), v.data() + M);
  tile<T, 64> const omax = atomic_max(v + arange<0, 64>(), val, lanes_mask<64>());
  std::vector<T> after_max(M);
  for (int c = 0; c < 64; ++c) ASSERT_EQ(omax(c), lane_on(c) ? before[c] : T(0)) << "max old " << at(c);
  for (int c = 0; c < M; ++c) {
    after_max[c] = lane_on(c) ? std::max(before[c], val(c)) : before[c];
    ASSERT_EQ(v(c), after_max[c]) << "max " << at(c) << ": " << before[c] << " vs " << val(c);
  }
  tile<T, 64> const omin = atomic_min(v + arange<0, 64>(), val, lanes_mask<64>());
  for (int c = 0; c < 64; ++c) ASSERT_EQ(omin(c), lane_on(c) ? after_max[c] : T(0)) << "min old " << at(c);
  for (int c = 0; c < M; ++c)
    ASSERT_EQ(v(c), lane_on(c) ? std::min(after_max[c], val(c)) : after_max[c]) << "min " << at(c);

  // All negative: the maximum of negative numbers, the minimum below them.
  owned_tensor<T> neg({7}, "neg");
  tg_mem::fill_with(neg, T(-100));
  tile<T, 7> nv;
  for (int c = 0; c < 7; ++c) nv(c) = T(-50 - 20 * c); // -50, -70, ..., -170
  atomic_max(tensor<T>(neg) + arange<0, 7>(), nv);
  for (int c = 0; c < 7; ++c) ASSERT_EQ(neg(c), std::max(T(-100), nv(c))) << at(c);
  atomic_min(tensor<T>(neg) + arange<0, 7>(), T(-120));
  for (int c = 0; c < 7; ++c) ASSERT_EQ(neg(c), std::min(std::max(T(-100), nv(c)), T(-120))) << at(c);
}

TYPED_TEST(Atomic, MaxAndMinFromManyThreads) {
  using T = TypeParam;
  constexpr int threads = 4, iters = 1000;
  owned_tensor<T> hi({7}, "hi"), lo({7}, "lo");
  tg_mem::fill_with(hi, T(-100000));
  tg_mem::fill_with(lo, T(100000));
  tensor<T> const h = hi, l = lo;
  on_threads(threads, [&](int t) {
    for (int i = 0; i < iters; ++i) {
      T const s = T(((t * iters + i) * 37) % (threads * iters) - 2000); // each of -2000..1999 once
      atomic_max(h + arange<0, 7>(), s);
      atomic_min(l + arange<0, 7>(), s);
    }
  });
  for (int e = 0; e < 7; ++e) {
    ASSERT_EQ(h(e), T(1999)) << at(e);
    ASSERT_EQ(l(e), T(-2000)) << at(e);
  }
}

TYPED_TEST(Atomic, Exchange) {
  using T = TypeParam;
  tensor<T> const v = this->v;
  std::vector<T> const before(v.data(), v.data() + M);
  tile<T, 64> val;
  for (int c = 0; c < 64; ++c) val(c) = value_at<T>(2000 + c);
  tile<T, 64> const old = atomic_xchg(v + arange<0, 64>(), val, lanes_mask<64>());
  for (int c = 0; c < 64; ++c) ASSERT_EQ(old(c), lane_on(c) ? before[c] : T(0)) << "old " << at(c);
  for (int c = 0; c < M; ++c) ASSERT_EQ(v(c), lane_on(c) ? val(c) : before[c]) << at(c);
  tile<T, 16> const o2 = atomic_xchg(v + (arange<0, 16>() * 2), T(7));
  for (int c = 0; c < 16; ++c) ASSERT_EQ(o2(c), lane_on(2 * c) ? val(2 * c) : before[2 * c]) << "old " << at(c);
  for (int c = 0; c < 32; c += 2) ASSERT_EQ(v(c), T(7)) << at(c);
}

TYPED_TEST(Atomic, CompareAndSwapPerLane) {
  using T = TypeParam;
  tensor<T> const v = this->v;
  std::vector<T> const before(v.data(), v.data() + M);
  // Even lanes compare equal (and swap), odd lanes do not (and keep their value).
  tile<T, 37> cmp, val;
  for (int c = 0; c < 37; ++c) {
    cmp(c) = c % 2 == 0 ? before[c] : T(before[c] + T(1));
    val(c) = value_at<T>(3000 + c);
  }
  tile<T, 37> const old = atomic_cas(v + arange<0, 37>(), cmp, val);
  for (int c = 0; c < 37; ++c) {
    ASSERT_EQ(old(c), before[c]) << "old " << at(c);
    ASSERT_EQ(v(c), c % 2 == 0 ? val(c) : before[c]) << at(c);
  }
  // A number to compare with, on a strided pointer tile: only lanes holding 5 swap.
  owned_tensor<T> f({40}, "f");
  for (int c = 0; c < 40; ++c) f(c) = c % 3 == 0 ? T(5) : T(c);
  tile<T, 13> const o2 = atomic_cas(tensor<T>(f) + arange<0, 13>() * 3 + 1, T(4), T(9)); // 1, 4, 7, ...
  for (int c = 0; c < 13; ++c) ASSERT_EQ(o2(c), T(3 * c + 1)) << at(c);
  tile<T, 13> const o3 = atomic_cas(tensor<T>(f) + arange<0, 13>() * 3, T(5), T(9)); // 0, 3, 6, ...
  for (int c = 0; c < 13; ++c) ASSERT_EQ(o3(c), T(5)) << at(c);
  for (int c = 0; c < 40; ++c) {
    T const ref = c == 4 || (c % 3 == 0 && c <= 36) ? T(9) : c % 3 == 0 ? T(5) : T(c);
    ASSERT_EQ(f(c), ref) << at(c);
  }
}

// A counter incremented by compare-and-swap loops on four threads: a rank-0 pointer and
// retries on failure; the total is exact only if every successful swap was atomic.
TYPED_TEST(Atomic, CompareAndSwapLoopsFromManyThreads) {
  using T = TypeParam;
  constexpr int threads = 4, iters = 1000;
  owned_tensor<T> counter({1}, "counter");
  tensor<T> const c = counter;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (int i = 0; i < iters; ++i)
        for (;;) {
          T const seen = atomic_add(c + 0, T(0)).item(); // an atomic read
          if (atomic_cas(c + 0, seen, T(seen + T(1))).item() == seen) break;
        }
    });
  for (auto& th : pool) th.join();
  EXPECT_EQ(c(0), T(threads * iters));
}

// An atomic of an expression of bf16 data, as a bf16 kernel's reduction into an fp32 buffer
// writes it (`atomic_add(acc + cols, x.to(float32) * 2, mask)`): it did not compile (the
// atomic's vector width ignored that such a value reads one lane at a time); every old value
// and the sums must be those of a plain loop.
TEST(AtomicOfBf16Data, AnExpressionOfBf16LoadsAddsIntoFloat) {
  constexpr int R = 50, C = 13;
  owned_tensor<bf16> x({R, C}, "x");
  owned_tensor<float> acc({C}, "acc"), top({C}, "top");
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j)
      x(i, j) = bf16(0.25f * static_cast<float>((i * 7 + j * 3) % 29));
  for (int j = 0; j < C; ++j)
    acc(j) = static_cast<float>(j), top(j) = -1;
  tensor<bf16 const> const xv = x;
  tensor<float> const av = acc, tv = top;
  std::vector<float> olds(R * 16, -7);
  for (int i = 0; i < R; ++i)
    as_program(i, R, [&](program const&) {
      auto const cols = arange<0, 16>();
      auto const m = cols < C;
      auto const v = to<float>(load(xv + i * C + cols, m, 0.0f));
      auto const old = atomic_add(av + cols, v * 2.0f, m);
      (void)atomic_max(tv + cols, v - 1.0f, m);
      for (int c = 0; c < 16; ++c)
        olds[static_cast<std::size_t>(i * 16 + c)] = old(c);
    });
  for (int j = 0; j < C; ++j) {
    float sum = static_cast<float>(j), most = -1;
    for (int i = 0; i < R; ++i) {
      ASSERT_EQ(olds[static_cast<std::size_t>(i * 16 + j)], sum) << at(i, j);
      sum += 2.0f * static_cast<float>(x(i, j)); // (exact: multiples of 0.5 below 2^24)
      most = std::max(most, static_cast<float>(x(i, j)) - 1.0f);
    }
    EXPECT_EQ(acc(j), sum) << at(j);
    EXPECT_EQ(top(j), most) << at(j);
  }
  for (int i = 0; i < R; ++i)
    for (int c = C; c < 16; ++c)
      ASSERT_EQ(olds[static_cast<std::size_t>(i * 16 + c)], 0.0f);
}

} // namespace

} // namespace test_atomic
