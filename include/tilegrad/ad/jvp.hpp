// jvp: forward-mode derivatives of a whole launch. The kernel runs once with dual<T, N> copies of
// the float tensors, whose tangents are the given input tangents (zero for every other tensor);
// the forward values go back to the tensors the kernel may write, and the tangents of the
// tensors marked as outputs come back by name. A launch of bf16 tensors runs on dual<float, N>
// copies, as vjp runs one on adjoint<float> copies: bf16 rounding is differentiated as identity.
#pragma once

#include "tilegrad/ad/aliasing.hpp"
#include "tilegrad/ad/dual.hpp"
#include "tilegrad/core/bf16.hpp"
#include "tilegrad/grid/launch.hpp"
#include "tilegrad/memory/tensor.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace tilegrad {

enum class tangent_role { in, out, inout };

namespace detail {
/// The type of a tangent of a T element, and what T computes in under jvp: float for bf16
/// storage, T itself for float and double.
template <class T>
using tangent_of = std::conditional_t<std::is_same_v<T, bf16>, float, T>;
template <class T>
inline constexpr bool jvp_float_v = std::is_floating_point_v<T> || std::is_same_v<T, bf16>;
} // namespace detail

/// A float tensor of a jvp launch, marked by name, with its N input tangents (none for out).
template <class T, int N, tangent_role R>
struct tangent_tensor {
  static constexpr tangent_role role = R;
  char const* name;
  tensor<T> t;
  std::array<tensor<detail::tangent_of<T> const>, N> u;
};

namespace detail {

// The float tensors jvp turns into dual tensors: views and owning tensors of float, double or
// bf16.
template <class X>
struct float_tensor {
  using type = void;
};
template <class E>
requires jvp_float_v<std::remove_const_t<E>>
struct float_tensor<tensor<E>> {
  using type = std::remove_const_t<E>;
  static constexpr bool writable = !std::is_const_v<E>;
  static tensor<E> view(tensor<E> const& t) { return t; }
};
template <class T>
requires jvp_float_v<T>
struct float_tensor<owned_tensor<T>> {
  using type = T;
  static constexpr bool writable = true;
  static tensor<T> view(owned_tensor<T> const& t) { return t.view(); }
};
template <class T, int N, tangent_role R>
struct float_tensor<tangent_tensor<T, N, R>> {
  using type = T;
  static constexpr bool writable = R != tangent_role::in;
  static tensor<T> view(tangent_tensor<T, N, R> const& t) { return t.t; }
};
template <class X>
using float_tensor_t = typename float_tensor<X>::type;

template <class X, class T = float_tensor_t<X>>
tensor<T> writable_view(X const& x) {
  auto v = float_tensor<X>::view(x);
  return tensor<T>(const_cast<T*>(v.data()), v.rank(), v.shape(), v.strides(), v.name());
}

// The element type of a tensor to mark: float, double or bf16.
template <class X>
struct markable {
  static_assert(!std::is_void_v<float_tensor_t<X>>,
                "tilegrad::tangent_in/out: only float, double and bf16 tensors have tangents "
                "(pass integer tensors as they are)");
  using type = float_tensor_t<X>;
};
template <class X>
using markable_t = typename markable<X>::type;

template <class T, class... U>
std::array<tensor<tangent_of<T> const>, sizeof...(U)> tangent_views(U const&... u) {
  static_assert((std::is_same_v<float_tensor_t<U>, tangent_of<T>> && ...),
                "tilegrad::tangent_in: a tangent is a tensor of the marked tensor's element type "
                "(float for a bf16 tensor)");
  return {float_tensor<U>::view(u)...};
}

} // namespace detail

/// tangent_in("x", x, u): the kernel reads x (as a const view) and x moves along u (a tensor of
/// x's shape; a float tensor for a bf16 x). Several directions at once: tangent_in("x", x, u0, u1,
/// u2) gives direction k the tangent u_k; every marked input of one jvp gives the same number of
/// directions.
template <class X, class... U>
auto tangent_in(char const* name, X const& x, U const&... u) {
  static_assert(sizeof...(U) >= 1, "tilegrad::tangent_in: give x's tangent, one per direction");
  using T = detail::markable_t<X>;
  return tangent_tensor<T, sizeof...(U), tangent_role::in>{name, detail::writable_view(x),
                                                           detail::tangent_views<T>(u...)};
}

