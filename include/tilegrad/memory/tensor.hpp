// Tensors: a non-owning view (pointer, shape, strides, name; rank 1 to 4) that kernels take,
// and an owning tensor with aligned storage for host code.
#pragma once

#include "tilegrad/core/bf16.hpp"
#include "tilegrad/core/config.hpp"
#include "tilegrad/core/pages.hpp"
#include "tilegrad/core/storage.hpp"
#include "tilegrad/grid/program.hpp"
#include "tilegrad/memory/access_error.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <new>
#include <source_location>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace tilegrad {

inline constexpr int max_tensor_rank = 4;
using extents = std::array<std::int64_t, max_tensor_rank>;

namespace detail {
[[noreturn]] TILEGRAD_NOINLINE inline void axis_out_of_range(int axis, int rank, char const* name) {
  program const* p = current_program();
  throw std::out_of_range("tilegrad::tensor" + std::string(*name ? " '" : "") + name +
                          (*name ? "'" : "") + ": axis " + std::to_string(axis) +
                          " out of range for rank " + std::to_string(rank) +
                          (p ? " (in " + p->describe() + ")" : std::string()));
}

/// A view's checks at construction, with its name in the message.
[[noreturn]] TILEGRAD_NOINLINE inline void bad_view(char const* what, char const* name) {
  throw std::invalid_argument("tilegrad::tensor" + std::string(*name ? " '" : "") + name +
                              (*name ? "'" : "") + ": " + what);
}

/// The first index of an element access t(i, ...), with the source line of the access: what
/// the error an access inside a checked launch throws names.
struct element_index {
  std::int64_t value;
  std::source_location loc;
  template <class I>
    requires requires(I i) { static_cast<std::int64_t>(i); }
  element_index(I i, // NOLINT: t(3) reads as it should
                std::source_location l = std::source_location::current()) noexcept
      : value(static_cast<std::int64_t>(i)), loc(l) {}
};

// The message of a t[i] that has no row i, built out of line: the tensor, the index, and where
// (the program, inside a kernel, and the source line).
[[noreturn]] TILEGRAD_NOINLINE inline void bad_row_index(std::int64_t i, int rank,
                                                         std::int64_t rows, char const* name,
                                                         std::source_location const& loc) {
  std::string const what = std::string(*name ? name : "unnamed");
  program const* p = current_program();
  std::string const at = std::string(p ? " by " + p->describe() : std::string()) + ", at " +
                         loc.file_name() + ":" + std::to_string(loc.line());
  if (rank < 2)
    throw std::invalid_argument("tilegrad::tensor: t[i] needs rank 2 or more (tensor " + what +
                                ")" + at);
  std::string const elem = "(" + std::to_string(i) + ")";
  throw access_error("tilegrad::tensor: index " + std::to_string(i) +
                         " out of range for axis 0 of size " + std::to_string(rows) + " (tensor " +
                         what + ")" + at,
                     p ? p->describe() : std::string("host code"), name, elem, loc);
}

/// Element access t(i, ...) inside a program of a checked launch (vjp, jvp's and
/// check_backward's launches, a launch that checks bounds or races): refused, since nothing
/// sees it (no bounds or race check; vjp would not differentiate it and give zero gradients).
[[noreturn]] TILEGRAD_MACHINERY void element_access_in_checked_launch(
    char const* name, std::string const& shape, std::string const& element,
    std::source_location const& loc)
#if TILEGRAD_MACHINERY_BODIES
{
  program const* p = current_program();
  std::string const prog = p ? p->describe() : std::string("a program");
  std::string const what = name && *name ? std::string("'") + name + "'" : "(unnamed)";
  throw access_error("tilegrad: element access " + what + element + " by " + prog +
                         " of a checked launch (tensor " + what + " of shape " + shape +
                         "), at " + loc.file_name() + ":" + std::to_string(loc.line()) +
                         ": element access t(i, ...) is for host code; inside a kernel no "
                         "bounds or race check sees it, and vjp does not differentiate it: "
                         "use tg::load, tg::store or tg::atomic_add",
                     prog, name ? name : "", element, loc);
}
#else
;
#endif
} // namespace detail

/// A view of strided memory: what kernels take as arguments (Triton's pointer arguments plus
/// the shape and strides they are launched with). Copying a view copies no data.
template <class T>
class tensor {
public:
  using element_type = T;
  using value_type = std::remove_const_t<T>;

  tensor() = default;

