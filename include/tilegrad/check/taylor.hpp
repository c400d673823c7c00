// The Taylor test of a reference gradient: central differences of <w, y(x)> along a random
// direction u, in double, at steps h, h/2, h/4, ...; their distance to <g, u> must shrink as h²
// (observed rate 2) at the smallest steps, down to round-off, whose size is measured from the
// objective's own noise.
#pragma once

#include "tilegrad/ad/vjp.hpp"
#include "tilegrad/check/double_copies.hpp"
#include "tilegrad/check/forward.hpp"
#include "tilegrad/grid/launch.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace tilegrad {

struct taylor_options {
  unsigned seed = 0; ///< draws the cotangent w and the direction u
  double h0 = 1e-2;  ///< the first step; each next one is half the last
  int steps = 6;     ///< steps taken at least
  /// Steps taken at most: the halving goes on until the rate settles at 2 (or the residual
  /// stalls, or reaches round-off). A kernel steep along u (exp(2000 x)) shows rates far above
  /// 2 until h is small beside its scale, and a wrong gradient's rate falls to 0 only there.
  int max_steps = 30;
  double min_rate = 1.8; ///< the rates of the smallest steps must reach this...
  double max_rate = 2.5; ///< ...and stay under this to count as settled at 2
  /// A residual within roundoff_factor * eps(float64) * sum|w * y| / h is round-off...
  double roundoff_factor = 256;
  /// ...and so is one within noise_factor * noise / h, with `noise` the standard deviation of
  /// the objective's round-off, measured from its values at 7 points 2^-20 h0 apart (the
  /// difference table of More and Wild's ECnoise): outputs made of large intermediates (a
  /// variance as E[x^2] - E[x]^2 at x = 1000) round far above sum|w * y|.
  double noise_factor = 16;
  /// A pass needs the differences to agree with <g, u> to this fraction of it at some step
  /// (exactly, where <g, u> is 0): round-off or a slow rate that hides errors of the size of the
  /// derivative itself says nothing of the gradient.
  double resolution = 0.01;
  launch_options launch = {};
};

/// The residuals |FD(h) - <g, u>| per step and the rates between consecutive steps.
struct taylor_result {
  double directional = 0; ///< <g, u>, from vjp
  std::vector<double> h, fd, residual, roundoff;
  std::vector<double> rate; ///< rate[i] = log2(residual[i - 1] / residual[i]); rate[0] is NaN
  std::vector<bool> at_roundoff;
  /// The rate between the last two steps above round-off (NaN: no such pair).
  double observed_rate = std::numeric_limits<double>::quiet_NaN();
  double noise = 0; ///< the objective's round-off (standard deviation), as measured
  bool passed = false;
  std::string verdict;

  explicit operator bool() const { return passed; }

  friend std::ostream& operator<<(std::ostream& os, taylor_result const& r) {
    char line[160];
    std::snprintf(line, sizeof line, "%.12g", r.directional);
    os << "taylor_test: " << (r.passed ? "PASS" : "FAIL") << " (" << r.verdict << ")\n"
       << "  <g, u> = " << line << " (vjp, float64); the objective's measured round-off " << r.noise
       << "\n"
       << "  h            FD(h)                 |FD(h) - <g, u>|  rate\n";
    for (std::size_t i = 0; i < r.h.size(); ++i) {
      std::snprintf(line, sizeof line, "  %-11.4g  %-20.14g  %-16.4g  ", r.h[i], r.fd[i],
                    r.residual[i]);
      os << line;
      if (i) {
        std::snprintf(line, sizeof line, "%.3f", r.rate[i]);
        os << line;
      }
      if (r.at_roundoff[i])
        os << "  (round-off)";
      os << "\n";
    }
    return os;
  }
};

