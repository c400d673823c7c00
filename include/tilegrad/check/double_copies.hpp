// What the self-checks of a reference (taylor_test, dot_product_test) run on: a forward()'s
// arguments re-made on float64 copies, a cotangent w drawn for every output and a direction u for
// every input, and a way to start every launch from the tensors as given.
#pragma once

#include "tilegrad/check/forward.hpp"
#include "tilegrad/check/saved.hpp"
#include "tilegrad/memory/checked.hpp"

#include <cstdint>
#include <deque>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace tilegrad::detail {

using cotangent_source = std::function<owned_tensor<double> const&(std::string const&)>;

/// The arguments X... re-made on float64 copies (rebind<double>).
template <class... X>
using double_args_t = std::tuple<decltype(rebind<double>(
    std::declval<X const&>(), std::declval<std::deque<owned_tensor<double>>&>(),
    std::declval<cotangent_source&>()))...>;

template <class Args>
struct double_copies;

/// @post every output (marked out) has a cotangent w and every input (marked in) a direction u,
/// each uniform in [-1, 1), drawn from `gen`: the outputs' as the arguments are met, then the
/// inputs', in argument order. The caller's tensors are read here and left as given by restore().
template <class... X>
struct double_copies<std::tuple<X...>> {
  /// An input: its copy, the offsets of its elements in row-major order, their values as given
  /// (x0) and the direction u.
  struct input {
    std::string name;
    double* x;
    std::vector<std::int64_t> at;
    std::vector<double> x0, u;
  };
  /// An output: its copy and its cotangent (contiguous, row-major).
  struct output {
    std::string name;
    tensor<double const> y;
    owned_tensor<double> const* w;
  };

  // The caller's marked tensors, while the copies live: an access of one through a view the
  // kernel captures throws in the launches on the copies (detail::watched_tensor).
  watching_originals watching;
  std::deque<owned_tensor<double>> keep, cots; // the copies, the cotangents
  double_args_t<X...> args;
  std::vector<input> ins;
  std::vector<output> outs;

  double_copies(std::tuple<X...> const& given, std::mt19937_64& gen)
      : watching(originals_of(given)), args(make_args(given, gen)) {
    std::uniform_real_distribution<double> d(-1, 1);
    std::size_t k = 0;
    std::apply(
        [&](auto const&... a) {
          auto collect = [&]<class A>(A const& x) {
            using K = arg_kind<A>;
            if constexpr (K::in) {
              auto& in = ins.emplace_back();
              in.name = x.name;
              in.x = const_cast<double*>(x.t.data());
              for (std::int64_t i = 0; i < x.t.numel(); ++i) {
                in.at.push_back(x.t.row_major_offset(i));
                in.x0.push_back(in.x[in.at.back()]);
                in.u.push_back(d(gen));
              }
            } else if constexpr (K::out) {
              outs.push_back({x.name, x.t, &cots[k++]});
            } else if constexpr (unmarked_writable_v<A>) {
              // The unmarked tensors the kernel may write: float copies, and the caller's own
              // integer tensors, which launches write in place.
              unmarked.push_back(contents_of(x));
            }
          };
          (collect(a), ...);
        },
        args);
    for (output const& q : outs) {
      auto& v = y0.emplace_back(static_cast<std::size_t>(q.y.numel()));
      for (std::int64_t i = 0; i < q.y.numel(); ++i)
        v[static_cast<std::size_t>(i)] = q.y.data()[q.y.row_major_offset(i)];
    }
  }
  double_copies(double_copies const&) = delete;
  double_copies& operator=(double_copies const&) = delete;

  /// Puts the outputs and the unmarked tensors the kernel may write back as they were given. Every
  /// launch of a self-check starts from them so (a kernel that adds into its output atomically,
  /// or takes its work from a counter, then runs as Triton's host runs it each time), and the
  /// caller's integer tensors end as given.
  void restore() const {
    for (std::size_t j = 0; j < outs.size(); ++j)
      for (std::int64_t i = 0; i < outs[j].y.numel(); ++i)
        const_cast<double*>(outs[j].y.data())[outs[j].y.row_major_offset(i)] =
            y0[j][static_cast<std::size_t>(i)];
    for (auto const& f : unmarked)
      f();
  }

  /// Moves every input to x0 + t u.
  void move_inputs(double t) {
    for (auto& in : ins)
      for (std::size_t i = 0; i < in.x0.size(); ++i)
        in.x[in.at[i]] = in.x0[i] + t * in.u[i];
  }

private:
  std::vector<std::vector<double>> y0;
  std::vector<std::function<void()>> unmarked;

  static std::vector<watched_tensor> originals_of(std::tuple<X...> const& given) {
    std::vector<watched_tensor> w;
    std::apply(
        [&](auto const&... a) {
          auto add = [&]<class A>(A const& x) {
            if constexpr (arg_kind<A>::in || arg_kind<A>::out)
              if (x.t.numel() > 0)
                w.push_back(watched_of(x.name, x.t));
          };
          (add(a), ...);
        },
        given);
    return w;
  }

  double_args_t<X...> make_args(std::tuple<X...> const& given, std::mt19937_64& gen) {
    std::uniform_real_distribution<double> d(-1, 1);
    cotangent_source cot = [&](std::string const&) -> owned_tensor<double> const& {
      return cots.back(); // one per output, drawn just before rebind asks for it
    };
    auto rebind_one = [&](auto const& a) {
      if constexpr (arg_kind<std::remove_cvref_t<decltype(a)>>::out) {
        auto& w =
            cots.emplace_back(a.t.shape().data(), static_cast<std::size_t>(a.t.rank()), a.name);
        for (double& v : w)
          v = d(gen);
      }
      return rebind<double>(a, keep, cot);
    };
    return std::apply([&](auto const&... a) { return double_args_t<X...>{rebind_one(a)...}; },
                      given);
  }
};

} // namespace tilegrad::detail
