// Host-side helpers of the kernel-level tests: seeded uniform fills of owned tensors and the
// tolerance of a float or double result against a double reference.
#pragma once

#include <tilegrad/memory/tensor.hpp>

#include <random>
#include <type_traits>

namespace test_support {

template <class T>
void fill(tilegrad::owned_tensor<T>& t, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(-1, 1);
  for (T& v : t) v = static_cast<T>(d(rng));
}

template <class T>
double tol(double for_float = 1e-5) {
  return std::is_same_v<T, float> ? for_float : 1e-12;
}

} // namespace test_support
