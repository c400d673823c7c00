// Options of check_backward: the pass rule and its constants, seeds, how inputs are drawn, which
// structural checks run.
#pragma once

#include "tilegrad/grid/launch.hpp"

#include <functional>
#include <optional>
#include <random>
#include <string>

namespace tilegrad {

/// How a hand-written gradient is judged against the fp64 reference.
enum class pass_rule {
  /// max|g - g_ref64| <= k * max|g_ref32 - g_ref64| + floor: the kernel may be off by k times
  /// what the reference itself loses at the working precision (the FlashAttention tests' rule).
  baseline,
  /// |g - g_ref64| <= atol + rtol * |g_ref64| elementwise (torch.testing.assert_close).
  atol_rtol,
};

/// Draws one input element; called in row-major order, per tensor, with a generator seeded
/// from the check's seed and the tensor's position.
using input_generator = std::function<double(std::string const& name, std::mt19937_64& rng)>;

/// Uniform values in [lo, hi) for every input (`uniform(0.5, 2)` for positive inputs).
inline input_generator uniform(double lo, double hi) {
  return [lo, hi](std::string const&, std::mt19937_64& rng) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  };
}

struct check_options {
  /// Seeds first_seed, first_seed + 1, ...: each draws fresh inputs and cotangents.
  int seeds = 3;
  unsigned first_seed = 0;

  pass_rule rule = pass_rule::baseline;
  /// baseline: the multiple of the reference's own fp32 error the kernel may have.
  double k = 3;
  /// baseline: floor = floor_ulps * epsilon(working dtype) * max|g_ref64| + floor_abs, the
  /// round-off of any arithmetic on the reference (covers a reference that is exact in fp32).
  double floor_ulps = 4;
  double floor_abs = 0;
  /// atol_rtol: unset means the working dtype's default (float32: 1e-5 and 1.3e-6, float64:
  /// 1e-7 and 1e-7, as torch.testing).
  std::optional<double> atol = {}, rtol = {};

  /// Worst elements listed per gradient, and the largest block map.
  int worst = 5;
  int map_rows = 16, map_cols = 32;

  /// Values of the inputs; uniform in [-1, 1) when unset.
  input_generator inputs = {};

  /// Structural checks, on the first seed: zero and doubled cotangents, and a second run of
  /// the backward compared bitwise with the first.
  bool check_linearity = true;
  bool check_determinism = true;
  /// A reference gradient that is all zeros, or an input the reference never read, fails the
  /// check (usually a tensor captured by the kernel instead of passed to it).
  bool zero_reference_fails = true;

  /// Options of the forward launch and of the reference vjp.
  launch_options launch = {};
};

} // namespace tilegrad
