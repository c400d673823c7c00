// Tiles of adjoint<T>: a handle to values and an adjoint buffer on the program's tape. Assigning
// an expression evaluates its primal values in one fused loop and records the expression once.
// Copies share the (immutable) recorded values, so value semantics hold.
#pragma once

#include "tilegrad/ad/adjoint.hpp"
#include "tilegrad/ad/context.hpp"
#include "tilegrad/ad/expr.hpp"
#include "tilegrad/ad/jitter.hpp"
#include "tilegrad/tile/elementwise.hpp"
#include "tilegrad/tile/eval.hpp"
#include "tilegrad/tile/expr.hpp"
#include "tilegrad/tile/tile.hpp"

#include <algorithm>
#include <utility>

namespace tilegrad {

template <class T>
class adjoint_item;

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
  /// Every element the number v (a constant), as `tile<float, N>(0.0)` on the fast path.
  template <class U>
  requires std::is_arithmetic_v<U>
  explicit tile(U v) : tile(uninitialized) { std::fill_n(values_, size, static_cast<T>(v)); }
  /// Every element the item of a rank-0 tile, its adjoint flowing back to that tile.
  explicit tile(adjoint_item<T> const& v) {
    assign_from(broadcast_node<adjoint_leaf<T, shape<>>, shape_type>{{}, v.as_expr_node()});
  }

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

  adjoint_leaf<T, shape_type> as_expr_node() const& {
    check_live();
    return {{}, values_, adj_, &values_};
  }
  adjoint_leaf<T, shape_type> as_expr_node() const&& { // a temporary: its values are the tape's
    check_live();
    return {{}, values_, adj_};
  }

  T* values() const { return values_; }
  T* adjoints() const { return adj_; }
  bool active() const { return adj_ != nullptr; }

  template <class... I>
  value_type operator()(I... idx) const {
    static_assert(sizeof...(I) == rank, "tilegrad: give one index per axis");
    int f = 0, a = 0;
    ((f += static_cast<int>(idx) * shape_type::stride(a++)), ...);
    check_live();
    return value_type(values_[f]);
  }
  /// The element of a rank-0 tile, still on the tape: it compares as a number, and its
  /// derivative flows on through full(), tile(v), expressions and its own arithmetic. Converting
  /// it to a plain number (T(x.item()), float(x.item())) detaches it, and must be written.
  adjoint_item<T> item() const
    requires(rank == 0)
  {
    check_live();
    return adjoint_item<T>(values_, adj_);
  }

  // Node protocol, for code that reads the values of a tile it was handed.
  template <int W>
  TILEGRAD_INLINE simd::vec_t<T, W> load(int row, int col) const {
    return simd::load<T, W>(values_ + row * shape_type::inner + col);
  }

private:
  tile(T* v, T* a, int) : values_(v), adj_(a) {}

  // A tile made or assigned in an iteration of a tg::loop whose records the loop has rewound
  // (kept past the iteration through a pointer or a container the body captures) holds values
  // that are gone: refused where it is read, naming the loop.
  void check_live() const {
    if (iteration_ != 0) { // (made in a loop body)
      ad::tape const& tp = ad::current_tape();
      if (tp.rewound(iteration_)) [[unlikely]]
        ad::read_after_rewind(tp, iteration_);
    }
  }

  template <class E>
  void assign_from(E const& e) {
    if constexpr (std::is_same_v<E, adjoint_leaf<T, shape_type>>) {
      e.check_current();
      // A tile of this type as it is (tile<F, ...> x = to<F>(load(...)) in fp32): share its
      // recorded values, as a copy does, rather than copy them and record an identity.
      values_ = const_cast<T*>(e.values); // (on the tape, never written after they are made)
      adj_ = e.adj;
      // (The values may be older: taken as this iteration's, a read after its rewind is refused,
      // as for any tile assigned here.)
      iteration_ = ad::current_tape().iteration();
      return;
    }
    auto p = detail::convert_as<T>(ad::to_primal(detail::as_node(e)));
    ad::tape& tp = ad::current_tape();
    iteration_ = tp.iteration();
    T* v = tp.template alloc<T>(size);
    if (ad::jitter_active<T>()) [[unlikely]] {
      if constexpr (std::is_same_v<T, double>)
        ad::assign_jittered<shape_type>(p, v, tp);
    } else {
      detail::assign<shape_type>(v, p);
    }
    T* a = nullptr;
    if constexpr (ad::is_active_v<decltype(p)>) {
      if (ad::any_active(p) && tp.recording()) {
        a = tp.template alloc_zero<T>(size);
        tp.template push<ad::expr_record<shape_type, decltype(p)>>(ad::persisted(p, tp), a, v);
      }
    }
    values_ = v;
    adj_ = a;
  }

