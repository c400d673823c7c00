// The Taylor test of a reference gradient: central differences of <w, y(x)> along a random
// direction u, in double, at steps h, h/2, h/4, ...; their distance to <g, u> must shrink as h²
// (observed rate 2) until it reaches round-off.
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
  int steps = 6;
  double min_rate = 1.8; ///< the median observed rate must reach this
  /// A residual within roundoff_factor * eps(float64) * sum|w * y| / h is round-off.
  double roundoff_factor = 256;
  /// Where every residual is at round-off, the test passes only if the residual of some step is
  /// at most this fraction of |<g, u>| (exactly 0 where <g, u> is): the finite differences agree
  /// that closely, which a wrong derivative's do not.
  double resolution = 0.01;
  launch_options launch = {};
};

/// The residuals |FD(h) - <g, u>| per step and the rates between consecutive steps.
struct taylor_result {
  double directional = 0; ///< <g, u>, from vjp
  std::vector<double> h, fd, residual, roundoff;
  std::vector<double> rate; ///< rate[i] = log2(residual[i - 1] / residual[i]); rate[0] is NaN
  std::vector<bool> at_roundoff;
  double observed_rate = std::numeric_limits<double>::quiet_NaN(); ///< median over clean pairs
  bool passed = false;
  std::string verdict;

  explicit operator bool() const { return passed; }

  friend std::ostream& operator<<(std::ostream& os, taylor_result const& r) {
    char line[160];
    std::snprintf(line, sizeof line, "%.12g", r.directional);
    os << "taylor_test: " << (r.passed ? "PASS" : "FAIL") << " (" << r.verdict << ")\n"
       << "  <g, u> = " << line << " (vjp, float64)\n"
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
  c.restore();
  auto const grads =
      std::apply([&](auto const&... a) { return vjp(o.launch, g, kernel, a...); }, args64);
  std::size_t k = 0;
  std::apply(
      [&](auto const&... a) {
        auto dot = [&]<class X>(X const& x) {
          if constexpr (detail::arg_kind<X>::in) {
            auto const& gx = grads[x.name];
            for (std::int64_t i = 0; i < gx.numel(); ++i)
              r.directional += gx.data()[i] * c.ins[k].u[static_cast<std::size_t>(i)];
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
  double h = o.h0;
  std::vector<double> clean;
  for (int i = 0; i < o.steps; ++i, h /= 2) {
    double const fd = (objective(h, nullptr) - objective(-h, nullptr)) / (2 * h);
    r.h.push_back(h);
    r.fd.push_back(fd);
    r.residual.push_back(std::abs(fd - r.directional));
    r.roundoff.push_back(o.roundoff_factor * std::numeric_limits<double>::epsilon() *
                         std::max(scale, std::abs(r.directional) * h) / h);
    r.at_roundoff.push_back(r.residual.back() <= r.roundoff.back());
    r.rate.push_back(
        i == 0 ? std::numeric_limits<double>::quiet_NaN()
               : std::log2(r.residual[static_cast<std::size_t>(i) - 1] / r.residual.back()));
    if (i > 0 && !r.at_roundoff.back() && !r.at_roundoff[static_cast<std::size_t>(i) - 1])
      clean.push_back(r.rate.back());
  }
  objective(0, nullptr); // leave the copies at x0 (nothing reads them, but tidy)
  c.restore();           // and the caller's integer tensors as they were given

  if (clean.empty()) {
    bool const all =
        std::all_of(r.at_roundoff.begin(), r.at_roundoff.end(), [](bool b) { return b; });
    // Round-off that hides errors of the size of the derivative itself (outputs with a large
    // constant part: sum|w * y| is large where <g, u> is not) says nothing of the gradient: a
    // derivative 5 % off passed under an offset of 1e10, twice the right one under 1e12. The
    // differences must agree with <g, u> at some step, to a fraction of it. (Not the round-off
    // bound: it is a bound, and a correct gradient of 1e-8 whose differences agree to 2e-6 of it
    // lies far under its own.)
    double const closest = r.residual.empty()
                               ? std::numeric_limits<double>::infinity()
                               : *std::min_element(r.residual.begin(), r.residual.end());
    bool const resolved = closest <= o.resolution * std::abs(r.directional);
    r.passed = all && resolved;
    char text[320];
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
    std::sort(clean.begin(), clean.end());
    r.observed_rate = clean[clean.size() / 2];
    r.passed = r.observed_rate >= o.min_rate;
    char text[96];
    std::snprintf(text, sizeof text, "observed rate %.3f %s %.2f, expected 2", r.observed_rate,
                  r.passed ? ">=" : "<", o.min_rate);
    r.verdict = text;
    if (std::any_of(r.at_roundoff.begin(), r.at_roundoff.end(), [](bool b) { return b; }))
      r.verdict += "; residuals marked (round-off) are left out of the rate";
    // Central differences across a kink (relu, abs, maximum, clamp) or a step (a comparison or an
    // integer cast of data) of the kernel are wrong for every input within h of it: a correct
    // gradient then fails too (relu over inputs spread across 0: rate 0.65; a step: below 0).
    if (!r.passed)
      r.verdict += "; a wrong derivative stalls the residual (rate near 0), and so does a kink or "
                   "a step of the kernel within h of an input (relu, abs, maximum, where or a "
                   "comparison on data): run it at inputs away from them, or a smaller h0";
  }
  return r;
}

template <class Kernel, class... Args>
requires(!std::is_same_v<std::remove_cvref_t<Kernel>, grid>) taylor_result
    taylor_test(grid g, Kernel kernel, Args const&... args) {
  return taylor_test(taylor_options{}, g, kernel, args...);
}

} // namespace tilegrad
