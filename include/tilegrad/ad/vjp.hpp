// vjp: reference gradients of a whole launch. The same kernel runs with adjoint<T> tensors;
// each program records its tape, seeds the adjoints of what it stored from the output
// cotangents, sweeps its tape backwards and drops it. Programs run in waves; after a wave their
// gradient contributions are added in program order, so gradients are bitwise identical for
// any thread count.
#pragma once

#include "tilegrad/ad/context.hpp"
#include "tilegrad/ad/expr.hpp"
#include "tilegrad/ad/memory.hpp"
#include "tilegrad/ad/reduce.hpp"
#include "tilegrad/ad/tile.hpp"
#include "tilegrad/grid/launch.hpp"
#include "tilegrad/memory/tensor.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace tilegrad {

/// A float tensor of a vjp launch, marked by name: in (gradient wanted), out (with its
/// cotangent), or inout.
template <class T, ad::role R>
struct marked_tensor {
  static constexpr ad::role r = R;
  char const* name;
  tensor<T> t;
  tensor<T const> cotangent;
};

/// in("x", x): the kernel reads x (as a const view); its gradient is wanted.
template <class T>
marked_tensor<T, ad::role::in> in(char const* name, tensor<T const> t) {
  static_assert(std::is_floating_point_v<T>,
                "tilegrad::in: only float tensors have gradients (pass integer tensors as they "
                "are)");
  return {name, tensor<T>(const_cast<T*>(t.data()), t.rank(), t.shape(), t.strides(), name), {}};
}
template <class T>
marked_tensor<T, ad::role::in> in(char const* name, tensor<T> t) {
  return in(name, tensor<T const>(t));
}
template <class T>
marked_tensor<T, ad::role::in> in(char const* name, owned_tensor<T> const& t) {
  return in(name, t.cview());
}
/// out("y", y, dy): the kernel writes y; dy (same shape) is the cotangent of y.
template <class T>
marked_tensor<T, ad::role::out> out(char const* name, tensor<T> t, tensor<T const> cotangent) {
  static_assert(std::is_floating_point_v<T>, "tilegrad::out: only float tensors");
  return {name, t, cotangent};
}
template <class T>
marked_tensor<T, ad::role::out> out(char const* name, owned_tensor<T> const& t,
                                    owned_tensor<T> const& cot) {
  return out(name, t.view(), cot.cview());
}

/// The gradients of a vjp, by tensor name.
template <class T>
class gradients {
public:
  owned_tensor<T> const& operator[](std::string const& name) const {
    auto it = grads_.find(name);
    if (it == grads_.end())
      throw std::out_of_range("tilegrad::vjp: no gradient named '" + name + "' (mark it in)");
    return it->second;
  }
  bool contains(std::string const& name) const { return grads_.count(name) != 0; }
  /// Inputs marked `in` that no program loaded from: usually a tensor captured by the kernel
  /// instead of passed as an argument, whose gradient is then silently zero.
  std::vector<std::string> const& unread() const { return unread_; }
  /// The largest tape of any program, in bytes.
  std::size_t peak_tape_bytes() const { return peak_tape_; }

  std::map<std::string, owned_tensor<T>> grads_;
  std::vector<std::string> unread_;
  std::size_t peak_tape_ = 0;
};

