// check_backward: runs a hand-written backward on seeded random inputs and cotangents and
// compares its gradients, by name, with the reference gradients vjp computes from the forward
// kernel in float64 (g_ref64) and at the working precision (g_ref32); plus structural checks.
#pragma once

#include "tilegrad/ad/aliasing.hpp"
#include "tilegrad/ad/vjp.hpp"
#include "tilegrad/check/compare.hpp"
#include "tilegrad/check/context.hpp"
#include "tilegrad/check/determinism.hpp"
#include "tilegrad/check/dot_product.hpp"
#include "tilegrad/check/forward.hpp"
#include "tilegrad/check/gradient_set.hpp"
#include "tilegrad/check/options.hpp"
#include "tilegrad/check/report.hpp"
#include "tilegrad/check/saved.hpp"
#include "tilegrad/grid/launch.hpp"
#include "tilegrad/memory/tracking.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace tilegrad {

namespace detail {

// The working dtype of a launch: that of its first marked tensor (in, out, passive), else of its
// first unmarked float tensor.
template <class... X>
struct working_float {
  using type = void;
};
template <class X, class... Rest>
struct working_float<X, Rest...> {
  using K = arg_kind<X>;
  using rest = typename working_float<Rest...>::type;
  using type = std::conditional_t<K::in || K::out || K::passive, typename K::type,
                                  std::conditional_t<std::is_void_v<rest>, typename K::type, rest>>;
};

// Whether an argument fits a launch of working dtype T: marked tensors have T; unmarked float
// tensors T or fp32<T> (the float logsumexp beside a bf16 attention's tensors).
template <class X, class T>
inline constexpr bool fits_working_float = std::is_void_v<typename arg_kind<X>::type> ||
                                           std::is_same_v<typename arg_kind<X>::type, T> ||
                                           (arg_kind<X>::float_tensor &&
                                            std::is_same_v<typename arg_kind<X>::type, fp32<T>>);

template <class T>
struct named_tensor {
  std::string name;
  std::string role;
  tensor<T> t;
  tensor<T const> cotangent = {}; // out("y", y, dy): the given cotangent, else none
  bool given = false;             // an input whose values are kept (check_options::given)
};

// A generator per (seed, stream): the same seed draws the same values for the same tensor.
inline std::mt19937_64 rng_for(unsigned seed, unsigned stream) {
  std::seed_seq seq{seed, stream, 0x7467u};
  return std::mt19937_64(seq);
}

// A value in a message, to 7 significant digits (std::to_string prints 1e-9 as 0.000000).
inline std::string number(double v) {
  std::ostringstream os;
  os.precision(7);
  os << v;
  return os.str();
}

inline std::string coordinates_of(erased_gradient const& g, std::int64_t i) {
  auto c = unravel(i, g.shape, g.rank);
  return tuple_string(c.data(), g.rank);
}

template <class T>
std::vector<double> values_of(owned_tensor<T> const& t) {
  return std::vector<double>(t.begin(), t.end());
}

// The hint for a tensor saved for the backward but marked out is looked for with up to this many
// outputs (every subset of them is tried).
inline constexpr std::size_t max_outputs_for_saved_hint = 8;

/// Whether the hand-written gradients `got`, which mismatch the reference, match it with the
/// cotangents of some outputs set to zero: the backward then ignores those outputs' cotangents,
/// as it does when a statistic saved for it (a logsumexp, a mean, an rstd) is marked out. The
/// reference for a set of outputs is the sum of `part[j]`, the reference gradients for output
/// j's cotangent alone (vjp is linear in the cotangent); the smallest set that matches under the
/// gradients' own tolerances is named, with what to do.
inline std::optional<std::string>
ignored_cotangent_hint(gradient_set const& got,
                       std::vector<std::pair<std::string, tolerance>> const& tols,
                       std::vector<std::string> const& ins, std::vector<std::string> const& outs,
                       std::vector<std::vector<std::vector<double>>> const& part, unsigned seed) {
  std::size_t const n = outs.size();
  if (n < 2 || tols.empty())
    return std::nullopt;
  auto matches = [&](unsigned zeroed) {
    for (auto const& [name, tol] : tols) {
      erased_gradient const* e = got.find(name);
      std::size_t q = 0;
      while (q < ins.size() && ins[q] != name)
        ++q;
      if (!e || q == ins.size())
        return false;
      for (std::size_t i = 0; i < e->values.size(); ++i) {
        double want = 0;
        for (std::size_t j = 0; j < n; ++j)
          if (!(zeroed >> j & 1u))
            want += part[j][q][i];
        if (!(abs_err(e->values[i], want) <= tol.bound(want, static_cast<std::int64_t>(i))))
          return false;
      }
    }
    return true;
  };
  // Fewest outputs first; setting every cotangent to zero is not tried (a zero gradient is no
  // saved statistic's doing).
  for (unsigned size = 1; size < n; ++size)
    for (unsigned zeroed = 1; zeroed < (1u << n) - 1; ++zeroed) {
      if (static_cast<unsigned>(std::popcount(zeroed)) != size || !matches(zeroed))
        continue;
      std::string list, plain;
      for (std::size_t j = 0, k = 0; j < n; ++j)
        if (zeroed >> j & 1u) {
          list += std::string(k == 0 ? "" : k + 1 == size ? " and " : ", ") + "'" + outs[j] + "'";
          ++k;
        }
      bool const one = size == 1;
      std::string const first = outs[static_cast<std::size_t>(std::countr_zero(zeroed))];
      return "seed " + std::to_string(seed) +
             ": the gradients match the reference computed with the cotangent" +
             (one ? " of " : "s of ") + list + " set to zero, so the backward ignores " +
             (one ? "that output's cotangent" : "those outputs' cotangents") +
             ". If the forward stores " + (one ? "it" : "them") +
             " only for the backward to read (a saved statistic: a logsumexp, a mean, an rstd), "
             "pass " +
             (one ? "it" : "them") + " to tg::forward unmarked (the tensor itself, not tg::out(\"" +
             first +
             "\", ...)): no cotangent is drawn then, and the backward reads the float "
             "forward's values from the tensor (docs/checking.md, \"Tensors saved for the "
             "backward\"). If " +
             (one ? "it is a real output" : "they are real outputs") + ", add " +
             (one ? "its cotangent's" : "their cotangents'") + " contribution to the gradients.";
    }
  return std::nullopt;
}

/// The user's backward behind one signature, so that check_backward's body is compiled once per
/// forward launch, not once per backward passed with it (a test passes several).
template <class T>
class backward_ref {
public:
  template <class F>
  explicit backward_ref(F& f)
      : obj_(&f), fn_([](void* o, backward_context<T>& ctx) { (*static_cast<F*>(o))(ctx); }) {}
  void operator()(backward_context<T>& ctx) const { fn_(obj_, ctx); }

private:
  void* obj_;
  void (*fn_)(void*, backward_context<T>&);
};

/// A reference to a callable of one signature (the callable outlives it).
template <class Signature>
class callable_ref;
template <class R, class... A>
class callable_ref<R(A...)> {
public:
  template <class F>
  requires(!std::is_same_v<std::remove_cv_t<F>, callable_ref>)
      callable_ref(F& f) // NOLINT: implicit, as a function pointer converts
      : obj_(&f), fn_([](void* o, A... a) -> R { return (*static_cast<F*>(o))(a...); }) {}
  R operator()(A... a) const { return fn_(obj_, a...); }

private:
  void* obj_;
  R (*fn_)(void*, A...);
};

/// What a float64 reference sweeps: the gradient, |J|^T |w|, |J|^2^T w^2, or the number of terms
/// of each element (ad::magnitude_scope).
enum class sweep { plain, magnitudes, squares, counts, branches };

/// What a float64 jvp of the forward gives the reference's self-check: <J u, w> for the seed's
/// cotangents w, the sum of its terms' magnitudes, and the direction u of each input marked in
/// (row-major).
struct forward_mode_side {
  double value = 0, scale = 0;
  std::vector<std::vector<double>> u;
};

/// What check_backward needs of a forward launch, with the kernel and argument types erased:
/// the checker's body (reports, comparisons, structural checks) then depends on the working
/// dtype only, and is compiled once per dtype, not once per forward kernel.
template <class T>
struct forward_parts {
  std::vector<named_tensor<T>> ins, passives, outs;
  int others = 0;                       // arguments passed through unmarked
  std::vector<ad::memory_ref> unmarked; // unmarked float tensors, for the overlap check
  callable_ref<void()> run_forward;     // the forward, bounds checked
  /// vjp in float64 on copies of the inputs (kept in `keep`) with the cotangents given, or their
  /// magnitude sweep (|J|^T |w|, or |J|^2^T w^2 of squares: sweep)
  callable_ref<gradients<double>(std::vector<owned_tensor<T>> const&,
                                 std::deque<owned_tensor<double>>&, sweep)>
      reference64;
  /// jvp in float64 on copies of the inputs along directions drawn from the seed given, with
  /// the cotangents given (check_options::check_reference)
  callable_ref<forward_mode_side(std::vector<owned_tensor<T>> const&, unsigned)> reference_jvp64;
  /// vjp at the working precision fp32<T>, or its sweep (sweep::branches: where its branches go)
  callable_ref<gradients<fp32<T>>(std::vector<owned_tensor<T>> const&,
                                  std::deque<owned_tensor<fp32<T>>>&, sweep)>
      reference32;
  /// the tensors the forward writes that the backward may read, with their float64 values
  callable_ref<std::vector<saved_values>(std::deque<owned_tensor<double>> const&)> saved_of;
  /// the float tensors the forward reads (marked in, and passive), each to be moved by an ulp
  callable_ref<std::vector<saved_values>()> inputs_of;
  /// the contents of every float tensor of the forward, which a backward must leave as they are
  callable_ref<std::vector<kept_contents>()> keep_all;
  /// where the float forward left NaN or Inf in a tensor it writes, as a problem (empty: none)
  callable_ref<std::string()> nonfinite_written;
};

template <class T>
check_report check_backward_core(grid const& g, forward_parts<T>& f, backward_ref<T> backward,
                                 check_options const& o);

template <class Kernel, class... Args, class T>
check_report check_backward_impl(forward_launch<Kernel, Args...> const& fwd,
                                 backward_ref<T> backward, check_options const& o);

} // namespace detail

/// Checks `backward` against the reference gradients of the forward launch `fwd` (see
/// forward()). `backward(ctx)` gets a backward_context<T> and either returns a gradient_set or
/// fills ctx.set_gradient(name, g); it must hand back one gradient per tensor marked in, of the
/// working dtype (for bf16 tensors: bf16, float or double) and the input's shape. The checker
/// overwrites the inputs (in and passive) with seeded random values and the outputs with the
/// forward's results. Each run of the forward starts with the outputs zeroed and the unmarked
/// tensors it may write as they were given.
///
/// The forward, the references and every launch the backward makes (from the calling thread)
/// check bounds whatever checked() says; the backward's launches are also checked for races
/// between their programs (reported, not thrown: the launch runs to its end), and their writes
/// are traced, so that the determinism check excuses what only the order of atomic_add explains.
///
/// With bf16 tensors the kernel runs as it will in use (bf16 storage, float compute); the inputs
/// and cotangents are drawn and rounded to bf16, and the references run the same kernel on
/// float and double copies of them: bf16 rounding is differentiated as identity.
template <class Kernel, class... Args, class Backward>
check_report check_backward(forward_launch<Kernel, Args...> const& fwd, Backward&& backward,
                            check_options const& o = {}) {
  using T = typename detail::working_float<Args...>::type;
  static_assert(detail::float_storage_v<T>,
                "tilegrad::check_backward: mark the float tensors of the forward with in / out");
  static_assert((detail::fits_working_float<Args, T> && ...),
                "tilegrad::check_backward: every marked tensor of the forward must have the same "
                "element type, and an unmarked float tensor that type or its compute type "
                "(float beside bf16)");
  using result_t = std::invoke_result_t<Backward&, backward_context<T>&>;
  static_assert(std::is_void_v<result_t> || std::is_convertible_v<result_t, gradient_set>,
                "tilegrad::check_backward: the backward returns a tilegrad::gradient_set or "
                "nothing (and fills ctx.set_gradient)");
  auto call = [&](backward_context<T>& ctx) {
    if constexpr (std::is_void_v<result_t>) {
      backward(ctx);
    } else {
      gradient_set g = backward(ctx);
      ctx.gradients().merge(g);
    }
  };
  return detail::check_backward_impl(fwd, detail::backward_ref<T>(call), o);
}

