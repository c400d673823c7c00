// Comparison of one hand-written gradient with its references: the tolerance of the pass rule,
// the error statistics, the worst elements and the block map of the mismatches.
#pragma once

#include "tilegrad/check/block_map.hpp"
#include "tilegrad/check/gradient_set.hpp"
#include "tilegrad/check/options.hpp"
#include "tilegrad/core/bf16.hpp"
#include "tilegrad/core/config.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace tilegrad {

namespace detail {
// |got - want|, infinite where either is not finite, so NaN counts as the worst error.
inline double abs_err(double got, double want) {
  double const e = std::abs(got - want);
  return std::isfinite(e) ? e : std::numeric_limits<double>::infinity();
}

} // namespace detail

/// The bands of rows over which the error_bound rule takes its k: runs of whole rows of a
/// gradient's 2-D view (every axis but the last folded), at most `max_bands` of them and each of
/// at least `min_elements` elements (a smaller tensor is one band), so that one badly conditioned
/// row raises k only in its band while every band holds enough elements to measure the
/// reference's own error by.
struct row_bands {
  std::int64_t cols = 1, rows_per_band = 1, elements = 1, count = 1;

  row_bands() = default;
  row_bands(std::int64_t numel, std::int64_t cols_, int max_bands, std::int64_t min_elements)
      : cols(std::max<std::int64_t>(cols_, 1)) {
    std::int64_t const rows = std::max<std::int64_t>(numel / cols, 1);
    rows_per_band = 1;
    while (rows_per_band * std::max(max_bands, 1) < rows)
      rows_per_band *= 2; // a power of two, as the block map's cells: they line up with tiles
    while (rows_per_band < rows && rows_per_band * cols < min_elements)
      rows_per_band *= 2;
    rows_per_band = std::min(rows_per_band, rows);
    elements = rows_per_band * cols;
    count = (rows + rows_per_band - 1) / rows_per_band;
  }
  /// The band of flat element i.
  std::int64_t of(std::int64_t i) const { return std::min(i / elements, count - 1); }
  /// The rows of the 2-D view band b covers, first and last, for a tensor of numel elements.
  std::int64_t first_row(std::int64_t b) const { return b * rows_per_band; }
  std::int64_t last_row(std::int64_t b, std::int64_t numel) const {
    return std::min((b + 1) * rows_per_band, std::max<std::int64_t>(numel / cols, 1)) - 1;
  }
};