namespace detail {
/// The standard deviation of the round-off of f near 0, from f at 7 points `spacing` apart
/// (More and Wild, "Estimating computational noise", SIAM J. Sci. Comput. 33(3), 2011): the k-th
/// differences of a smooth f shrink as spacing^k, those of noise of deviation s keep
/// s^2 (2k)!/(k!)^2 as their mean square. The level of the first k where three successive
/// levels agree within a factor 4 and the differences change sign; else the smallest level (a
/// bound: what is left is smooth). 0 where f takes one value.
template <class F>
double objective_noise(F&& f, double h0) {
  constexpr int m = 6;
  double const spacing = std::ldexp(h0, -20);
  std::vector<double> d(m + 1);
  for (int k = 0; k <= m; ++k)
    d[static_cast<std::size_t>(k)] = f((k - m / 2) * spacing);
  std::vector<double> level(m + 1, 0.0);
  std::vector<bool> sign_change(m + 1, false);
  double gamma = 1;
  for (int k = 1; k <= m; ++k) {
    double sq = 0, lo = 0, hi = 0;
    for (int i = 0; i + k <= m; ++i) {
      auto const at = static_cast<std::size_t>(i);
      d[at] = d[at + 1] - d[at];
      sq += d[at] * d[at];
      lo = std::min(lo, d[at]);
      hi = std::max(hi, d[at]);
    }
    gamma *= 0.5 * k / (2.0 * k - 1); // (k!)^2 / (2k)!
    level[static_cast<std::size_t>(k)] = std::sqrt(gamma * sq / (m + 1 - k));
    sign_change[static_cast<std::size_t>(k)] = lo < 0 && hi > 0;
  }
  for (int k = 1; k + 2 <= m; ++k) {
    auto const at = static_cast<std::size_t>(k);
    double const lo = std::min({level[at], level[at + 1], level[at + 2]});
    double const hi = std::max({level[at], level[at + 1], level[at + 2]});
    if (sign_change[at] && hi <= 4 * lo)
      return std::isfinite(level[at]) ? level[at] : 0.0;
  }
  double smallest = level[2];
  for (int k = 3; k <= m; ++k)
    smallest = std::min(smallest, level[static_cast<std::size_t>(k)]);
  return std::isfinite(smallest) ? smallest : 0.0;
}
} // namespace detail

