// The dot-product test of a reference: forward mode and reverse mode must agree on
// <J u, w> = <u, J^T w> for a random direction u and cotangent w. Both run the kernel's float64
// instantiation (dual<double> and adjoint<double>), so a derivative rule that one mode has wrong,
// or a memory semantic (a mask, a reload, an atomic) that one mode gets wrong, shows as a
// difference far beyond round-off; no step size is involved, so kinks do not matter.
#pragma once

#include "tilegrad/ad/jvp.hpp"
#include "tilegrad/ad/vjp.hpp"
#include "tilegrad/check/double_copies.hpp"
#include "tilegrad/check/forward.hpp"
#include "tilegrad/grid/launch.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace tilegrad {

struct dot_product_options {
  unsigned seed = 0; ///< draws the cotangent w and the direction u
  /// |<J u, w> - <u, J^T w>| must be at most tolerance * (sum|(J u) * w| + sum|u * (J^T w)| +
  /// sum |u| * |J|^T |w|): both sides add the same terms in float64, in another order, and round
  /// every product summed inside them.
  double tolerance = 1e-10;
  launch_options launch = {};
};

struct dot_product_result {
  double forward_side = 0; ///< <J u, w>, from jvp
  double reverse_side = 0; ///< <u, J^T w>, from vjp
  double scale = 0;        ///< sum|(J u) * w| + sum|u * (J^T w)|
  /// sum |u| * |J|^T |w|: the size of every product summed inside both sides, swept (a vjp of
  /// magnitudes) only where the scale alone does not cover the difference; else 0
  double magnitude = 0;
  double tolerance = 0; ///< the bound on the difference: options' tolerance * (scale + magnitude)
  bool passed = false;
  std::string verdict;

  explicit operator bool() const { return passed; }

  friend std::ostream& operator<<(std::ostream& os, dot_product_result const& r) {
    char line[200];
    os << "dot_product_test: " << (r.passed ? "PASS" : "FAIL") << " (" << r.verdict << ")\n";
    std::snprintf(line, sizeof line,
                  "  <J u, w> = %.17g (jvp, float64)\n  <u, J^T w> = %.17g (vjp, float64)\n",
                  r.forward_side, r.reverse_side);
    os << line;
    std::snprintf(line, sizeof line, "  difference %.3g, bound %.3g (scale %.3g",
                  std::abs(r.forward_side - r.reverse_side), r.tolerance, r.scale);
    os << line;
    if (r.magnitude > 0) {
      std::snprintf(line, sizeof line, " + magnitude %.3g", r.magnitude);
      os << line;
    }
    return os << ")\n";
  }
};

namespace detail {
/// The argument as jvp takes it: inputs move along their u, outputs give their tangents back.
template <class X>
auto tangent_arg(X const& x, owned_tensor<double> const* u) {
  using K = arg_kind<X>;
  if constexpr (K::in) {
    return tangent_in(x.name, tensor<double const>(x.t), u->cview());
  } else if constexpr (K::out) {
    return tangent_out(x.name, x.t);
  } else {
    return launch_arg(x);
  }
}
} // namespace detail

