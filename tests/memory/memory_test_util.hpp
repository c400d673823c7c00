// Shared helpers of the memory tests: element types, deterministic tensor contents that are
// exact in every element type, running a piece of kernel code as one program, and element
// checks that print coordinates. References are plain scalar loops written in each test.
#pragma once

#include <tilegrad/grid/program.hpp>
#include <tilegrad/memory/checked.hpp>
#include <tilegrad/memory/tensor.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

namespace tg_mem {

using AllTypes = ::testing::Types<float, double, std::int32_t, std::int64_t>;
using FloatTypes = ::testing::Types<float, double>;

/// A value for flat index i: distinct for i < 4099, exact in float, double, int32 and int64
/// (floats get quarters, so a wrong element and a right one never compare equal by rounding).
template <class T>
T value_at(std::int64_t i) {
  std::int64_t const k = (i * 7 + 3) % 4099 - 2000;
  if constexpr (std::is_floating_point_v<T>)
    return static_cast<T>(k) * static_cast<T>(0.25);
  else
    return static_cast<T>(k);
}

/// A value that value_at never produces: marks elements a store must not touch.
template <class T>
T sentinel() {
  return static_cast<T>(-9999);
}

/// Fills an owned tensor with value_at(flat index).
template <class T>
void fill_values(tilegrad::owned_tensor<T>& t, std::int64_t salt = 0) {
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = value_at<T>(i + salt);
}

template <class T>
void fill_with(tilegrad::owned_tensor<T>& t, T v) {
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = v;
}

/// Runs f(program) as program (pid, 0, 0) of a grid of n, with the program context set, as a
/// launcher would.
template <class F>
void as_program(int pid, int n, F&& f) {
  tilegrad::program p({pid, 0, 0}, {n, 1, 1});
  tilegrad::detail::program_scope scope(p);
  f(p);
}

/// "(i, j)": the spelling tensor::coordinates and error messages use.
inline std::string coord(std::int64_t i) {
  std::string s = "(";
  s += std::to_string(i);
  s += ")";
  return s;
}
inline std::string coord(std::int64_t i, std::int64_t j) {
  std::string s = "(";
  s += std::to_string(i);
  s += ", ";
  s += std::to_string(j);
  s += ")";
  return s;
}

inline std::string at(std::int64_t i) { return std::string("at ").append(coord(i)); }
inline std::string at(std::int64_t i, std::int64_t j) {
  return std::string("at ").append(coord(i, j));
}
inline std::string at(std::int64_t i, std::int64_t j, std::int64_t k) {
  std::string s = "at (";
  s += std::to_string(i);
  s += ", ";
  s += std::to_string(j);
  s += ", ";
  s += std::to_string(k);
  s += ")";
  return s;
}

/// Exact equality that also accepts two NaNs (a NaN `other` or padding must read as NaN).
template <class T>
bool same_value(T a, T b) {
  if constexpr (std::is_floating_point_v<T>)
    if (std::isnan(a) && std::isnan(b)) return true;
  return a == b;
}

/// The test tensors are M x N: no extent divides a SIMD width.
inline constexpr int M = 37, N = 70;

/// Fixture of the pointer load and store tests: x holds value_at(flat index), y a sentinel
/// everywhere a store did not write; every test runs checked, so no access outside goes
/// unnoticed.
template <class T>
class pointer_fixture : public ::testing::Test {
protected:
  pointer_fixture() : x({M, N}, "x"), y({M, N}, "y") {
    fill_values(x);
    fill_with(y, sentinel<T>());
  }
  tilegrad::owned_tensor<T> x;
  tilegrad::owned_tensor<T> y;
  tilegrad::tensor<T const> xc() const { return x; }
  T xv(std::int64_t i, std::int64_t j) const { return x(i, j); }
  tilegrad::checked_scope checks{true};
};

} // namespace tg_mem