/// taylor_test(grid, kernel, args...): the Taylor test of vjp's gradient for the launch, with
/// float tensors marked in (perturbed along u), out (cotangent w drawn) or passive, as for
/// forward(). The kernel runs with double copies of every float tensor; every launch starts from
/// the unmarked tensors it may write (a statistic, an integer work counter or lock) as the caller
/// gave them, and the caller's tensors are left as they were.
template <class Kernel, class... Args>
taylor_result taylor_test(taylor_options const& o, grid g, Kernel kernel, Args const&... args) {
  auto const fwd = forward(g, kernel, args...);
  std::mt19937_64 gen(o.seed * 0x9E3779B97F4A7C15ull + 1);
  detail::double_copies<std::remove_cvref_t<decltype(fwd.args)>> c(fwd.args, gen);
  auto& args64 = c.args;

  taylor_result r;
  double terms = 0; // sum |g_i u_i|: 0 where the gradient is (along u)
  // No rounding to bf16 either: it makes the float64 objective a staircase (grid/program.hpp).
  static constexpr detail::float64_run run{"taylor_test (float64 vjp and forwards)", true};
  detail::float64_reference_scope const float64(&run);
  c.restore();
  auto const grads =
      std::apply([&](auto const&... a) { return vjp(o.launch, g, kernel, a...); }, args64);
  std::size_t k = 0;
  std::apply(
      [&](auto const&... a) {
        auto dot = [&]<class X>(X const& x) {
          if constexpr (detail::arg_kind<X>::in) {
            auto const& gx = grads[x.name];
            for (std::int64_t i = 0; i < gx.numel(); ++i) {
              double const term = gx.data()[i] * c.ins[k].u[static_cast<std::size_t>(i)];
              r.directional += term;
              terms += std::abs(term);
            }
            ++k;
          }
        };
        (dot(a), ...);
      },
      args64);

  // J(x0 + t u) = <w, y> and sum|w * y| (the scale of its round-off).
  auto objective = [&](double t, double* scale) {
    c.move_inputs(t);
    c.restore();
    std::apply([&](auto const&... a) { launch(o.launch, g, kernel, detail::launch_arg(a)...); },
               args64);
    double j = 0, s = 0;
    for (auto const& q : c.outs)
      for (std::int64_t i = 0; i < q.y.numel(); ++i) {
        double const yw = q.y.data()[q.y.row_major_offset(i)] * q.w->data()[i];
        j += yw;
        s += std::abs(yw);
      }
    if (scale)
      *scale = s;
    return j;
  };
  double scale = 0;
  objective(0, &scale);
  r.noise = detail::objective_noise([&](double t) { return objective(t, nullptr); }, o.h0);
  bool const directional_finite = std::isfinite(r.directional);
  double h = o.h0;
  std::size_t last_clean = 0; // the last step i of a clean pair (i - 1, i); 0: none
  enum class ending { steps, converged, roundoff, stalled, not_finite } end = ending::steps;
  for (int i = 0; i < std::max(o.max_steps, 1); ++i, h /= 2) {
    double const fd = (objective(h, nullptr) - objective(-h, nullptr)) / (2 * h);
    auto const at = static_cast<std::size_t>(i);
    r.h.push_back(h);
    r.fd.push_back(fd);
    r.residual.push_back(std::abs(fd - r.directional));
    double const eps = std::numeric_limits<double>::epsilon();
    r.roundoff.push_back(
        std::max(o.roundoff_factor * eps * std::max(scale, std::abs(r.directional) * h),
                 o.noise_factor * r.noise) /
        h);
    r.at_roundoff.push_back(r.residual.back() <= r.roundoff.back());
    r.rate.push_back(i == 0 ? std::numeric_limits<double>::quiet_NaN()
                            : std::log2(r.residual[at - 1] / r.residual.back()));
    if (!std::isfinite(fd) || !directional_finite) {
      end = ending::not_finite;
      break;
    }
    bool const clean = i > 0 && !r.at_roundoff[at] && !r.at_roundoff[at - 1];
    if (clean)
      last_clean = at;
    auto settled = [&](std::size_t j) {
      return j >= 1 && !r.at_roundoff[j] && !r.at_roundoff[j - 1] && r.rate[j] >= o.min_rate &&
             r.rate[j] <= o.max_rate;
    };
    auto still = [&](std::size_t j) {
      return j >= 1 && !r.at_roundoff[j] && !r.at_roundoff[j - 1] && std::abs(r.rate[j]) < 0.25;
    };
    if (i + 1 < o.steps)
      continue;
    // (A gradient that is 0 along u has no size to resolve: the rates alone say it is right, as
    // a wrong 0 would stall at the true derivative. y = x^3 at x = 0 converges at rate 2.)
    if (settled(at) && settled(at - 1) &&
        (r.residual[at] <= o.resolution * std::abs(r.directional) || terms == 0)) {
      end = ending::converged;
      break;
    }
    if (i >= 1 && r.at_roundoff[at] && r.at_roundoff[at - 1]) {
      end = ending::roundoff;
      break;
    }
    if (i >= 3 && still(at) && still(at - 1) && still(at - 2)) {
      end = ending::stalled;
      break;
    }
  }
  objective(0, nullptr); // leave the copies at x0 (nothing reads them, but tidy)
  c.restore();           // and the caller's integer tensors as they were given

  char text[400];
  double const closest = *std::min_element(r.residual.begin(), r.residual.end());
  bool const resolved = closest <= o.resolution * std::abs(r.directional);
  if (last_clean)
    r.observed_rate = r.rate[last_clean];
  if (end == ending::not_finite) {
    r.passed = false;
    std::snprintf(text, sizeof text,
                  "not finite: %s at h = %.3g (an input moved by h u out of the kernel's domain: "
                  "a log or a division near 0? inputs away from it, or a smaller h0)",
                  directional_finite ? "the objective" : "<g, u>", r.h.back());
    r.verdict = text;
  } else if (end == ending::converged) {
    r.passed = true;
    std::snprintf(text, sizeof text,
                  "observed rate %.3f, and %.3f before it, settled in [%.2f, %.2f]: expected 2",
                  r.rate.back(), r.rate[r.rate.size() - 2], o.min_rate, o.max_rate);
    r.verdict = text;
  } else if (!last_clean) {
    bool const all =
        std::all_of(r.at_roundoff.begin(), r.at_roundoff.end(), [](bool b) { return b; });
    // Round-off that hides errors of the size of the derivative itself (outputs with a large
    // constant part: sum|w * y| is large where <g, u> is not) says nothing of the gradient: a
    // derivative 5 % off passed under an offset of 1e10, twice the right one under 1e12. The
    // differences must agree with <g, u> at some step, to a fraction of it. (Not the round-off
    // bound: it is a bound, and a correct gradient of 1e-8 whose differences agree to 2e-6 of it
    // lies far under its own.)
    r.passed = all && resolved;
    std::snprintf(text, sizeof text,
                  "inconclusive: every residual is at round-off, and the smallest, %.3g, is more "
                  "than %g of |<g, u>| = %.3g: the differences do not tell that error from "
                  "round-off (outputs with a large constant part? a larger h0, or cotangents on "
                  "the varying part)",
                  closest, o.resolution, std::abs(r.directional));
    r.verdict = !all ? "too few steps above round-off to measure a rate"
                : resolved
                    ? "every residual is at round-off: the objective is (close to) quadratic "
                      "along u, where central differences are exact, and the gradient agrees"
                    : text;
  } else {
    // The residual fell at the rate of the last clean pair down to round-off (the steps after it),
    // or stalled, or the steps ran out.
    bool const down_to_roundoff = end == ending::roundoff && r.observed_rate >= o.min_rate;
    // The steps at round-off after it must agree with <g, u> to the resolution, every one: a
    // wrong gradient's residual can dip through 0 (its error crossing the truncation's) at a step,
    // with a large rate into it and round-off after, where the error hides under the bound.
    double trailing = 0;
    for (std::size_t j = last_clean + 1; j < r.residual.size(); ++j)
      trailing = std::max(trailing, r.residual[j]);
    bool const trailing_resolved = trailing <= o.resolution * std::abs(r.directional) || terms == 0;
    r.passed = down_to_roundoff && trailing_resolved;
    double const stall = r.residual[last_clean];
    std::snprintf(text, sizeof text,
                  "observed rate %.3f %s %.2f at the smallest steps above round-off",
                  r.observed_rate, r.observed_rate >= o.min_rate ? ">=" : "<", o.min_rate);
    r.verdict = text;
    if (down_to_roundoff)
      r.verdict += trailing_resolved ? ", then round-off"
                                     : ", then round-off, where the differences are further "
                                       "from <g, u> than its resolution allows";
    if (!r.passed) {
      if (end == ending::stalled || end == ending::steps) {
        std::snprintf(text, sizeof text,
                      "; the residual %s at %.3g, %.3g of |<g, u>|: the gradient is off along u by "
                      "about that much",
                      end == ending::stalled ? "stalls" : "is still", stall,
                      stall / std::abs(r.directional));
        r.verdict += text;
      }
      // Central differences across a kink (relu, abs, maximum, clamp) or a step (a comparison or
      // an integer cast of data) of the kernel are wrong for every input within h of it: a correct
      // gradient then fails too (relu over inputs spread across 0: rate 0.65; a step: below 0).
      r.verdict += "; a wrong derivative stalls the residual (rate near 0), and so does a kink or "
                   "a step of the kernel within h of an input (relu, abs, maximum, where or a "
                   "comparison on data): run it at inputs away from them, or a smaller h0";
    }
  }
  return r;
}

template <class Kernel, class... Args>
requires(!std::is_same_v<std::remove_cvref_t<Kernel>, grid>) taylor_result
    taylor_test(grid g, Kernel kernel, Args const&... args) {
  return taylor_test(taylor_options{}, g, kernel, args...);
}

} // namespace tilegrad