/// dot_product_test(grid, kernel, args...): jvp and vjp of the launch, with float tensors marked
/// in (moved along a random u), out (a random cotangent w) or passive, as for forward(), must
/// agree: <J u, w> = <u, J^T w>. The kernel runs with float64 copies of every float tensor, every
/// run starting from the outputs and the unmarked tensors it may write as the caller gave them;
/// the caller's tensors are left as they were.
template <class Kernel, class... Args>
dot_product_result dot_product_test(dot_product_options const& o, grid g, Kernel kernel,
                                    Args const&... args) {
  auto const fwd = forward(g, kernel, args...);
  std::mt19937_64 gen(o.seed * 0x9E3779B97F4A7C15ull + 7);
  detail::double_copies<std::remove_cvref_t<decltype(fwd.args)>> c(fwd.args, gen);

  // The directions as tensors of the inputs' shapes (row-major, as jvp reads a tangent).
  std::deque<owned_tensor<double>> us;
  std::size_t k = 0;
  std::apply(
      [&](auto const&... a) {
        auto make = [&]<class X>(X const& x) {
          if constexpr (detail::arg_kind<X>::in) {
            auto& u = us.emplace_back(x.t.shape().data(), static_cast<std::size_t>(x.t.rank()));
            std::copy(c.ins[k].u.begin(), c.ins[k].u.end(), u.data());
            ++k;
          }
        };
        (make(a), ...);
      },
      c.args);

  dot_product_result r;
  static constexpr detail::float64_run run{"dot_product_test (float64 jvp and vjp)"};
  detail::float64_reference_scope const float64(&run);
  c.restore();
  k = 0;
  auto const t = std::apply(
      [&](auto const&... a) {
        auto arg = [&]<class X>(X const& x) {
          owned_tensor<double> const* u = nullptr;
          if constexpr (detail::arg_kind<X>::in)
            u = &us[k++];
          return detail::tangent_arg(x, u);
        };
        // (braces: the arguments are made left to right, so the k-th input takes the k-th u)
        return std::apply([&](auto&&... b) { return jvp(o.launch, g, kernel, b...); },
                          std::tuple{arg(a)...});
      },
      c.args);
  for (auto const& q : c.outs) {
    auto const& jw = t[q.name];
    for (std::int64_t i = 0; i < jw.numel(); ++i) {
      double const term = jw.data()[i] * q.w->data()[i];
      r.forward_side += term;
      r.scale += std::abs(term);
    }
  }

  c.restore();
  auto const grads =
      std::apply([&](auto const&... a) { return vjp(o.launch, g, kernel, a...); }, c.args);
  for (auto const& in : c.ins) {
    auto const& gx = grads[in.name];
    for (std::int64_t i = 0; i < gx.numel(); ++i) {
      double const term = gx.data()[i] * in.u[static_cast<std::size_t>(i)];
      r.reverse_side += term;
      r.scale += std::abs(term);
    }
  }
  r.tolerance = o.tolerance * r.scale;
  double const diff = std::abs(r.forward_side - r.reverse_side);
  // Where a gradient is 0 by cancellation (a row bias under softmax), both sides are rounding
  // noise as large as their own terms: round-off is that of every product summed inside them,
  // sum |u| * |J|^T |w|, a vjp of magnitudes (cotangents and partials by their absolute values),
  // run only where the terms do not cover the difference (or are all 0).
  if (!(diff <= r.tolerance && r.scale > 0) && std::isfinite(diff)) {
    std::vector<std::vector<double>> signed_w;
    for (auto& w : c.cots) {
      signed_w.emplace_back(w.begin(), w.end());
      for (double& v : w)
        v = std::abs(v);
    }
    c.restore();
    auto const mags = [&] {
      ad::magnitude_scope const sweeping(true, ad::magnitude_kind::absolute);
      return std::apply([&](auto const&... a) { return vjp(o.launch, g, kernel, a...); }, c.args);
    }();
    for (auto const& in : c.ins) {
      auto const& m = mags[in.name];
      for (std::int64_t i = 0; i < m.numel(); ++i)
        if (std::isfinite(m.data()[i]))
          r.magnitude += std::abs(in.u[static_cast<std::size_t>(i)]) * m.data()[i];
    }
    for (std::size_t j = 0; j < c.cots.size(); ++j) // (the cotangents as drawn again)
      std::copy(signed_w[j].begin(), signed_w[j].end(), c.cots[j].begin());
    r.tolerance = o.tolerance * (r.scale + r.magnitude);
  }
  c.restore(); // the caller's integer tensors as they were given

  // Nothing compared (no marked input or output, empty tensors, outputs that do not depend on
  // the inputs): both sides 0 would pass any bound, and say nothing.
  double const scale = r.scale + r.magnitude;
  bool const empty = scale == 0;
  r.passed = !empty && diff <= r.tolerance; // (false for NaN)
  char text[240];
  if (empty)
    std::snprintf(text, sizeof text,
                  "inconclusive: every term of both sides is 0 (no marked input or output, empty "
                  "tensors, or outputs that do not depend on the inputs): nothing was compared");
  else if (r.passed && r.magnitude == 0)
    std::snprintf(text, sizeof text, "forward and reverse mode agree to %.3g times the scale",
                  diff / scale);
  else if (r.passed)
    std::snprintf(text, sizeof text,
                  "forward and reverse mode agree to %.3g times the scale and magnitude (%.3g "
                  "times the scale alone: the terms cancel)",
                  diff / scale, r.scale > 0 ? diff / r.scale : diff);
  else
    std::snprintf(text, sizeof text,
                  "forward and reverse mode differ by %.3g times the scale%s, more than %g: a "
                  "derivative rule or a memory semantic that one mode gets wrong",
                  diff / scale, r.magnitude > 0 ? " and magnitude" : "", o.tolerance);
  r.verdict = text;
  return r;
}

template <class Kernel, class... Args>
  requires(!std::is_same_v<std::remove_cvref_t<Kernel>, grid>)
dot_product_result dot_product_test(grid g, Kernel kernel, Args const&... args) {
  return dot_product_test(dot_product_options{}, g, kernel, args...);
}

} // namespace tilegrad
