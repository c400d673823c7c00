// Options of check_backward: the pass rule and its constants, seeds, how inputs are drawn, which
// structural checks run.
#pragma once

#include "tilegrad/core/bf16.hpp"
#include "tilegrad/grid/launch.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace tilegrad {

/// How a hand-written gradient is judged against the fp64 reference.
enum class pass_rule {
  /// |g - g_ref64| <= k_bound * u * m elementwise, m = (|J|^T |w|) at that element: the gradient of
  /// the same kernel taken on absolute values (every partial and cotangent by its magnitude),
  /// which weighs each rounding a float evaluation of the gradient makes; u the working dtype's
  /// unit roundoff. A running error bound per element: it holds for a correct kernel whatever
  /// order it sums in, and is 0 only where nothing reaches the element.
  error_bound,
  /// max|g - g_ref64| <= k * max|g_ref32 - g_ref64| + floor: the kernel may be off by k times
  /// what the reference itself loses at the working precision (the FlashAttention tests' rule).
  baseline,
  /// |g - g_ref64| <= atol + rtol * |g_ref64| elementwise (torch.testing.assert_close).
  atol_rtol,
  /// max|g - g_ref64| <= rtol * max|g_ref64| + atol: errors measured against the gradient's
  /// largest element, the rule for bf16 storage (where g_ref32 rounds nothing to bf16).
  normwise,
};

/// The working dtype's constants of the pass rules: its default rule, the default k_bound of the
/// error_bound rule and the defaults of the atol_rtol and normwise rules (used where
/// check_options leaves them unset).
struct dtype_rules {
  char const* name;
  double eps; ///< the spacing of the dtype at 1 (numeric_limits::epsilon); eps / 2 rounds
  pass_rule rule;
  double atol, rtol; ///< atol_rtol: torch.testing's defaults
  double normwise_rtol;
  /// normwise_rtol = normwise_units * eps / 2: 4 * 2^-8 for bfloat16.
  static constexpr double normwise_units = 4;
  /// error_bound: the multiple of u * (|J|^T |w|) an element may be off by. float32 and float64:
  /// 32, for sums run in any order of moderate depth (a correct FlashAttention backward reached
  /// 18 units; long sums in sequence: compute_unit below).
  /// bfloat16: 4, for the bf16 roundings of a kernel that computes in float (the stored
  /// gradient, P and dS before their dot, the forward's outputs the backward reads), in units of
  /// `squares` below: correct softmax and FlashAttention backwards stay within 2.6 units, one 2%
  /// off reaches 4.2-5 (docs/checking.md has the sweeps).
  double k_bound;
  /// The smallest normal number of the dtype: below it a rounding loses an absolute
  /// eps / 2 * min_normal (the spacing of the subnormals), whatever the size of the terms.
  double min_normal;
  /// The unit roundoff of the arithmetic (float's for bf16 storage): a sum of n terms of one sign
  /// run one after another (a loop over 8192 rows, per-row atomics) is off by about sqrt(n) / 3
  /// of it times the sum (one standard deviation; past k_bound units at n of a few thousand in
  /// the worst of many elements); an element may be off by 3 sqrt(n) compute_unit |g_ref64|, n
  /// the number of terms of its sum (at most the longest axis of the launch's tensors,
  /// or their most elements per element of the gradient; set by the checker).
  double compute_unit;
  std::int64_t longest_axis = 0;
  /// error_bound: what u multiplies per element. false: m = |J|^T |w|, a rounding charged to
  /// every term of the element's gradient in full (float32, float64: sums of float roundings).
  /// true (bfloat16): |g_ref64| + sqrt(|J|^2^T w^2), one rounding of the result plus a random walk
  /// of one independent rounding per term; a kernel that computes in float rounds the terms of
  /// a long reduction to bf16 at most once each (P and dS before their dot), where m charged
  /// each its full size and let bugs of 20-50 % through (docs/checking.md, bf16 storage).
  bool squares = false;
};