/// tangent_out("y", y): the kernel writes y; its tangent comes back by name. Elements the kernel
/// reads before writing them start with zero tangent.
template <class X>
auto tangent_out(char const* name, X const& y) {
  using T = detail::markable_t<X>;
  static_assert(detail::float_tensor<X>::writable,
                "tilegrad::tangent_out: the kernel writes y: pass a mutable tensor");
  return tangent_tensor<T, 0, tangent_role::out>{name, detail::writable_view(y), {}};
}

/// tangent_inout("y", y, u...): the kernel reads and writes y; y starts along u and its tangent
/// comes back by name.
template <class X, class... U>
auto tangent_inout(char const* name, X const& y, U const&... u) {
  static_assert(sizeof...(U) >= 1, "tilegrad::tangent_inout: give y's tangent, one per direction");
  using T = detail::markable_t<X>;
  static_assert(detail::float_tensor<X>::writable,
                "tilegrad::tangent_inout: the kernel writes y: pass a mutable tensor");
  return tangent_tensor<T, sizeof...(U), tangent_role::inout>{name, detail::writable_view(y),
                                                              detail::tangent_views<T>(u...)};
}

/// The output tangents of a jvp, by tensor name and direction.
template <class T>
class tangents {
public:
  /// The tangent of `name` along direction 0.
  owned_tensor<T> const& operator[](std::string const& name) const { return tangent(name, 0); }
  /// The tangent of `name` along direction k.
  owned_tensor<T> const& tangent(std::string const& name, int k) const {
    auto it = t_.find(name);
    if (it == t_.end())
      throw std::out_of_range("tilegrad::jvp: no tangent named '" + name +
                              "' (mark it tangent_out or tangent_inout)");
    if (k < 0 || k >= static_cast<int>(it->second.size()))
      throw std::out_of_range("tilegrad::jvp: direction " + std::to_string(k) + " of '" + name +
                              "': the launch had " + std::to_string(it->second.size()));
    return it->second[static_cast<std::size_t>(k)];
  }
  bool contains(std::string const& name) const { return t_.count(name) != 0; }
  void insert(std::string const& name, std::vector<owned_tensor<T>> directions) {
    t_.emplace(name, std::move(directions));
  }

private:
  std::map<std::string, std::vector<owned_tensor<T>>> t_;
};

namespace detail {

template <class X>
inline constexpr int directions_of = 0;
template <class T, int N, tangent_role R>
inline constexpr int directions_of<tangent_tensor<T, N, R>> = N;

// The directions of a launch: those every marked input gives (1 when none does, 0 when they
// disagree).
template <class... X>
constexpr int launch_directions() {
  int n = 0;
  bool agree = true;
  for (int k : {directions_of<X>..., 0}) {
    if (k == 0)
      continue;
    if (n != 0 && n != k)
      agree = false;
    n = k;
  }
  return !agree ? 0 : n == 0 ? 1 : n;
}

template <class X>
struct marked_type {
  using type = void;
};
template <class T, int N, tangent_role R>
struct marked_type<tangent_tensor<T, N, R>> {
  using type = T;
};

/// The float type of a jvp launch, by vjp's rule (ad::first_float): bf16 when a marked tensor is
/// bf16; else that of the first marked tensor; else that of the first float tensor (void if none).
/// So an unmarked bf16 table before a marked float tensor leaves the launch a float one.
template <class... X>
struct first_float_tensor {
  using marked = typename tilegrad::detail::first_non_void<typename marked_type<X>::type...>::type;
  static constexpr bool bf16_marked =
      (std::is_same_v<typename marked_type<X>::type, bf16> || ... || false);
  using type = std::conditional_t<
      bf16_marked, bf16,
      std::conditional_t<!std::is_void_v<marked>, marked,
                         typename tilegrad::detail::first_non_void<float_tensor_t<X>...>::type>>;
};

template <class A, class B>
void check_same_shape(char const* name, tensor<A> const& t, tensor<B> const& u) {
  if (!t.same_shape(u))
    throw std::invalid_argument(std::string("tilegrad::jvp: the tangent of '") + name +
                                "' has shape " + u.shape_string() + ", the tensor " +
                                t.shape_string());
}

/// The dual copy of one float tensor, laid out as the original (same offsets and strides), so
/// a kernel that indexes with the tensor's strides reads the same elements. The kernel receives
/// its view through the kernel_arg hook of launch.
template <class D, bool Writable>
struct dual_copy {
  std::vector<D> storage;
  tensor<std::conditional_t<Writable, D, D const>> view;