  /// A contiguous row-major view.
  tensor(T* data, std::initializer_list<std::int64_t> shape, char const* name = "")
      : data_(data), name_(name ? name : "") {
    set_shape(shape.begin(), shape.size());
    std::int64_t s = 1;
    for (int a = rank_ - 1; a >= 0; --a) {
      strides_[a] = s;
      s *= shape_[a];
    }
    check_data();
  }

  /// A strided view (strides in elements).
  tensor(T* data, std::initializer_list<std::int64_t> shape,
         std::initializer_list<std::int64_t> strides, char const* name = "")
      : data_(data), name_(name ? name : "") {
    set_shape(shape.begin(), shape.size());
    if (strides.size() != shape.size())
      detail::bad_view("give one stride per axis", name_);
    std::copy(strides.begin(), strides.end(), strides_.begin());
    check_strides();
    check_data();
  }

  tensor(T* data, int rank, extents const& shape, extents const& strides, char const* name = "")
      : data_(data), rank_(rank), shape_(shape), strides_(strides), name_(name ? name : "") {
    if (rank < 1 || rank > max_tensor_rank)
      detail::bad_view("rank must be 1 to 4", name_);
    check_strides();
    check_data();
  }

  /// A view of mutable data converts to a view of const data.
  operator tensor<T const>() const
    requires(!std::is_const_v<T>)
  {
    return tensor<T const>(data_, rank_, shape_, strides_, name_);
  }

  T* data() const { return data_; }
  int rank() const { return rank_; }
  std::int64_t size(int axis) const { return shape_[check_axis(axis)]; }
  std::int64_t stride(int axis) const { return strides_[check_axis(axis)]; }
  extents const& shape() const { return shape_; }
  extents const& strides() const { return strides_; }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (int a = 0; a < rank_; ++a) n *= shape_[a];
    return n;
  }
  char const* name() const { return name_; }

  /// The same view under another name (names appear in error messages and reports).
  tensor named(char const* name) const {
    tensor t = *this;
    t.name_ = name;
    return t;
  }

  /// Element access by coordinates, for host code (no bounds check). Through a writable view
  /// the element may be written: tiles of this thread reading it in place (loads that borrow,
  /// core/storage.hpp) take their own copies first. Inside a program of a checked launch it
  /// throws access_error (kernels load and store).
  template <class... I>
  T& operator()(detail::element_index i0, I... idx) const {
    std::int64_t off = i0.value * strides_[0];
    int a = 1;
    ((off += static_cast<std::int64_t>(idx) * strides_[a++]), ...);
    if (detail::current_hooks()) [[unlikely]]
      detail::element_access_in_checked_launch(
          name_, shape_string(),
          coordinates_of({i0.value, static_cast<std::int64_t>(idx)...}), i0.loc);
    if constexpr (!std::is_const_v<T>)
      detail::before_write(data_ + off, data_ + off + 1);
    return data_[off];
  }

  /// t[i]: the view of index i along the first axis, one rank lower and under the same name
  /// (PyTorch's t[i]; a kernel takes q[b][h] for the (N, D) matrix of batch b, head h).
  tensor operator[](detail::element_index at) const {
    std::int64_t const i = at.value;
    if (rank_ < 2 || i < 0 || i >= shape_[0]) [[unlikely]]
      detail::bad_row_index(i, rank_, shape_[0], name_, at.loc);
    // (A fixed number of steps: a row kernel takes a view per program, and this is its cost.)
    tensor t;
    t.data_ = data_ + i * strides_[0];
    t.rank_ = rank_ - 1;
    t.name_ = name_;
    for (int a = 0; a + 1 < max_tensor_rank; ++a) {
      bool const in = a + 1 < rank_;
      t.shape_[a] = in ? shape_[a + 1] : 1;
      t.strides_[a] = in ? strides_[a + 1] : 1;
    }
    return t;
  }

  /// The offset from data() of the i-th element in row-major order (whatever the strides).
  std::int64_t row_major_offset(std::int64_t i) const {
    // (Host loops call this once per element: a contiguous view, the common case, skips the
    // divisions, a few compares against a division per axis.)
    if (is_contiguous())
      return i;
    std::int64_t off = 0;
    for (int a = rank_ - 1; a >= 0; --a) {
      off += (i % shape_[a]) * strides_[a];
      i /= shape_[a];
    }
    return off;
  }

  /// Whether u has this view's shape (any element type, any strides).
  template <class U>
  bool same_shape(tensor<U> const& u) const {
    if (u.rank() != rank_) return false;
    for (int a = 0; a < rank_; ++a)
      if (u.size(a) != shape_[a]) return false;
    return true;
  }

  /// Offsets that address elements of this view lie in [0, span()).
  std::int64_t span() const {
    std::int64_t hi = 0;
    for (int a = 0; a < rank_; ++a) hi += (shape_[a] - 1) * strides_[a];
    return hi + 1;
  }

  /// Whether the layout is contiguous row-major.
  bool is_contiguous() const {
    std::int64_t s = 1;
    for (int a = rank_ - 1; a >= 0; --a) {
      if (shape_[a] != 1 && strides_[a] != s) return false;
      s *= shape_[a];
    }
    return true;
  }

  /// Whether `offset` from data() addresses an element of this view.
  bool contains(std::int64_t offset) const {
    if (offset < 0 || offset >= span()) return false;
    return is_contiguous() || element_at_or_before(offset) == offset || search(offset);
  }

  /// The offset of the element whose coordinates `offset` unravels to, where they lie inside the
  /// shape: `offset` itself, or for one in a gap between elements the element before it; -1
  /// where a coordinate lies outside its extent.
  std::int64_t element_at_or_before(std::int64_t offset) const {
    auto c = unravel(offset);
    std::int64_t back = 0;
    for (int a = 0; a < rank_; ++a) {
      if (c[a] < 0 || c[a] >= shape_[a]) return -1;
      back += c[a] * strides_[a];
    }
    return back;
  }

  /// Coordinates of the element at `offset` from data(), for messages: "(3, 17)".
  std::string coordinates(std::int64_t offset) const {
    auto c = unravel(offset);
    std::string out = "(";
    for (int a = 0; a < rank_; ++a) out += (a ? ", " : "") + std::to_string(c[a]);
    return out + ")";
  }

  /// Coordinates given, for messages: "(3, 17)".
  static std::string coordinates_of(std::initializer_list<std::int64_t> c) {
    std::string out = "(";
    for (auto i = c.begin(); i != c.end(); ++i)
      out += (i != c.begin() ? ", " : "") + std::to_string(*i);
    return out + ")";
  }

