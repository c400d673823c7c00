// Host-side helpers of the kernel-level tests: seeded uniform fills of owned tensors, the
// tolerance of a float or double result against a double reference, and the statistics of a row
// in double (layer norm's reference).
#pragma once

#include <tilegrad/memory/tensor.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <type_traits>

namespace test_support {

template <class T>
void fill(tilegrad::owned_tensor<T>& t, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(-1, 1);
  for (T& v : t) v = static_cast<T>(d(rng));
}

/// Float values uniform in [lo, hi), drawn as floats (the checker tests' inputs).
inline void fill_float(tilegrad::owned_tensor<float>& t, unsigned seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  for (float& v : t)
    v = d(rng);
}

template <class T>
double tol(double for_float = 1e-5) {
  return std::is_same_v<T, float> ? for_float : 1e-12;
}

/// Row i of a (M, N) tensor's mean and 1 / sqrt(variance + eps), in double (two passes).
struct row_stats {
  double mean, rstd;
};
template <class T>
row_stats stats_of_row(tilegrad::owned_tensor<T> const& x, std::int64_t i, double eps) {
  std::int64_t const n = x.size(1);
  double mu = 0, var = 0;
  for (std::int64_t j = 0; j < n; ++j)
    mu += static_cast<double>(x(i, j));
  mu /= static_cast<double>(n);
  for (std::int64_t j = 0; j < n; ++j)
    var += (static_cast<double>(x(i, j)) - mu) * (static_cast<double>(x(i, j)) - mu);
  return {mu, 1 / std::sqrt(var / static_cast<double>(n) + eps)};
}

} // namespace test_support