  friend auto kernel_arg(dual_copy const& c) { return c.view; }
};

/// Whether jvp of a launch whose first float tensor is T makes a dual copy of X: X holds T, or X
/// holds float in a launch of bf16 (the float logsumexp beside bf16 attention tensors), as both
/// compute in dual<float> there.
template <class X, class T>
inline constexpr bool dualised_v = std::is_same_v<float_tensor_t<X>, T> ||
                                   (std::is_same_v<T, bf16> &&
                                    std::is_same_v<float_tensor_t<X>, float>);

template <class D, class T, class X>
auto to_dual(X const& x) {
  using P = typename D::primal_type;
  if constexpr (!dualised_v<X, T>) {
    return prepare_arg(x); // integer tensors, numbers, tensors of another float type: as they are
  } else {
    using E = float_tensor_t<X>;
    tensor<E const> const t = float_tensor<X>::view(x);
    std::int64_t const n = t.numel();
    dual_copy<D, float_tensor<X>::writable> c;
    c.storage.resize(static_cast<std::size_t>(n == 0 ? 1 : t.span()), D(0));
    for (std::int64_t i = 0; i < n; ++i) {
      std::int64_t const off = t.row_major_offset(i);
      D& e = c.storage[static_cast<std::size_t>(off)];
      e.v = static_cast<P>(t.data()[off]);
      if constexpr (requires { x.u; })
        for (std::size_t k = 0; k < x.u.size(); ++k)
          e.d[k] = x.u[k].data()[x.u[k].row_major_offset(i)];
    }
    c.view = {c.storage.data(), t.rank(), t.shape(), t.strides(), t.name()};
    if constexpr (requires { x.name; })
      c.view = c.view.named(x.name);
    return c;
  }
}

// After the launch: the values back into a tensor the kernel may write (rounded to bf16 for a bf16
// tensor), and the tangents of a marked output into the result.
template <class D, class T, class X, class C>
void from_dual(X const& x, C const& c, tangents<typename D::primal_type>& result) {
  using P = typename D::primal_type;
  if constexpr (dualised_v<X, T>) {
    if constexpr (float_tensor<X>::writable) {
      using E = float_tensor_t<X>;
      tensor<E> const t = writable_view(x);
      std::int64_t const n = t.numel();
      for (std::int64_t i = 0; i < n; ++i) {
        std::int64_t const off = t.row_major_offset(i);
        t.data()[off] = static_cast<E>(c.storage[static_cast<std::size_t>(off)].v);
      }
      if constexpr (requires { X::role; }) {
        std::vector<owned_tensor<P>> out;
        for (int k = 0; k < D::directions; ++k) {
          owned_tensor<P> o(t.shape().data(), static_cast<std::size_t>(t.rank()), x.name);
          for (std::int64_t i = 0; i < n; ++i)
            o.data()[i] = c.storage[static_cast<std::size_t>(t.row_major_offset(i))].d[k];
          out.push_back(std::move(o));
        }
        result.insert(x.name, std::move(out));
      }
    }
  }
}

} // namespace detail