namespace detail {
inline std::vector<std::int64_t> unravel(std::int64_t i, extents const& shape, int rank) {
  std::vector<std::int64_t> c(static_cast<std::size_t>(rank));
  for (int a = rank - 1; a >= 0; --a) {
    c[static_cast<std::size_t>(a)] = i % shape[a];
    i /= shape[a];
  }
  return c;
}

inline double max_abs(std::vector<double> const& v) {
  double m = 0;
  for (double x : v)
    m = std::max(m, std::abs(x));
  return m;
}
/// error_bound: how many times the largest units of the other elements of its band an element
/// where the fp32 reference took another branch must be off by to be judged alone (error_units).
inline constexpr double flipped_gap = 16;
/// error_bound: the units beyond what the forward's roundings explain past which an element where
/// the fp32 reference took another branch is judged alone whatever its band (error_units): 2^13,
/// where roundings the first look does not explain reach a few hundred (a prefix sum of 1000
/// terms: up to 640; a layer-norm row at 1e4: 243).
inline constexpr double flipped_units = 0x1p13;
// The largest |a - b| / (unit * m + underflow) over the elements where m > 0, per band (a empty:
// zeros).
/// @param explained per element, the part of |a - b| the forward's own roundings explain (the
///   first look's jittered reference; null: none): a band's units are then the larger of those
///   of what it does not explain and, up to `cap`, those of the whole error
/// @param flips per element, whether the sweeps counting the terms of its gradient, each term
///   marked by the branches it takes (ad::branches_sweep), disagree between the runs that gave a
///   and b: the run that gave `a` took another branch on a path to it (a relu at a pre-activation
///   that rounds to 0, a maximum whose two largest candidates tie only after rounding); null: not
///   counted. Such an element is off by a whole term, about 1 / unit units where roundings reach
///   tens, and would raise k for its whole band. It counts in no band's units and is judged alone
///   where it is off by flipped_gap times the units of the elements of its band that agree, and
///   they are most of it (where most are not, values that underflow in one run only made the
///   counts differ), where it is off by flipped_units beyond `explained` (a bias summed over one
///   band, all of which flipped), or where nothing reaches it in b's run (m = 0). Only where
///   cap > 0 (cap = 0: the raw units, which decide whether the first look's references run)
/// @param alone where not null, a - b at the elements judged alone, 0 elsewhere
inline std::vector<double> error_units(std::vector<double> const& a, std::vector<double> const& b,
                                       std::vector<double> const& m, double unit,
                                       row_bands const& bands, double underflow,
                                       std::vector<double> const* explained = nullptr,
                                       double cap = 0, std::vector<char> const* flips = nullptr,
                                       std::vector<double>* alone = nullptr) {
  std::vector<double> whole(static_cast<std::size_t>(bands.count), 0.0), rest = whole;
  bool const ex = explained && explained->size() == a.size();
  std::size_t const n = std::min(a.size(), m.size());
  auto band_of = [&](std::size_t i) {
    return static_cast<std::size_t>(bands.of(static_cast<std::int64_t>(i)));
  };
  auto units_of = [&](std::size_t i) { return abs_err(a[i], b[i]) / (unit * m[i] + underflow); };
  bool const fl = flips && flips->size() >= n;
  auto flipped = [&](std::size_t i) {
    return fl && (*flips)[i] && std::isfinite(abs_err(a[i], b[i])) && a[i] != b[i];
  };
  // The units of each band's elements that took the same branches; the gap to them tells a
  // flipped term where most of the band took the same branches (where most did not, values that
  // underflow in float only, exp of scores far below their row's maximum, make the counts differ
  // and say nothing of the size of the error).
  std::vector<double> same(whole.size(), 0.0);
  std::vector<std::int64_t> agree(whole.size(), 0), differ(whole.size(), 0);
  for (std::size_t i = 0; fl && i < n; ++i)
    if (m[i] > 0 && !flipped(i)) {
      same[band_of(i)] = std::max(same[band_of(i)], units_of(i));
      ++agree[band_of(i)];
    } else if (m[i] > 0)
      ++differ[band_of(i)];
  std::vector<char> judged(n, 0);
  for (std::size_t i = 0; cap > 0 && i < n; ++i) {
    auto const band = band_of(i);
    double const err = abs_err(a[i], b[i]);
    double const unexplained = ex ? std::max(0.0, err - (*explained)[i]) : err;
    judged[i] =
        flipped(i) && (m[i] == 0 || unexplained >= flipped_units * (unit * m[i] + underflow) ||
                       (agree[band] >= differ[band] && units_of(i) >= flipped_gap * same[band]));
  }
  if (alone)
    alone->assign(a.size(), 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    auto const band = band_of(i);
    if (judged[i]) {
      if (alone)
        (*alone)[i] = a[i] - b[i];
      continue;
    }
    if (m[i] > 0) {
      double const err = abs_err(a[i], b[i]), to = unit * m[i] + underflow;
      whole[band] = std::max(whole[band], err / to);
      if (ex)
        rest[band] = std::max(rest[band], std::max(0.0, err - (*explained)[i]) / to);
    }
  }
  if (ex)
    for (std::size_t band = 0; band < whole.size(); ++band)
      whole[band] = std::max(rest[band], std::min(whole[band], cap));
  return whole;
}
/// A jittered reference's moves, per element: g1 the reference with every rounding move at full
/// size, g2 at half, g0 without. An element's move |g1 - g0| counts where it halves with the
/// moves, within 20 % (a rounding's does; a comparison or a branch the moves flip does not, and
/// counts nothing); `moves` keeps the larger of that and what it held (g0's size; left as it is
/// where a run's size differs).
inline void halving_moves(std::vector<double> const& g0, std::vector<double> const& g1,
                          std::vector<double> const& g2, std::vector<double>& moves) {
  if (g1.size() != g0.size() || g2.size() != g0.size())
    return;
  moves.resize(g0.size(), 0.0);
  for (std::size_t i = 0; i < g0.size(); ++i) {
    double const d1 = g1[i] - g0[i], d2 = g2[i] - g0[i];
    bool const linear = std::abs(2 * d2 - d1) <= 0.2 * std::abs(d1) + 1e-12 * std::abs(g0[i]);
    if (std::isfinite(d1) && linear)
      moves[i] = std::max(moves[i], std::abs(d1));
  }
}
inline double max_abs_diff(std::vector<double> const& a, std::vector<double> const& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    m = std::max(m, abs_err(a[i], b[i]));
  return m;
}
} // namespace detail

/// One element: coordinates, the hand-written value and the reference value.
struct element_error {
  std::vector<std::int64_t> at;
  double got = 0, want = 0;
  double ratio = 0; ///< err / bound (inf where the bound is 0 and the error is not)
  /// Where the fp32 reference took another branch (tolerance::alone): its value, the other
  /// branch's reference; 0 elsewhere (other_branch false)
  double branch = 0;
  bool other_branch = false;
  /// |got - want|, or the distance to the nearer branch where the fp32 reference took another
  double abs_err() const {
    double const e = detail::abs_err(got, want);
    return other_branch ? std::min(e, detail::abs_err(got, branch)) : e;
  }
  TILEGRAD_MACHINERY_MEMBER std::string where() const
#if TILEGRAD_MACHINERY_BODIES
  { return tuple_string(at.data(), static_cast<int>(at.size())); }
#else
  ;
#endif
};