namespace detail {

template <class Kernel, class... Args, class T>
check_report check_backward_impl(forward_launch<Kernel, Args...> const& fwd,
                                 backward_ref<T> backward, check_options const& o) {
  std::vector<detail::named_tensor<T>> ins, passives, outs;
  int others = 0;
  detail::for_each_arg(fwd.args, [&]<class X>(X const& x) {
    using K = detail::arg_kind<X>;
    if constexpr (K::in)
      ins.push_back({x.name, "in", x.t});
    else if constexpr (K::out)
      outs.push_back({x.name, "out", x.t, x.cotangent});
    else if constexpr (K::passive)
      passives.push_back({x.name, "passive",
                          tensor<T>(const_cast<T*>(x.t.data()), x.t.rank(), x.t.shape(),
                                    x.t.strides(), x.name)});
    else
      ++others;
  });

  // The caller's marked tensors: the references differentiate copies of them, so an access of
  // one through a view the kernel captures throws there (detail::watched_tensor).
  std::vector<detail::watched_tensor> originals;
  for (auto const* list : {&ins, &outs})
    for (auto const& x : *list)
      if (x.t.numel() > 0)
        originals.push_back(detail::watched_of(x.name, x.t));

  // Unmarked float tensors, for the overlap check (marked ones are added by the core).
  std::vector<ad::memory_ref> unmarked;
  detail::for_each_arg(fwd.args, [&]<class X>(X const& x) {
    if constexpr (detail::arg_kind<X>::float_tensor) {
      auto const* lo = reinterpret_cast<std::byte const*>(x.data());
      unmarked.push_back(
          {x.name(), "unmarked", lo,
           tensor<std::byte const>(lo, x.rank(), x.shape(), x.strides(), x.name()), sizeof(T),
           !std::is_const_v<typename X::element_type>, false});
    }
  });

  // What the forward writes, as every run of it starts: outputs zeroed (as in the references),
  // and the unmarked tensors it may write, integer ones too, as the caller gave them. A forward
  // that adds into them atomically, or counts tickets in them, then finds the same on every seed
  // and in every reference.
  std::vector<std::function<void()>> zero_outputs, unmarked_initial;
  detail::for_each_arg(fwd.args, [&]<class X>(X const& x) {
    if constexpr (detail::arg_kind<X>::out)
      zero_outputs.push_back(detail::contents_of(x.t, true));
    else if constexpr (detail::unmarked_writable_v<X>)
      unmarked_initial.push_back(detail::contents_of(x));
  });
  // The unmarked tensors the forward may write put back as the caller gave them, for the scope's
  // lifetime; then what they held before.
  struct unmarked_as_given {
    std::vector<std::function<void()>> now;
    unmarked_as_given(std::vector<std::function<void()>> const& initial,
                      forward_launch<Kernel, Args...> const& fwd) {
      detail::for_each_arg(fwd.args, [&]<class X>(X const& x) {
        if constexpr (detail::unmarked_writable_v<X>)
          now.push_back(detail::contents_of(x));
      });
      for (auto const& f : initial)
        f();
    }
    ~unmarked_as_given() {
      for (auto const& f : now)
        f();
    }
  };

  // The forward, bounds checked whatever checked() says: an access outside is a message, not a
  // crash.
  auto run_forward = [&] {
    for (auto const& f : zero_outputs)
      f();
    for (auto const& f : unmarked_initial)
      f();
    launch_options checked_launch = o.launch;
    checked_launch.check_bounds = true;
    std::apply(
        [&](auto const&... a) {
          launch(checked_launch, fwd.g, fwd.kernel, detail::launch_arg(a)...);
        },
        fwd.args);
  };
  // Output `name`'s cotangent among `copies`, one per output in the order of `outs`.
  auto cotangent_named = [&]<class U>(std::deque<owned_tensor<U>> const& copies,
                                      std::string const& name) -> owned_tensor<U> const& {
    for (std::size_t j = 0; j < outs.size(); ++j)
      if (outs[j].name == name)
        return copies[j];
    return copies.front(); // unreachable: every out has a cotangent
  };
  // vjp of the forward on copies of the inputs in U, with the cotangents `cots` (taken by their
  // magnitudes for the |J|^T |w| sweep, squared for the |J|^2^T w^2 one, as 1 where nonzero for
  // the count of terms); `keep` holds the copies.
  auto reference = [&]<class U>(std::vector<owned_tensor<T>> const& cots,
                                std::deque<owned_tensor<U>>& keep, sweep kind = sweep::plain) {
    unmarked_as_given const as_given(unmarked_initial, fwd); // the float forward's put back after
    detail::watching_originals const watching(originals);
    static constexpr detail::float64_run run{"check_backward's float64 reference"};
    detail::float64_reference_scope const float64(std::is_same_v<U, double> ? &run : nullptr);
    std::deque<owned_tensor<U>> cot_copies;
    for (auto const& c : cots) {
      cot_copies.push_back(detail::copy_as<U>(c.cview()));
      if (kind != sweep::plain)
        for (U& v : cot_copies.back())
          v = kind == sweep::squares                             ? v * v
              : kind == sweep::counts || kind == sweep::branches ? U(v != U(0) ? 1 : 0)
                                                                 : std::abs(v);
    }
    auto cot = [&](std::string const& name) -> owned_tensor<U> const& {
      return cotangent_named(cot_copies, name);
    };
    auto args = std::apply(
        // Braces: the copies are made (and `keep` filled) in the order of the arguments.
        [&](auto const&... a) { return std::tuple{detail::rebind<U>(a, keep, cot)...}; }, fwd.args);
    std::optional<ad::magnitude_scope> scope;
    if (kind != sweep::plain)
      scope.emplace(true, kind == sweep::squares    ? ad::magnitude_kind::squares
                          : kind == sweep::counts   ? ad::magnitude_kind::counts
                          : kind == sweep::branches ? ad::magnitude_kind::branches
                                                    : ad::magnitude_kind::absolute);
    return std::apply([&](auto const&... a) { return vjp(o.launch, fwd.g, fwd.kernel, a...); },
                      args);
  };
  // jvp of the forward in float64 on copies of the inputs, along a direction u drawn from
  // `seed` (uniform in [-1, 1) per element of each input marked in), and <J u, w> for the
  // cotangents `cots`: forward mode's side of the reference's dot-product test.
  auto reference_jvp64 = [&](std::vector<owned_tensor<T>> const& cots, unsigned seed) {
    unmarked_as_given const as_given(unmarked_initial, fwd);
    detail::watching_originals const watching(originals);
    static constexpr detail::float64_run run{"check_backward's float64 reference (jvp)"};
    detail::float64_reference_scope const float64(&run);
    std::deque<owned_tensor<double>> keep, cot_copies, us;
    for (auto const& c : cots)
      cot_copies.push_back(detail::copy_as<double>(c.cview()));
    auto cot = [&](std::string const& name) -> owned_tensor<double> const& {
      return cotangent_named(cot_copies, name);
    };
    auto args = std::apply(
        [&](auto const&... a) { return std::tuple{detail::rebind<double>(a, keep, cot)...}; },
        fwd.args);
    std::mt19937_64 gen(detail::mix64(std::uint64_t{seed} << 8 | 0x51u));
    std::uniform_real_distribution<double> d(-1, 1);
    forward_mode_side side;
    auto const tangents = std::apply(
        [&](auto const&... a) {
          auto arg = [&]<class X>(X const& x) {
            owned_tensor<double> const* u = nullptr;
            if constexpr (detail::arg_kind<X>::in) {
              auto& t = us.emplace_back(x.t.shape().data(), static_cast<std::size_t>(x.t.rank()));
              for (double& v : t)
                v = d(gen);
              side.u.emplace_back(t.begin(), t.end());
              u = &t;
            }
            return detail::tangent_arg(x, u);
          };
          // (braces: the directions are drawn in the order of the arguments)
          return std::apply([&](auto&&... b) { return jvp(o.launch, fwd.g, fwd.kernel, b...); },
                            std::tuple{arg(a)...});
        },
        args);
    for (std::size_t j = 0; j < outs.size(); ++j) {
      auto const& jw = tangents[outs[j].name];
      for (std::int64_t i = 0; i < jw.numel(); ++i) {
        double const term = jw.data()[i] * cot_copies[j].data()[i];
        side.value += term;
        side.scale += std::abs(term);
      }
    }
    return side;
  };
  // The tensors the forward writes that the backward may read: its outputs and the unmarked
  // tensors it writes (a logsumexp, a mean, an rstd), with their float64 forward values, which
  // the float64 reference left in `keep` (one copy per float tensor argument, in order).
  auto saved_of = [&](std::deque<owned_tensor<double>> const& keep) {
    std::vector<detail::saved_values> saved;
    std::size_t k = 0;
    detail::for_each_arg(fwd.args, [&]<class X>(X const& x) {
      using K = detail::arg_kind<X>;
      if constexpr (K::out)
        saved.push_back(detail::make_saved_values(
            x.name, x.t, detail::row_major_values(x.t, keep[k].data()).data()));
      else if constexpr (K::float_tensor) {
        if constexpr (!std::is_const_v<typename X::element_type>)
          saved.push_back(detail::make_saved_values(
              x.name(), x, detail::row_major_values(x, keep[k].data()).data()));
      }
      if constexpr (K::in || K::out || K::passive || K::float_tensor)
        ++k;
    });
    return saved;
  };
  // The float tensors the forward reads (marked in, and passive): the user's values, which the
  // second look moves by an ulp each, as a float backward that recomputes from them rounds.
  auto inputs_of = [&] {
    std::vector<detail::saved_values> moved;
    detail::for_each_arg(fwd.args, [&]<class X>(X const& x) {
      using K = detail::arg_kind<X>;
      if constexpr (K::in || K::passive) {
        using M = std::remove_const_t<typename decltype(x.t)::element_type>;
        moved.push_back(detail::make_moved_inputs(
            x.name, tensor<M>(const_cast<M*>(x.t.data()), x.t.rank(), x.t.shape(), x.t.strides(),
                              x.t.name())));
      }
    });
    return moved;
  };
  // The contents of every float tensor of the forward, as the backward is about to find them.
  auto keep_all = [&] {
    std::vector<detail::kept_contents> kept;
    auto keep = [&]<class E>(std::string what, tensor<E> const& t) {
      using M = std::remove_const_t<E>;
      kept.push_back(
          detail::keep_contents(std::move(what), tensor<M>(const_cast<M*>(t.data()), t.rank(),
                                                           t.shape(), t.strides(), t.name())));
    };
    detail::for_each_float_tensor(fwd.args, [&](detail::float_role r, std::string const& name,
                                                auto const& t) {
      if (r == detail::float_role::input)
        keep("input '" + name + "'", t);
      else if (r == detail::float_role::output)
        keep("output '" + name + "' of the forward", t);
      else
        keep(name.empty() ? std::string("an unmarked tensor of the forward")
                          : "unmarked tensor '" + name + "' of the forward",
             t);
    });
    return kept;
  };
  // The first tensor the forward writes that holds NaN or Inf, where and how many.
  auto nonfinite_written = [&]() -> std::string {
    std::string found;
    auto scan = [&]<class E>(std::string const& what, tensor<E> const& t) {
      if (!found.empty())
        return;
      std::int64_t count = 0, first = -1, nans = 0;
      for (std::int64_t i = 0; i < t.numel(); ++i) {
        double const v = static_cast<double>(t.data()[t.row_major_offset(i)]);
        nans += std::isnan(v);
        if (!std::isfinite(v) && count++ == 0)
          first = i;
      }
      std::string const at = count ? t.coordinates(t.row_major_offset(first)) : "";
      if (nans)
        found = "the forward's " + what + " holds " + std::to_string(count) +
                " NaN/Inf element(s), the first at " + at + " (on this seed's inputs), " +
                std::to_string(nans) +
                " of them NaN: the references and the gradients are then NaN too. Guard what "
                "makes them (a where around a log or a division; in an online softmax, a row "
                "whose every key is masked, where m stays -inf)";
      else if (count)
        found = "the forward's " + what + " holds " + std::to_string(count) +
                " infinite element(s), the first at " + at +
                " (on this seed's inputs): fine where they are meant (a logsumexp of -inf for a "
                "row with no key), but a backward that takes exp or a difference of them makes "
                "NaN unless it guards them";
    };
    detail::for_each_float_tensor(fwd.args, [&](detail::float_role r, std::string const& name,
                                                auto const& t) {
      if (r == detail::float_role::output)
        scan("output '" + name + "'", t);
      else if (r == detail::float_role::unmarked_written)
        scan(name.empty() ? std::string("unmarked tensor") : "unmarked tensor '" + name + "'", t);
    });
    return found;
  };
  auto reference64 = [&](std::vector<owned_tensor<T>> const& cots,
                         std::deque<owned_tensor<double>>& keep,
                         sweep kind) { return reference(cots, keep, kind); };
  auto reference32 = [&](std::vector<owned_tensor<T>> const& cots,
                         std::deque<owned_tensor<fp32<T>>>& keep,
                         sweep kind) { return reference(cots, keep, kind); };
  // Copies: `reference` reads `outs`.
  forward_parts<T> parts{ins,
                         passives,
                         outs,
                         others,
                         std::move(unmarked),
                         run_forward,
                         reference64,
                         reference_jvp64,
                         reference32,
                         saved_of,
                         inputs_of,
                         keep_all,
                         nonfinite_written};
  return check_backward_core(fwd.g, parts, backward, o);
}

template <class T>
check_report check_backward_core(grid const& g, forward_parts<T>& f, backward_ref<T> backward,
                                 check_options const& o) {
  dtype_rules dtype = rules_for<T>();
  constexpr bool storage = std::is_same_v<T, bf16>; // the references compute in wider types
  using W = fp32<T>;                                // the working precision of the compute
  pass_rule const rule = o.rule.value_or(dtype.rule);

  check_report rep;
  auto& ins = f.ins;
  auto& passives = f.passives;
  auto& outs = f.outs;
  std::int64_t most_elements = 0;
  for (auto const* group : {&ins, &passives, &outs})
    for (auto const& n : *group) {
      most_elements = std::max(most_elements, n.t.numel());
      for (int a = 0; a < n.t.rank(); ++a)
        dtype.longest_axis = std::max(dtype.longest_axis, n.t.size(a));
    }
  // The most terms a sum into one element of gradient q may count: the longest axis, or the most
  // elements of a tensor per element of q (a bias summed over (B, N) rows of a (B, N, D) tensor).
  // Each element's own count, the number of terms of its sum, comes from a sweep that counts them
  // where it can matter: where 3 sqrt(n) u' may exceed k u.
  std::vector<std::int64_t> most_terms;
  bool terms_may_matter = false;
  for (auto const& n : ins) {
    std::int64_t const per = n.t.numel() > 0 ? (most_elements + n.t.numel() - 1) / n.t.numel() : 0;
    most_terms.push_back(std::max(dtype.longest_axis, per));
    terms_may_matter =
        terms_may_matter || tolerance::sequence_factor *
                                    std::sqrt(static_cast<double>(most_terms.back())) *
                                    dtype.compute_unit >
                                o.k_bound.value_or(dtype.k_bound) * dtype.eps / 2;
  }
  auto const refs = storage ? " on copies of the bfloat16 inputs and cotangents (the same "
                              "kernel; bf16 rounding differentiated as identity)"
                            : "";
  if (storage && o.bf16_partial_sums.value_or(false))
    dtype.squares = false; // sums kept in bf16: the running error bound
  auto const error_bound_rule = [&] {
    std::ostringstream r;
    r.precision(3);
    r << "|g - g_ref64| <= k * u * ("
      << (dtype.squares ? "|g_ref64| + sqrt(|J|^2^T w^2)" : "|J|^T |w|")
      << ") elementwise, k = max(" << o.k_bound.value_or(dtype.k_bound) << ", " << o.k
      << " * the units g_ref32 is off by at worst), u = 2^" << std::ilogb(dtype.eps) - 1
      << " (the unit roundoff of " << dtype.name << "); "
      << (dtype.squares
              ? "|J|^2^T w^2: vjp of the forward in float64 with every partial and cotangent "
                "squared, the sum of the squares of each gradient's terms (one rounding of the "
                "result, and a random walk of one rounding per term)"
              : "|J|^T |w|: vjp of the forward in float64 with every partial and cotangent "
                "taken by its magnitude (a running error bound's weights)")
      << "; g_ref64, g_ref32: vjp in float64 and " << dtype_name<W>() << refs;
    if (o.floor_abs)
      r << "; + " << o.floor_abs;
    return r.str();
  };
  int const others = f.others;
  {
    std::ostringstream os;
    os << "grid (" << g.dims[0];
    for (int a = 1; a < g.rank; ++a)
      os << ", " << g.dims[a];
    os << ")";
    for (auto const* group : {&ins, &passives, &outs})
      for (auto const& n : *group)
        os << "; " << n.role << " " << n.name << " " << dtype_name<T>() << " " << n.t.shape_string()
           << (std::count(o.given.begin(), o.given.end(), n.name) || n.cotangent.data() ? " given"
                                                                                        : "");
    if (others)
      os << "; " << others << " more argument(s) passed through";
    rep.launch = os.str();
    os.str("");
    os.precision(3);
    if (rule == pass_rule::error_bound) {
      os << error_bound_rule();
    } else if (rule == pass_rule::baseline) {
      os << "max|g - g_ref64| <= k * max|g_ref32 - g_ref64| + floor, k = " << o.k
         << ", floor = " << o.floor_ulps << " * eps(" << dtype.name << ") * max|g_ref64|"
         << (o.floor_abs ? " + " + std::to_string(o.floor_abs) : std::string())
         << "; g_ref64, g_ref32: vjp of the forward in float64 and " << dtype_name<W>() << refs
         << "; max|g_ref32 - g_ref64| at least the seeds' largest relative one * max|g_ref64|";
      if (storage)
        rep.warnings.push_back(
            "the baseline rule with bfloat16 tensors: g_ref32 rounds nothing to bfloat16, so "
            "k * max|g_ref32 - g_ref64| is float32 round-off and the floor alone bounds the "
            "kernel's bf16 roundings (error_bound is bfloat16's default)");
    } else if (rule == pass_rule::normwise) {
      auto t = make_tolerance(o, dtype, {}, {});
      os << "max|g - g_ref64| <= rtol * max|g_ref64| + atol, rtol = ";
      if (o.rtol)
        os << t.rtol;
      else
        os << dtype_rules::normwise_units << " * 2^" << std::ilogb(dtype.eps) - 1 << " = " << t.rtol
           << " (2^" << std::ilogb(dtype.eps) - 1 << ": the unit roundoff of " << dtype.name << ")";
      os << ", atol = " << t.atol << "; g_ref64: vjp of the forward in float64" << refs;
    } else {
      auto t = make_tolerance(o, dtype, {}, {});
      os << "|g - g_ref64| <= atol + rtol * |g_ref64| elementwise, atol = " << t.atol
         << ", rtol = " << t.rtol << "; g_ref64: vjp of the forward in float64" << refs;
    }
    rep.rule = os.str();
  }
  std::vector<std::string> names;
  for (auto const* group : {&ins, &passives, &outs})
    for (auto const& n : *group) {
      for (auto const& m : names)
        if (m == n.name)
          rep.warnings.push_back("the name '" + n.name + "' is given twice");
      names.push_back(n.name);
    }
  {
    // Given values: names that are inputs, cotangents of the outputs' shapes; options that
    // would check nothing or could not draw a map.
    std::string bad;
    if (o.seeds < 1)
      bad = "check_options::seeds is " + std::to_string(o.seeds) + ": nothing would be checked";
    else if (o.map_rows < 1 || o.map_cols < 1 || o.worst < 0)
      bad = "check_options::map_rows, map_cols must be at least 1 and worst at least 0 (they are " +
            std::to_string(o.map_rows) + ", " + std::to_string(o.map_cols) + ", " +
            std::to_string(o.worst) + ")";
    // Tolerances must be numbers of 0 or more: a negative one failed every element and blamed
    // the backward (a correct one read as "not linear in the cotangent").
    auto const tolerance = [&](char const* name, std::optional<double> v) {
      if (bad.empty() && v && !(*v >= 0))
        bad = std::string("check_options::") + name + " is " + detail::number(*v) +
              ": a tolerance is a number of 0 or more";
    };
    tolerance("k_bound", o.k_bound);
    tolerance("scale_units", o.scale_units);
    tolerance("k_saved", o.k_saved);
    tolerance("k", o.k);
    tolerance("floor_ulps", o.floor_ulps);
    tolerance("floor_abs", o.floor_abs);
    tolerance("atol", o.atol);
    tolerance("rtol", o.rtol);
    tolerance("reference_tolerance", o.reference_tolerance);
    for (auto const& g : o.given) {
      bool found = false;
      for (auto* group : {&ins, &passives})
        for (auto& n : *group)
          if (n.name == g)
            found = n.given = true;
      bool const output =
          std::any_of(outs.begin(), outs.end(), [&](auto const& n) { return n.name == g; });
      if (!found)
        bad =
            "check_options::given names '" + g + "', which is no tensor marked in or passive" +
            (output ? " (an output's cotangent is given as out(\"" + g + "\", y, dy) in forward())"
                    : "");
    }
    for (auto const& n : outs)
      if (n.cotangent.data() && !n.t.same_shape(n.cotangent))
        bad = "the cotangent given for '" + n.name + "' has shape " + n.cotangent.shape_string() +
              ", the output " + n.t.shape_string();
    if (!bad.empty()) {
      seed_report& sr = rep.seeds.emplace_back();
      sr.seed = o.first_seed;
      sr.problems.push_back(bad);
      return rep;
    }
  }
  {
    // Tensors that share elements (an in-place forward marked in and out) fail before anything
    // runs: the references run on separate copies and could not see it.
    std::vector<ad::memory_ref> refs;
    auto ref = [&](char const* name, char const* role, auto const& t, bool tracked, bool distinct) {
      auto const* lo = reinterpret_cast<std::byte const*>(t.data());
      refs.push_back({name, role, lo,
                      tensor<std::byte const>(lo, t.rank(), t.shape(), t.strides(), name),
                      sizeof(T), tracked, distinct});
    };
    for (auto const* group : {&ins, &passives, &outs})
      for (auto const& n : *group) {
        bool const marked = n.role != "passive";
        ref(n.name.c_str(), n.role.c_str(), n.t, marked, marked);
      }
    refs.insert(refs.end(), f.unmarked.begin(), f.unmarked.end());
    try {
      ad::check_overlaps(refs, "tilegrad::check_backward",
                         "Where an output shares memory with an input (an in-place kernel), "
                         "give the forward an output buffer of its own: the gradients of an "
                         "in-place kernel are those of the same kernel writing elsewhere, as "
                         "long as no program reads what another writes. Where two inputs share "
                         "it (tied weights: a tensor and its transposed view), pass the tensor "
                         "once and make the other view in the kernel from its data and strides: "
                         "each input's gradient is taken with the others held, which one buffer "
                         "cannot do.");
    } catch (std::invalid_argument const& e) {
      seed_report& sr = rep.seeds.emplace_back();
      sr.seed = o.first_seed;
      sr.problems.push_back(e.what());
      return rep;
    }
  }
  if (ins.empty())
    rep.warnings.push_back("no tensor is marked in: there is nothing to check");
  if (outs.empty())
    rep.warnings.push_back("no tensor is marked out: every gradient is zero");
  auto role_of = [&](std::string const& name) -> std::string {
    for (auto const* group : {&ins, &passives, &outs})
      for (auto const& n : *group)
        if (n.name == name)
          return n.role;
    return "";
  };

  auto named_views = [](auto const& v) {
    typename backward_context<T>::named out;
    for (auto const& n : v) { // an unnamed tensor takes its mark's name, for error messages
      tensor<T const> t(n.t);
      out.emplace_back(n.name, *t.name() ? t : t.named(n.name.c_str()));
    }
    return out;
  };
  auto inputs_named = named_views(ins);
  for (auto& p : named_views(passives))
    inputs_named.push_back(p);
  auto const outputs_named = named_views(outs);
  // The cotangents' names in error messages (an output and its cotangent are told apart).
  std::vector<std::string> cotangent_names;
  for (auto const& n : outs)
    cotangent_names.push_back("cotangent of " + n.name);

  // The bands of rows the error_bound rule takes k over, per input marked in.
  auto bands_of = [&](std::size_t q) {
    auto const& t = ins[q].t;
    return row_bands(t.numel(), t.rank() ? t.size(t.rank() - 1) : 1, o.k_bands, 512);
  };

  // What each seed produced; compared once every seed has run.
  struct pending {
    std::size_t seed_index = 0;
    gradient_set got;
    std::vector<std::vector<double>> ref64, ref32, mag; // per input marked in
    std::vector<std::vector<double>> terms;             // terms per element, or empty: not swept
    bool one_term = false; // where not swept, one term per element (the count was not needed)
    std::vector<std::vector<double>> saved;  // second look: per input marked in, or empty
    // second look: per input marked in, how far the moves shifted the gradient's fitted scale
    // error (gradient_report::scale_error), or empty
    std::vector<double> scale_moved;
    std::vector<std::vector<double>> explained; // first look's jittered reference, or empty
    // per input marked in, where the fp32 reference took other branches (error_units), or empty
    std::vector<std::vector<char>> flips;
    std::optional<gradient_set> zero, twice; // first seed: scaled cotangents
    detail::launch_observer first_launches, twice_launches; // ... and what their launches wrote
    std::string forward_nonfinite; // the float forward's NaN or Inf, as a problem (empty: none)
    std::vector<std::pair<std::string, tolerance>> tols; // per gradient compared
  };
  std::vector<pending> later;
  auto explained_of = [](pending const& pd, std::size_t q) -> std::vector<double> const* {
    return q < pd.explained.size() && !pd.explained[q].empty() ? &pd.explained[q] : nullptr;
  };
  auto flips_of = [](pending const& pd, std::size_t q) -> std::vector<char> const* {
    return q < pd.flips.size() && !pd.flips[q].empty() ? &pd.flips[q] : nullptr;
  };
  auto terms_of = [](pending const& pd, std::size_t q) -> std::vector<double> const* {
    return q < pd.terms.size() && !pd.terms[q].empty() ? &pd.terms[q] : nullptr;
  };
  auto most_terms_of = [&](pending const& pd, std::size_t q) -> std::int64_t {
    return pd.one_term && !terms_of(pd, q) ? 1 : most_terms[q];
  };
  // The first look's bound on each element of gradient q: this seed's alone (the final one,
  // pooled over the seeds, is no smaller), before the second look.
  auto first_look_tolerance = [&](pending const& pd, std::size_t q) {
    return make_tolerance(o, dtype, pd.ref64[q], pd.ref32[q], 0, &pd.mag[q], nullptr, nullptr,
                          bands_of(q), explained_of(pd, q), terms_of(pd, q), most_terms_of(pd, q),
                          flips_of(pd, q));
  };
  auto first_look_bounds = [&](pending const& pd, std::size_t q) {
    auto const t = first_look_tolerance(pd, q);
    std::vector<double> bounds(pd.ref64[q].size());
    for (std::size_t i = 0; i < bounds.size(); ++i)
      bounds[i] = t.bound(pd.ref64[q][i], static_cast<std::int64_t>(i));
    return bounds;
  };
  // Whether an element of `got` is over this seed's bound.
  auto over_bound = [&](gradient_set const& got, pending const& pd) {
    for (std::size_t q = 0; q < ins.size(); ++q) {
      erased_gradient const* e = got.find(ins[q].name);
      if (!e || pd.mag[q].empty() || e->values.size() != pd.ref64[q].size())
        continue;
      auto const t = first_look_tolerance(pd, q);
      for (std::size_t i = 0; i < e->values.size(); ++i) {
        auto const at = static_cast<std::int64_t>(i);
        if (!(t.error(e->values[i], pd.ref64[q][i], at) <= t.bound(pd.ref64[q][i], at)))
          return true;
      }
    }
    return false;
  };
  // check_options::scale_units as it applies (0: off).
  double const scale_limit =
      rule == pass_rule::error_bound ? o.scale_units.value_or(dtype.squares ? 0.1 : 0.25) : 0.0;
  // Whether a gradient of `got` is off along its reference all over, by this seed's bounds (the
  // second look then measures how far the forward's roundings move that fit).
  auto off_along = [&](gradient_set const& got, pending const& pd) {
    for (std::size_t q = 0; q < ins.size() && scale_limit > 0; ++q) {
      erased_gradient const* e = got.find(ins[q].name);
      if (!e || pd.mag[q].empty() || e->values.size() != pd.ref64[q].size())
        continue;
      std::vector<double> const bounds = first_look_bounds(pd, q);
      gradient_report fit;
      detail::fit_scale(
          e->values, pd.ref64[q],
          [&](std::int64_t i) { return bounds[static_cast<std::size_t>(i)]; }, fit,
          e->dtype == "bfloat16" ? scale_limit : 0);
      // (bf16: a fit past two unit roundoffs is judged whatever its share of the bounds: compare.)
      bool const past =
          e->dtype == "bfloat16" && !o.scale_units && std::abs(fit.scale_error) > dtype.eps;
      if ((fit.scale_units > scale_limit || past) && fit.scale_z > scale_agreement)
        return true;
    }
    return false;
  };
  // The number of terms of each element's sum, from a float64 sweep that counts them (the paths
  // from a nonzero cotangent along which every partial is nonzero): 1 for an elementwise gradient
  // or a lookup in a long table, whatever the shapes of the tensors, n for a sum of n terms. A sum
  // in sequence rounds once per term at the size of its partial sums, however unequal the terms:
  // after a few large terms, thousands of small ones each round at the size of the large ones (the
  // first keys of causal attention's dv). An effective number, (sum |t|)^2 / sum t^2, counted those
  // sums as a few terms, and a correct FlashAttention backward failed at N = 8192. Counted only
  // where the seed has an element over its bound with every count 1 (the final bound, pooled over
  // the seeds, is no smaller, and larger counts only widen it): the sweep is one more float64 vjp.
  auto count_terms = [&](pending& pd, std::vector<owned_tensor<T>> const& cots) {
    std::optional<gradients<double>> counts;
    try {
      std::deque<owned_tensor<double>> keep;
      counts.emplace(f.reference64(cots, keep, sweep::counts));
    } catch (std::exception const&) {
      return false; // (the other references ran: the same forward does not throw here)
    }
    for (std::size_t q = 0; q < ins.size(); ++q) {
      auto const n = detail::values_of((*counts)[ins[q].name]);
      auto& terms = pd.terms[q];
      double const most = static_cast<double>(most_terms[q]);
      terms.assign(pd.mag[q].size(), 1.0);
      for (std::size_t i = 0; i < terms.size() && i < n.size(); ++i)
        if (std::isfinite(n[i]))
          terms[i] = std::clamp(n[i], 1.0, most);
    }
    return true;
  };

  // Inputs and cotangents of a seed, drawn per tensor so that a tensor's values depend on the
  // seed and its place only: the inputs are written into the tensors, the cotangents returned.
  auto draw = [&](unsigned seed) {
    unsigned stream = 0;
    input_generator const gen = o.inputs ? o.inputs : uniform(-1, 1);
    for (auto const* group : {&ins, &passives})
      for (auto const& n : *group) {
        auto rng = detail::rng_for(seed, stream++);
        if (n.given)
          continue;
        for (std::int64_t i = 0; i < n.t.numel(); ++i)
          n.t.data()[n.t.row_major_offset(i)] = static_cast<T>(gen(n.name, rng));
      }
    std::vector<owned_tensor<T>> cots;
    for (auto const& n : outs) {
      auto& c = cots.emplace_back(n.t.shape().data(), static_cast<std::size_t>(n.t.rank()),
                                  n.name.c_str());
      auto rng = detail::rng_for(seed, 1000 + stream++);
      std::uniform_real_distribution<double> d(-1, 1);
      if (n.cotangent.data())
        for (std::int64_t i = 0; i < c.numel(); ++i)
          c.data()[i] = n.cotangent.data()[n.cotangent.row_major_offset(i)];
      else
        for (T& v : c)
          v = static_cast<T>(d(rng));
    }
    return cots;
  };

  // The reference against forward mode (check_options::check_reference): <J u, w> from a float64
  // jvp, <u, J^T w> from the float64 reference's gradients g64. They add the same terms in
  // another order, so they agree to round-off; a derivative rule or a memory semantic (a masked
  // lane, a reload, an atomic) that reverse mode gets wrong in this kernel shows as a difference
  // of the size of its error (dot_product_test). Round-off is that of every product summed inside
  // both sides, not only of their final terms: where the gradient is 0 by cancellation (a bias
  // that softmax's shift invariance cancels), both sides are rounding noise as large as their
  // terms. So the difference is judged against sum |u| * |J|^T |w| too, the size of the whole
  // computation: `mag`, the error_bound rule's magnitude sweep, or swept here only where the terms
  // alone do not cover the difference (and where every term is 0).
  auto check_reference = [&](seed_report& sr, std::vector<owned_tensor<T>> const& cots,
                             gradients<double> const& g64, gradients<double> const* mag) {
    std::optional<forward_mode_side> fm;
    try {
      fm.emplace(f.reference_jvp64(cots, sr.seed));
    } catch (std::exception const& e) {
      sr.problems.push_back(
          std::string("the reference's check against forward mode (jvp of the forward) threw: ") +
          e.what());
      return;
    }
    double reverse = 0, terms = fm->scale;
    for (std::size_t q = 0; q < ins.size() && q < fm->u.size(); ++q) {
      auto const gq = detail::values_of(g64[ins[q].name]);
      for (std::size_t i = 0; i < gq.size() && i < fm->u[q].size(); ++i) {
        double const term = gq[i] * fm->u[q][i];
        reverse += term;
        terms += std::abs(term);
      }
    }
    double const diff = std::abs(fm->value - reverse);
    bool const finite = std::isfinite(fm->value) && std::isfinite(reverse);
    // sum |u| * |J|^T |w| (finite elements), or -1: not swept
    double magnitude = -1;
    std::optional<gradients<double>> swept;
    if (!mag && finite && !(diff <= o.reference_tolerance * terms && terms > 0)) {
      try {
        std::deque<owned_tensor<double>> keep;
        swept.emplace(f.reference64(cots, keep, sweep::magnitudes));
        mag = &*swept;
      } catch (std::exception const&) {
        // (the other references ran: the same forward does not throw here)
      }
    }
    if (mag) {
      magnitude = 0;
      for (std::size_t q = 0; q < ins.size() && q < fm->u.size(); ++q) {
        auto const mq = detail::values_of((*mag)[ins[q].name]);
        for (std::size_t i = 0; i < mq.size() && i < fm->u[q].size(); ++i)
          if (std::isfinite(mq[i]))
            magnitude += std::abs(fm->u[q][i]) * mq[i];
      }
    }
    double const scale = terms + std::max(magnitude, 0.0), bound = o.reference_tolerance * scale;
    // The terms' magnitudes where they cover the difference (the line as it reads for most
    // kernels), else the whole computation's.
    bool const by_terms = (terms > 0 && diff <= o.reference_tolerance * terms) || magnitude < 0;
    char measure[240], alone[60] = "";
    if (terms > 0)
      std::snprintf(alone, sizeof alone, "; %.3g of their terms' alone", diff / terms);
    if (by_terms)
      std::snprintf(measure, sizeof measure, "%.3g of their terms' magnitudes apart", diff / terms);
    else
      std::snprintf(measure, sizeof measure,
                    "%.3g of the computation's magnitude apart (their terms' magnitudes plus sum "
                    "|u| * |J|^T |w|, the sizes of the products summed inside them%s)",
                    diff / scale, alone);
    char text[600];
    if (!finite) {
      std::snprintf(text, sizeof text,
                    "not checked against forward mode: <J u, w> = %g (jvp), <u, J^T w> = %g "
                    "(vjp), not finite",
                    fm->value, reverse);
    } else if (scale == 0) {
      std::snprintf(text, sizeof text,
                    "not checked against forward mode: every term of <J u, w> and <u, J^T w> "
                    "is 0");
    } else {
      std::snprintf(text, sizeof text,
                    "%s (float64, seed %u, a random direction u of the inputs marked in): "
                    "<J u, w> = %.17g (jvp), <u, J^T w> = %.17g (vjp), %s (at most %g)",
                    diff <= bound ? "agrees with forward mode" : "DISAGREES with forward mode",
                    sr.seed, fm->value, reverse, measure, o.reference_tolerance);
      if (!(diff <= bound)) {
        char problem[600];
        std::snprintf(problem, sizeof problem,
                      "the reference is wrong: reverse mode (vjp) and forward mode (jvp) of the "
                      "forward differ by %.3g of %s along a random direction, where they add the "
                      "same terms (at most %g)",
                      diff / scale,
                      by_terms ? "their terms' magnitudes" : "the computation's magnitude",
                      o.reference_tolerance);
        sr.problems.push_back(problem);
        rep.hints.push_back(
            "the reference gradients themselves are off (see 'reference:' above), so the "
            "comparisons with them say nothing: a derivative rule or a memory semantic that "
            "tilegrad's reverse mode gets wrong in this kernel, or a kernel that computes "
            "differently per scalar type (if constexpr on T). tg::dot_product_test runs the same "
            "check alone; please report the kernel");
      }
    }
    rep.reference = text;
  };

  // bf16 tensors in which the backward keeps sums, as (launch, argument): seen on the first seed.
  std::vector<std::pair<std::size_t, int>> kept_sums;
  // Two gradients handed back over one memory (the first pair found), and their names.
  std::string shared_message;
  std::pair<std::string, std::string> shared_names;
  std::vector<double> kept_widened(ins.size(), 0); // the most each gradient's bound was widened
  // Widens each gradient's weights (|g_ref64| + sqrt(s)) by how far its elements move, in units
  // of u times them, when every bf16 value the backward stores into kept_sums moves by a unit in
  // the last place: the root mean square over the elements and two runs (jittered(0), (1)), each
  // with its own directions, where above 1. (A rounding error is at most half a unit, a third of
  // one in root mean square: the move is larger than what the roundings lose, and measured on the
  // kernel's own sums.)
  auto widen_for_kept_sums = [&](pending& pd, gradient_set const& got, auto&& jittered) {
    double const u = dtype.eps / 2;
    std::vector<double> sum(ins.size(), 0.0);
    std::vector<std::int64_t> count(ins.size(), 0);
    for (int way = 0; way < 2; ++way) {
      gradient_set const moved = jittered(way);
      for (std::size_t q = 0; q < ins.size(); ++q) {
        erased_gradient const* a = got.find(ins[q].name);
        erased_gradient const* b = moved.find(ins[q].name);
        if (!a || !b || a->values.size() != pd.mag[q].size() ||
            b->values.size() != a->values.size())
          continue;
        for (std::size_t i = 0; i < a->values.size(); ++i)
          if (pd.mag[q][i] > 0 && std::isfinite(a->values[i]) && std::isfinite(b->values[i])) {
            double const r = std::abs(b->values[i] - a->values[i]) / (u * pd.mag[q][i]);
            sum[q] += r * r;
            ++count[q];
          }
      }
    }
    for (std::size_t q = 0; q < ins.size(); ++q) {
      double const widen = count[q] ? std::sqrt(sum[q] / static_cast<double>(count[q])) : 0;
      kept_widened[q] = std::max(kept_widened[q], widen);
      if (widen > 1)
        for (double& m : pd.mag[q])
          m *= widen;
    }
  };
  // The locks the backward's launches took and gave back, launch by launch: from the run after
  // the first on, each program's first try at one of them finds it held (a spin lock that does
  // not wait races then; launch_tracker, "Locks found held").
  std::vector<std::vector<detail::known_lock_site>> known_locks;
  bool probing_locks = false; // the run is the probe of locks
  for (int si = 0; si < o.seeds; ++si) {
    unsigned const seed = o.first_seed + static_cast<unsigned>(si);
    seed_report& sr = rep.seeds.emplace_back();
    sr.seed = seed;

    std::vector<owned_tensor<T>> const cots = draw(seed);
    try {
      f.run_forward();
    } catch (std::exception const& e) {
      sr.problems.push_back(std::string("the forward threw: ") + e.what());
      continue;
    }
    std::string const forward_nonfinite = f.nonfinite_written();

    // The user's backward, on given cotangents. Every launch it makes is tracked: bounds are
    // checked and races kept (in `launches`) rather than thrown, so the launch runs to its end.
    // What it handed over is kept even when it threw.
    struct backward_run {
      gradient_set got;
      std::optional<std::string> error;
      detail::launch_observer launches;
    };
    // Every tensor it is given is kept and compared after it ran: a backward that writes into an
    // input, an output of the forward or a cotangent fails (the references are computed from them
    // afterwards, and the backward runs again on them), and what it wrote is put back.
    // (`jitter`: bf16 values stored into kept_sums moved by a unit in the last place, that seed.)
    auto run_backward = [&](std::vector<owned_tensor<T>> const& c, std::uint64_t jitter = 0,
                            bool reverse = false) {
      std::vector<detail::kept_contents> kept = f.keep_all();
      for (std::size_t j = 0; j < c.size(); ++j)
        kept.push_back(
            detail::keep_contents("the cotangent of '" + outs[j].name + "'", c[j].view()));
      backward_run r;
      typename backward_context<T>::named cn;
      for (std::size_t j = 0; j < outs.size(); ++j)
        cn.emplace_back(outs[j].name, c[j].cview().named(cotangent_names[j].c_str()));
      backward_context<T> ctx(inputs_named, outputs_named, cn, seed, o.launch);
      r.launches.bf16_jitter = jitter;
      if (jitter)
        r.launches.jitter_targets = kept_sums;
      r.launches.known_locks = known_locks;
      r.launches.probe_locks = probing_locks;
      r.launches.reverse_order = reverse;
      {
        detail::observer_scope const tracked(&r.launches);
        try {
          backward(ctx);
        } catch (std::exception const& e) {
          r.error = e.what();
        } catch (...) {
          r.error = "an exception not derived from std::exception";
        }
      }
      known_locks = r.launches.known_locks;
      r.got = std::move(ctx.gradients());
      for (auto& k : kept)
        if (std::string const at = k.check_and_restore(); !at.empty()) {
          std::string const msg =
              "the backward wrote into " + at +
              " (put back): the checker computes the references from the forward's tensors and "
              "the cotangents after the backward has run, and runs it again on them; a backward "
              "must leave them as it found them (write into a copy)";
          if (std::find(sr.problems.begin(), sr.problems.end(), msg) == sr.problems.end())
            sr.problems.push_back(msg);
        }
      return r;
    };
    // The second look (error_bound), where an element is over this seed's bound: the backward
    // runs once more as it is and four times more with the values it reads from the forward
    // moved by their rounding errors, in two patterns of directions drawn at random, each run
    // both ways (values the float forward computed exactly stay); how far each gradient element
    // moves, the larger over the patterns, may be added k_saved times to its bound, where the
    // plain rerun reproduced it.
    auto second_look = [&](gradient_set const& got, pending const& pd,
                           std::deque<owned_tensor<double>> const& keep,
                           std::vector<double>& scale_moved) {
      std::vector<std::vector<double>> moved;
      scale_moved.assign(ins.size(), 0.0);
      // The reference's own sensitivity to roundings that do not cancel (ad/jitter.hpp): how far
      // the float64 reference moves when each value its forward computes is read, by each
      // operation that reads it, moved by a random fraction of its rounding error (a backward
      // recomputes scores q k^T with roundings of its own, which the saved logsumexp does not
      // share). Two draws; an element may move by the larger. Each draw runs again with the
      // moves halved: a move a rounding makes halves with it, and an element whose move does not
      // (a comparison of two computed values that the moves flip, a branch taken the other way)
      // is allowed nothing.
      std::vector<std::vector<double>> recomputed(ins.size());
      auto jittered_reference = [&](std::uint64_t r, double scale) {
        std::deque<owned_tensor<double>> keep_j;
        ad::jitter_scope const jittering(
            {(std::uint64_t{seed} << 8 | r) * 0x9e3779b97f4a7c15ull | 1,
             static_cast<double>(std::numeric_limits<W>::epsilon()) / 2, scale});
        return f.reference64(cots, keep_j, sweep::plain);
      };
      for (std::uint64_t r = 1; r <= (o.jitter_reference ? 2 : 0); ++r) {
        std::optional<gradients<double>> full, half;
        try {
          full.emplace(jittered_reference(r, 1.0));
          half.emplace(jittered_reference(r, 0.5));
        } catch (std::exception const&) {
          break;
        }
        for (std::size_t q = 0; q < ins.size(); ++q)
          detail::halving_moves(pd.ref64[q], detail::values_of((*full)[ins[q].name]),
                                detail::values_of((*half)[ins[q].name]), recomputed[q]);
      }
      moved = recomputed;
      auto saved = f.saved_of(keep);
      auto inputs = o.move_inputs ? f.inputs_of() : std::vector<detail::saved_values>{};
      if (saved.empty() && inputs.empty())
        return moved;
      // A plain rerun first: where the backward does not reproduce its own first run within the
      // first look's bound (memory it never initialised, an accumulator it never zeroes), a move
      // under the jitter says nothing of the forward's roundings, and allows nothing there.
      backward_run base = run_backward(cots);
      if (base.error)
        return moved;
      std::vector<std::vector<char>> unstable(ins.size());
      std::vector<std::vector<double>> first_bound(ins.size());
      for (std::size_t q = 0; q < ins.size(); ++q) {
        erased_gradient const* e = got.find(ins[q].name);
        erased_gradient const* e0 = base.got.find(ins[q].name);
        if (!e || pd.mag[q].empty() || e->values.size() != pd.ref64[q].size())
          continue;
        unstable[q].assign(e->values.size(), 1);
        first_bound[q] = first_look_bounds(pd, q);
        if (!e0 || e0->values.size() != e->values.size())
          continue;
        for (std::size_t i = 0; i < e->values.size(); ++i)
          unstable[q][i] = !(detail::abs_err(e0->values[i], e->values[i]) <= first_bound[q][i]);
      }
      // Two patterns of directions, each run both ways; an element may move by the larger of the
      // two patterns. What roundings move changes sign with the moves, by about as much either
      // way; a comparison the moves flip does not (a backward that picks the maximum by comparing
      // a recomputed score with the saved one bitwise loses the pick whichever way the saved
      // value moves; one that compares with >= loses it one way only). Where a pattern's two runs
      // move an element well past the first look's bound (4 times), they count only if they move
      // it opposite ways, and by no more than twice the smaller move.
      // The saved values first, then the inputs (each moved by an ulp: a backward that recomputes
      // a logsumexp from them rounds it, and exp(x - lse) carries that rounding, |lse| u, where
      // the reference's exp(x - max) rounds nothing; CheckerEdges.ACrossEntropyBackward...).
      // An error in a run leaves what the moves before it allowed.
      // Moves of the inputs by an ulp may round what the backward recomputes from them (its
      // logsumexp) across a float, one way and not the other: a step, not a flip of a comparison,
      // when it moves the element by a small part of its value (at most 2^-10 of it), which is
      // allowed even when the two ways do not move it opposite ways.
      // The first two patterns allow all three kinds of move; any after them only steps (they
      // look for roundings across a float that the first two missed, and must not widen what
      // larger moves allow: with eight patterns in full, bf16 gradients 3 % off passed).
      auto moves_of = [&](std::vector<detail::saved_values>& set, std::uint64_t stream,
                          double step_part, int patterns) {
        auto rng = detail::rng_for(seed, stream);
        for (int r = 0; r < patterns; ++r) {
          bool const steps_only = r >= 2;
          std::uint64_t const pattern = rng();
          std::optional<backward_run> runs[2];
          for (int way = 0; way < 2; ++way) {
            for (auto& s : set)
              s.jitter(pattern, way == 1);
            runs[way].emplace(run_backward(cots));
            for (auto& s : set)
              s.restore();
            if (runs[way]->error)
              return false;
          }
          for (std::size_t q = 0; q < ins.size(); ++q) {
            erased_gradient const* e = got.find(ins[q].name);
            erased_gradient const* up = runs[0]->got.find(ins[q].name);
            erased_gradient const* down = runs[1]->got.find(ins[q].name);
            if (!e || !up || !down || up->values.size() != e->values.size() ||
                down->values.size() != e->values.size())
              continue;
            moved[q].resize(e->values.size(), 0.0);
            // The whole gradient's fit along the reference moves with such roundings too (a
            // saved value all elements read, rounded to bf16): by as much, the fit may be off.
            double const s0 = steps_only ? 0.0 : detail::scale_error_of(e->values, pd.ref64[q]);
            for (auto const* run : {up, down}) {
              if (steps_only)
                break;
              if (double const s = detail::scale_error_of(run->values, pd.ref64[q]);
                  std::isfinite(s) && std::isfinite(s0))
                scale_moved[q] = std::max(scale_moved[q], std::abs(s - s0));
            }
            for (std::size_t i = 0; i < e->values.size(); ++i) {
              double const d1 = up->values[i] - e->values[i], d2 = down->values[i] - e->values[i];
              // A NaN after the move allows nothing, nor does an element the rerun did not keep.
              if (!std::isfinite(d1) || !std::isfinite(d2) || i >= unstable[q].size() ||
                  unstable[q][i])
                continue;
              double const hi = std::max(std::abs(d1), std::abs(d2));
              double const lo = std::min(std::abs(d1), std::abs(d2));
              bool const opposite = (d1 < 0 && d2 > 0) || (d1 > 0 && d2 < 0);
              double const step = step_part * std::abs(pd.ref64[q][i]);
              // (A step is allowed whichever way the other run moved it: a recomputed
              // logsumexp that rounds across a float one way moves the element by the step, the
              // other way by next to nothing, of either sign.)
              double const allowed = steps_only                    ? (hi <= step ? hi : 0.0)
                                     : hi <= 4 * first_bound[q][i] ? hi
                                     : hi <= step                  ? hi
                                     : opposite                    ? std::min(hi, 2 * lo)
                                                                   : 0.0;
              moved[q][i] = std::max(moved[q][i], allowed);
            }
          }
        }
        return true;
      };
      if (!saved.empty() && !moves_of(saved, 3000, 0.0, 2))
        return recomputed;
      if (!inputs.empty()) {
        std::vector<std::vector<double>> const before = moved;
        // Eight patterns: a row's recomputed logsumexp rounds across a float in a run only now
        // and then (ulp moves of random signs move it by a fraction of an ulp), and each row needs
        // one such run (a softmax backward that recomputes it, logits in [100, 200): 4 of 6
        // seeds failed with two patterns, none with eight).
        if (!moves_of(inputs, 3001, 0x1p-10, 8))
          return before;
      }
      return moved;
    };
    // The first look's k: how many units of u |J|^T |w| the fp32 reference is off by, per band.
    // Where that raises k past 8 k_bound, part of the fp32 reference's error may come from values
    // the forward computes that |J|^T |w| takes as exact (an angle pos * freq that sin and cos
    // read, scores that exp reads): the float64 reference runs again with each of them read moved
    // by its whole rounding error, up or down at random (ad/jitter.hpp), and again at half the
    // moves. Where an element's move halves (a rounding's does; a comparison the moves flip
    // does not), what of the fp32 reference's error it explains raises k no further than 8
    // k_bound, and the element may be off by k times that move. (The largest of an element's
    // units over a band sets its k, and an element where |J|^T |w| nearly vanishes but such a
    // rounding does not made k, and the bound of every element of the band, tens of thousands of
    // times what the kernel is off by.)
    // Where the fp32 reference's units raise k past 8 k_bound, part of its error may be branches
    // it took otherwise than the float64 one (a relu at a pre-activation that rounds to 0, a
    // maximum whose largest candidates tie only after rounding): off by a whole term there, it
    // raised k to tens of millions for the band and let any bug in it pass. The terms of each
    // element's gradient are counted in both precisions, each marked by the branches it takes
    // (ad::branches_sweep); where the counts differ, the element took another branch (error_units).
    // Whether the fp32 reference's raw units raise k past 8 k_bound somewhere (the first look's
    // references below run only then).
    auto raises_past_cap = [&](pending const& pd) {
      double const cap = explained_units_cap(o, dtype);
      for (std::size_t q = 0; q < ins.size(); ++q)
        if (!pd.mag[q].empty())
          for (double u : detail::error_units(pd.ref32[q], pd.ref64[q], pd.mag[q], dtype.eps / 2,
                                              bands_of(q), dtype.eps / 2 * dtype.min_normal))
            if (u > cap)
              return true;
      return false;
    };
    auto find_flips = [&](pending const& pd) {
      std::vector<std::vector<char>> flips;
      if (!raises_past_cap(pd))
        return flips;
      std::optional<gradients<double>> c64;
      std::optional<gradients<W>> c32;
      try {
        std::deque<owned_tensor<double>> keep;
        c64.emplace(f.reference64(cots, keep, sweep::branches));
        std::deque<owned_tensor<W>> keep32;
        c32.emplace(f.reference32(cots, keep32, sweep::branches));
      } catch (std::exception const&) {
        return flips;
      }
      flips.resize(ins.size());
      for (std::size_t q = 0; q < ins.size(); ++q) {
        auto const n64 = detail::values_of((*c64)[ins[q].name]);
        auto const n32 = detail::values_of((*c32)[ins[q].name]);
        if (pd.mag[q].empty() || n64.size() != pd.mag[q].size() || n32.size() != n64.size())
          continue;
        flips[q].resize(n64.size());
        for (std::size_t i = 0; i < n64.size(); ++i)
          flips[q][i] = n64[i] != n32[i];
      }
      return flips;
    };
    auto explain = [&](pending const& pd) {
      std::vector<std::vector<double>> moves;
      if (!raises_past_cap(pd))
        return moves;
      auto jittered_reference = [&](double scale) {
        std::deque<owned_tensor<double>> keep_j;
        ad::jitter_scope const jittering(
            {(std::uint64_t{seed} << 8 | 0x80) * 0x9e3779b97f4a7c15ull | 1,
             static_cast<double>(std::numeric_limits<W>::epsilon()) / 2, scale, true});
        return f.reference64(cots, keep_j, sweep::plain);
      };
      std::optional<gradients<double>> full, half;
      try {
        full.emplace(jittered_reference(1.0));
        half.emplace(jittered_reference(0.5));
      } catch (std::exception const&) {
        return moves;
      }
      moves.resize(ins.size());
      for (std::size_t q = 0; q < ins.size(); ++q)
        if (!pd.mag[q].empty())
          detail::halving_moves(pd.ref64[q], detail::values_of((*full)[ins[q].name]),
                                detail::values_of((*half)[ins[q].name]), moves[q]);
      return moves;
    };
    backward_run first = run_backward(cots);
    if (first.error)
      sr.problems.push_back("the backward threw: " + *first.error);
    // bf16 sums the backward keeps in bf16 memory are rounded at every step, at their full size:
    // the random walk of one rounding per term does not cover them (check_options). How far those
    // roundings move each gradient is measured below, on every seed.
    if (si == 0 && dtype.squares && rule == pass_rule::error_bound && !o.bf16_partial_sums)
      if (auto const why = detail::bf16_sums_seen(first.launches, first.got, &kept_sums);
          !why.empty())
        rep.notes.push_back(
            "the backward keeps sums in bf16 memory (" + why +
            "): they are rounded at every step, at their full size, which the random walk of one "
            "rounding per term does not cover; so on every seed the backward runs twice more with "
            "each bf16 value it stores there moved by one unit in the last place, up or down at "
            "random, and each gradient's bound is widened by how far that moves it, in units of "
            "u * (|g_ref64| + sqrt(|J|^2^T w^2)) (the root mean square over its elements, at "
            "least 1). Accumulate in float32 for the tighter bound; .bf16_partial_sums = true "
            "weighs by the running error bound |J|^T |w| instead, false ignores the sums");
    auto races_of = [&](backward_run const& r, std::string const& when) {
      bool any = false;
      for (std::size_t l = 0; l < r.launches.launches.size(); ++l)
        if (auto const& race = r.launches.launches[l].race) {
          auto const& d = r.launches.launches[l].g;
          std::string grid_dims = std::to_string(d.dims[0]);
          for (int a = 1; a < d.rank; ++a)
            grid_dims += ", " + std::to_string(d.dims[static_cast<std::size_t>(a)]);
          // A buffer the backward made without a name is named by its place among the kernel's
          // arguments: where it is handed back as a gradient, the gradient's name says more.
          std::string handed;
          if (race->unnamed && race->address)
            for (auto const& e : r.got.entries())
              for (std::int64_t i = 0; i < e.numel() && handed.empty(); ++i)
                if (e.source_of(i) == race->address)
                  handed = " (That tensor is the memory of the gradient '" + e.name +
                           "' the backward hands back.)";
          sr.problems.push_back("race in launch " + std::to_string(l + 1) + " of the backward" +
                                when + " (grid (" + grid_dims + ")): " + race->message + handed);
          any = true;
        }
      return any;
    };
    bool const raced = races_of(first, "");
    // The probe of locks: where the first run took locks and gave them back, the first seed's
    // backward runs once more (after the structural checks, below), the first tries of each
    // taking of those locks made to find them held; its races fail as the first run's do.
    bool const probe_locks = si == 0 && !raced && !first.error &&
                             std::any_of(known_locks.begin(), known_locks.end(),
                                         [](auto const& k) { return !k.empty(); });
    auto probe = [&] {
      bool& on = probing_locks;
      on = true;
      backward_run const r = run_backward(cots);
      on = false;
      std::string const when = ", run again with the first " +
                               std::to_string(detail::launch_tracker::probe_failures) +
                               " tries of each taking of a lock failing";
      if (!r.launches.probe_stopped.empty())
        rep.notes.push_back("the probe of locks stopped: " + r.launches.probe_stopped +
                            "; what the backward did under its locks until then did not race");
      else if (r.error)
        sr.problems.push_back("the backward threw when" + when.substr(1) + ": " + *r.error);
      races_of(r, when);
    };
    gradient_set const* got = &first.got;
    for (auto const& d : got->duplicates())
      sr.problems.push_back("the backward set gradient '" + d + "' more than once");
    if (shared_message.empty())
      shared_message = shared_gradients(got->entries(), shared_names);
    // A backward that threw before handing anything over is said once; one that threw after
    // handing some over gets the others named.
    for (auto const& n : ins)
      if (!got->contains(n.name) && !(first.error && got->entries().empty()))
        sr.problems.push_back(
            first.error ? "no gradient '" + n.name + "': the backward threw before handing it over"
                        : "missing gradient '" + n.name + "' (the forward marks it in)");
    for (auto const& e : got->entries()) {
      auto const role = role_of(e.name);
      if (role != "in")
        sr.problems.push_back("extra gradient '" + e.name + "': " +
                              (role.empty() ? std::string("no tensor of the forward has that name")
                                            : "the forward marks it " + role + ", not in"));
    }

    // The references, on copies, with the same cotangents.
    std::optional<gradients<double>> g64, gmag;
    std::optional<gradients<W>> g32;         // only the baseline rule reads it
    std::deque<owned_tensor<double>> keep64; // the float64 forward's values, for the second look
    try {
      g64.emplace(f.reference64(cots, keep64, sweep::plain));
      if (rule == pass_rule::error_bound) {
        std::deque<owned_tensor<double>> keepm;
        gmag.emplace(
            f.reference64(cots, keepm, dtype.squares ? sweep::squares : sweep::magnitudes));
      }
      if (rule == pass_rule::baseline || rule == pass_rule::error_bound) {
        std::deque<owned_tensor<W>> keep32;
        g32.emplace(f.reference32(cots, keep32, sweep::plain));
      }
    } catch (std::exception const& e) {
      sr.problems.push_back(std::string("the reference (vjp of the forward) threw: ") + e.what());
      continue;
    }
    // No output element: nothing depends on any input, whether it is read or not.
    bool const no_outputs =
        std::all_of(outs.begin(), outs.end(), [](auto const& y) { return y.t.numel() == 0; });
    for (auto const& n : g64->unread()) {
      bool const empty = no_outputs || std::any_of(ins.begin(), ins.end(), [&](auto const& x) {
                           return x.name == n && x.t.numel() == 0;
                         }); // nothing to read
      if (empty)
        continue;
      auto msg = "the reference never read '" + n +
                 "': does the kernel capture it instead of taking it as an argument?";
      if (o.zero_reference_fails)
        sr.problems.push_back(msg);
      else
        rep.warnings.push_back(msg);
    }

    if (si == 0 && o.check_reference && !ins.empty() && !outs.empty())
      check_reference(sr, cots, *g64, gmag && !dtype.squares ? &*gmag : nullptr);

    pending& pd = later.emplace_back();
    pd.seed_index = rep.seeds.size() - 1;
    pd.got = first.got;
    pd.forward_nonfinite = forward_nonfinite;
    for (auto const& n : ins) {
      pd.ref64.push_back(detail::values_of((*g64)[n.name]));
      pd.ref32.push_back(g32 ? detail::values_of((*g32)[n.name]) : std::vector<double>{});
      pd.mag.push_back(gmag ? detail::values_of((*gmag)[n.name]) : std::vector<double>{});
      if (gmag && dtype.squares) // |g_ref64| + sqrt(|J|^2^T w^2)
        for (std::size_t i = 0; i < pd.mag.back().size(); ++i)
          pd.mag.back()[i] = std::abs(pd.ref64.back()[i]) + std::sqrt(pd.mag.back()[i]);
      pd.terms.emplace_back(); // counted below where needed; 1 per element until then
    }
    pd.one_term = terms_may_matter && gmag && !dtype.squares;
    if (!kept_sums.empty() && gmag && dtype.squares && !first.error)
      widen_for_kept_sums(pd, first.got, [&](int way) {
        std::uint64_t const s = detail::mix64(std::uint64_t{seed} << 8 | 0x40u | unsigned(way));
        return run_backward(cots, s | 1u).got;
      });

    if (rule == pass_rule::error_bound && gmag && g32)
      pd.flips = find_flips(pd);
    if (rule == pass_rule::error_bound && o.jitter_reference)
      pd.explained = explain(pd);
    bool over = rule == pass_rule::error_bound && !first.error && over_bound(first.got, pd);
    if (over && pd.one_term) {
      pd.one_term = false;
      if (count_terms(pd, cots))
        over = over_bound(first.got, pd);
    }
    bool const off =
        rule == pass_rule::error_bound && !first.error && !over && off_along(first.got, pd);
    if ((over || off) && o.k_saved > 0)
      pd.saved = second_look(first.got, pd, keep64, pd.scale_moved);
    keep64.clear(); // not held through the structural checks

    if (si != 0 || first.error)
      continue;
    // Structural checks on the first seed: a second run must give the same bits; zero
    // cotangents must give zero gradients and doubled ones doubled gradients.
    auto scaled = [&](double f) { // exact for 0 and 2, in every dtype
      std::vector<owned_tensor<T>> c;
      for (auto const& t : cots) {
        auto& s = c.emplace_back(t);
        for (T& v : s)
          v = static_cast<T>(static_cast<double>(v) * f);
      }
      return c;
    };
    if (o.check_determinism) {
      // Elements that differ are traced to the launches that wrote them: atomic_add alone, by
      // no more than reordering its additions explains, is a note; anything else fails. The
      // second run takes every program in reverse order, waves included: a backward that reduces in
      // the program it takes to run last (the last id, under a lock that orders nothing) passed
      // whenever the threads happened to run that program last.
      backward_run again = run_backward(cots, 0, true);
      std::optional<backward_run> third;
      // Tickets order programs as the run drew them: a reduction by the last id that draws a
      // ticket too is ordered in a run where it draws the last one, and races in this one.
      bool const again_raced =
          !raced &&
          races_of(again, " run a second time (the programs of each launch in reverse order)");
      if (again.error) {
        sr.problems.push_back("the backward threw when run a second time (the programs of each "
                              "launch in reverse order): " +
                              *again.error);
      } else {
        for (auto const& e : got->entries())
          if (auto const* e2 = again.got.find(e.name)) {
            // The first look's bound per element: what a difference passed on from atomic_add
            // in an earlier launch may be at most.
            std::vector<double> bounds;
            for (std::size_t q = 0; q < ins.size() && e.bits != e2->bits; ++q)
              if (ins[q].name == e.name && !pd.mag[q].empty() &&
                  pd.ref64[q].size() == e.values.size())
                bounds = first_look_bounds(pd, q);
            auto const v =
                detail::compare_runs(e, *e2, first.launches, again.launches, &bounds);
            if (!v.problem.empty() && (raced || again_raced)) {
              // The tracing of a run's accesses stops at its first race: the additions each
              // element took after it are not counted, and a sum made by atomic_add alone reads
              // as more than reordering explains (a correct gradient called non-deterministic).
              rep.notes.push_back(
                  "seed " + std::to_string(seed) + ": " + v.problem +
                  ": not judged, since a run raced and its accesses were traced up to the race "
                  "only (the additions each element took after it are not counted); fix the race "
                  "first");
            } else if (!v.problem.empty()) {
              // A third run, in the first run's order, tells a result that depends on the order
              // from one that depends on the runs before it (a buffer kept from call to call and
              // never zeroed, a static accumulator). On one thread only: on several, the threads'
              // timing moves a third run as well, and the message blamed kept state where the
              // cause was an atomic sum the check cannot follow.
              bool const one_thread =
                  o.launch.exec == executor::sequential || o.launch.num_threads == 1;
              if (!third && one_thread)
                third.emplace(run_backward(cots));
              erased_gradient const* e3 =
                  !third || third->error ? nullptr : third->got.find(e.name);
              bool const drifts =
                  e3 && e3->bits != e.bits &&
                  !detail::compare_runs(e, *e3, first.launches, third->launches, &bounds)
                       .problem.empty();
              sr.problems.push_back(
                  v.problem +
                  " (the second run took the programs of each launch in reverse order: a result "
                  "that depends on which program runs first or last, a reduction by the program "
                  "with the last id, changes with it)" +
                  (drifts ? ". A third run, in the first run's order on one thread, differs "
                            "from the first as well: the result depends on the calls before it "
                            "(state the backward keeps from call to call: a buffer not zeroed, a "
                            "static accumulator)"
                          : ""));
            }
            if (!v.note.empty())
              rep.notes.push_back("seed " + std::to_string(seed) + ": " + v.note);
          }
      }
    } else if (!raced) {
      // Without the determinism check the second run, in reverse order, still looks for races
      // (its values are not compared): accesses that tickets or locks order only in the order
      // a run drew them (a program reading what the one before it stored, after drawing its
      // ticket) race in it, and on one thread the first run never shows them.
      backward_run again = run_backward(cots, 0, true);
      if (again.error)
        sr.problems.push_back("the backward threw when run a second time (the programs of each "
                              "launch in reverse order): " +
                              *again.error);
      else
        (void)races_of(again, " run a second time (the programs of each launch in reverse order)");
    }
    if (o.check_linearity) {
      auto scaled_run = [&](double f,
                            detail::launch_observer* launches) -> std::optional<gradient_set> {
        backward_run r = run_backward(scaled(f));
        if (r.error) {
          sr.problems.push_back("the backward threw on scaled cotangents: " + *r.error);
          return std::nullopt;
        }
        if (launches)
          *launches = std::move(r.launches);
        return std::move(r.got);
      };
      pd.zero = scaled_run(0, nullptr);
      pd.twice = pd.zero ? scaled_run(2, &pd.twice_launches) : std::nullopt;
      if (pd.twice)
        pd.first_launches = std::move(first.launches);
    }
    if (probe_locks)
      probe();
  }

  if (!kept_sums.empty()) {
    std::ostringstream os;
    os.precision(3);
    os << "the bf16 sums kept in memory, each value moved by a unit in the last place, move the "
          "gradients by (root mean square over the elements, in units of u * (|g_ref64| + "
          "sqrt(|J|^2^T w^2)), the largest over the seeds; bounds widened by it where above 1):";
    for (std::size_t q = 0; q < ins.size(); ++q)
      os << (q ? ", '" : " '") << ins[q].name << "' " << kept_widened[q];
    rep.notes.push_back(os.str());
  }

  // The reference's own relative error at the working precision, the largest over the seeds:
  // one seed of a small tensor can be lucky (a few elements rounding the same way).
  // Under error_bound, the units it is off by, per band of rows.
  std::vector<double> pooled(ins.size(), 0.0);
  std::vector<std::vector<double>> pooled_units(ins.size());
  for (auto const& pd : later)
    for (std::size_t q = 0; q < ins.size(); ++q) {
      if (double const scale = detail::max_abs(pd.ref64[q]); scale > 0)
        pooled[q] = std::max(pooled[q], detail::max_abs_diff(pd.ref32[q], pd.ref64[q]) / scale);
      if (pd.mag[q].empty())
        continue;
      auto const units =
          detail::error_units(pd.ref32[q], pd.ref64[q], pd.mag[q], dtype.eps / 2, bands_of(q),
                              dtype.eps / 2 * dtype.min_normal, explained_of(pd, q),
                              explained_units_cap(o, dtype), flips_of(pd, q));
      pooled_units[q].resize(units.size(), 0.0);
      for (std::size_t b = 0; b < units.size(); ++b)
        pooled_units[q][b] = std::max(pooled_units[q][b], units[b]);
    }

  for (auto& pd : later) {
    seed_report& sr = rep.seeds[pd.seed_index];
    auto const* got = &pd.got;
    // A forward that made NaN or Inf: the cause, named before what follows from it (a problem
    // where the reference or the gradients are not finite, a warning where they are).
    if (!pd.forward_nonfinite.empty()) {
      bool follows = false;
      for (auto const& r : pd.ref64)
        for (double v : r)
          follows = follows || !std::isfinite(v);
      for (auto const& e : got->entries())
        for (double v : e.values)
          follows = follows || !std::isfinite(v);
      if (follows)
        sr.problems.insert(sr.problems.begin(), pd.forward_nonfinite);
      else
        rep.warnings.push_back("seed " + std::to_string(sr.seed) + ": " + pd.forward_nonfinite);
    }
    std::vector<std::pair<std::string, tolerance>> tols;
    for (std::size_t q = 0; q < ins.size(); ++q) {
      auto const& n = ins[q];
      auto const& ref64 = pd.ref64[q];
      auto const& ref32 = pd.ref32[q];
      bool finite = true;
      for (double v : ref64)
        finite = finite && std::isfinite(v);
      if (!finite)
        sr.problems.push_back("the reference gradient of '" + n.name + "' holds NaN or Inf");
      // All zeros with a non-zero |J|^T |w|: the kernel reads the input and the terms cancel
      // (attention over one key), which is no capture.
      bool const cancels = !pd.mag[q].empty() && detail::max_abs(pd.mag[q]) > 0;
      if (finite && !ref64.empty() && detail::max_abs(ref64) == 0 && cancels)
        rep.warnings.push_back("the reference gradient of '" + n.name +
                               "' is all zeros by cancellation (|J|^T |w| is not): the kernel "
                               "reads it, and its terms cancel");
      bool const no_outputs =
          std::all_of(outs.begin(), outs.end(), [](auto const& y) { return y.t.numel() == 0; });
      if (finite && !ref64.empty() && detail::max_abs(ref64) == 0 && !cancels && !no_outputs) {
        auto msg = "the reference gradient of '" + n.name +
                   "' is all zeros: does the kernel capture it instead of taking it as an "
                   "argument, or not depend on it?";
        if (o.zero_reference_fails)
          sr.problems.push_back(msg);
        else
          rep.warnings.push_back(msg);
      }
      erased_gradient const* e = got->find(n.name);
      if (!e)
        continue;
      bool same_shape = e->rank == n.t.rank();
      for (int a = 0; same_shape && a < e->rank; ++a)
        same_shape = e->shape[a] == n.t.size(a);
      if (!same_shape) {
        gradient_report r;
        r.name = n.name;
        r.dtype = e->dtype;
        r.shape = e->shape_string();
        r.numel = e->numel();
        r.notes.push_back("shape " + e->shape_string() + ", the input's is " + n.t.shape_string());
        sr.gradients.push_back(std::move(r));
        continue;
      }
      auto const tol = make_tolerance(
          o, dtype, ref64, ref32, pooled[q], pd.mag[q].empty() ? nullptr : &pd.mag[q],
          &pooled_units[q], q < pd.saved.size() ? &pd.saved[q] : nullptr, bands_of(q),
          explained_of(pd, q), terms_of(pd, q), most_terms_of(pd, q), flips_of(pd, q));
      tols.emplace_back(n.name, tol);
      double const scale_allowed = q < pd.scale_moved.size() ? o.k_saved * pd.scale_moved[q] : 0.0;
      auto r = compare_gradient(*e, ref64, tol, o, scale_limit, scale_allowed);
      if (r.scale_failed && !(std::abs(r.scale_correlation) >= scale_correlation_min))
        r.notes.push_back(
            "unlike the reference all over: kernel and reference correlate at " +
            detail::number(r.scale_correlation) +
            " over its elements, where a factor off would correlate near 1 (values transposed, "
            "misplaced, or another gradient's?)");
      else if (r.scale_failed)
        r.notes.push_back(
            "off along the reference all over: " + detail::number(r.scale_units) +
            " of its bounds" +
            (r.scale_units > scale_limit
                 ? ", past check_options::scale_units " + detail::number(scale_limit)
                 : std::string(" (within check_options::scale_units ") +
                       detail::number(scale_limit) + "; a bf16 factor is judged past it)") +
            ", by more than roundings allow (" + detail::number(r.scale_allowed) +
            ": the reference rounded to " + e->dtype + ", two unit roundoffs" +
            (scale_allowed > 0 ? ", k_saved times how far the second look's moves shift it" : "") +
            ")");
      // A bf16 input's gradient may be handed back wider (kept in float, say).
      bool const dtype_ok = e->dtype == dtype_name<T>() ||
                            (storage && (e->dtype == "float32" || e->dtype == "float64"));
      if (!dtype_ok) {
        r.ok = false;
        r.notes.push_back("dtype " + e->dtype + ", the input's is " + dtype_name<T>());
      }
      if (r.nonfinite) {
        std::int64_t first = 0;
        while (std::isfinite(e->values[static_cast<std::size_t>(first)]))
          ++first;
        sr.problems.push_back("gradient '" + n.name + "' holds " + std::to_string(r.nonfinite) +
                              " NaN/Inf element(s), the first at " +
                              detail::coordinates_of(*e, first));
      }
      sr.gradients.push_back(std::move(r));
    }

    pd.tols = tols;
    if (!pd.zero || !pd.twice)
      continue;
    auto tol_of = [&](std::string const& name) -> tolerance const* {
      for (auto const& [n, t] : tols)
        if (n == name)
          return &t;
      return nullptr;
    };
    auto const& zero = pd.zero;
    auto const& twice = pd.twice;
    for (auto const& e : got->entries()) {
      auto const* tol = tol_of(e.name);
      auto const* z = zero->find(e.name);
      auto const* t2 = twice->find(e.name);
      if (!tol || !z || !t2 || z->numel() != e.numel() || t2->numel() != e.numel())
        continue;
      // A gradient handed back in integers is reported for its dtype; truncated, it is not
      // linear in the cotangent either, which would read as a second fault.
      if (e.dtype != "float32" && e.dtype != "float64" && e.dtype != "bfloat16")
        continue;
      for (std::int64_t i = 0; i < e.numel(); ++i) {
        auto const u = static_cast<std::size_t>(i);
        if (!std::isfinite(e.values[u]) || !std::isfinite(tol->bound(0)))
          continue; // reported as NaN/Inf already
        if (!(std::abs(z->values[u]) <= tol->bound(0))) {
          sr.problems.push_back("not linear in the cotangent: with zero cotangents '" + e.name +
                                "' is " + detail::number(z->values[u]) + " at " +
                                detail::coordinates_of(e, i));
          break;
        }
      }
      for (std::int64_t i = 0; i < e.numel(); ++i) {
        auto const u = static_cast<std::size_t>(i);
        double const allowed = 2 * tol->bound(e.values[u], i);
        if (!std::isfinite(e.values[u]) || !std::isfinite(allowed))
          continue;
        double const d = std::abs(t2->values[u] - 2 * e.values[u]);
        // Doubling every contribution is exact: the sums differ only where the order of
        // atomic additions did, and by no more than it can.
        if (!(d <= allowed) &&
            !(d <= detail::reordering_bound(
                       pd.first_launches.last_write(e.source_of(i), e.elem_size, e.traced),
                       pd.twice_launches.last_write(t2->source_of(i), t2->elem_size, t2->traced),
                       std::max(std::abs(2 * e.values[u]), std::abs(t2->values[u])),
                       detail::unit_roundoff(e.dtype), 2))) {
          sr.problems.push_back("not linear in the cotangent: doubling the cotangents makes '" +
                                e.name + "' " + detail::number(t2->values[u]) + " at " +
                                detail::coordinates_of(e, i) + ", not 2 * " +
                                detail::number(e.values[u]));
          break;
        }
      }
    }
  }
  if (outs.size() >= 2 && outs.size() <= detail::max_outputs_for_saved_hint)
    for (auto const& pd : later) {
      seed_report const& sr = rep.seeds[pd.seed_index];
      bool mismatched = false;
      for (auto const& g : sr.gradients)
        mismatched |= g.compared && g.mismatches > 0;
      if (!mismatched)
        continue;
      // The first seed whose gradients mismatch: one float64 vjp per output, on that seed's
      // inputs (drawn again) and each output's cotangent alone, and the inputs of the last seed
      // put back afterwards.
      try {
        auto const cots = draw(sr.seed);
        f.run_forward();
        std::vector<std::vector<std::vector<double>>> part; // [output][input marked in]
        for (std::size_t j = 0; j < outs.size(); ++j) {
          std::vector<owned_tensor<T>> alone = cots;
          for (std::size_t i = 0; i < alone.size(); ++i)
            if (i != j)
              std::fill(alone[i].begin(), alone[i].end(), T{});
          std::deque<owned_tensor<double>> keep;
          auto const g = f.reference64(alone, keep, sweep::plain);
          auto& pj = part.emplace_back();
          for (auto const& n : ins)
            pj.push_back(detail::values_of(g[n.name]));
        }
        std::vector<std::string> out_names;
        for (auto const& n : outs)
          out_names.push_back(n.name);
        std::vector<std::string> in_names;
        for (auto const& n : ins)
          in_names.push_back(n.name);
        if (auto hint =
                detail::ignored_cotangent_hint(pd.got, pd.tols, in_names, out_names, part, sr.seed))
          rep.hints.push_back(*hint);
      } catch (std::exception const&) {
        // No hint: the failure is reported as it is.
      }
      unsigned const last = o.first_seed + static_cast<unsigned>(o.seeds - 1);
      if (sr.seed != last) {
        try {
          draw(last);
          f.run_forward();
        } catch (std::exception const&) {
        }
      }
      break;
    }
  // Gradients handed back over one memory, where one of the two fails: the likely cause.
  if (!shared_message.empty()) {
    bool failed = false;
    for (auto const& sr : rep.seeds)
      for (auto const& g : sr.gradients)
        failed =
            failed || (!g.ok && (g.name == shared_names.first || g.name == shared_names.second));
    if (failed)
      rep.hints.push_back(shared_message);
  }
  if (dtype.squares && rule == pass_rule::error_bound) {
    // Only where every failing gradient is off by a few times its bound (sums kept in bf16 are
    // off by the roundings of their partial sums; a missing term or row, by far more).
    bool failed = false, near = true;
    for (auto const& sr : rep.seeds)
      for (auto const& g : sr.gradients)
        if (g.compared && !g.ok) {
          failed = true;
          near = near && g.worst_ratio < 16;
        }
    if (failed && near)
      rep.hints.push_back(
          "bf16 gradients are weighed by |g_ref64| + sqrt(|J|^2^T w^2), one rounding of the "
          "result and a random walk of one rounding per term; a backward that keeps sums in bf16 "
          "where its launches do not show it (an accumulator rounded to bf16 as it adds, partial "
          "sums added up on the host) loses more: if yours does by design, check it with "
          ".bf16_partial_sums = true (the running error bound |J|^T |w|, looser)");
  }
  // Mismatches of a gradient where nothing reaches it in the reference, and the others where the
  // backward is 0: the backward sends gradient elsewhere than the forward's branches. At an
  // exact tie that is a choice the reference makes one way (and the report's ratios, 1e30 and
  // more, say nothing).
  if (rule == pass_rule::error_bound) {
    std::vector<std::string> names;
    for (auto const& sr : rep.seeds)
      for (auto const& g : sr.gradients)
        if (g.compared && !g.ok && g.unreached > 0 && g.unreached + g.zeroed == g.mismatches &&
            std::find(names.begin(), names.end(), g.name) == names.end())
          names.push_back(g.name);
    for (auto const& name : names)
      rep.hints.push_back(
          "the mismatches of '" + name +
          "' are at elements nothing reaches in the float64 reference (|J|^T |w| = 0 there) "
          "where the backward is not 0, and where the backward is 0 and the reference is not: it "
          "sends gradient elsewhere than the forward's branches do. "
          "At a tie of a max or min (equal inputs, a window of zeros after a relu) the reference "
          "sends it all to the first of the equal elements, as argmax picks the first; a "
          "backward that splits it, or picks another, or a mask or where() of the backward that "
          "differs from the forward's, differs there");
  }
  // A given cotangent of one sign (all ones: the gradient of sum(y)) makes every sum of the
  // backward a sum of terms of one sign, which the bound allows 3 sqrt(n) u |g| for rounding in
  // sequence: a long reduction missing a few of its terms can pass.
  for (auto const& n : outs) {
    std::int64_t const m = n.cotangent.numel();
    if (!n.cotangent.data() || m < 256)
      continue;
    bool pos = true, neg = true;
    for (std::int64_t i = 0; i < m && (pos || neg); ++i) {
      double const v = static_cast<double>(n.cotangent.data()[n.cotangent.row_major_offset(i)]);
      pos = pos && v > 0;
      neg = neg && v < 0;
    }
    if (pos || neg)
      rep.hints.push_back(
          "the cotangent given for '" + n.name +
          "' is of one sign: sums the backward makes of it "
          "are sums of terms of one sign, allowed 3 sqrt(n) u |g| for their roundings in sequence "
          "(1.8e-4 of an element that sums 2^20 terms), so a reduction that misses a few of its "
          "terms can pass; cotangents of mixed signs (drawn at random when none is given) hold "
          "such sums about ten times tighter");
  }
  return rep;
}

} // namespace detail

} // namespace tilegrad

#if TILEGRAD_SEPARATE_COMPILATION // compiled in tilegrad/separate.hpp
namespace tilegrad::detail {
extern template check_report check_backward_core<float>(grid const&, forward_parts<float>&,
                                                        backward_ref<float>, check_options const&);
extern template check_report check_backward_core<double>(grid const&, forward_parts<double>&,
                                                         backward_ref<double>,
                                                         check_options const&);
extern template check_report check_backward_core<bf16>(grid const&, forward_parts<bf16>&,
                                                       backward_ref<bf16>, check_options const&);
} // namespace tilegrad::detail
#endif
