// The result of check_backward: per seed, a report per gradient and the structural problems
// found; bool-convertible (true when everything passed) and printable.
#pragma once

#include "tilegrad/check/compare.hpp"
#include "tilegrad/core/config.hpp"

#include <cmath>
#include <cstddef>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

namespace tilegrad {

/// What one seed found.
struct seed_report {
  unsigned seed = 0;
  std::vector<gradient_report> gradients;
  std::vector<std::string> problems; ///< structural failures: each fails the check
  bool ok() const {
    if (!problems.empty())
      return false;
    for (auto const& g : gradients)
      if (!g.ok)
        return false;
    return true;
  }
};

class check_report {
public:
  std::string launch; ///< grid and tensors: role, name, dtype, shape
  std::string rule;   ///< the pass rule in words
  /// The reference's own check against forward mode (check_options::check_reference): both
  /// sides of <J u, w> = <u, J^T w> on the first seed, and how far apart; empty where not run.
  std::string reference;
  std::vector<seed_report> seeds;
  std::vector<std::string> warnings; ///< printed; they do not fail the check
  std::vector<std::string> notes;    ///< what was seen and found harmless (atomic reordering)
  /// What a failure most likely means and what to do (an output whose cotangent the backward
  /// ignores: a tensor saved for the backward marked out); printed last.
  std::vector<std::string> hints;

  bool ok() const {
    if (seeds.empty())
      return false;
    for (auto const& s : seeds)
      if (!s.ok())
        return false;
    return true;
  }
  explicit operator bool() const { return ok(); }

  /// The report of gradient `name` on the seed at `seed_index` (null if it has none).
  gradient_report const* gradient(std::string const& name, std::size_t seed_index = 0) const {
    if (seed_index >= seeds.size())
      return nullptr;
    for (auto const& g : seeds[seed_index].gradients)
      if (g.name == name)
        return &g;
    return nullptr;
  }
  /// Every structural problem, as "seed S: ...".
  TILEGRAD_MACHINERY_MEMBER std::vector<std::string> problems() const
#if TILEGRAD_MACHINERY_BODIES
  {
    std::vector<std::string> out;
    for (auto const& s : seeds)
      for (auto const& p : s.problems)
        out.push_back("seed " + std::to_string(s.seed) + ": " + p);
    return out;
  }
#else
  ;
#endif
  /// Whether some problem, warning, note or hint contains `text`.
  bool mentions(std::string const& text) const {
    for (auto const& p : problems())
      if (p.find(text) != std::string::npos)
        return true;
    for (auto const* list : {&warnings, &notes, &hints})
      for (auto const& w : *list)
        if (w.find(text) != std::string::npos)
          return true;
    return false;
  }

  std::string str() const {
    std::ostringstream os;
    os << *this;
    return os.str();
  }