namespace ad {

template <class X>
struct float_of {
  using type = void;
};
template <class T, role R>
struct float_of<marked_tensor<T, R>> {
  using type = T;
};
template <class T>
  requires std::is_floating_point_v<std::remove_const_t<T>>
struct float_of<tensor<T>> {
  using type = std::remove_const_t<T>;
};
template <class T>
  requires std::is_floating_point_v<T>
struct float_of<owned_tensor<T>> {
  using type = T;
};

// The float type of a launch: that of its first float tensor (void if none).
template <class... X>
struct first_float {
  using type = void;
};
template <class X, class... Rest>
struct first_float<X, Rest...> {
  using type = std::conditional_t<!std::is_void_v<typename float_of<X>::type>,
                                  typename float_of<X>::type, typename first_float<Rest...>::type>;
};

template <class X, class T>
void add_entry(X const& x, std::vector<tensor_entry>& entries, std::vector<std::string>& names) {
  using D = std::remove_cvref_t<X>;
  auto push = [&](auto const& t, role r, void const* cot, char const* name) {
    tensor_entry e;
    e.lo = reinterpret_cast<std::byte const*>(t.data());
    e.hi = e.lo + (t.numel() == 0 ? 0 : t.span()) * static_cast<std::int64_t>(sizeof(T));
    e.index = static_cast<int>(entries.size());
    e.r = r;
    e.cotangent = cot;
    e.name = name;
    entries.push_back(e);
    names.emplace_back(name);
  };
  if constexpr (std::is_same_v<typename float_of<D>::type, T>) {
    if constexpr (requires { x.cotangent; }) {
      if (x.r == role::out || x.r == role::inout) {
        if (x.cotangent.rank() != x.t.rank())
          throw std::invalid_argument(std::string("tilegrad::vjp: cotangent of '") + x.name +
                                      "' has rank " + std::to_string(x.cotangent.rank()) +
                                      ", the tensor " + std::to_string(x.t.rank()));
        for (int a = 0; a < x.t.rank(); ++a)
          if (x.cotangent.size(a) != x.t.size(a))
            throw std::invalid_argument(std::string("tilegrad::vjp: cotangent of '") + x.name +
                                        "' has shape " + x.cotangent.shape_string() +
                                        ", the tensor " + x.t.shape_string());
      }
      push(x.t, x.r, x.cotangent.data(), x.name);
    } else if constexpr (requires { x.view(); }) {
      push(x.view(), role::passive, nullptr, x.name());
    } else {
      push(x, role::passive, nullptr, x.name());
    }
  }
}

// The argument the kernel receives in reverse mode.
template <class T, class X>
auto convert_arg(X const& x) {
  using D = std::remove_cvref_t<X>;
  using A = adjoint<T>;
  auto as_adj = []<class E>(tensor<E> const& t) {
    using P = std::conditional_t<std::is_const_v<E>, A const, A>;
    return tensor<P>(reinterpret_cast<P*>(const_cast<std::remove_const_t<E>*>(t.data())),
                     t.rank(), t.shape(), t.strides(), t.name());
  };
  if constexpr (!std::is_same_v<typename float_of<D>::type, T>) {
    return detail::prepare_arg(x); // integer tensors, numbers: as they are
  } else if constexpr (requires { x.cotangent; }) {
    if constexpr (D::r == role::in)
      return as_adj(tensor<T const>(x.t)).named(x.name);
    else
      return as_adj(x.t).named(x.name);
  } else if constexpr (requires { x.view(); }) {
    return as_adj(x.view());
  } else {
    return as_adj(x);
  }
}

} // namespace ad