/// The bound the errors of one gradient are held to, with the numbers it came from.
struct tolerance {
  pass_rule rule = pass_rule::baseline;
  double k = 0, ref32_err = 0, floor = 0; // baseline
  double ref32_err_seed = 0; ///< this seed's own max|g_ref32 - g_ref64| (ref32_err may pool)
  double scale = 0;          ///< max|g_ref64| (baseline, normwise)
  double atol = 0, rtol = 0; // atol_rtol, normwise
  // error_bound: element i may be off by k_at(i) * (unit * magnitude[i] + underflow) (+ floor_abs)
  double k_bound = 0, unit = 0; ///< k_bound: the largest k of any band
  /// error_bound: unit * the dtype's smallest normal, what a rounding below it loses
  double underflow = 0;
  double ref_units = 0; ///< max |g_ref32 - g_ref64| / (unit * magnitude), over the seeds
  /// error_bound: k and the reference's units per band of rows (empty: k_bound everywhere).
  row_bands bands;
  std::shared_ptr<std::vector<double> const> band_k, band_units;
  /// |J|^T |w| per element, or |g_ref64| + sqrt(|J|^2^T w^2) where `squares` (bf16)
  std::shared_ptr<std::vector<double> const> magnitude;
  double max_magnitude = 0;
  bool squares = false;
  /// What `magnitude` holds, for the report.
  char const* weight() const { return squares ? "|g_ref64| + sqrt(|J|^2^T w^2)" : "|J|^T |w|"; }
  /// error_bound, second look: how far the kernel's gradient moves, per element, when the
  /// values it reads from the forward (outputs, saved tensors) move by their rounding errors;
  /// element i may be off by k_saved times that more. Null unless the first look failed.
  std::shared_ptr<std::vector<double> const> saved;
  double k_saved = 0;
  /// error_bound, first look, where the fp32 reference raised k: how far the float64 reference
  /// moves, per element, when each value its forward computes moves by its whole rounding error
  /// (whatever of the fp32 reference's error this explains does not raise k); element i may be off
  /// by k_explained times that more. Null elsewhere.
  std::shared_ptr<std::vector<double> const> explained;
  double k_explained = 0;
  /// error_bound: g_ref32 - g_ref64 at the elements where the fp32 reference took another
  /// branch than the float64 one (detail::error_units), 0 elsewhere. Those elements raise no band's
  /// k, and the kernel may take either branch there: its error is the smaller of those against
  /// g_ref64 and g_ref32 (error()), and the bound counts the other branch's own roundings,
  /// k * u * |g_ref32 - g_ref64| more. Null where there are none.
  std::shared_ptr<std::vector<double> const> alone;
  std::int64_t alone_count = 0;
  /// error_bound, a long sum of one sign run in sequence: element i may be off by
  /// 3 sqrt(n_i) u' |g_ref64|, u' the arithmetic's unit roundoff, n_i the number of terms of the
  /// element's sum, counted by a sweep of the reference (`terms`; null where the sweep did not
  /// run, as 3 sqrt(sequence_n) u' cannot exceed k u there), at most sequence_n: the longest
  /// axis of the launch's tensors, or their most elements per element of this gradient.
  double compute_unit = 0;
  std::int64_t sequence_n = 0;
  std::shared_ptr<std::vector<double> const> terms;
  /// The allowance of a long sum in sequence, in its standard deviations' units: a sum of n terms
  /// whose partial sums are about its result g is off by about sqrt(n / 3) u' |g| (one standard
  /// deviation: a random walk of n roundings, each at most u' |g|), so 3 sqrt(n) u' |g| is five
  /// of them at least.
  static constexpr double sequence_factor = 3;
  /// 3 sqrt(n_i) u' of element i (-1: of sequence_n).
  double sequence_at(std::int64_t i) const {
    double const n = i < 0 || !terms ? static_cast<double>(sequence_n)
                                     : (*terms)[static_cast<std::size_t>(i)];
    return sequence_factor * std::sqrt(n) * compute_unit;
  }

  /// The largest error allowed at element i (flat index; -1: the tensor's largest) where the
  /// reference is `want`; one bound for the whole tensor under the baseline and normwise rules.
  double bound(double want, std::int64_t i = -1) const {
    switch (rule) {
    case pass_rule::error_bound:
      return std::max(k_at(i) * (unit * (i < 0 || !magnitude
                                             ? max_magnitude
                                             : (*magnitude)[static_cast<std::size_t>(i)]) +
                                 underflow),
                      sequence_at(i) * std::abs(want)) +
             (i < 0 || !saved ? 0 : k_saved * (*saved)[static_cast<std::size_t>(i)]) +
             (i < 0 || !explained ? 0 : k_explained * (*explained)[static_cast<std::size_t>(i)]) +
             (i < 0 || !alone ? 0
                              : k_at(i) * unit * std::abs((*alone)[static_cast<std::size_t>(i)])) +
             floor;
    case pass_rule::baseline:
      return k * ref32_err + floor;
    case pass_rule::normwise:
      return rtol * scale + atol;
    default:
      return atol + rtol * std::abs(want);
    }
  }
  /// The error of `got` at element i (flat index) where the reference is `want`: |got - want|, or
  /// where the fp32 reference took another branch (`alone`), the distance to the nearer branch.
  double error(double got, double want, std::int64_t i) const {
    double const e = detail::abs_err(got, want);
    double const d = i < 0 || !alone ? 0.0 : (*alone)[static_cast<std::size_t>(i)];
    return d == 0 ? e : std::min(e, detail::abs_err(got, want + d));
  }
  /// error_bound: the k of element i (flat index; -1: the largest).
  double k_at(std::int64_t i) const {
    return i < 0 || !band_k ? k_bound : (*band_k)[static_cast<std::size_t>(bands.of(i))];
  }
  TILEGRAD_MACHINERY_MEMBER std::string describe() const
#if TILEGRAD_MACHINERY_BODIES
  {
    std::ostringstream os;
    os.precision(3);
    if (rule == pass_rule::error_bound) {
      double k_min = k_bound;
      std::size_t b_max = 0;
      for (std::size_t b = 0; band_k && b < band_k->size(); ++b) {
        k_min = std::min(k_min, (*band_k)[b]);
        if ((*band_k)[b] > (*band_k)[b_max])
          b_max = b;
      }
      if (k_min == k_bound) {
        os << "|err| <= k " << k_bound << " * u " << unit << " * (" << weight() << ") elementwise";
        if (ref_units > 0)
          os << " (the fp32 reference is " << ref_units << " units off at worst)";
      } else {
        // k per band of rows: say where it is largest and why.
        auto const numel = static_cast<std::int64_t>(magnitude ? magnitude->size() : 0);
        auto const b = static_cast<std::int64_t>(b_max);
        os << "|err| <= k * u " << unit << " * (" << weight() << ") elementwise, k per band of "
           << bands.rows_per_band << " row(s): " << k_min << " to " << k_bound
           << ", the largest in rows " << bands.first_row(b) << "-" << bands.last_row(b, numel)
           << " (the fp32 reference is " << (*band_units)[b_max] << " units off there)";
      }
      if (sequence_at(-1) > k_min * unit) {
        os << ", or 3 sqrt(n) * u' * |g_ref64| where larger (long sums run in sequence; ";
        if (terms)
          os << "n per element: the number of terms of its sum, counted by a float64 sweep of the "
                "reference, at most "
             << sequence_n;
        else
          os << "n = " << sequence_n;
        os << ", the longest axis of the launch's tensors or their most elements per element of "
              "this gradient)";
      }
      if (explained)
        os << " + " << k_explained
           << " * (how far the float64 reference moves when each value its forward computes moves "
              "by its whole rounding error; what of the fp32 reference's error this explains "
              "raises k to at most 8 k_bound)";
      if (alone)
        os << " + k * u * |g_ref32 - g_ref64| at " << alone_count
           << " element(s) judged alone (the fp32 reference took another branch there than the "
              "float64 one: a comparison near a tie, a relu at 0; off by a whole term, they raise "
              "no k, and either branch passes: err is the smaller of those against g_ref64 and "
              "g_ref32)";
      if (saved)
        os << " + " << k_saved
           << " * (how far the gradient moves when the values the backward reads from the forward, "
              "or those the reference computes, move by their rounding errors, or its inputs by "
              "an ulp)";
      if (floor)
        os << " + " << floor;
    } else if (rule == pass_rule::baseline) {
      os << "tol " << bound(0) << " = k " << k << " * max|g_ref32 - g_ref64| " << ref32_err;
      if (ref32_err > 1.01 * ref32_err_seed)
        os << " (pooled over the seeds; this seed " << ref32_err_seed << ")";
      os << " + floor " << floor << " (max|g_ref64| " << scale << ")";
    } else if (rule == pass_rule::normwise) {
      os << "tol " << bound(0) << " = rtol " << rtol << " * max|g_ref64| " << scale << " + atol "
         << atol;
    } else
      os << "|err| <= atol " << atol << " + rtol " << rtol << " * |g_ref64|";
    return os.str();
  }
#else
  ;
#endif
};

