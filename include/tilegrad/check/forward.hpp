// The forward launch that check_backward and taylor_test run: grid, kernel and arguments, with
// float tensors marked by name as inputs (in), outputs (out) or inputs without a gradient
// (passive), and the copies of those arguments the references run on.
#pragma once

#include "tilegrad/ad/vjp.hpp"
#include "tilegrad/check/gradient_set.hpp"
#include "tilegrad/grid/program.hpp"
#include "tilegrad/memory/tensor.hpp"

#include <deque>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace tilegrad {

/// out("y", y): an output whose cotangent the checker draws (vjp takes it as a third argument).
template <class T>
marked_tensor<T, ad::role::out> out(char const* name, tensor<T> t) {
  static_assert(detail::float_storage_v<T>, "tilegrad::out: only float tensors");
  return {name, t, {}};
}
template <class T>
marked_tensor<T, ad::role::out> out(char const* name, owned_tensor<T> const& t) {
  return out(name, t.view());
}

/// passive("w", w): an input the checker fills with random values, as it does an `in`, but
/// whose gradient is not wanted: a backward that computes only dx is checked with x marked in
/// and w passive, and the reference then computes dx only.
template <class T>
struct passive_tensor {
  char const* name;
  tensor<T const> t;
};
template <class T>
passive_tensor<T> passive(char const* name, tensor<T const> t) {
  static_assert(detail::float_storage_v<T>, "tilegrad::passive: only float tensors");
  return {name, t.named(name)};
}
template <class T>
passive_tensor<T> passive(char const* name, tensor<T> t) {
  return passive(name, tensor<T const>(t));
}
template <class T>
passive_tensor<T> passive(char const* name, owned_tensor<T> const& t) {
  return passive(name, t.cview());
}

/// A launch to check: what forward() returns.
template <class Kernel, class... Args>
struct forward_launch {
  grid g;
  Kernel kernel;
  std::tuple<Args...> args;
};

