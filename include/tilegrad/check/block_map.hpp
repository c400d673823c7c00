// Block map: where the mismatched elements of a tensor sit, as a grid of at most 16 x 32 cells
// over its 2-D view (rows = every axis but the last, folded; columns = the last axis).
#pragma once

#include "tilegrad/core/config.hpp"

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
      : block_map(rows, cols, {}, max_cell_rows, max_cell_cols) {}

  /// The map of a tensor of rank 3 or more given its leading axes `lead` (every axis but the
  /// last two): the rows of the 2-D view are then `lead`'s product times `rows / product`
  /// matrix rows, and each matrix (one attention head, say) gets its own band of cells, so a
  /// bug in the last row of every head shows at the bottom of every band.
  block_map(std::int64_t rows, std::int64_t cols, std::vector<std::int64_t> lead,
            int max_cell_rows = 16, int max_cell_cols = 32)
      : rows_(rows), cols_(cols) {
    std::int64_t matrices = 1;
    for (auto n : lead)
      matrices *= n;
    // Bands only while each matrix keeps at least one cell row of its own and the map stays
    // readable; otherwise the rows are folded as one.
    if (matrices > 1 && rows > 0 && rows % matrices == 0 && matrices <= max_cell_rows * 2) {
      lead_ = std::move(lead);
      matrix_rows_ = rows / matrices;
      std::int64_t const per_band = std::max<std::int64_t>(1, max_cell_rows / matrices);
      rows_per_cell_ = pow2_at_least((matrix_rows_ + per_band - 1) / per_band);
      band_cells_ = static_cast<int>((matrix_rows_ + rows_per_cell_ - 1) / rows_per_cell_);
      cell_rows_ = static_cast<int>(matrices) * band_cells_;
    } else {
      matrix_rows_ = rows;
      // Cells of a power-of-two extent line up with power-of-two tiles.
      rows_per_cell_ = pow2_at_least((rows + max_cell_rows - 1) / max_cell_rows);
      band_cells_ = cell_rows_ = static_cast<int>((rows + rows_per_cell_ - 1) / rows_per_cell_);
    }
    cols_per_cell_ = pow2_at_least((cols + max_cell_cols - 1) / max_cell_cols);
    cell_cols_ = static_cast<int>((cols + cols_per_cell_ - 1) / cols_per_cell_);
    bad_.assign(static_cast<std::size_t>(cell_rows_) * cell_cols_, 0);
  }

  /// Records a mismatch at element (r, c) of the 2-D view.
  void mark(std::int64_t r, std::int64_t c) {
    ++bad_[static_cast<std::size_t>(cell_row_of(r)) * cell_cols_ + c / cols_per_cell_];
  }

  /// The rows of the 2-D view that cell row i covers, first and last.
  std::int64_t first_row(int i) const {
    return i / band_cells_ * matrix_rows_ + i % band_cells_ * rows_per_cell_;
  }
  std::int64_t last_row(int i) const {
    return i / band_cells_ * matrix_rows_ +
           std::min(matrix_rows_, (i % band_cells_ + 1) * rows_per_cell_) - 1;
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
    return (last_row(i) - first_row(i) + 1) *
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

  friend TILEGRAD_MACHINERY_MEMBER std::ostream& operator<<(std::ostream& os, block_map const& m)
#if TILEGRAD_MACHINERY_BODIES
  {
    auto range = [](std::int64_t lo, std::int64_t hi) {
      return lo == hi ? std::to_string(lo) : std::to_string(lo) + "-" + std::to_string(hi);
    };
    // A band's label: the leading coordinates of its matrix, then its rows inside the matrix.
    auto lead_label = [&](int i) {
      if (m.lead_.empty())
        return std::string();
      std::int64_t k = i / m.band_cells_;
      std::vector<std::int64_t> c(m.lead_.size());
      for (std::size_t a = c.size(); a-- > 0;) {
        c[a] = k % m.lead_[a];
        k /= m.lead_[a];
      }
      std::string lead = "(";
      for (std::size_t a = 0; a < c.size(); ++a)
        lead += (a ? ", " : "") + std::to_string(c[a]);
      return lead + ") ";
    };
    auto rows_label = [&](int i) {
      std::int64_t const base = i / m.band_cells_ * m.matrix_rows_;
      return range(m.first_row(i) - base, m.last_row(i) - base);
    };
    std::size_t lead_w = 0, rows_w = 0;
    for (int i = 0; i < m.cell_rows_; ++i) {
      lead_w = std::max(lead_w, lead_label(i).size());
      rows_w = std::max(rows_w, rows_label(i).size());
    }
    auto row_label = [&](int i) {
      auto const l = lead_label(i), r = rows_label(i);
      return l + std::string(lead_w - l.size(), ' ') + "rows " +
             std::string(rows_w - r.size(), ' ') + r;
    };
    std::string const pad = "        ";
    std::size_t const label = lead_w + 5 + rows_w;
    // Column ruler: the first column of every 8th cell.
    std::string ruler(label + 1 + static_cast<std::size_t>(m.cell_cols_) + 8, ' ');
    for (int j = 0; j < m.cell_cols_; j += 8) {
      auto const s = std::to_string(j * m.cols_per_cell_);
      ruler.replace(label + 1 + static_cast<std::size_t>(j), s.size(), s);
    }
    while (!ruler.empty() && ruler.back() == ' ')
      ruler.pop_back();
    os << pad << "block map: " << m.rows_ << " x " << m.cols_;
    if (m.lead_.empty())
      os << " (rows x last axis)";
    else
      os << " (" << m.rows_ / m.matrix_rows_ << " matrices of " << m.matrix_rows_
         << " rows, one band each, x last axis)";
    os << ", cell = " << m.rows_per_cell_ << " x " << m.cols_per_cell_
       << "; '.' none, 1-9 tenths of the cell mismatch, '#' all\n";
    os << pad << ruler << "  <- column\n";
    for (int i = 0; i < m.cell_rows_; ++i) {
      os << pad << row_label(i) << " " << m.row_string(i) << "\n";
    }
    return os;
  }
#else
  ;
#endif

private:
  static std::int64_t pow2_at_least(std::int64_t n) {
    std::int64_t p = 1;
    while (p < n)
      p *= 2;
    return p;
  }
  int cell_row_of(std::int64_t r) const {
    return static_cast<int>(r / matrix_rows_ * band_cells_ + r % matrix_rows_ / rows_per_cell_);
  }

  std::int64_t rows_ = 0, cols_ = 0;
  std::vector<std::int64_t> lead_; // leading axes when each matrix has its own band
  std::int64_t matrix_rows_ = 1;   // rows of the view per band
  int band_cells_ = 0;             // cell rows per band
  std::int64_t rows_per_cell_ = 1, cols_per_cell_ = 1;
  int cell_rows_ = 0, cell_cols_ = 0;
  std::vector<std::int64_t> bad_;
};

} // namespace tilegrad
