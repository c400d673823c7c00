// Shared helpers of the tile tests: seeded random fills, reference tiles built element by
// element with plain scalar code, and element-by-element checks whose failure messages give the
// element's coordinates. Nothing here uses tilegrad's algebra: only tile storage.
//
// The checks are templates over the element type alone (not over shapes or lambdas), so the
// GoogleTest assertion code is instantiated a handful of times per test file: compile time.
#pragma once

#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <type_traits>

namespace tg_test {

/// The RNG of every test: a fixed seed (plus a per-call salt), so a failure reproduces.
inline std::mt19937_64 make_rng(std::uint64_t salt = 0) {
  return std::mt19937_64(0x7467'7261'6400ULL + salt);
}

/// Extents of a tile shape at run time (what the failure messages need).
struct extents {
  int rank = 0;
  std::array<int, 3> dim{1, 1, 1};
  int size = 1;
};

template <class S>
extents extents_of() {
  extents e;
  e.rank = S::rank;
  for (int a = 0; a < S::rank; ++a)
    e.dim[static_cast<std::size_t>(a)] = S::dim(a);
  e.size = S::size;
  return e;
}

/// Coordinates of a row-major flat index.
inline std::array<int, 3> coords(extents const& e, int flat) {
  std::array<int, 3> c{0, 0, 0};
  for (int a = e.rank - 1; a >= 0; --a) {
    c[static_cast<std::size_t>(a)] = flat % e.dim[static_cast<std::size_t>(a)];
    flat /= e.dim[static_cast<std::size_t>(a)];
  }
  return c;
}

/// "at (i, j, k)" for failure messages.
inline std::string at_str(extents const& e, int flat) {
  auto const c = coords(e, flat);
  std::string s = "at (";
  for (int a = 0; a < e.rank; ++a) {
    if (a)
      s += ", ";
    s += std::to_string(c[static_cast<std::size_t>(a)]);
  }
  return s + ")";
}

// ---------------------------------------------------------------------------------------------
// Fills
// ---------------------------------------------------------------------------------------------

/// Values uniform in [lo, hi] (integers: the inclusive range; bool: fair coin).
template <class T, int... Ns, class Rng>
void fill_uniform(tilegrad::tile<T, Ns...>& t, Rng& rng, double lo, double hi) {
  T* p = t.data();
  if constexpr (std::is_same_v<T, bool>) {
    std::bernoulli_distribution d(0.5);
    for (int i = 0; i < t.size; ++i)
      p[i] = d(rng);
  } else if constexpr (std::is_integral_v<T>) {
    std::uniform_int_distribution<long long> d(static_cast<long long>(lo),
                                               static_cast<long long>(hi));
    for (int i = 0; i < t.size; ++i)
      p[i] = static_cast<T>(d(rng));
  } else {
    std::uniform_real_distribution<double> d(lo, hi);
    for (int i = 0; i < t.size; ++i)
      p[i] = static_cast<T>(d(rng));
  }
}

/// k / den for integers k in [-kmax, kmax]: sums and products of such numbers stay exact in
/// float, so reductions and dot can be compared exactly whatever their order of evaluation.
template <class T, int... Ns, class Rng>
void fill_dyadic(tilegrad::tile<T, Ns...>& t, Rng& rng, int kmax = 16, int den = 8) {
  std::uniform_int_distribution<int> d(-kmax, kmax);
  for (int i = 0; i < t.size; ++i)
    t.data()[i] = static_cast<T>(double(d(rng)) / den);
}

/// Values with min_abs <= |x| <= max_abs, either sign (divisors; integers are rounded).
template <class T, int... Ns, class Rng>
void fill_away_from_zero(tilegrad::tile<T, Ns...>& t, Rng& rng, double min_abs, double max_abs) {
  std::uniform_real_distribution<double> d(min_abs, max_abs);
  std::bernoulli_distribution negative(0.5);
  for (int i = 0; i < t.size; ++i) {
    double v = d(rng);
    if constexpr (std::is_integral_v<T>)
      v = std::round(v);
    t.data()[i] = static_cast<T>(negative(rng) ? -v : v);
  }
}

// ---------------------------------------------------------------------------------------------
// Reference tiles, written element by element
// ---------------------------------------------------------------------------------------------

/// The tile whose flat element i is f(i).
template <class Tile, class F>
Tile from_flat(F&& f) {
  Tile r;
  for (int i = 0; i < Tile::size; ++i)
    r.data()[i] = static_cast<typename Tile::value_type>(f(i));
  return r;
}

// ---------------------------------------------------------------------------------------------
// Checks
// ---------------------------------------------------------------------------------------------

/// got[i] == want[i] for every element.
template <class T>
void check_eq(T const* got, T const* want, extents const& e, char const* what) {
  for (int i = 0; i < e.size; ++i)
    EXPECT_EQ(got[i], want[i]) << what << " " << at_str(e, i);
}

/// |got[i] - want[i]| <= rtol * max(|want[i]|, floor): a relative tolerance, absolute below
/// `floor` (for functions with zeros inside the tested range).
template <class T>
void check_near(T const* got, T const* want, extents const& e, double rtol, double floor,
                char const* what) {
  for (int i = 0; i < e.size; ++i) {
    double const w = static_cast<double>(want[i]);
    EXPECT_NEAR(static_cast<double>(got[i]), w, rtol * std::max(std::abs(w), floor))
        << what << " " << at_str(e, i);
  }
}

template <class T, int... Ns>
void expect_eq(tilegrad::tile<T, Ns...> const& got, tilegrad::tile<T, Ns...> const& want,
               char const* what) {
  check_eq(got.data(), want.data(), extents_of<tilegrad::shape<Ns...>>(), what);
}

template <class T, int... Ns>
void expect_near(tilegrad::tile<T, Ns...> const& got, tilegrad::tile<T, Ns...> const& want,
                 double rtol, double floor, char const* what) {
  check_near(got.data(), want.data(), extents_of<tilegrad::shape<Ns...>>(), rtol, floor, what);
}

/// Relative tolerance for expressions that mix * with + or -: zero (exact) unless the target
/// has FMA instructions, where the compiler may contract a * b + c into one fused operation, in
/// the library's loops or in the reference, rounding once instead of twice. Scale it by the
/// magnitude of the terms (the `floor` of expect_near), not by the result.
template <class T>
inline constexpr double contraction_rtol =
#if defined(__FMA__) || defined(__aarch64__) || defined(__ARM_FEATURE_FMA)
    4 * std::numeric_limits<T>::epsilon();
#else
    0;
#endif

/// Relative tolerance of vector math that is not bit-identical to libm: a few ulp of T.
template <class T>
inline constexpr double math_rtol = std::is_same_v<T, float> ? 4e-6 : 1e-14;

} // namespace tg_test
