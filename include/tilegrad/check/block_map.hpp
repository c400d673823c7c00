// Block map: where the mismatched elements of a tensor sit, as a grid of at most 16 x 32 cells
// over its 2-D view (rows = every axis but the last, folded; columns = the last axis).
#pragma once

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace tilegrad {

/// Mismatch counts per cell. A bug in the last row tile shows as marks in the bottom cells
/// only, a causal-mask bug as a diagonal, a missing column tile as the right-hand cells.
class block_map {
public:
  block_map() = default;
  block_map(std::int64_t rows, std::int64_t cols, int max_cell_rows = 16, int max_cell_cols = 32)
      : rows_(rows), cols_(cols) {
    // Cells of a power-of-two extent line up with power-of-two tiles.
    rows_per_cell_ = pow2_at_least((rows + max_cell_rows - 1) / max_cell_rows);
    cols_per_cell_ = pow2_at_least((cols + max_cell_cols - 1) / max_cell_cols);
    cell_rows_ = static_cast<int>((rows + rows_per_cell_ - 1) / rows_per_cell_);
    cell_cols_ = static_cast<int>((cols + cols_per_cell_ - 1) / cols_per_cell_);
    bad_.assign(static_cast<std::size_t>(cell_rows_) * cell_cols_, 0);
  }

  /// Records a mismatch at element (r, c) of the 2-D view.
  void mark(std::int64_t r, std::int64_t c) {
    ++bad_[static_cast<std::size_t>(r / rows_per_cell_) * cell_cols_ + c / cols_per_cell_];
  }

  int cell_rows() const { return cell_rows_; }
  int cell_cols() const { return cell_cols_; }
  std::int64_t rows_per_cell() const { return rows_per_cell_; }
  std::int64_t cols_per_cell() const { return cols_per_cell_; }
  /// Mismatches in cell (i, j) and the elements it covers.
  std::int64_t mismatches(int i, int j) const {
    return bad_[static_cast<std::size_t>(i) * cell_cols_ + j];
  }
  std::int64_t elements(int i, int j) const {
    return (std::min(rows_, (i + 1) * rows_per_cell_) - i * rows_per_cell_) *
           (std::min(cols_, (j + 1) * cols_per_cell_) - j * cols_per_cell_);
  }

  /// '.' no mismatch, '1'..'9' up to that many tenths of the cell mismatch, '#' all of it.
  char symbol(int i, int j) const {
    std::int64_t const b = mismatches(i, j), n = elements(i, j);
    if (b == 0)
      return '.';
    if (b == n)
      return '#';
    return static_cast<char>('0' + std::clamp<std::int64_t>((10 * b + n - 1) / n, 1, 9));
  }
  /// The symbols of cell row i.
  std::string row_string(int i) const {
    std::string s;
    for (int j = 0; j < cell_cols_; ++j)
      s += symbol(i, j);
    return s;
  }

  friend std::ostream& operator<<(std::ostream& os, block_map const& m) {
    auto range = [](std::int64_t lo, std::int64_t hi) {
      return lo == hi ? std::to_string(lo) : std::to_string(lo) + "-" + std::to_string(hi);
    };
    std::string const pad = "        ";
    std::size_t label = 0;
    for (int i = 0; i < m.cell_rows_; ++i)
      label = std::max(
          label,
          range(i * m.rows_per_cell_, std::min(m.rows_, (i + 1) * m.rows_per_cell_) - 1).size());
    // Column ruler: the first column of every 8th cell.
    std::string ruler(label + 6 + static_cast<std::size_t>(m.cell_cols_) + 8, ' ');
    for (int j = 0; j < m.cell_cols_; j += 8) {
      auto const s = std::to_string(j * m.cols_per_cell_);
      ruler.replace(label + 6 + static_cast<std::size_t>(j), s.size(), s);
    }
    while (!ruler.empty() && ruler.back() == ' ')
      ruler.pop_back();
    os << pad << "block map: " << m.rows_ << " x " << m.cols_
       << " (rows x last axis), cell = " << m.rows_per_cell_ << " x " << m.cols_per_cell_
       << "; '.' none, 1-9 tenths of the cell "
       << "mismatch, '#' all\n";
    os << pad << ruler << "  <- column\n";
    for (int i = 0; i < m.cell_rows_; ++i) {
      auto r = range(i * m.rows_per_cell_, std::min(m.rows_, (i + 1) * m.rows_per_cell_) - 1);
      os << pad << "rows " << std::string(label - r.size(), ' ') << r << " " << m.row_string(i)
         << "\n";
    }
    return os;
  }

private:
  static std::int64_t pow2_at_least(std::int64_t n) {
    std::int64_t p = 1;
    while (p < n)
      p *= 2;
    return p;
  }
  std::int64_t rows_ = 0, cols_ = 0;
  std::int64_t rows_per_cell_ = 1, cols_per_cell_ = 1;
  int cell_rows_ = 0, cell_cols_ = 0;
  std::vector<std::int64_t> bad_;
};

} // namespace tilegrad
