// GoogleTest assertions for check_backward and taylor_test reports: they print the whole report
// when the check fails. The only tilegrad header that includes GoogleTest.
#pragma once

#include <gtest/gtest.h>

#include <sstream>

namespace tilegrad::detail {
/// Success when `result` converts to true; otherwise a failure carrying the printed report.
template <class Result>
::testing::AssertionResult report_ok(char const* expr, Result const& result) {
  if (static_cast<bool>(result))
    return ::testing::AssertionSuccess();
  std::ostringstream os;
  os << expr << " failed:\n" << result;
  return ::testing::AssertionFailure() << os.str();
}
} // namespace tilegrad::detail

/// EXPECT_BACKWARD_OK(report): a non-fatal failure printing the report unless it passed.
#define EXPECT_BACKWARD_OK(report) EXPECT_PRED_FORMAT1(::tilegrad::detail::report_ok, report)
/// ASSERT_BACKWARD_OK(report): as EXPECT_BACKWARD_OK, and returns from the test on failure.
#define ASSERT_BACKWARD_OK(report) ASSERT_PRED_FORMAT1(::tilegrad::detail::report_ok, report)