/// How a gradient's fit along its reference was taken (gradient_report::scale_error): each
/// element weighed by its reference's square, the blocks runs of elements in order; the same in
/// blocks of equal weight; each element weighed by (reference / bound)^2, in runs.
enum class scale_fit_kind { squares, equal_weight, by_bounds };

/// What the check found for one gradient tensor on one seed.
struct gradient_report {
  std::string name, dtype, shape;
  std::int64_t numel = 0;
  bool compared = false; ///< false when the shape ruled a comparison out
  bool ok = false;
  tolerance tol;
  double max_abs_err = 0, max_rel_err = 0, mean_abs_err = 0;
  element_error at_max_abs, at_max_rel;
  /// The element closest to (or furthest over) its bound: error / bound, the bound, and under
  /// error_bound the |J|^T |w| it was formed from.
  double worst_ratio = 0, worst_ratio_bound = 0, worst_ratio_magnitude = 0;
  double worst_ratio_saved = 0; ///< the saved values' share of that bound (second look), if any
  double worst_ratio_explained = 0; ///< the reference's moves' share of it (first look), if any
  double worst_ratio_alone = 0;     ///< the share of an element judged alone (tolerance::alone)
  /// error_bound: the first few elements judged alone (tolerance::alone), in order
  std::vector<element_error> alone;
  double worst_ratio_k = 0;     ///< error_bound: the k of that element's band
  /// error_bound: where the allowance of a long sum, 3 sqrt(n) u' |g_ref64|, was that element's
  /// (larger than k u m), its n; else 0
  double worst_ratio_terms = 0;
  element_error at_worst_ratio;
  std::int64_t mismatches = 0, nonfinite = 0;
  /// error_bound: the mismatches at elements nothing reaches in the float64 reference (its
  /// |J|^T |w| is 0 there), where the kernel is not 0; and those where the kernel is 0 and the
  /// reference is not
  std::int64_t unreached = 0, zeroed = 0;
  std::vector<element_error> worst; ///< the largest errors first
  block_map map;
  /// Bounding box of the mismatches in the 2-D view (rows x last axis); lo > hi when none.
  std::int64_t bad_row_lo = 1, bad_row_hi = 0, bad_col_lo = 1, bad_col_hi = 0;
  std::vector<std::string> notes; ///< why it failed besides the numbers (dtype, shape)
  /// The gradient fitted as a multiple of the reference, g = (1 + scale_error) g_ref64 (least
  /// squares); that error in units of the bounds (what one bound with the reference's sign on
  /// every element would give); and how many standard errors it lies from 0 as blocks of the
  /// elements measure it (0: not measured).
  double scale_error = 0, scale_units = 0, scale_z = 0;
  /// The correlation of the gradient with the reference over the fit's elements (weighted as
  /// in it): near 1 where the gradient is a multiple of the reference, near 0 where it is
  /// unrelated (transposed, misplaced, another tensor's), 1 where the gradient is all zeros.
  double scale_correlation = 1;
  bool scale_failed = false; ///< failed by check_options::scale_units
  /// How the fit was taken (detail::fit_scale).
  scale_fit_kind scale_fit = scale_fit_kind::squares;
  /// The |scale_error| roundings allow besides (compare_gradient; the rounded reference's part
  /// only where the size and the agreement of the fit say it fails).
  double scale_allowed = 0;
};

/// The standard errors by which the blocks of a gradient's elements must agree on its fitted scale
/// error for check_options::scale_units to fail it.
inline constexpr double scale_agreement = 16;

