// Assertions on where check_backward found a gradient's mismatches: their bounding box in the
// 2-D view and the block map cells (marked inside the box, clean outside it).
#pragma once

#include <tilegrad/check/compare.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace test_support {

/// Whether the mismatches of `g` fill exactly the box rows [r0, r1] x columns [c0, c1] (both
/// inclusive) as a bounding box, and the block map agrees: a cell is marked iff it meets the box.
inline ::testing::AssertionResult mismatches_in(tilegrad::gradient_report const* g, std::int64_t r0,
                                                std::int64_t r1, std::int64_t c0, std::int64_t c1) {
  if (!g)
    return ::testing::AssertionFailure() << "no such gradient in the report";
  if (g->bad_row_lo != r0 || g->bad_row_hi != r1 || g->bad_col_lo != c0 || g->bad_col_hi != c1)
    return ::testing::AssertionFailure()
           << g->name << ": mismatches in rows " << g->bad_row_lo << "-" << g->bad_row_hi
           << ", columns " << g->bad_col_lo << "-" << g->bad_col_hi << "; expected rows " << r0
           << "-" << r1 << ", columns " << c0 << "-" << c1;
  auto const& m = g->map;
  for (int i = 0; i < m.cell_rows(); ++i)
    for (int j = 0; j < m.cell_cols(); ++j) {
      bool const meets = m.first_row(i) <= r1 && m.last_row(i) >= r0 &&
                         j * m.cols_per_cell() <= c1 && (j + 1) * m.cols_per_cell() > c0;
      if (meets != (m.symbol(i, j) != '.'))
        return ::testing::AssertionFailure() << g->name << ": block map cell (" << i << ", " << j
                                             << ") is '" << m.symbol(i, j) << "'\n"
                                             << m;
    }
  return ::testing::AssertionSuccess();
}

} // namespace test_support
