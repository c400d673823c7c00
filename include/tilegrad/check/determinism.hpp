// check_backward's determinism check: the same backward run twice on the same data must give the
// same bits, except where only the order of atomic additions, or of programs taking a lock, can
// differ. Each run's launches are tracked (memory/tracking.hpp), so an element that differs is
// traced to the last launch that wrote it: written by atomic_add alone in both runs, and by no
// more than reordering its additions can change a sum, it is reported as such and passes; stored
// holding a lock in both runs, or stored from such sums by a later launch, by no more than the
// first look's bound there, likewise; anything else fails.
#pragma once

#include "tilegrad/check/gradient_set.hpp"
#include "tilegrad/memory/tracking.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace tilegrad::detail {

/// The unit roundoff of a dtype as reports name it (0 for integers: their additions are exact).
inline double unit_roundoff(std::string const& dtype) {
  if (dtype == "float32")
    return 0x1p-24;
  if (dtype == "float64")
    return 0x1p-53;
  if (dtype == "bfloat16")
    return 0x1p-8;
  return 0;
}

/// What two runs of one gradient showed: a problem (fails the check), a note, or neither.
struct determinism_verdict {
  std::string problem, note;
};

/// How far two values of one element, each written last by atomic_add alone in one of two runs
/// (ta, tb: as traced there), may differ by the order of their additions alone: recursive
/// summation of x0 + v1 + ... + vn in any order is within n u (|x0| + sum|v|) of the exact sum,
/// so two orders within twice that; x0 is not known, but |x0| <= |g| + sum|v| for the sum g, which
/// gives 2 n u (|g| + 2 sum|v|). Through a copy (an fp32 accumulator rounded into the gradient's
/// type) the additions ran at the source's roundoff, and the final rounding may differ by one
/// unit, 2 u |g| more. `scale_a` multiplies a's additions (a run on scaled cotangents is
/// compared). -1 where either was written otherwise.
inline double reordering_bound(traced_write const& ta, traced_write const& tb, double g, double u,
                               double scale_a = 1) {
  if (ta.ops != op_atomic_add || tb.ops != op_atomic_add)
    return -1;
  double const adds = std::max(ta.sum.n, tb.sum.n);
  double const mag = std::max<double>(scale_a * ta.sum.abs, tb.sum.abs);
  double const u_add = std::max(ta.copied_from_unit, tb.copied_from_unit);
  return u_add > 0 ? 2 * adds * u_add * (g + 2 * mag) + 2 * u * g : 2 * adds * u * (g + 2 * mag);
}

/// A tensor some launch of a run wrote holding a lock, as messages name it (empty: none).
inline std::string locked_writes(launch_observer const& o) {
  for (auto const& l : o.launches)
    if (!l.locked.empty())
      return l.locked;
  return {};
}

