// Reverse mode of loads and stores. Memory semantics are exact:
// - a load records, per lane it really reads, where the lane's adjoint goes: to the adjoint of
//   the value this program stored at that element earlier (if it did), else to the gradient of
//   the tensor (if one is wanted); masked-off lanes, `other` and padding get nothing;
// - a store writes the primal values and remembers, per element, the adjoint slot of the value
//   stored there last; after the forward pass those slots receive the output cotangents.
#pragma once

#include "tilegrad/ad/context.hpp"
#include "tilegrad/ad/tile.hpp"
#include "tilegrad/memory/block_ptr.hpp"
#include "tilegrad/memory/pointer.hpp"

#include <cstring>
#include <source_location>
#include <vector>

namespace tilegrad::ad {

template <class A>
auto primal_view(tensor<A> const& t) {
  using T = primal_of_t<A>;
  using P = std::conditional_t<std::is_const_v<A>, T const, T>;
  return tensor<P>(reinterpret_cast<P*>(t.data()), t.rank(), t.shape(), t.strides(), t.name());
}

template <class T>
struct load_record final : record {
  struct lane {
    int pos;
    std::int64_t offset;
    T* route;      // the adjoint of an earlier store by this program, or null
    bool stored;   // the element was stored by this program earlier (route may be a constant)
  };
  T* adj;
  int tensor;
  bool wants_grad;
  std::vector<lane> lanes;
  load_record(T* a, int t, bool w) : adj(a), tensor(t), wants_grad(w) {}
  void backward() override {
    program_state* st = current_state();
    for (lane const& l : lanes) {
      T const g = adj[l.pos];
      if (g == T(0)) continue;
      if (l.stored) {
        if (l.route) *l.route += g;
      } else if (wants_grad && st) {
        st->contributions.push_back({tensor, l.offset, static_cast<double>(g)});
      }
    }
  }
};

/// Records a load of shape S whose lanes are listed by `each(visit)`; returns its adjoint.
template <class T, class S, class Each>
T* record_load(void const* base, Each&& each) {
  program_state* st = current_state();
  if (!st) return nullptr;
  tensor_entry const* e = st->find(base);
  if (!e) return nullptr;
  tape& tp = st->t;
  T* adj = tp.alloc_zero<T>(S::size);
  auto* rec = tp.push<load_record<T>>(adj, e->index, e->wants_grad());
  bool const any_stored = !st->stored.empty();
  each([&](int pos, std::int64_t off) {
    auto it = any_stored ? st->stored.find(program_state::key(e->index, off)) : st->stored.end();
    if (it != st->stored.end())
      rec->lanes.push_back({pos, off, static_cast<T*>(it->second), true});
    else if (e->wants_grad())
      rec->lanes.push_back({pos, off, nullptr, false});
  });
  st->reads |= std::uint64_t{1} << e->index;
  return adj;
}

/// Remembers, per stored element, the adjoint slot of the stored value (the last one wins).
template <class T, class Each>
void record_store(void const* base, T* adj, Each&& each) {
  program_state* st = current_state();
  if (!st) return;
  tensor_entry const* e = st->find(base);
  if (!e) return;
  each([&](int pos, std::int64_t off) {
    st->stored[program_state::key(e->index, off)] = adj ? static_cast<void*>(adj + pos) : nullptr;
  });
}

template <class A, class Off, class Mask, class Other>
auto load_ptr(ptr_tile<A, Off> const& p, Mask const& mask, Other const& other,
              std::source_location const& loc) {
  using T = primal_of_t<A>;
  using S = detail::access_shape_t<Off, Mask>;
  ptr_tile<T const, Off> fp(primal_view(p.base), p.offsets, p.shift);
  auto const values = [&] {
    if constexpr (std::is_same_v<Other, detail::no_mask>)
      return detail::load_impl(fp, mask, other, loc);
    else
      return detail::load_impl(fp, mask, to_primal(other), loc);
  }();
  tape& tp = current_tape();
  T* v = tp.alloc<T>(S::size);
  std::memcpy(v, values.data(), sizeof(T) * S::size);
  auto maskb = [&] {
    if constexpr (std::is_same_v<Mask, detail::no_mask>)
      return detail::no_mask{};
    else
      return detail::bcast<S>(mask);
  }();
  T* a = record_load<T, S>(p.base.data(), [&](auto&& visit) {
    detail::for_each_access<S, 1>(
        fp, maskb, [&](int r, int c, std::int64_t e) { visit(r * S::inner + c, e); },
        [](int, int, std::int64_t) {});
  });
  return detail::tile_t<adjoint<T>, S>::from_buffers(v, a);
}

template <class A, class Off, class Val, class Mask>
void store_ptr(ptr_tile<A, Off> const& p, Val const& val, Mask const& mask,
               std::source_location const& loc) {
  using T = primal_of_t<A>;
  using S = detail::access_shape_t<Off, Mask>;
  detail::tile_t<adjoint<T>, S> const v(detail::bcast<S>(detail::convert_as<adjoint<T>>(val)));
  ptr_tile<T, Off> fp(primal_view(p.base), p.offsets, p.shift);
  detail::store_impl(fp, tile_ref<T, S>{{}, v.values()}, mask, loc);
  auto maskb = [&] {
    if constexpr (std::is_same_v<Mask, detail::no_mask>)
      return detail::no_mask{};
    else
      return detail::bcast<S>(mask);
  }();
  record_store<T>(p.base.data(), v.adjoints(), [&](auto&& visit) {
    detail::for_each_access<S, 1>(
        fp, maskb, [&](int r, int c, std::int64_t e) { visit(r * S::inner + c, e); },
        [](int, int, std::int64_t) {});
  });
}

template <class A, int... Bs>
auto primal_block(block_ptr<A, Bs...> const& bp) {
  auto const t = primal_view(bp.base());
  using P = typename std::remove_cvref_t<decltype(t)>::element_type;
  return block_ptr<P, Bs...>(t, bp.shape(), bp.strides(), bp.offsets());
}

template <class Check, class FB, class Visit>
void block_lanes(FB const& fbp, char const* what, std::source_location const& loc, Visit&& visit) {
  constexpr int L = FB::shape_type::inner;
  std::int64_t const sc = fbp.strides()[FB::rank - 1];
  detail::for_each_block_row<Check>(fbp, what, loc, [&](int r, std::int64_t mem, int lo, int hi) {
    for (int c = lo; c < hi; ++c) visit(r * L + c, mem + c * sc);
  });
}

template <class A, int... Bs, int... Axes>
auto load_block(block_ptr<A, Bs...> const& bp, boundary_check<Axes...> check, padding pad,
                std::source_location const& loc) {
  using T = primal_of_t<A>;
  using S = shape<Bs...>;
  auto const fbp = primal_block(bp);
  auto const values = tilegrad::load(fbp, check, pad, loc);
  tape& tp = current_tape();
  T* v = tp.alloc<T>(S::size);
  std::memcpy(v, values.data(), sizeof(T) * S::size);
  T* a = record_load<T, S>(bp.base().data(), [&](auto&& visit) {
    block_lanes<boundary_check<Axes...>>(fbp, "load", loc, visit);
  });
  return tile<adjoint<T>, Bs...>::from_buffers(v, a);
}

template <class A, int... Bs, class E, int... Axes>
void store_block(block_ptr<A, Bs...> const& bp, E&& value, boundary_check<Axes...> check,
                 std::source_location const& loc) {
  using T = primal_of_t<A>;
  using S = shape<Bs...>;
  tile<adjoint<T>, Bs...> const v(value);
  auto const fbp = primal_block(bp);
  tilegrad::store(fbp, tile_ref<T, S>{{}, v.values()}, check, loc);
  record_store<T>(bp.base().data(), v.adjoints(), [&](auto&& visit) {
    block_lanes<boundary_check<Axes...>>(fbp, "store", loc, visit);
  });
}

} // namespace tilegrad::ad