private:
  /// Whether some coordinates inside the shape give `offset`, by a search over the axes by
  /// decreasing stride: the rows of a view whose rows overlap (sliding windows: shape (5, 16),
  /// strides (8, 1)) hold offsets that unravel (which takes the largest coordinate the largest
  /// stride allows) puts past the shape. (Taken only where unravel found none: nested layouts
  /// never need it.)
  bool search(std::int64_t offset) const {
    std::array<int, max_tensor_rank> ax{};
    int k = 0;
    for (int a = 0; a < rank_; ++a)
      if (shape_[a] > 1 && strides_[a] > 0)
        ax[k++] = a;
    for (int i = 1; i < k; ++i) // insertion sort of at most 4 axes
      for (int j = i; j > 0 && strides_[ax[j]] > strides_[ax[j - 1]]; --j)
        std::swap(ax[j - 1], ax[j]);
    std::array<std::int64_t, max_tensor_rank + 1> reach{}; // the most the axes from i on add
    for (int i = k - 1; i >= 0; --i)
      reach[i] = reach[i + 1] + (shape_[ax[i]] - 1) * strides_[ax[i]];
    auto const from = [&](auto const& self, int i, std::int64_t rem) -> bool {
      // (k <= max_tensor_rank: the second test never decides, but bounds the recursion GCC
      // inlines at -O3, which otherwise warns of subscripts past the arrays at depths never met.)
      if (i == k || i >= max_tensor_rank)
        return rem == 0;
      std::int64_t const st = strides_[ax[i]];
      std::int64_t const lo = std::max<std::int64_t>(0, (rem - reach[i + 1] + st - 1) / st);
      for (std::int64_t c = std::min(shape_[ax[i]] - 1, rem / st); c >= lo; --c)
        if (self(self, i + 1, rem - c * st))
          return true;
      return false;
    };
    return offset >= 0 && from(from, 0, offset);
  }

  std::array<std::int64_t, max_tensor_rank> unravel(std::int64_t offset) const {
    // Unravel along axes by decreasing stride; an offset outside the view still gets
    // coordinates (some past their extent, or negative), which is what a message about it needs. Axes of
    // extent 1 go last, whatever their stride: their coordinate is 0, and one whose stride ties
    // with a longer axis's (shape (1, 4, 4), strides (8, 8, 1)) must not take that axis's share.
    std::array<int, max_tensor_rank> order{0, 1, 2, 3};
    auto const before = [&](int a, int b) {
      if ((shape_[a] == 1) != (shape_[b] == 1))
        return shape_[b] == 1;
      return strides_[a] > strides_[b];
    };
    for (int i = 1; i < rank_; ++i) // insertion sort of at most 4 axes
      for (int j = i; j > 0 && before(order[j], order[j - 1]); --j)
        std::swap(order[j - 1], order[j]);
    std::array<std::int64_t, max_tensor_rank> c{};
    std::int64_t rem = offset;
    for (int i = 0; i < rank_; ++i) {
      int const a = order[i];
      std::int64_t const s = strides_[a] == 0 ? 1 : strides_[a];
      c[a] = rem / s; // toward zero: offset -1 of a row-major view is (0, ..., 0, -1)
      rem -= c[a] * s;
    }
    return c;
  }