/// Compares gradient a of one run with b of another on the same data; la and lb are the runs'
/// launches. An element written last by atomic_add alone in both runs may differ by the order
/// of its additions (reordering_bound); one stored holding a lock in both runs (a sum made under
/// it, in the order the programs took it), or by a launch that takes sums made so in an earlier
/// launch, by that order, up to `bounds` (the first look's bound per element; none given: it may
/// not differ).
inline determinism_verdict compare_runs(erased_gradient const& a, erased_gradient const& b,
                                        launch_observer const& la, launch_observer const& lb,
                                        std::vector<double> const* bounds = nullptr) {
  determinism_verdict v;
  std::int64_t const n = a.numel();
  if (b.numel() != n || b.bits.size() != a.bits.size() || n == 0)
    return v;
  std::size_t const w = a.bits.size() / static_cast<std::size_t>(n);
  double const u = unit_roundoff(a.dtype);
  std::int64_t diff = 0, unexplained = 0, first = -1, over = 0, first_over = -1, worst = -1;
  // Elements a launch stored from sums atomic_add made in an earlier launch (in both runs): the
  // order of those additions reaches them through the launch, by an amount this check does not
  // follow through a kernel; they may differ by the first look's bound there (`bounds`).
  std::int64_t derived = 0, first_derived = -1;
  std::int64_t locked = 0, first_locked = -1; // stored holding a lock in both runs
  std::string derived_from;
  std::ptrdiff_t derived_launch = -1;
  std::vector<std::pair<std::ptrdiff_t, std::string>> seen_a, seen_b;
  auto sums_taken = [](launch_observer const& o, std::ptrdiff_t l,
                       std::vector<std::pair<std::ptrdiff_t, std::string>>& seen) {
    for (auto const& [k, name] : seen)
      if (k == l)
        return name;
    seen.emplace_back(l, o.takes_atomic_sums(l));
    return seen.back().second;
  };
  double worst_ratio = -1, worst_bound = 0, over_bound = 0;
  std::uint32_t most_adds = 0, over_adds = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    auto const at = static_cast<std::size_t>(i);
    if (std::memcmp(a.bits.data() + at * w, b.bits.data() + at * w, w) == 0)
      continue;
    ++diff;
    traced_write const ta = la.last_write(a.source_of(i), a.elem_size, a.traced);
    traced_write const tb = lb.last_write(b.source_of(i), b.elem_size, b.traced);
    double const g = std::max(std::abs(a.values[at]), std::abs(b.values[at]));
    double const bound = reordering_bound(ta, tb, g, u);
    if (bound < 0) {
      std::string from;
      bool const within = ta.ops == op_store && tb.ops == op_store && ta.launch == tb.launch &&
                          bounds && at < bounds->size() &&
                          std::abs(a.values[at] - b.values[at]) <= (*bounds)[at];
      if (within && ta.locked && tb.locked) {
        if (locked++ == 0)
          first_locked = i;
        continue;
      }
      if (within && !(from = sums_taken(la, ta.launch, seen_a)).empty() &&
          !sums_taken(lb, tb.launch, seen_b).empty()) {
        if (derived++ == 0) {
          first_derived = i;
          derived_from = from;
          derived_launch = ta.launch;
        }
        continue;
      }
      if (unexplained++ == 0)
        first = i;
      continue;
    }
    std::uint32_t const adds = std::max(ta.sum.n, tb.sum.n);
    double const d = std::abs(a.values[at] - b.values[at]);
    double const ratio =
        d <= bound ? (bound > 0 ? d / bound : 0) : std::numeric_limits<double>::infinity();
    most_adds = std::max(most_adds, adds);
    if (!(d <= bound) && over++ == 0) {
      first_over = i;
      over_bound = bound;
      over_adds = adds;
    }
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = i;
      worst_bound = bound;
    }
  }
  if (diff == 0)
    return v;
  auto coords = [&](std::int64_t i) {
    std::int64_t c[max_tensor_rank] = {};
    for (int ax = a.rank - 1; ax >= 0; --ax) {
      c[ax] = i % a.shape[ax];
      i /= a.shape[ax];
    }
    return tuple_string(c, a.rank);
  };
  auto delta = [&](std::int64_t i) {
    return std::abs(a.values[static_cast<std::size_t>(i)] - b.values[static_cast<std::size_t>(i)]);
  };
  std::ostringstream os;
  os.precision(3);
  if (unexplained) {
    os << "not deterministic: two runs on the same data differ in " << unexplained << " of " << n
       << " elements of '" << a.name << "', the first at " << coords(first);
    if (diff > unexplained)
      os << " (and in " << diff - unexplained << " that atomic_add alone wrote)";
    if (std::string const held = locked_writes(la).empty() ? locked_writes(lb)
                                                           : locked_writes(la);
        !held.empty())
      os << ". The backward writes tensor " << held
         << " holding a lock: programs take a lock in the order their threads reach it, so sums "
            "made under one change with that order, which passes within the first look's bound; "
            "these differ by more, or were not stored holding the lock. If that is intended, set "
            "check_options::check_determinism = false";
  } else if (over) {
    os << "not deterministic: two runs on the same data differ in " << over << " of " << n
       << " elements of '" << a.name
       << "' that atomic_add alone wrote, by more than reordering the additions can: at "
       << coords(first_over) << " by " << delta(first_over)
       << " > 2 n u (|g| + 2 sum|v|) = " << over_bound << " (n = " << over_adds << " additions)";
  }
  if (unexplained || over) {
    if (derived)
      os << " (and in " << derived << " stored by a launch that takes sums made by atomic_add or "
         << "under a lock)";
    if (locked)
      os << " (and in " << locked << " stored holding a lock)";
    v.problem = os.str();
    return v;
  }
  if (diff > derived + locked) {
    os << "'" << a.name << "' differs between two runs in " << diff - derived - locked << " of " << n
       << " elements, each written by atomic_add alone (up to " << most_adds
       << " additions): the order of the additions, not a fault; the largest difference, "
       << delta(worst) << " at " << coords(worst) << ", is " << worst_ratio
       << " of its bound 2 n u (|g| + 2 sum|v|) = " << worst_bound;
    if (derived || locked)
      os << "; ";
  }
  if (locked) {
    os << "'" << a.name << "' differs between two runs in " << locked << " of " << n
       << " elements (the first at " << coords(first_locked) << ", by " << delta(first_locked)
       << ") stored holding a lock: programs take a lock in the order their threads reach it, so "
          "sums made under it change with that order, not a fault (each within the first look's "
          "bound there)";
    if (derived)
      os << "; ";
  }
  if (derived)
    os << "'" << a.name << "' differs between two runs in " << derived << " of " << n
       << " elements (the first at " << coords(first_derived) << ", by "
       << delta(first_derived) << ") stored by launch " << derived_launch + 1
       << " of the backward, which takes " << derived_from
       << ", made by atomic_add or under a lock in an earlier launch: the order of those "
          "additions, passed on (not followed through the kernel; each within the first look's "
          "bound there)";
  v.note = os.str();
  return v;
}

/// Where a backward keeps sums in bf16 memory, as its traced launches show it: a bf16 tensor one
/// launch both reads and writes (a partial sum read back and added to), or one a launch writes
/// that is not a gradient handed over (partial sums a later step adds up). Says why for the
/// first (empty where none), and adds every such tensor to `kept` as (launch, argument).
/// (A tg::copy into bf16 rounds a finished value once: not a sum.)
inline std::string bf16_sums_seen(launch_observer const& o, gradient_set const& got,
                                  std::vector<std::pair<std::size_t, int>>* kept = nullptr) {
  std::string why;
  for (launch_writes const& w : o.writes) {
    if (!w.bf16 || !w.from.empty())
      continue;
    std::string const name = w.name.empty() ? std::string("a bf16 tensor") : "'" + w.name + "'";
    std::string seen;
    for (std::uint8_t op : w.ops)
      if ((op & op_load) && (op & op_write)) {
        seen = name + " is read and written by one launch of the backward";
        break;
      }
    bool handed = false;
    for (auto const& e : got.entries())
      for (std::int64_t i = 0; seen.empty() && e.source && i < e.numel() && !handed; ++i) {
        auto const* b = static_cast<std::byte const*>(e.source_of(i));
        handed = b >= w.lo && b < w.hi;
      }
    if (seen.empty() && !handed)
      seen = name + " is written by the backward and not handed over as a gradient";
    if (seen.empty())
      continue;
    if (why.empty())
      why = seen;
    if (kept)
      kept->emplace_back(w.launch, w.arg);
  }
  return why;
}

} // namespace tilegrad::detail
