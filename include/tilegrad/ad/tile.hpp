// Tiles of adjoint<T>: a handle to values and an adjoint buffer on the program's tape. Assigning
// an expression evaluates its primal values in one fused loop and records the expression once.
// Copies share the (immutable) recorded values, so value semantics hold.
#pragma once

#include "tilegrad/ad/adjoint.hpp"
#include "tilegrad/ad/context.hpp"
#include "tilegrad/ad/expr.hpp"
#include "tilegrad/tile/eval.hpp"
#include "tilegrad/tile/expr.hpp"
#include "tilegrad/tile/tile.hpp"

#include <algorithm>
#include <utility>

namespace tilegrad {

template <class T, int... Ns>
class tile<adjoint<T>, Ns...> : public node_base {
public:
  using value_type = adjoint<T>;
  using shape_type = shape<Ns...>;
  static constexpr int rank = shape_type::rank;
  static constexpr int size = shape_type::size;
  static constexpr bool may_alias = false;
  template <int W>
  static constexpr bool vectorizes = simd::has_vec_v<T, W>;

  /// Zeros (a constant: no adjoint).
  tile() : values_(ad::current_tape().template alloc_zero<T>(size)) {}
  explicit tile(uninitialized_t) : values_(ad::current_tape().template alloc<T>(size)) {}
  explicit tile(value_type const& v) : tile(uninitialized) { std::fill_n(values_, size, v.v); }

  template <tile_expression E>
    requires(!std::is_same_v<std::remove_cvref_t<E>, tile>)
  tile(E const& e) { // NOLINT: implicit, as for float tiles
    static_assert(detail::require_same_shape<shape_type, shape_of_t<E>>);
    // The fast path's rule, so that a kernel compiles in every mode or in none.
    static_assert(detail::require_implicit<value_type, value_of_t<E>>);
    assign_from(e);
  }
  template <tile_expression E>
    requires(!std::is_same_v<std::remove_cvref_t<E>, tile>)
  tile& operator=(E const& e) {
    static_assert(detail::require_same_shape<shape_type, shape_of_t<E>>);
    static_assert(detail::require_implicit<value_type, value_of_t<E>>);
    assign_from(e);
    return *this;
  }
  tile(tile const&) = default;
  tile& operator=(tile const&) = default;

  /// A tile over buffers already on the tape (adj null: a constant).
  static tile from_buffers(T* values, T* adj) {
    tile t(values, adj, 0);
    return t;
  }

  adjoint_leaf<T, shape_type> as_expr_node() const { return {{}, values_, adj_}; }

  T* values() const { return values_; }
  T* adjoints() const { return adj_; }
  bool active() const { return adj_ != nullptr; }

  template <class... I>
  value_type operator()(I... idx) const {
    static_assert(sizeof...(I) == rank, "tilegrad: give one index per axis");
    int f = 0, a = 0;
    ((f += static_cast<int>(idx) * shape_type::stride(a++)), ...);
    return value_type(values_[f]);
  }
  value_type item() const
    requires(rank == 0)
  {
    return value_type(values_[0]);
  }

  // Node protocol, for code that reads the values of a tile it was handed.
  template <int W>
  TILEGRAD_INLINE simd::vec_t<T, W> load(int row, int col) const {
    return simd::load<T, W>(values_ + row * shape_type::inner + col);
  }

private:
  tile(T* v, T* a, int) : values_(v), adj_(a) {}

  template <class E>
  void assign_from(E const& e) {
    auto p = detail::convert_as<T>(ad::to_primal(detail::as_node(e)));
    ad::tape& tp = ad::current_tape();
    T* v = tp.template alloc<T>(size);
    detail::assign<shape_type>(v, p);
    T* a = nullptr;
    if constexpr (ad::is_active_v<decltype(p)>) {
      if (ad::any_active(p)) {
        a = tp.template alloc_zero<T>(size);
        tp.template push<ad::expr_record<shape_type, decltype(p)>>(p, a, v);
      }
    }
    values_ = v;
    adj_ = a;
  }

  T* values_ = nullptr;
  T* adj_ = nullptr;
};

} // namespace tilegrad