/// Tangents of the launch `kernel` over `g`: the kernel runs once with dual<T, N> tensors, T the
/// element type of the first float tensor and N the directions its tangent_in / tangent_inout
/// arguments give. Unmarked float tensors of type T are passive (zero tangent); integer
/// tensors, numbers and tensors of another type pass through as they are. Every float tensor
/// the kernel may write receives its forward values. When T is bf16 the kernel runs on
/// dual<float, N> copies of the bf16 and the float tensors (bf16 rounding is differentiated as
/// identity, as in vjp), the tangents are float, and the bf16 tensors the kernel writes receive
/// its float results rounded to bf16.
/// Bounds are checked whatever the build type or options.
/// @throws std::invalid_argument when a tangent's shape differs from its tensor's, a name is
///   given twice, a marked tensor's elements overlap (a broadcast view), or two float tensors
///   share an element while one of them is marked or writable.
template <class Kernel, class... Args>
auto jvp(launch_options const& opts, grid g, Kernel&& kernel, Args const&... args) {
  using T = typename detail::first_float_tensor<Args...>::type;
  static_assert(!std::is_void_v<T>, "tilegrad::jvp: no float tensor among the arguments");
  constexpr int N = detail::launch_directions<Args...>();
  static_assert(N > 0, "tilegrad::jvp: every tangent_in / tangent_inout of one launch must give "
                       "the same number of tangents (directions)");
  using P = detail::tangent_of<T>; // what the kernel computes in
  using D = dual<P, N>;

  std::vector<std::string> names;
  auto check = [&](auto const& x) {
    if constexpr (requires { x.role; }) {
      static_assert(detail::dualised_v<std::remove_cvref_t<decltype(x)>, T>,
                    "tilegrad::jvp: every marked tensor has the launch's float type (or float in "
                    "a launch of bf16 tensors)");
      for (auto const& u : x.u)
        detail::check_same_shape(x.name, x.t, u);
      // Each element gets its own dual: a view whose elements share memory (a stride-0
      // broadcast) would keep one of their tangents for all of them.
      if (x.t.numel() > 0 && !ad::nested_layout(x.t)) {
        std::string strides;
        for (int a = 0; a < x.t.rank(); ++a)
          strides += (a ? ", " : "") + std::to_string(x.t.stride(a));
        throw std::invalid_argument(
            "tilegrad::jvp: tensor '" + std::string(x.name) + "' has strides (" + strides +
            "): its elements overlap or interleave. A tensor with a tangent needs distinct "
            "elements, each axis's stride at least the span of the axes with smaller strides "
            "(pass the tensor itself, not a broadcast view, and broadcast in the kernel).");
      }
      for (auto const& other : names)
        if (other == x.name)
          throw std::invalid_argument("tilegrad::jvp: the name '" + other + "' is given twice");
      names.emplace_back(x.name);
    }
  };
  (check(args), ...);
  // Each float tensor becomes a dual copy of its own: two that share an element (one buffer
  // marked in and passed again as a writable view) would no longer see each other's writes.
  std::vector<ad::memory_ref> refs;
  auto add_ref = [&]<class X>(X const& x) {
    if constexpr (detail::dualised_v<X, T>) {
      auto const v = detail::float_tensor<X>::view(x);
      char const* name = "";
      if constexpr (requires { x.name; })
        name = x.name;
      else
        name = v.name();
      bool marked = false;
      char const* role = "unmarked";
      if constexpr (requires { X::role; }) {
        marked = true;
        role = X::role == tangent_role::in    ? "tangent_in"
               : X::role == tangent_role::out ? "tangent_out"
                                              : "tangent_inout";
      }
      refs.push_back({name, role, reinterpret_cast<std::byte const*>(v.data()),
                      tensor<std::byte const>(reinterpret_cast<std::byte const*>(v.data()),
                                              v.rank(), v.shape(), v.strides(), name),
                      sizeof(detail::float_tensor_t<X>),
                      marked || detail::float_tensor<X>::writable, marked});
    }
  };
  (add_ref(args), ...);
  ad::check_overlaps(refs, "tilegrad::jvp",
                     "Pass a buffer once (tg::tangent_inout for one read and written in place); "
                     "views of one buffer may share it as long as they share no element; a tensor "
                     "read twice, as it is and transposed (tied weights), is passed once, the "
                     "other view made in the kernel from its data and strides.");

  // The caller's marked tensors (and those of which the caller differentiates copies): the kernel
  // reads and writes their copies, so a load of the caller's own elements through a view it
  // captures would carry no tangent, and a write there would change values the launch does not
  // read (access_hooks::watched).
  std::vector<detail::watched_tensor> watched;
  auto add_watched = [&]<class X>(X const& x) {
    if constexpr (requires { X::role; })
      if (x.t.numel() > 0)
        watched.push_back(detail::watched_of(x.name, x.t));
  };
  (add_watched(args), ...);
  watched.insert(watched.end(), detail::watched_originals().begin(),
                 detail::watched_originals().end());
  for (auto& w : watched) {
    w.by = "tilegrad::jvp";
    w.copy = true;
  }

  auto duals = std::make_tuple(detail::to_dual<D, T>(args)...);
  // Bounds are always checked: an access outside a dual copy would be outside its storage.
  launch_options checked_opts = opts;
  checked_opts.check_bounds = true;
  {
    // Each tensor is a copy of its own: an access through a view made from one's data must stay
    // among its elements (access_hooks::confined).
    struct confine {
      bool saved = std::exchange(detail::confine_accesses(), true);
      std::vector<detail::watched_tensor> const* saved_watched;
      explicit confine(std::vector<detail::watched_tensor> const* w)
          : saved_watched(std::exchange(detail::watched_memory(), w)) {}
      ~confine() {
        detail::confine_accesses() = saved;
        detail::watched_memory() = saved_watched;
      }
    } const confined(watched.empty() ? nullptr : &watched);
    std::apply([&](auto const&... a) { launch(checked_opts, g, kernel, a...); }, duals);
  }

  tangents<P> result;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (detail::from_dual<D, T>(args, std::get<I>(duals), result), ...);
  }
  (std::index_sequence_for<Args...>{});
  return result;
}

template <class Kernel, class... Args>
auto jvp(grid g, Kernel&& kernel, Args const&... args) {
  return jvp(default_options(), g, std::forward<Kernel>(kernel), args...);
}

} // namespace tilegrad