/// Whether a gradient's fit along the reference describes it (reports say "off along the
/// reference", a factor): its correlation with the reference at least this in size (-1: a sign
/// flipped, a multiple too). Below, the gradient
/// is not a multiple of the reference (transposed, or another tensor's values), and the factor a
/// fit finds, about -1, would point at a missing scale or a sign.
inline constexpr double scale_correlation_min = 0.9;

namespace detail {
/// The least-squares s of got = (1 + s) ref over the elements where both are finite (NaN where
/// ref is all zeros there).
inline double scale_error_of(std::vector<double> const& got, std::vector<double> const& ref) {
  double gg = 0, eg = 0;
  for (std::size_t i = 0; i < std::min(got.size(), ref.size()); ++i)
    if (double const e = got[i] - ref[i]; std::isfinite(e) && std::isfinite(ref[i])) {
      gg += ref[i] * ref[i];
      eg += e * ref[i];
    }
  return gg > 0 ? eg / gg : std::numeric_limits<double>::quiet_NaN();
}

/// The fitted scale error of the reference itself rounded to nearest in `dtype` (as reports name
/// it): how far a gradient correctly rounded to its dtype lies along the reference (all the
/// elements near one value, rounding one way: a loss averaged over 255 rows in bf16).
/// (`bound`, where the fit weighed each element by its bound: fit_scale.)
template <class Bound = std::nullptr_t>
double rounding_scale_error(std::vector<double> const& ref, std::string const& dtype,
                            Bound&& bound = nullptr) {
  if (dtype != "bfloat16" && dtype != "float32")
    return 0;
  std::vector<double> rounded(ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i)
    rounded[i] = dtype == "bfloat16"
                     ? static_cast<double>(static_cast<float>(bf16(static_cast<float>(ref[i]))))
                     : static_cast<double>(static_cast<float>(ref[i]));
  if constexpr (!std::is_same_v<std::remove_cvref_t<Bound>, std::nullptr_t>) {
    double gg = 0, eg = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      double const b = bound(static_cast<std::int64_t>(i)), e = rounded[i] - ref[i];
      if (std::isfinite(e) && std::isfinite(b) && b > 0 && ref[i] != 0) {
        gg += ref[i] * ref[i] / (b * b);
        eg += e * ref[i] / (b * b);
      }
    }
    return gg > 0 && std::isfinite(eg / gg) ? eg / gg : 0;
  } else {
    double const s = scale_error_of(rounded, ref);
    return std::isfinite(s) ? s : 0;
  }
}

/// The fit of gradient_report::scale_error over elements where the gradient, the reference and
/// the bound are finite and the bound positive: `bound(i)` the bound of element i. Least squares
/// weighs element i by g_i^2, and the blocks are 64 runs of elements in order. Where that weight
/// sits in fewer than 8 blocks' worth (a few elements dwarf the rest: an embedding whose lookups
/// mostly hit a few rows) and `limit` is positive (check_options::scale_units, given for bf16
/// gradients only), two more fits are taken (gradient_report::scale_fit):
/// - the same weights in 64 blocks of equal weight, which split the few heavy elements (a factor
///   off on the hot rows alone);
/// - each element weighed by (g_i / bound_i)^2, as much as its own bound lets it count, in runs
///   (a factor off on every element, which the many light ones show).
/// The first of them that fails (units past `limit`, blocks agreeing past scale_agreement) is
/// kept, else the first measured. (A bf16 embedding gradient 1.5 % off all over, or on its hot
/// rows alone, passed with its fit not measured. Float32 keeps the first fit only: its sums'
/// one-sided roundings, small terms absorbed by a large one, are within its bounds and would
/// fail a correct backward.)
template <class Bound>
void fit_scale(std::vector<double> const& got, std::vector<double> const& ref, Bound&& bound,
               gradient_report& r, double limit = 0) {
  std::size_t const n = std::min(got.size(), ref.size());
  int const blocks = static_cast<int>(std::min<std::size_t>(64, std::max<std::size_t>(n / 16, 1)));
  std::vector<double> bg(static_cast<std::size_t>(blocks)), be(bg.size());
  // One weighted fit: weight(b) of each element, blocks of equal weight or runs; whether its
  // blocks measure it (enough).
  auto fit = [&](auto&& weight, bool equal_weight) {
    std::fill(bg.begin(), bg.end(), 0.0);
    std::fill(be.begin(), be.end(), 0.0);
    auto each = [&](auto&& f) {
      for (std::size_t i = 0; i < n; ++i) {
        double const g = ref[i], e = got[i] - ref[i];
        double const b = bound(static_cast<std::int64_t>(i));
        if (std::isfinite(e) && std::isfinite(b) && b > 0 && g != 0)
          f(i, g, e, b, weight(b));
      }
    };
    double total = 0;
    if (equal_weight)
      each([&](std::size_t, double g, double, double, double w) { total += w * g * g; });
    double gg = 0, eg = 0, b_abs = 0, kk = 0;
    each([&](std::size_t i, double g, double e, double b, double w) {
      auto const k = equal_weight
                         ? std::min(static_cast<std::size_t>(gg / total * blocks),
                                    static_cast<std::size_t>(blocks - 1))
                         : static_cast<std::size_t>(i * static_cast<std::size_t>(blocks) / n);
      gg += w * g * g;
      eg += w * e * g;
      kk += w * (g + e) * (g + e);
      b_abs += w * b * std::abs(g);
      bg[k] += w * g * g;
      be[k] += w * e * g;
    });
    if (!(gg > 0) || !std::isfinite(gg))
      return false;
    r.scale_error = eg / gg;
    r.scale_units = std::abs(eg) / b_abs;
    r.scale_correlation = kk > 0 ? (eg + gg) / std::sqrt(kk * gg) : 1.0;
    // Spread of the blocks' own fits about the whole's, weighted as they weigh in it.
    double var = 0, w2 = 0;
    int used = 0;
    for (int k = 0; k < blocks; ++k)
      if (bg[static_cast<std::size_t>(k)] > 0) {
        double const w = bg[static_cast<std::size_t>(k)] / gg;
        double const d =
            be[static_cast<std::size_t>(k)] / bg[static_cast<std::size_t>(k)] - r.scale_error;
        var += w * w * d * d;
        w2 += w * w;
        ++used;
      }
    // (Blocks that carry the whole weight between them count as that few: n_eff = 1 / sum w^2.)
    bool const enough = used >= 8 && w2 > 0 && 1 / w2 >= 8;
    r.scale_z = enough && var > 0   ? std::abs(r.scale_error) / std::sqrt(var)
                : enough && eg != 0 ? std::numeric_limits<double>::infinity()
                                    : 0;
    return enough;
  };
  auto const squares = [](double) { return 1.0; };
  auto const by_bounds = [](double b) { return 1 / (b * b); };
  r.scale_fit = scale_fit_kind::squares;
  if (fit(squares, false) || !(limit > 0))
    return;
  struct measured {
    double s, units, z, correlation;
    scale_fit_kind kind;
  };
  measured const first{r.scale_error, r.scale_units, r.scale_z, r.scale_correlation,
                       scale_fit_kind::squares};
  std::optional<measured> kept;
  for (scale_fit_kind kind : {scale_fit_kind::equal_weight, scale_fit_kind::by_bounds}) {
    if (!(kind == scale_fit_kind::equal_weight ? fit(squares, true) : fit(by_bounds, false)))
      continue;
    measured const m{r.scale_error, r.scale_units, r.scale_z, r.scale_correlation, kind};
    if (m.units > limit && m.z > scale_agreement) {
      kept = m;
      break;
    }
    if (!kept)
      kept = m;
  }
  measured const& k = kept ? *kept : first;
  r.scale_error = k.s, r.scale_units = k.units, r.scale_z = k.z, r.scale_fit = k.kind;
  r.scale_correlation = k.correlation;
}
} // namespace detail