namespace detail {

template <class X>
struct arg_kind {
  static constexpr bool in = false, out = false, passive = false, float_tensor = false;
  using type = void; // the float type of a float tensor argument
};
template <class T>
struct arg_kind<marked_tensor<T, ad::role::in>> : arg_kind<void> {
  static constexpr bool in = true;
  using type = T;
};
template <class T>
struct arg_kind<marked_tensor<T, ad::role::out>> : arg_kind<void> {
  static constexpr bool out = true;
  using type = T;
};
template <class T>
struct arg_kind<passive_tensor<T>> : arg_kind<void> {
  static constexpr bool passive = true;
  using type = T;
};
template <class E>
requires float_storage_v<std::remove_const_t<E>>
struct arg_kind<tensor<E>> : arg_kind<void> {
  static constexpr bool float_tensor = true;
  using type = std::remove_const_t<E>;
};

/// Calls f on each of a forward's arguments (its tuple), in order.
template <class Args, class F>
void for_each_arg(Args const& args, F&& f) {
  std::apply([&](auto const&... a) { (f(a), ...); }, args);
}

/// The role of a float tensor among a forward's arguments.
enum class float_role { input, output, unmarked, unmarked_written };

/// Calls f(role, name, tensor) on each float tensor of a forward's arguments, in order: inputs
/// (passive ones too), outputs and unmarked float tensors (`unmarked_written` those the forward
/// may write).
template <class Args, class F>
void for_each_float_tensor(Args const& args, F&& f) {
  for_each_arg(args, [&]<class X>(X const& x) {
    using K = arg_kind<X>;
    if constexpr (K::in || K::passive)
      f(float_role::input, std::string(x.name), x.t);
    else if constexpr (K::out)
      f(float_role::output, std::string(x.name), x.t);
    else if constexpr (K::float_tensor)
      f(std::is_const_v<typename X::element_type> ? float_role::unmarked
                                                  : float_role::unmarked_written,
        std::string(x.name()), x);
  });
}

/// An unmarked tensor argument the forward may write (of any element type: a float statistic,
/// an integer counter or lock).
template <class X>
inline constexpr bool unmarked_writable_v = false;
template <class E>
inline constexpr bool unmarked_writable_v<tensor<E>> = !std::is_const_v<E>;

template <class X>
inline constexpr bool is_inout_v = false;
template <class T>
inline constexpr bool is_inout_v<marked_tensor<T, ad::role::inout>> = true;

// Owning tensors are held as const views (launch passes a const owning tensor as one too).
template <class X>
X store_arg(X const& x) {
  return x;
}
template <class T>
tensor<T const> store_arg(owned_tensor<T> const& t) {
  return t.cview();
}

/// The argument as the working-precision kernel takes it.
template <class X>
auto launch_arg(X const& x) {
  using K = arg_kind<X>;
  if constexpr (K::in)
    return tensor<typename K::type const>(x.t).named(x.name);
  else if constexpr (K::out)
    return x.t.named(x.name);
  else if constexpr (K::passive)
    return x.t;
  else
    return x;
}

/// A contiguous copy of a view, converted to U.
template <class U, class E>
owned_tensor<U> copy_as(tensor<E> const& t) {
  owned_tensor<U> c(t.shape().data(), static_cast<std::size_t>(t.rank()), t.name());
  for (std::int64_t i = 0; i < t.numel(); ++i)
    c.data()[i] = static_cast<U>(t.data()[t.row_major_offset(i)]);
  return c;
}

/// The argument re-made on copies of element type U, for a reference: outputs get fresh
/// buffers and the cotangent `cot(name)` returns (an owned_tensor<U>); inputs, passive inputs
/// and unmarked float tensors are copied (so a reference never writes the caller's tensors);
/// integer tensors and numbers pass through. Copies and fresh buffers are laid out as the
/// caller's tensors (laid_out_copy: a forward that takes its strides as numbers reads the same
/// elements), each in one buffer of `keep`, in the order of the arguments.
template <class U, class X, class Cot>
auto rebind(X const& x, std::deque<owned_tensor<U>>& keep, Cot&& cot) {
  using K = arg_kind<X>;
  if constexpr (K::in) {
    return tilegrad::in(x.name, tensor<U const>(laid_out_copy<U>(x.t, keep, x.t.name())));
  } else if constexpr (K::out) {
    std::int64_t const span = x.t.numel() == 0 ? 1 : x.t.span();
    auto& y = keep.emplace_back(&span, std::size_t{1}, x.name);
    return tilegrad::out(x.name,
                         tensor<U>(y.data(), x.t.rank(), x.t.shape(), x.t.strides(), x.name),
                         cot(std::string(x.name)).cview());
  } else if constexpr (K::passive) {
    return tensor<U const>(laid_out_copy<U>(x.t, keep, x.t.name())).named(x.name);
  } else if constexpr (K::float_tensor) {
    tensor<U> const c = laid_out_copy<U>(x, keep, x.name());
    if constexpr (std::is_const_v<typename X::element_type>)
      return tensor<U const>(c);
    else
      return c;
  } else {
    return x;
  }
}

/// The values of a tensor laid out as t in `data` (a copy rebind made), in row-major order.
template <class E>
std::vector<double> row_major_values(tensor<E> const& t, double const* data) {
  std::vector<double> v(static_cast<std::size_t>(t.numel()));
  for (std::int64_t i = 0; i < t.numel(); ++i)
    v[static_cast<std::size_t>(i)] = data[t.row_major_offset(i)];
  return v;
}

} // namespace detail

/// forward(grid, kernel, args...): the launch `launch(grid, kernel, args...)` with its float
/// tensors marked: tg::in("x", x) (gradient wanted), tg::out("y", y) (cotangent drawn by the
/// checker), tg::passive("w", w) (random input, no gradient). Unmarked float tensors keep their
/// values and get no gradient; integer tensors and numbers pass through.
template <class Kernel, class... Args>
auto forward(grid g, Kernel kernel, Args const&... args) {
  static_assert(!(detail::is_inout_v<Args> || ...),
                "tilegrad::forward: check_backward takes no inout tensor (tg::inout is vjp's). Give "
                "the output a buffer of its own, tg::out(\"y\", y), and the input tg::in(\"x\", "
                "x): a backward's gradients are those of the same kernel writing elsewhere");
  return forward_launch<Kernel, decltype(detail::store_arg(args))...>{
      g, kernel, {detail::store_arg(args)...}};
}

} // namespace tilegrad
