// adjoint<T>: the element type of a kernel's tensors in reverse mode. In memory it is just a T
// (a tensor<adjoint<float>> views the same floats); what it changes is the type the kernel is
// instantiated with, so that its tiles record onto the program's tape.
#pragma once

#include "tilegrad/core/types.hpp"

#include <type_traits>

namespace tilegrad {

template <class T>
struct adjoint {
  static_assert(std::is_floating_point_v<T>, "tilegrad: adjoint<T> wants float or double");
  using adjoint_tag = void;
  using primal_type = T;
  template <class U>
  using rebind = adjoint<U>; // the same mode at another float width (to<double>, fp64<T>)
  T v{};

  constexpr adjoint() = default;
  template <class U>
    requires std::is_arithmetic_v<U>
  constexpr explicit adjoint(U x) : v(static_cast<T>(x)) {}

  template <class U>
    requires std::is_arithmetic_v<U>
  constexpr explicit operator U() const {
    return static_cast<U>(v);
  }

  // Scalar arithmetic on values only (a lone element outside a tile is not recorded).
  friend constexpr adjoint operator+(adjoint a, adjoint b) { return adjoint(a.v + b.v); }
  friend constexpr adjoint operator-(adjoint a, adjoint b) { return adjoint(a.v - b.v); }
  friend constexpr adjoint operator*(adjoint a, adjoint b) { return adjoint(a.v * b.v); }
  friend constexpr adjoint operator/(adjoint a, adjoint b) { return adjoint(a.v / b.v); }
  friend constexpr adjoint operator-(adjoint a) { return adjoint(-a.v); }
  friend constexpr bool operator==(adjoint a, adjoint b) { return a.v == b.v; }
  friend constexpr auto operator<=>(adjoint a, adjoint b) { return a.v <=> b.v; }
};

static_assert(sizeof(adjoint<float>) == sizeof(float) && alignof(adjoint<float>) == alignof(float));

template <class T>
concept adjoint_scalar = requires { typename std::remove_cvref_t<T>::adjoint_tag; };

/// The number type under T: float for adjoint<float>, T itself otherwise.
template <class T>
struct primal_of {
  using type = T;
};
template <adjoint_scalar T>
struct primal_of<T> {
  using type = typename T::primal_type;
};
template <class T>
using primal_of_t = typename primal_of<std::remove_cv_t<T>>::type;

} // namespace tilegrad
