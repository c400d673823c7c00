// tile<T, N...>: a value-semantics block of T with a compile-time shape (Triton's block).
#pragma once

#include "tilegrad/core/config.hpp"
#include "tilegrad/core/shape.hpp"
#include "tilegrad/core/simd.hpp"
#include "tilegrad/core/storage.hpp"
#include "tilegrad/core/types.hpp"
#include "tilegrad/tile/eval.hpp"
#include "tilegrad/tile/expr.hpp"

#include <algorithm>
#include <type_traits>
#include <utility>

namespace tilegrad {

namespace detail {
// Instantiated only on a shape mismatch: the compiler prints its name, which holds both shapes.
template <class Target, class Source>
struct cannot_assign_tile_shape {
  static_assert(std::is_same_v<Target, Source>,
                "tilegrad: tile shape mismatch: the expression's shape differs from the tile's "
                "(broadcast_to<...>(e) or reshape<...>(e) makes it match)");
  static constexpr bool value = true;
};
template <class Target, class Source>
inline constexpr bool require_same_shape =
    std::is_same_v<Target, Source> || cannot_assign_tile_shape<Target, Source>::value;

// Implicit conversion is allowed where Triton would promote (int -> float, float -> double,
// float -> a custom scalar, bf16 -> float or double: `tile<fp32<T>, B> a = load(bf16 pointers)`);
// narrowing needs to<T>. (bf16 has no arithmetic, hence no promotion with other types: it is
// decided before promote_t is formed.)
template <class To, class From>
constexpr bool widens() {
  if constexpr (std::is_same_v<To, From>)
    return true;
  else if constexpr (std::is_same_v<From, bf16>)
    return std::is_floating_point_v<To> || !is_builtin_v<To>;
  else if constexpr (std::is_same_v<To, bf16>)
    return false;
  else
    return std::is_same_v<promote_t<To, From>, To>;
}
template <class To, class From>
inline constexpr bool converts_implicitly = widens<To, From>();

template <class To, class From>
struct cannot_convert_tile_implicitly {
  // The whole condition: require_implicit's || instantiates this struct whether or not its left
  // operand already holds.
  static_assert(converts_implicitly<To, From> || is_builtin_v<From> || !is_builtin_v<To>,
                "tilegrad: this tile holds plain numbers but the expression carries derivatives "
                "(dual or adjoint elements): declare it tile<fp32<T>, ...> (Triton's "
                "tl.float32 in the kernel's mode) so the derivatives flow on");
  static_assert(converts_implicitly<To, From> || (is_builtin_v<To> && !is_builtin_v<From>),
                "tilegrad: narrowing element-type conversion: write to<T>(e) to convert "
                "explicitly");
  static constexpr bool value = true;
};
template <class To, class From>
inline constexpr bool require_implicit =
    converts_implicitly<To, From> || cannot_convert_tile_implicitly<To, From>::value;
} // namespace detail

template <class T, int... Ns>
class tile : public node_base {
public:
  using value_type = T;
  using shape_type = shape<Ns...>;
  static constexpr int rank = shape_type::rank;
  static constexpr int size = shape_type::size;
  static constexpr bool may_alias = false;
  template <int W>
  static constexpr bool vectorizes = simd::has_vec_v<T, W>;

  /// Zero-filled.
  tile() { std::fill_n(data(), size, T{}); }

  /// Elements left unset (for code that writes every element next).
  explicit tile(uninitialized_t) {}

  /// Every element equal to v.
  explicit tile(T const& v) { std::fill_n(data(), size, v); }

  /// Evaluates an expression (one fused loop).
  template <tile_expression E>
    requires(!std::is_same_v<std::remove_cvref_t<E>, tile>)
  tile(E const& e) { // NOLINT: implicit, as in `tile<float, 16> y = exp(x);`
    static_assert(detail::require_same_shape<shape_type, shape_of_t<E>>);
    static_assert(detail::require_implicit<T, value_of_t<E>>);
    assign_from(e);
  }

  /// The elements at `src` (row-major), read in place while nothing writes them: a block load of
  /// memory [lo, hi) that this program only reads (detail::borrows). Small tiles copy.
  tile(detail::borrow_t b, T const* src, void const* lo, void const* hi) : storage_(b, src, lo, hi) {}

  tile(tile const&) = default;
  tile(tile&&) noexcept = default;
  tile& operator=(tile const&) = default;
  tile& operator=(tile&&) noexcept = default;

  template <tile_expression E>
    requires(!std::is_same_v<std::remove_cvref_t<E>, tile>)
  tile& operator=(E const& e) {
    static_assert(detail::require_same_shape<shape_type, shape_of_t<E>>);
    static_assert(detail::require_implicit<T, value_of_t<E>>);
    if constexpr (std::remove_cvref_t<E>::may_alias) {
      tile tmp(e); // a permuted view of this very tile would read what it overwrites
      *this = std::move(tmp);
    } else {
      assign_from(e);
    }
    return *this;
  }

  T* data() { return storage_.get(); }
  T const* data() const { return storage_.get(); }
  /// Where a heap tile's elements are found (its expression leaves read through it).
  T const* const* data_slot() const
    requires requires(detail::tile_storage<T, size> const& st) { st.slot(); }
  {
    return storage_.slot();
  }

  /// Element access by coordinates (for tests and host code; kernels use tile algebra).
  template <class... I>
  T& operator()(I... idx) {
    return data()[flat(idx...)];
  }
  template <class... I>
  T const& operator()(I... idx) const {
    return data()[flat(idx...)];
  }

  /// The value of a rank-0 tile.
  T const& item() const
    requires(rank == 0)
  {
    return data()[0];
  }

  // Node protocol: a temporary tile held by an expression reads like a tile_ref.
  template <int W>
  TILEGRAD_INLINE simd::vec_t<T, W> load(int row, int col) const {
    return simd::load<T, W>(data() + row * shape_type::inner + col);
  }

private:
  template <class E>
  void assign_from(E const& e) {
    auto n = detail::convert_as<T>(detail::as_node(e));
    using N = decltype(n);
    if constexpr (detail::stored_transpose<T, N>::value) {
      // trans(x) of a tile in memory: by blocks on registers, not element by element (the
      // operator= of a transpose of this very tile makes a new tile first).
      detail::transpose_into<T, shape_type::dim(1), shape_type::dim(0)>(
          data(), detail::stored_transpose<T, N>::data(n));
    } else {
      detail::assign<shape_type>(data(), n);
    }
  }

  template <class... I>
  static int flat(I... idx) {
    static_assert(sizeof...(I) == rank, "tilegrad: give one index per axis");
    int f = 0, a = 0;
    ((f += static_cast<int>(idx) * shape_type::stride(a++)), ...);
    return f;
  }

  detail::tile_storage<T, size> storage_;
};

} // namespace tilegrad