  friend TILEGRAD_MACHINERY_MEMBER std::ostream& operator<<(std::ostream& os, check_report const& r)
#if TILEGRAD_MACHINERY_BODIES
  {
    os << "check_backward: " << (r.ok() ? "PASS" : "FAIL") << "\n  launch: " << r.launch
       << "\n  rule:   " << r.rule << "\n";
    if (!r.reference.empty())
      os << "  reference: " << r.reference << "\n";
    for (auto const& w : r.warnings)
      os << "  warning: " << w << "\n";
    for (auto const& n : r.notes)
      os << "  note: " << n << "\n";
    for (auto const& s : r.seeds) {
      os << "  seed " << s.seed << ": " << (s.ok() ? "pass" : "FAIL") << "\n";
      for (auto const& p : s.problems)
        os << "    problem: " << p << "\n";
      for (auto const& g : s.gradients)
        print(os, g);
    }
    for (auto const& s : r.seeds)
      if (!s.ok()) {
        os << "  reproduce with check_options{.seeds = 1, .first_seed = " << s.seed << "}\n";
        break;
      }
    for (auto const& h : r.hints)
      os << "  hint: " << h << "\n";
    return os;
  }
#else
  ;
#endif

private:
  TILEGRAD_MACHINERY_MEMBER static void print(std::ostream& os, gradient_report const& g)
#if TILEGRAD_MACHINERY_BODIES
  {
    auto const flags = os.flags();
    auto const prec = os.precision(4);
    os << "    " << g.name << " " << g.dtype << " " << g.shape << ": " << (g.ok ? "ok" : "FAIL");
    for (auto const& n : g.notes)
      os << "; " << n;
    if (!g.compared) {
      os << "\n";
      os.precision(prec);
      return;
    }
    os << "; max abs err " << g.max_abs_err;
    if (g.tol.rule == pass_rule::error_bound) {
      os << ", " << g.mismatches << " elements over " << g.tol.describe() << "\n";
      if (!g.at_worst_ratio.at.empty()) {
        os << "      closest to its bound: " << g.at_worst_ratio.where() << " err "
           << g.at_worst_ratio.abs_err() << (g.worst_ratio <= 1 ? " <= " : " > ") << "bound "
           << g.worst_ratio_bound << " = ";
        if (g.worst_ratio_terms > 0) // the long sum's allowance, larger there than k u m
          os << g.tol.sequence_factor << " sqrt(" << g.worst_ratio_terms << " terms) * "
             << g.tol.compute_unit << " * " << std::abs(g.at_worst_ratio.want)
             << " (|g_ref64| there: a long sum in sequence)";
        else
          os << g.worst_ratio_k << " * " << g.tol.unit << " * " << g.worst_ratio_magnitude << " ("
             << g.tol.weight() << " there)";
        if (g.worst_ratio_explained > 0)
          os << " + " << g.worst_ratio_explained << " (the forward's roundings, first look)";
        if (g.worst_ratio_alone > 0)
          os << " + " << g.worst_ratio_alone << " (judged alone: another branch in the fp32 "
             << "reference)";
        if (g.worst_ratio_saved > 0)
          os << " + " << g.worst_ratio_saved << " (the forward's roundings, second look)";
        os << (g.tol.floor ? " + " + std::to_string(g.tol.floor) : std::string())
           << ", err/bound " << g.worst_ratio << "\n";
      }
      if (!g.alone.empty()) {
        os << "      judged alone (another branch in the fp32 reference):";
        for (auto const& e : g.alone)
          os << " " << e.where() << " kernel " << e.got << " reference " << e.want
             << " fp32 reference " << e.branch << " err/bound " << e.ratio << ";";
        if (g.tol.alone_count > static_cast<std::int64_t>(g.alone.size()))
          os << " ... (" << g.tol.alone_count << " in all)";
        os << "\n";
      }
    } else if (g.tol.rule != pass_rule::atol_rtol) // one bound for the tensor
      os << (g.max_abs_err <= g.tol.bound(0) ? " <= " : " > ") << g.tol.describe() << "\n";
    else
      os << ", " << g.mismatches << " elements over " << g.tol.describe() << "\n";
    if (!g.ok) {
      auto pct =
          100.0 * static_cast<double>(g.mismatches) / static_cast<double>(g.numel ? g.numel : 1);
      os << "      max abs err " << g.max_abs_err << " at " << g.at_max_abs.where() << ": kernel "
         << g.at_max_abs.got << ", reference " << g.at_max_abs.want << "\n";
      if (!g.at_max_rel.at.empty())
        os << "      max rel err " << g.max_rel_err << " at " << g.at_max_rel.where() << ": kernel "
           << g.at_max_rel.got << ", reference " << g.at_max_rel.want << "\n";
      os << "      mismatches " << g.mismatches << " of " << g.numel << " (" << pct
         << "%), mean abs err " << g.mean_abs_err;
      if (g.nonfinite)
        os << ", " << g.nonfinite << " NaN/Inf";
      os << "\n      worst:";
      for (std::size_t i = 0; i < g.worst.size(); ++i) {
        os << (i ? "\n             " : " ") << g.worst[i].where() << " kernel " << g.worst[i].got
           << " reference " << g.worst[i].want;
        if (g.worst[i].other_branch)
          os << " (another branch: " << g.worst[i].branch << ")";
        os << " err " << g.worst[i].abs_err() << " err/bound " << g.worst[i].ratio;
      }
      os << "\n";
      if (g.mismatches)
        os << g.map;
      // What a factor missing, or applied twice, leaves: the whole gradient a multiple of the
      // reference, which its blocks agree on.
      if (g.scale_z > scale_agreement && !(std::abs(g.scale_correlation) >= scale_correlation_min))
        os << "      unlike the reference: kernel and reference correlate at "
           << g.scale_correlation << " over its elements (a least-squares factor would be (1 + "
           << g.scale_error << "), but they are not multiples of each other)\n";
      else if (g.scale_z > scale_agreement)
        os << "      along the reference: kernel = (1 + " << g.scale_error
           << ") * reference, fitted over its elements (least squares"
           << (g.scale_fit == scale_fit_kind::by_bounds
                   ? ", each weighted by its bound: the reference's largest elements sit in a "
                     "few blocks"
               : g.scale_fit == scale_fit_kind::equal_weight
                   ? ", in blocks of equal weight: the reference's largest elements sit in a "
                     "few places"
                   : "")
           << "; its blocks agree to " << g.scale_z << " standard errors), " << g.scale_units
           << " of its bounds (sum bound |ref| / sum ref^2)\n";
    }
    os.flags(flags);
    os.precision(prec);
  }
#else
  ;
#endif
};

} // namespace tilegrad