/// Gradients of the launch `kernel` over `g` with respect to the tensors marked `in`, for the
/// cotangents given with the tensors marked `out`. Unmarked float tensors are passive;
/// integer tensors and numbers pass through.
template <class Kernel, class... Args>
auto vjp(launch_options const& opts, grid g, Kernel&& kernel, Args const&... args) {
  using T = typename ad::first_float<std::remove_cvref_t<Args>...>::type;
  static_assert(std::is_floating_point_v<T>, "tilegrad::vjp: no float tensor among the arguments");

  std::vector<ad::tensor_entry> entries;
  std::vector<std::string> names;
  (ad::add_entry<Args, T>(args, entries, names), ...);
  for (std::size_t i = 0; i < names.size(); ++i)
    for (std::size_t j = i + 1; j < names.size(); ++j)
      if (!names[i].empty() && names[i] == names[j])
        throw std::invalid_argument("tilegrad::vjp: the name '" + names[i] + "' is given twice");
  if (entries.size() > 63) throw std::invalid_argument("tilegrad::vjp: at most 63 float tensors");

  gradients<T> result;
  std::vector<T*> grad_of(entries.size(), nullptr);
  auto make_grad = [&](auto const& x) {
    using D = std::remove_cvref_t<decltype(x)>;
    if constexpr (requires { x.cotangent; } && std::is_same_v<typename ad::float_of<D>::type, T>) {
      if (x.r == ad::role::in || x.r == ad::role::inout) {
        if (!x.t.is_contiguous())
          throw std::invalid_argument(std::string("tilegrad::vjp: '") + x.name +
                                      "' must be contiguous");
        auto [it, ok] = result.grads_.emplace(
            x.name, owned_tensor<T>(x.t.shape().data(), static_cast<std::size_t>(x.t.rank()),
                                    x.name));
        (void)ok;
        for (auto& e : entries)
          if (e.name == x.name) grad_of[static_cast<std::size_t>(e.index)] = it->second.data();
      }
    }
  };
  (make_grad(args), ...);

  auto converted = std::make_tuple(ad::convert_arg<T>(args)...);
  std::int64_t const total = g.size();
  int const threads = opts.num_threads > 0 ? opts.num_threads : 64;
  std::int64_t const wave = std::max<std::int64_t>(64, 4 * threads);
  std::uint64_t reads = 0;
  std::size_t peak = 0;
  std::mutex merge;

  for (std::int64_t w0 = 0; w0 < total; w0 += wave) {
    std::int64_t const n = std::min(wave, total - w0);
    std::vector<std::vector<ad::contribution>> results(static_cast<std::size_t>(n));
    launch(opts, static_cast<int>(n), [&](program const& local) {
      std::int64_t const lin = w0 + local.program_id(0);
      int const x = static_cast<int>(lin % g.dims[0]);
      int const y = static_cast<int>((lin / g.dims[0]) % g.dims[1]);
      int const z = static_cast<int>(lin / (std::int64_t{g.dims[0]} * g.dims[1]));
      program const p({x, y, z}, g.dims);
      detail::program_scope scope(p);
      thread_local ad::program_state state;
      state.reset();
      state.tensors = &entries;
      ad::program_state* saved = ad::current_state();
      ad::current_state() = &state;
      try {
        std::apply([&](auto&... a) { kernel(p, a...); }, converted);
        // Seed: the value stored last at each element of an output receives its cotangent.
        for (auto const& [key, slot] : state.stored) {
          if (!slot) continue;
          int const t = static_cast<int>(key >> 48);
          auto const& e = entries[static_cast<std::size_t>(t)];
          if (e.r != ad::role::out && e.r != ad::role::inout) continue;
          std::int64_t const off = static_cast<std::int64_t>(key & ((std::uint64_t{1} << 48) - 1));
          *static_cast<T*>(slot) += static_cast<T const*>(e.cotangent)[off];
        }
        state.t.sweep();
      } catch (...) {
        ad::current_state() = saved;
        throw;
      }
      ad::current_state() = saved;
      results[static_cast<std::size_t>(local.program_id(0))] = std::move(state.contributions);
      state.contributions.clear();
      std::lock_guard<std::mutex> lock(merge);
      reads |= state.reads;
      peak = std::max(peak, state.t.peak());
    });
    // Program order, element by element: deterministic whatever ran where.
    for (auto const& r : results)
      for (auto const& c : r) grad_of[static_cast<std::size_t>(c.tensor)][c.offset] += static_cast<T>(c.value);
  }
  for (auto const& e : entries)
    if (e.wants_grad() && !(reads & (std::uint64_t{1} << e.index))) result.unread_.emplace_back(e.name);
  result.peak_tape_ = peak;
  return result;
}

template <class Kernel, class... Args>
auto vjp(grid g, Kernel&& kernel, Args const&... args) {
  return vjp(default_options(), g, std::forward<Kernel>(kernel), args...);
}

} // namespace tilegrad