public:

  std::string shape_string() const {
    std::string out = "(";
    for (int a = 0; a < rank_; ++a) out += (a ? ", " : "") + std::to_string(shape_[a]);
    return out + ")";
  }

private:
  // Offsets are checked against [0, span()): views with negative strides would need their
  // own bounds and are not supported (point data() at the first element and flip the index).
  void check_strides() const {
    for (int a = 0; a < rank_; ++a)
      if (strides_[a] < 0)
        detail::bad_view("negative strides are not supported", name_);
  }
  // A null pointer with elements: every access would fault, bounds checks or not (they look at
  // offsets).
  void check_data() const {
    if (data_ == nullptr && numel() > 0)
      detail::bad_view(("null data for shape " + shape_string()).c_str(), name_);
  }
  void set_shape(std::int64_t const* s, std::size_t n) {
    if (n < 1 || n > max_tensor_rank)
      detail::bad_view(("rank must be 1 to 4 (" + std::to_string(n) + " extents given)").c_str(),
                       name_);
    rank_ = static_cast<int>(n);
    for (std::size_t a = 0; a < n; ++a) {
      if (s[a] < 0)
        detail::bad_view(
            ("negative extent " + std::to_string(s[a]) + " on axis " + std::to_string(a)).c_str(),
            name_);
      shape_[a] = s[a];
    }
  }
  // Small enough to inline into the size() and stride() calls of every kernel; the message is
  // built out of line.
  int check_axis(int axis) const {
    if (axis < 0) axis += rank_;
    if (axis < 0 || axis >= rank_) [[unlikely]]
      detail::axis_out_of_range(axis, rank_, name_);
    return axis;
  }

  T* data_ = nullptr;
  int rank_ = 1;
  extents shape_{0, 1, 1, 1};
  extents strides_{1, 1, 1, 1};
  char const* name_ = "";
};

/// A contiguous row-major tensor that owns its (64-byte aligned, zero-initialised unless made
/// `uninitialized`) storage.
/// Converts to views; pass it to launch and it is passed on as tensor<T>.
template <class T>
class owned_tensor {
public:
  owned_tensor() = default;
  explicit owned_tensor(std::initializer_list<std::int64_t> shape, char const* name = "")
      : owned_tensor(shape.begin(), shape.size(), name) {}
  owned_tensor(std::int64_t const* shape, std::size_t rank, char const* name = "")
      : owned_tensor(uninitialized, shape, rank, name) {
    std::fill_n(storage_.get(), size_, T{});
  }
  /// Storage left default-initialised (for float: uninitialised), for a caller that writes every
  /// element next.
  owned_tensor(uninitialized_t, std::int64_t const* shape, std::size_t rank, char const* name = "") {
    char const* const label = name ? name : "";
    if (rank < 1 || rank > max_tensor_rank)
      detail::bad_view(("rank must be 1 to 4 (" + std::to_string(rank) + " extents given)").c_str(),
                       label);
    std::int64_t n = 1;
    for (std::size_t a = 0; a < rank; ++a) {
      if (shape[a] < 0)
        detail::bad_view(
            ("negative extent " + std::to_string(shape[a]) + " on axis " + std::to_string(a))
                .c_str(),
            label);
      n *= shape[a];
    }
    std::size_t const bytes = static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * sizeof(T);
    storage_ = std::unique_ptr<T, deleter>(static_cast<T*>(detail::allocate_block(bytes, false)),
                                           deleter{bytes});
    std::uninitialized_default_construct_n(storage_.get(), n);
    size_ = n;
    extents e{1, 1, 1, 1};
    std::copy(shape, shape + rank, e.begin());
    extents s{1, 1, 1, 1};
    std::int64_t st = 1;
    for (int a = static_cast<int>(rank) - 1; a >= 0; --a) {
      s[a] = st;
      st *= e[a];
    }
    view_ = tensor<T>(storage_.get(), static_cast<int>(rank), e, s, name);
  }