/// error_bound: the units of the fp32 reference's error that its forward's explained roundings may
/// still count for (k up to 8 times k_bound, as before they were explained): past that, only what
/// they do not explain raises k. (Explained roundings of the fp32 reference, FlashAttention's
/// scores read by exp, go with roundings of a backward's own that they do not explain, the
/// scores it recomputes; with no k from them at all, correct attention backwards with query rows
/// scaled up to 100 failed 14 checks in 400 where 9 had.)
inline double explained_units_cap(check_options const& o, dtype_rules const& dtype) {
  return 8 * o.k_bound.value_or(dtype.k_bound) / o.k;
}

/// The tolerance of the pass rule for one gradient, from its two references.
/// @param dtype the pass rules' constants of the working dtype (that of the forward's float
///   tensors)
/// @param ref32 the reference at the working precision; read by the baseline rule only
/// @param pooled_rel the largest max|g_ref32 - g_ref64| / max|g_ref64| over all seeds, which
///   stands in for this seed's when larger
/// @param magnitude error_bound: |J|^T |w| per element (the magnitude sweep of the reference)
/// @param pooled_units error_bound: per band, the largest units the reference is off by over
///   all seeds, which stand in for this seed's when larger
/// @param bands error_bound: the bands of rows k is taken over (one band: one k per gradient)
/// @param saved error_bound: per element, how far the kernel's gradient moved when the values it
///   reads from the forward moved by their rounding errors (the second look; null: none)
/// @param explained error_bound: per element, how far the float64 reference moved when the values
///   its forward computes moved by their whole rounding errors (null or empty: not run)
/// @param terms error_bound: per element, the number of terms of its sum (null: not
///   swept, sequence_n stands for it)
/// @param sequence_n error_bound: the most terms a sum may count (-1: the dtype's longest axis)
/// @param flips error_bound: per element, whether the fp32 reference took another branch on a path
///   to it (detail::error_units; null: none)
inline tolerance
make_tolerance(check_options const& o, dtype_rules const& dtype, std::vector<double> const& ref64,
               std::vector<double> const& ref32, double pooled_rel = 0,
               std::vector<double> const* magnitude = nullptr,
               std::vector<double> const* pooled_units = nullptr,
               std::vector<double> const* saved = nullptr, row_bands const& bands = {},
               std::vector<double> const* explained = nullptr,
               std::vector<double> const* terms = nullptr, std::int64_t sequence_n = -1,
               std::vector<char> const* flips = nullptr) {
  tolerance t;
  t.rule = o.rule.value_or(dtype.rule);
  t.scale = detail::max_abs(ref64);
  if (t.rule == pass_rule::error_bound) {
    t.unit = dtype.eps / 2;
    t.underflow = t.unit * dtype.min_normal;
    t.sequence_n = sequence_n < 0 ? dtype.longest_axis : sequence_n;
    t.compute_unit = dtype.compute_unit;
    if (terms && terms->size() == ref64.size())
      t.terms = std::make_shared<std::vector<double> const>(*terms);
    t.floor = o.floor_abs;
    t.squares = dtype.squares;
    if (magnitude) {
      t.magnitude = std::make_shared<std::vector<double> const>(*magnitude);
      t.max_magnitude = detail::max_abs(*magnitude);
    }
    // The forward's own roundings (an exp amplifies its argument's) reach the gradient through
    // values the magnitude sweep takes as exact; the reference at the working precision suffers
    // them too, so the kernel may be k times as many units off as the reference is.
    // Per band of rows, so that one badly conditioned row raises k only in its band.
    // Elements where the fp32 reference took another branch are judged alone.
    std::vector<double> units(static_cast<std::size_t>(bands.count), 0.0), alone;
    bool const ex = explained && !explained->empty() && explained->size() == ref64.size();
    if (magnitude)
      units = detail::error_units(ref32, ref64, *magnitude, t.unit, bands, t.underflow,
                                  ex ? explained : nullptr, explained_units_cap(o, dtype), flips,
                                  &alone);
    t.alone_count = std::count_if(alone.begin(), alone.end(), [](double v) { return v != 0; });
    if (t.alone_count)
      t.alone = std::make_shared<std::vector<double> const>(std::move(alone));
    std::vector<double> ks(units.size());
    double const k0 = o.k_bound.value_or(dtype.k_bound);
    for (std::size_t b = 0; b < units.size(); ++b) {
      if (pooled_units && b < pooled_units->size())
        units[b] = std::max(units[b], (*pooled_units)[b]);
      ks[b] = std::max(k0, o.k * units[b]);
      t.ref_units = std::max(t.ref_units, units[b]);
    }
    t.k_bound = std::max(k0, o.k * t.ref_units);
    t.bands = bands;
    t.band_k = std::make_shared<std::vector<double> const>(std::move(ks));
    t.band_units = std::make_shared<std::vector<double> const>(std::move(units));
    if (saved && !saved->empty()) {
      t.saved = std::make_shared<std::vector<double> const>(*saved);
      t.k_saved = o.k_saved;
    }
    if (ex) {
      t.explained = std::make_shared<std::vector<double> const>(*explained);
      t.k_explained = o.k;
    }
  } else if (t.rule == pass_rule::baseline) {
    t.k = o.k;
    t.ref32_err_seed = detail::max_abs_diff(ref32, ref64);
    t.ref32_err = std::max(t.ref32_err_seed, pooled_rel * t.scale);
    t.floor = o.floor_ulps * dtype.eps * t.scale + o.floor_abs;
  } else if (t.rule == pass_rule::normwise) {
    t.atol = o.atol.value_or(0);
    t.rtol = o.rtol.value_or(dtype.normwise_rtol);
  } else {
    t.atol = o.atol.value_or(dtype.atol);
    t.rtol = o.rtol.value_or(dtype.rtol);
  }
  return t;
}

