// The values a backward reads from the forward (its outputs, the statistics it saves), for
// check_backward's second look: a float32 forward leaves each of them a rounding error away from
// the float64 forward's, and a correct backward can amplify that error (layer norm's rows of two
// or three columns, where dx is a small difference of large terms). The second look moves these
// values by their rounding errors and measures how far the backward's gradients move.
#pragma once

#include "tilegrad/core/bf16.hpp"
#include "tilegrad/core/config.hpp"
#include "tilegrad/memory/tensor.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace tilegrad::detail {

/// The spacing of E's values at |v| (v finite): the size of one rounding error there.
template <class E>
double ulp_of(double v) {
  double const a = std::abs(v);
  if constexpr (std::is_same_v<E, bf16>) {
    // 8 significant bits; below the smallest normal the spacing is that of the smallest normal.
    // On the bits of a (ilogb and ldexp, library calls, took half of a bf16 check's time): its
    // exponent, -126 at least, and 2^(e - 7) a normal double.
    std::uint64_t const field = std::bit_cast<std::uint64_t>(a) >> 52;
    if (field == 0x7ff) { // infinity or NaN (callers pass finite values)
      int const e = std::max(std::ilogb(a), -126);
      return std::ldexp(1.0, e - 7);
    }
    int const e = std::max(static_cast<int>(field) - 1023, -126);
    return std::bit_cast<double>(static_cast<std::uint64_t>(e - 7 + 1023) << 52);
  } else {
    E const x = static_cast<E>(a);
    // The next E above x is x's bits plus one where x is finite and not negative (the largest
    // finite value's is infinity, as nextafter gives); the check runs this once per element of
    // every moved tensor, where nextafter, a library call, took a quarter of a check's time.
    using bits = std::conditional_t<sizeof(E) == 4, std::uint32_t, std::uint64_t>;
    if (!(x < std::numeric_limits<E>::infinity()))
      return static_cast<double>(std::nextafter(x, std::numeric_limits<E>::infinity()) - x);
    return static_cast<double>(std::bit_cast<E>(std::bit_cast<bits>(x) + 1) - x);
  }
}

/// One tensor the forward writes and the backward may read, with its float forward values and
/// its float64 forward values.
struct saved_values {
  std::string name;
  /// Sets every element to its float value moved by max(one ulp, |float - float64|), up or down
  /// at random (the directions drawn from `pattern`; `flip` moves each the other way); values
  /// the float forward computed exactly (equal to the float64 forward's: a max, a copy) and
  /// non-finite ones stay.
  std::function<void(std::uint64_t pattern, bool flip)> jitter;
  /// Puts the float forward's values back.
  std::function<void()> restore;
};

/// What a tensor the backward must leave as it found it held (an input, an output or another
/// tensor of the forward, a cotangent): the checker computes its references from them after the
/// backward has run, and runs the backward again on them.
struct kept_contents {
  /// Where t differs bitwise from what was kept, the first element and its values (empty: it does
  /// not); and the kept values put back.
  std::function<std::string()> check_and_restore;
};

/// Keeps the contents of t; `what` names it in the message ("input 'x'").
template <class E>
kept_contents keep_contents(std::string what, tensor<E> t) {
  auto kept = std::make_shared<std::vector<E>>();
  bool const dense = t.is_contiguous();
  if (dense) {
    if (t.numel() > 0)
      kept->assign(t.data(), t.data() + t.numel());
  } else {
    kept->reserve(static_cast<std::size_t>(t.numel()));
    for (std::int64_t i = 0; i < t.numel(); ++i)
      kept->push_back(t.data()[t.row_major_offset(i)]);
  }
  return {[t, kept, dense, what = std::move(what)]() -> std::string {
    if (dense && (kept->empty() || std::memcmp(static_cast<void const*>(t.data()), kept->data(),
                                               sizeof(E) * kept->size()) == 0))
      return {}; // (the usual case, in one pass; else the element-wise walk finds where)
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      E& now = t.data()[t.row_major_offset(i)];
      E const& was = (*kept)[static_cast<std::size_t>(i)];
      if (std::memcmp(&now, &was, sizeof(E)) == 0)
        continue;
      std::ostringstream os;
      os.precision(7);
      os << what << " at " << t.coordinates(t.row_major_offset(i)) << ": "
         << static_cast<double>(was) << " before, " << static_cast<double>(now) << " after";
      for (std::int64_t j = i; j < t.numel(); ++j)
        t.data()[t.row_major_offset(j)] = (*kept)[static_cast<std::size_t>(j)];
      return os.str();
    }
    return {};
  }};
}