  ~owned_tensor() {
    if (storage_) std::destroy_n(storage_.get(), size_);
  }
  owned_tensor(owned_tensor&&) noexcept = default;
  owned_tensor& operator=(owned_tensor&&) noexcept = default;
  owned_tensor(owned_tensor const& o)
      : owned_tensor(o.view_.shape().data(), static_cast<std::size_t>(o.view_.rank()),
                     o.view_.name()) {
    std::copy(o.data(), o.data() + size_, data());
  }
  owned_tensor& operator=(owned_tensor const& o) {
    if (this != &o) *this = owned_tensor(o);
    return *this;
  }

  tensor<T> view() const { return view_; }
  tensor<T const> cview() const { return view_; }
  operator tensor<T>() const { return view_; }             // NOLINT: views are what kernels take
  operator tensor<T const>() const { return view_; }       // NOLINT

  T* data() const { return storage_.get(); }
  T* begin() const { return data(); }
  T* end() const { return data() + size_; }
  std::int64_t numel() const { return size_; }
  int rank() const { return view_.rank(); }
  std::int64_t size(int axis) const { return view_.size(axis); }
  char const* name() const { return view_.name(); }
  template <class... I>
  T& operator()(detail::element_index i0, I... idx) const {
    return view_(i0, idx...);
  }

  // launch() hands kernels the view (found by argument-dependent lookup).
  friend tensor<T> kernel_arg(owned_tensor& t) { return t.view(); }
  friend tensor<T> kernel_arg(owned_tensor&& t) { return t.view(); } // lives until launch returns
  friend tensor<T const> kernel_arg(owned_tensor const& t) { return t.cview(); }

private:
  struct deleter {
    std::size_t bytes = 0;
    void operator()(T* p) const { detail::free_block(p, bytes); }
  };
  std::unique_ptr<T, deleter> storage_;
  std::int64_t size_ = 0;
  tensor<T> view_;
};

/// Throws std::invalid_argument, naming the tensor, both shapes and the caller's line, unless t
/// has exactly this shape: the one-line check of a host entry point (a kernel's block pointer
/// bounds would zero-pad a weight passed transposed, in every mode, without a word).
template <class T>
void expect_shape(tensor<T> const& t, std::initializer_list<std::int64_t> shape,
                  std::source_location const where = std::source_location::current()) {
  bool same = static_cast<std::size_t>(t.rank()) == shape.size();
  for (std::size_t a = 0; same && a < shape.size(); ++a)
    same = t.size(static_cast<int>(a)) == shape.begin()[a];
  if (same)
    return;
  std::string want = "(";
  for (std::size_t a = 0; a < shape.size(); ++a)
    want += (a ? ", " : "") + std::to_string(shape.begin()[a]);
  want += ")";
  program const* p = detail::current_program();
  throw std::invalid_argument(std::string("tilegrad::expect_shape: '") + t.name() + "' has shape " +
                              t.shape_string() + ", expected " + want + " (" + where.file_name() +
                              ":" + std::to_string(where.line()) +
                              (p ? ", in " + p->describe() : std::string()) + ")");
}

template <class T>
void expect_shape(owned_tensor<T> const& t, std::initializer_list<std::int64_t> shape,
                  std::source_location const where = std::source_location::current()) {
  expect_shape(t.cview(), shape, where);
}

namespace detail {
/// A copy of t converted to U and laid out as t: the same offsets from its first element and the
/// same strides, in a buffer of t's span that `keep` (a container of owned_tensor<U>, such as a
/// deque) owns, the addresses between t's elements zero. A kernel that indexes with t's strides
/// taken as numbers reads the same elements in the copy as in t.
template <class U, class E, class Keep>
tensor<U> laid_out_copy(tensor<E> const& t, Keep& keep, char const* name) {
  std::int64_t const span = t.numel() == 0 ? 1 : t.span();
  owned_tensor<U>& buf = keep.emplace_back(&span, std::size_t{1}, name);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    std::int64_t const off = t.row_major_offset(i);
    buf.data()[off] = static_cast<U>(static_cast<double>(t.data()[off]));
  }
  return tensor<U>(buf.data(), t.rank(), t.shape(), t.strides(), name);
}
} // namespace detail

} // namespace tilegrad

#if TILEGRAD_SEPARATE_COMPILATION // compiled in tilegrad/separate.hpp
namespace tilegrad {
extern template class tensor<float>;
extern template class tensor<float const>;
extern template class tensor<double>;
extern template class tensor<double const>;
extern template class tensor<bf16>;
extern template class tensor<bf16 const>;
extern template class tensor<std::byte const>; // layouts, in the machinery
extern template class owned_tensor<float>;
extern template class owned_tensor<double>;
extern template class owned_tensor<bf16>;
} // namespace tilegrad
#endif