/// The pass rules' constants for a working dtype (float, double or bf16). Every dtype is checked
/// by error_bound, with u its unit roundoff. bf16 takes a smaller k: the kernel computes in
/// float with bf16-rounded operands and stores bf16, so what it loses is a few bf16 roundings:
/// of its result, and, as a random walk, of the terms it sums (the references run in float and
/// double, bf16 rounding differentiated as identity; the baseline's max|g_ref32 - g_ref64| says
/// nothing of what a bf16 kernel loses).
template <class T>
constexpr dtype_rules rules_for() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bf16>,
                "tilegrad::check_backward: the float tensors are float, double or bf16");
  constexpr double units = dtype_rules::normwise_units;
  if constexpr (std::is_same_v<T, bf16>)
    return {"bfloat16", 0x1p-7,  pass_rule::error_bound, 1e-5, 1.6e-2, units * 0x1p-8, 4,
            0x1p-126,   0x1p-24, 0,                      true};
  else if constexpr (std::is_same_v<T, float>)
    return {"float32", 0x1p-23,  pass_rule::error_bound, 1e-5, 1.3e-6, units * 0x1p-24,
            32,        0x1p-126, 0x1p-24,                0};
  else
    return {"float64", 0x1p-52,   pass_rule::error_bound, 1e-7, 1e-7, units * 0x1p-53, 32,
            0x1p-1022, 0x1p-53, 0};
}

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

  /// Unset: the working dtype's default (error_bound for float32, float64 and bfloat16; see
  /// rules_for).
  std::optional<pass_rule> rule = {};
  /// error_bound: the multiple of u * (|J|^T |w|) an element's error may reach; unset, the working
  /// dtype's (32 for float32 and float64, 4 for bfloat16; docs/checking.md has the sweeps that
  /// set them).
  std::optional<double> k_bound = {};
  /// error_bound: how far, in units of its bounds, a gradient may be off along its reference all
  /// over, g = (1 + s) g_ref64 fitted by least squares: a gradient fails where |s| exceeds this
  /// share of sum(bound |g_ref64|) / sum(g_ref64^2), the s of an error of one bound with the
  /// reference's sign on every element, and the blocks of its elements agree on s (16 standard
  /// errors; at least 8 blocks' worth of weight). Roundings move elements either way; a missing
  /// factor moves them all one way, and a few percent of a bf16 gradient passed element by
  /// element. Unset: 0.1 for bfloat16, 0.25 for float32 and float64 (docs/checking.md, "Errors
  /// along the reference"); 0: off. Unset, a bf16 gradient is also judged where its factor is
  /// past what roundings allow (two unit roundoffs and more), whatever its share of the bounds.
  std::optional<double> scale_units = {};
  /// error_bound with bfloat16 tensors: whether the backward keeps sums of many terms in bf16
  /// (partial weight gradients in a bf16 buffer, read back and added to, as in Triton's
  /// layer-norm tutorial). Such a sum is rounded at every step, at its full size, and the random
  /// walk of one rounding per term (|g_ref64| + sqrt(|J|^2^T w^2)) does not cover it.
  /// Unset: seen in the backward's launches (a bf16 tensor a launch both reads and writes, or one
  /// it writes that is not a gradient handed back); where seen, each seed runs the backward twice
  /// more with every bf16 value stored there moved by a unit in the last place, and widens each
  /// gradient's bound by how far that moves it (docs/checking.md). true: sums the launches cannot
  /// show (an accumulator tile rounded to bf16 as it adds): the gradients are weighed by the
  /// running error bound |J|^T |w|, as float32 ones are, which lets bugs of 20 % through in long
  /// reductions. false: the random walk alone.
  std::optional<bool> bf16_partial_sums = {};
  /// error_bound, second look: when an element is over its bound, the backward runs again with
  /// the values it reads from the forward (outputs, unmarked tensors the forward writes) moved by
  /// their rounding errors, and each element may also be off by k_saved times how far it moved
  /// (0: no second look). See docs/checking.md, "The forward's roundings".
  double k_saved = 2;
  /// error_bound, second look: the float64 reference runs twice more, every value its forward
  /// computes read by each operation that reads it moved by a random fraction of its rounding
  /// error (u |A| |B| for a dot), and how far each gradient element moves is allowed as the
  /// saved values' moves are: what a backward that recomputes those values (scores q k^T, then
  /// exp(s - lse)) with roundings of its own can be off by. And in the first look, where the
  /// fp32 reference's units raise k above k_bound, it runs twice more with every computed value
  /// moved by its whole rounding error (one draw per value): what of the fp32 reference's error
  /// that explains does not raise k, and each element may be off by k times its move (an angle
  /// pos * freq that cos reads). false: neither; only the saved values move.
  bool jitter_reference = true;
  /// error_bound, second look: the backward also runs on the forward's float inputs (marked in,
  /// and passive) each moved by one ulp, up or down at random (two patterns, each both ways), and
  /// an element may be off by k_saved times how far that moves it, as for the saved values: a
  /// float backward is as good as the exact gradient of inputs one rounding away, and one that
  /// recomputes what the forward computed from them (a cross-entropy's logsumexp, read by
  /// exp(x - lse)) rounds it where the reference (exp(x - max)) rounds nothing. false: the
  /// inputs stay.
  bool move_inputs = true;
  /// error_bound: k = max(k_bound, k * the units g_ref32 is off by) is taken per band of rows of
  /// each gradient's 2-D view (every axis but the last folded): at most k_bands bands, each of at
  /// least 512 elements (a smaller gradient is one band), so that one badly conditioned row
  /// raises k only in its band. 1: one k per gradient.
  int k_bands = 16;
  /// baseline: the multiple of the reference's own fp32 error the kernel may have.
  double k = 3;
  /// baseline: floor = floor_ulps * epsilon(working dtype) * max|g_ref64| + floor_abs, the
  /// round-off of any arithmetic on the reference (covers a reference that is exact in fp32).
  double floor_ulps = 4;
  double floor_abs = 0;
  /// atol_rtol and normwise: unset means the working dtype's default. atol_rtol as
  /// torch.testing (float32: 1e-5 and 1.3e-6, float64: 1e-7 and 1e-7, bfloat16: 1e-5 and
  /// 1.6e-2); normwise rtol = 4 units of roundoff (bfloat16: 4 * 2^-8 = 0.0156), atol = 0.
  std::optional<double> atol = {}, rtol = {};

  /// Worst elements listed per gradient, and the largest block map.
  int worst = 5;
  int map_rows = 16, map_cols = 32;

  /// Values of the inputs; uniform in [-1, 1) when unset.
  input_generator inputs = {};
  /// Inputs (in or passive) whose values are given: they keep what their tensors hold when
  /// check_backward is called, for every seed, while the others are still drawn. (An output's
  /// cotangent is given in forward() as out("y", y, dy).) For data from a failing run, or to
  /// compare with another framework on the same numbers.
  std::vector<std::string> given = {};

  /// Structural checks, on the first seed: zero and doubled cotangents, and a second run of
  /// the backward (the programs of each launch in reverse order) compared bitwise with the
  /// first. Without check_determinism the second run still looks for races, which tickets and
  /// locks can hide in the first run's order; only the comparison of its values is left out.
  bool check_linearity = true;
  bool check_determinism = true;
  /// The reference checked against forward mode, on the first seed: jvp of the forward in
  /// float64 along a random direction u of the inputs marked in must give <J u, w> = <u, J^T w>
  /// with the reference's gradients and the seed's cotangents w, to `reference_tolerance` times
  /// the sum of the terms' magnitudes plus sum |u| * |J|^T |w|, the sizes of the products summed
  /// inside them (dot_product_test, run on the check's own inputs). A derivative rule or memory
  /// semantic that reverse mode gets wrong in this kernel then fails the check as a wrong
  /// reference, whatever the backward does; it costs one float64 jvp.
  bool check_reference = true;
  double reference_tolerance = 1e-10;
  /// A reference gradient that is all zeros, or an input the reference never read, fails the
  /// check (usually a tensor captured by the kernel instead of passed to it).
  bool zero_reference_fails = true;

  /// Options of the forward launch and of the reference vjp.
  launch_options launch = {};
};

} // namespace tilegrad