/// Compares `got` with `ref64` under `tol`. `got` must have ref64's number of elements.
/// @param scale_units check_options::scale_units as it applies (0: off)
/// @param scale_allowed how far the fitted scale error may be off all the same (what the second
///   look's moves of the forward's roundings shifted it by, k_saved times)
inline gradient_report compare_gradient(erased_gradient const& got,
                                        std::vector<double> const& ref64, tolerance const& tol,
                                        check_options const& o, double scale_units = 0,
                                        double scale_allowed = 0) {
  gradient_report r;
  r.name = got.name;
  r.dtype = got.dtype;
  r.shape = got.shape_string();
  r.numel = got.numel();
  r.compared = true;
  r.tol = tol;
  std::int64_t const cols = got.shape[got.rank - 1];
  std::int64_t const rows = cols == 0 ? 0 : r.numel / cols;
  std::vector<std::int64_t> lead(got.shape.begin(), got.shape.begin() + std::max(0, got.rank - 2));
  r.map = block_map(rows, cols, std::move(lead), o.map_rows, o.map_cols);

  double sum = 0;
  std::int64_t i_abs = 0, i_rel = -1, i_ratio = -1;
  std::vector<std::int64_t> order;
  std::vector<double> ratios; // err / bound per element: the worst are the furthest over it
  for (std::int64_t i = 0; i < r.numel; ++i) {
    double const g = got.values[static_cast<std::size_t>(i)];
    double const w = ref64[static_cast<std::size_t>(i)];
    if (!std::isfinite(g))
      ++r.nonfinite;
    {
      double const e = detail::abs_err(g, w);
      sum += e;
      if (e > r.max_abs_err) {
        r.max_abs_err = e;
        i_abs = i;
      }
      if (w != 0 && e / std::abs(w) > r.max_rel_err) {
        r.max_rel_err = e / std::abs(w);
        i_rel = i;
      }
    }
    double const b = tol.bound(w, i);
    double const e = tol.error(g, w, i); // (the nearer branch's, where the fp32 one differs)
    double ratio = b > 0 ? e / b : e > 0 ? std::numeric_limits<double>::infinity() : 0.0;
    if (std::isnan(ratio)) // an infinite error against an infinite bound
      ratio = e <= b ? 0.0 : std::numeric_limits<double>::infinity();
    ratios.push_back(ratio);
    if (b > 0 ? e / b > r.worst_ratio : e > 0) {
      r.worst_ratio = b > 0 ? e / b : std::numeric_limits<double>::infinity();
      r.worst_ratio_bound = b;
      i_ratio = i;
    }
    if (!(e <= b)) {
      ++r.mismatches;
      if (tol.magnitude && (*tol.magnitude)[static_cast<std::size_t>(i)] == 0 && w == 0)
        ++r.unreached;
      else if (g == 0)
        ++r.zeroed;
      std::int64_t const row = i / cols, col = i % cols;
      r.map.mark(row, col);
      r.bad_row_lo = r.mismatches == 1 ? row : std::min(r.bad_row_lo, row);
      r.bad_row_hi = std::max(r.bad_row_hi, row);
      r.bad_col_lo = r.mismatches == 1 ? col : std::min(r.bad_col_lo, col);
      r.bad_col_hi = std::max(r.bad_col_hi, col);
    }
    order.push_back(i);
  }
  r.mean_abs_err = r.numel ? sum / static_cast<double>(r.numel) : 0;
  auto element = [&](std::int64_t i) {
    element_error el{detail::unravel(i, got.shape, got.rank),
                     got.values[static_cast<std::size_t>(i)], ref64[static_cast<std::size_t>(i)],
                     ratios[static_cast<std::size_t>(i)]};
    if (double const d = tol.alone ? (*tol.alone)[static_cast<std::size_t>(i)] : 0.0; d != 0) {
      el.branch = el.want + d;
      el.other_branch = true;
    }
    return el;
  };
  if (r.numel)
    r.at_max_abs = element(i_abs);
  if (i_rel >= 0)
    r.at_max_rel = element(i_rel);
  for (std::int64_t i = 0; tol.alone && i < r.numel && r.alone.size() < 3; ++i)
    if ((*tol.alone)[static_cast<std::size_t>(i)] != 0)
      r.alone.push_back(element(i));
  if (i_ratio >= 0) {
    r.at_worst_ratio = element(i_ratio);
    if (tol.magnitude)
      r.worst_ratio_magnitude = (*tol.magnitude)[static_cast<std::size_t>(i_ratio)];
    if (tol.saved)
      r.worst_ratio_saved = tol.k_saved * (*tol.saved)[static_cast<std::size_t>(i_ratio)];
    if (tol.explained)
      r.worst_ratio_explained =
          tol.k_explained * (*tol.explained)[static_cast<std::size_t>(i_ratio)];
    if (tol.alone)
      r.worst_ratio_alone =
          tol.k_at(i_ratio) * tol.unit * std::abs((*tol.alone)[static_cast<std::size_t>(i_ratio)]);
    r.worst_ratio_k = tol.k_at(i_ratio);
    if (tol.rule == pass_rule::error_bound) {
      double const want = std::abs(ref64[static_cast<std::size_t>(i_ratio)]);
      double const m = tol.magnitude ? r.worst_ratio_magnitude : tol.max_magnitude;
      if (tol.sequence_at(i_ratio) * want > r.worst_ratio_k * (tol.unit * m + tol.underflow)) {
        double const c = tol.sequence_at(i_ratio) / (tol.sequence_factor * tol.compute_unit);
        r.worst_ratio_terms = c * c;
      }
    }
  }
  auto const k =
      std::min<std::size_t>(static_cast<std::size_t>(std::max(o.worst, 0)), order.size());
  // The worst: the furthest over their bounds (a bug in a row of small values before large
  // correct values whose rounding is larger), then by absolute error.
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](std::int64_t a, std::int64_t b) {
                      auto const ra = ratios[static_cast<std::size_t>(a)];
                      auto const rb = ratios[static_cast<std::size_t>(b)];
                      if (ra != rb)
                        return ra > rb;
                      auto const ea = detail::abs_err(got.values[static_cast<std::size_t>(a)],
                                                      ref64[static_cast<std::size_t>(a)]);
                      auto const eb = detail::abs_err(got.values[static_cast<std::size_t>(b)],
                                                      ref64[static_cast<std::size_t>(b)]);
                      return ea > eb || (ea == eb && a < b);
                    });
  for (std::size_t j = 0; j < k; ++j)
    r.worst.push_back(element(order[j]));
  r.ok = r.mismatches == 0;
  if (tol.rule == pass_rule::error_bound) {
    auto const bound = [&](std::int64_t i) {
      return tol.bound(ref64[static_cast<std::size_t>(i)], i);
    };
    detail::fit_scale(got.values, ref64, bound, r, got.dtype == "bfloat16" ? scale_units : 0);
    // Allowed besides: the fit of the reference rounded to the gradient's dtype, and two unit
    // roundoffs of the working dtype (two roundings of factors every element shares: 1/N of a
    // mean rounded to bf16 before use, as autograd's MeanBackward does, is up to one).
    // The rounded reference's fit is a pass over the gradient: taken only where the fit's size
    // and its blocks' agreement already say it may fail.
    r.scale_allowed = scale_allowed + 2 * tol.unit;
    // A bf16 gradient is judged too where its fit is past that allowance, however small a share
    // of its bounds: where its elements sum many terms that cancel (dq and dk of attention over
    // N keys), the bounds grow with sqrt(N), and FlashAttention's dq 1 % too large was 0.087 of
    // them at N = 1024 (passed) though its blocks agreed to 178 standard errors. (Correct bf16
    // gradients' blocks agree to 8 at most; float32 keeps the share: docs/checking.md.) A share
    // the caller sets is the rule as given.
    bool const past_allowance =
        got.dtype == "bfloat16" && !o.scale_units && std::abs(r.scale_error) > r.scale_allowed;
    if (scale_units > 0 && (r.scale_units > scale_units || past_allowance) &&
        r.scale_z > scale_agreement) {
      r.scale_allowed += std::abs(r.scale_fit == scale_fit_kind::by_bounds
                                      ? detail::rounding_scale_error(ref64, got.dtype, bound)
                                      : detail::rounding_scale_error(ref64, got.dtype));
      if (std::abs(r.scale_error) > r.scale_allowed) {
        r.ok = false;
        r.scale_failed = true;
      }
    }
  }
  return r;
}

} // namespace tilegrad