/// Puts the contents t has now back into it, each time it is called; with `zero`, zeroes it.
template <class E>
std::function<void()> contents_of(tensor<E> t, bool zero = false) {
  auto kept = std::make_shared<std::vector<E>>();
  if (!zero) {
    kept->reserve(static_cast<std::size_t>(t.numel()));
    for (std::int64_t i = 0; i < t.numel(); ++i)
      kept->push_back(t.data()[t.row_major_offset(i)]);
  }
  return [t, kept, zero] {
    for (std::int64_t i = 0; i < t.numel(); ++i)
      t.data()[t.row_major_offset(i)] = zero ? E{} : (*kept)[static_cast<std::size_t>(i)];
  };
}

/// The saved values of tensor t (as the float forward left it), whose float64 forward values
/// are `ref`, contiguous in row-major order.
template <class E>
saved_values make_saved_values(std::string name, tensor<E> t, double const* ref) {
  auto const n = t.numel();
  auto kept = std::make_shared<std::vector<E>>();
  auto refs = std::make_shared<std::vector<double>>(ref, ref + n);
  kept->reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    kept->push_back(t.data()[t.row_major_offset(i)]);
  saved_values s;
  s.name = std::move(name);
  s.jitter = [t, kept, refs](std::uint64_t pattern, bool flip) {
    std::mt19937_64 rng(pattern);
    bool const dense = t.is_contiguous();
    E* const data = t.data();
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      auto const at = static_cast<std::size_t>(i);
      double const v = static_cast<double>((*kept)[at]), r = (*refs)[at];
      bool const up = ((rng() & 1) != 0) != flip;
      if (!std::isfinite(v) || !std::isfinite(r) || v == r)
        continue;
      double const e = std::max(ulp_of<E>(v), std::abs(v - r));
      data[dense ? i : t.row_major_offset(i)] = static_cast<E>(up ? v + e : v - e);
    }
  };
  s.restore = [t, kept] {
    for (std::int64_t i = 0; i < t.numel(); ++i)
      t.data()[t.row_major_offset(i)] = (*kept)[static_cast<std::size_t>(i)];
  };
  return s;
}

/// An input of the forward (float values the user gave: exact), for the second look's moves of
/// the inputs: `jitter` sets every element to its value moved by one ulp, up or down at random
/// (non-finite values and zeros stay), as a float backward that recomputes what the forward
/// computed from them (a logsumexp) rounds it.
template <class E>
saved_values make_moved_inputs(std::string name, tensor<E> t) {
  auto const n = t.numel();
  auto kept = std::make_shared<std::vector<E>>();
  kept->reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    kept->push_back(t.data()[t.row_major_offset(i)]);
  saved_values s;
  s.name = std::move(name);
  s.jitter = [t, kept](std::uint64_t pattern, bool flip) {
    std::mt19937_64 rng(pattern);
    bool const dense = t.is_contiguous();
    E* const data = t.data();
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      double const v = static_cast<double>((*kept)[static_cast<std::size_t>(i)]);
      bool const up = ((rng() & 1) != 0) != flip;
      if (!std::isfinite(v) || v == 0)
        continue;
      double const e = ulp_of<E>(v);
      data[dense ? i : t.row_major_offset(i)] = static_cast<E>(up ? v + e : v - e);
    }
  };
  s.restore = [t, kept] {
    for (std::int64_t i = 0; i < t.numel(); ++i)
      t.data()[t.row_major_offset(i)] = (*kept)[static_cast<std::size_t>(i)];
  };
  return s;
}

} // namespace tilegrad::detail

#if TILEGRAD_SEPARATE_COMPILATION // compiled in tilegrad/separate.hpp
namespace tilegrad::detail {
extern template saved_values make_saved_values<float>(std::string, tensor<float>, double const*);
extern template saved_values make_saved_values<double>(std::string, tensor<double>, double const*);
extern template saved_values make_saved_values<bf16>(std::string, tensor<bf16>, double const*);
extern template saved_values make_moved_inputs<float>(std::string, tensor<float>);
extern template saved_values make_moved_inputs<double>(std::string, tensor<double>);
extern template saved_values make_moved_inputs<bf16>(std::string, tensor<bf16>);
extern template kept_contents keep_contents<float>(std::string, tensor<float>);
extern template kept_contents keep_contents<double>(std::string, tensor<double>);
extern template kept_contents keep_contents<bf16>(std::string, tensor<bf16>);
} // namespace tilegrad::detail
#endif
