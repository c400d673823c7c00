// Small host-side helpers the examples share: seeded random fill and error measures.
#pragma once

#include <tilegrad/tilegrad.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>

namespace examples {

template <class T>
void fill_uniform(tilegrad::owned_tensor<T>& t, std::uint32_t seed, double lo = -1, double hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  for (T& v : t) v = static_cast<T>(dist(rng));
}

/// max |a - b| over the elements of two equally sized ranges.
template <class A, class B>
double max_abs_diff(A const& a, B const& b) {
  double m = 0;
  auto ib = b.begin();
  for (auto const& x : a) m = std::max(m, std::abs(static_cast<double>(x) - static_cast<double>(*ib++)));
  return m;
}

/// Seconds per call of f, best of `reps` runs.
template <class F>
double best_seconds(F&& f, int reps = 5) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

} // namespace examples