  T* values_ = nullptr;
  T* adj_ = nullptr;
  // The tg::loop iteration whose records hold the values (ad::tape::iteration; 0: none). A copy
  // shares it, as it shares the values.
  std::uint64_t iteration_ = ad::current_tape().iteration();
};

/// What item() of a rank-0 adjoint tile returns (see there).
template <class T>
class adjoint_item {
public:
  using scalar_tag = void; // meets a tile as a number does, through as_expr_node()

  adjoint_item(T const* value, T* adj) : value_(value), adj_(adj) {}

  T primal() const { return *value_; }
  adjoint_leaf<T, shape<>> as_expr_node() const { return {{}, value_, adj_}; }

  template <class U>
    requires std::is_arithmetic_v<U>
  explicit operator U() const {
    return static_cast<U>(*value_);
  }
  // fp32<T>(s), T(s): in reverse mode a number of the kernel's float type is plain (adjoint<U>
  // carries no derivative outside a tile), where forward mode's dual keeps s's tangent; the
  // conversion would cut the derivative in one mode only, so it is refused.
  template <class U>
  explicit operator adjoint<U>() const {
    static_assert(detail::dependent_false<U>,
                  "tilegrad: fp32<T>(x.item()) (or T(x.item())) in reverse mode would drop the "
                  "item's derivative, which forward mode keeps: keep the item as it is (auto "
                  "const s = x.item(); it carries its derivative through full<F, N>(s), "
                  "tile<F, N>(s), v * s and s * s), or write float(s) to drop the derivative in "
                  "every mode");
    return adjoint<U>(*value_);
  }

private:
  T const* value_;
  T* adj_;
};

namespace detail {
template <class X>
inline constexpr bool is_adjoint_item_v = false;
template <class T>
inline constexpr bool is_adjoint_item_v<adjoint_item<T>> = true;

template <class X>
concept item_operand = is_adjoint_item_v<X> || std::is_arithmetic_v<X> || adjoint_scalar<X>;
template <class A, class B>
concept item_operands = (is_adjoint_item_v<std::remove_cvref_t<A>> ||
                         is_adjoint_item_v<std::remove_cvref_t<B>>) &&
                        item_operand<std::remove_cvref_t<A>> &&
                        item_operand<std::remove_cvref_t<B>>;

template <class X>
auto item_value(X const& x) {
  if constexpr (is_adjoint_item_v<X>)
    return x.primal();
  else if constexpr (adjoint_scalar<X>)
    return x.v;
  else
    return x;
}

// An item in arithmetic: a rank-0 expression of adjoint tiles, evaluated (and recorded) at once.
template <class X>
auto item_node(X const& x) {
  if constexpr (is_adjoint_item_v<X>)
    return x.as_expr_node();
  else
    return x;
}
template <class E>
auto item_of(E const& e) {
  using T = primal_of_t<value_of_t<E>>;
  return tile<adjoint<T>>(e).item();
}
} // namespace detail

#define TILEGRAD_ITEM_COMPARISON(OP)                                                               \
  template <class A, class B>                                                                      \
    requires detail::item_operands<A, B>                                                           \
  bool operator OP(A const& a, B const& b) {                                                       \
    return detail::item_value(a) OP detail::item_value(b);                                         \
  }
TILEGRAD_ITEM_COMPARISON(==)
TILEGRAD_ITEM_COMPARISON(!=)
TILEGRAD_ITEM_COMPARISON(<)
TILEGRAD_ITEM_COMPARISON(<=)
TILEGRAD_ITEM_COMPARISON(>)
TILEGRAD_ITEM_COMPARISON(>=)
#undef TILEGRAD_ITEM_COMPARISON

#define TILEGRAD_ITEM_ARITHMETIC(OP)                                                               \
  template <class A, class B>                                                                      \
    requires detail::item_operands<A, B>                                                           \
  auto operator OP(A const& a, B const& b) {                                                       \
    return detail::item_of(detail::item_node(a) OP detail::item_node(b));                          \
  }
TILEGRAD_ITEM_ARITHMETIC(+)
TILEGRAD_ITEM_ARITHMETIC(-)
TILEGRAD_ITEM_ARITHMETIC(*)
TILEGRAD_ITEM_ARITHMETIC(/)
#undef TILEGRAD_ITEM_ARITHMETIC

template <class T>
auto operator-(adjoint_item<T> const& a) {
  return detail::item_of(-a.as_expr_node());
}

/// full<fp32<T>, N...>(x.item()): the item's adjoint collects the tile's.
template <class T, int... Ns>
  requires adjoint_scalar<T>
tile<T, Ns...> full(adjoint_item<primal_of_t<T>> const& v) {
  return tile<T, Ns...>(v);
}

} // namespace tilegrad
