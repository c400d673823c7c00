// The float64 runs of the checker (check_backward's references, dot_product_test, taylor_test):
// what they promise, set on the thread that starts them and carried to the threads that run their
// programs (grid/launch.hpp's program_runner).
#pragma once

namespace tilegrad::detail {

struct float64_run {
  char const* who = nullptr; ///< the check, for messages
  /// to<bf16> of a float64 value throws (taylor_test: the staircase the rounding makes of the
  /// objective has no derivative for central differences to follow).
  bool refuse_bf16 = false;
};

/// The float64 run this thread is part of; null outside one (the fast path, plain launches).
inline float64_run const*& float64_reference() {
  thread_local float64_run const* run = nullptr;
  return run;
}

/// Makes this thread's launches part of `run` while it lives (null: of none).
struct float64_reference_scope {
  float64_run const* saved;
  explicit float64_reference_scope(float64_run const* run) : saved(float64_reference()) {
    float64_reference() = run;
  }
  ~float64_reference_scope() { float64_reference() = saved; }
  float64_reference_scope(float64_reference_scope const&) = delete;
  float64_reference_scope& operator=(float64_reference_scope const&) = delete;
};

} // namespace tilegrad::detail
