// Gradients by name with their element type erased: a hand-written backward hands back tensors of
// any dtype and shape, and the checker reports a wrong one instead of failing to compile.
#pragma once

#include "tilegrad/core/bf16.hpp"
#include "tilegrad/core/config.hpp"
#include "tilegrad/memory/tensor.hpp"
#include "tilegrad/memory/tracking.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tilegrad {

/// The name of an element type as reports print it ("float32", "float64", "bfloat16", ...).
template <class T>
constexpr char const* dtype_name() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>)
    return "float32";
  else if constexpr (std::is_same_v<U, double>)
    return "float64";
  else if constexpr (std::is_same_v<U, bf16>)
    return "bfloat16";
  else if constexpr (std::is_same_v<U, bool>)
    return "bool";
  else if constexpr (std::is_integral_v<U>)
    return std::is_signed_v<U> ? (sizeof(U) == 8   ? "int64"
                                  : sizeof(U) == 4 ? "int32"
                                                   : "int")
                               : (sizeof(U) == 8   ? "uint64"
                                  : sizeof(U) == 4 ? "uint32"
                                                   : "uint");
  else
    return "unknown";
}

/// "(3, 17)" for a shape or coordinates.
inline std::string tuple_string(std::int64_t const* v, int n) {
  std::string s = "(";
  for (int a = 0; a < n; ++a)
    s += (a ? ", " : "") + std::to_string(v[a]);
  return s + ")";
}

/// One gradient as the checker holds it: values widened to double and the stored bits, both in
/// row-major order, with the shape and dtype it was handed over with.
struct erased_gradient {
  std::string name;
  std::string dtype;
  int rank = 1;
  extents shape{0, 1, 1, 1};
  std::vector<double> values;
  std::vector<unsigned char> bits;
  /// The memory the values were copied from, kept as addresses only: the checker traces a
  /// difference between two runs to the launches that wrote it (atomic_add alone, or not).
  void const* source = nullptr;
  extents source_strides{1, 1, 1, 1};
  std::size_t elem_size = 0;
  /// The traced launches' writes when it was handed over (launch_observer::writes.size()): what
  /// later launches write into the same memory (a reused workspace) is not its history.
  std::size_t traced = static_cast<std::size_t>(-1);

  std::int64_t numel() const { return static_cast<std::int64_t>(values.size()); }
  std::string shape_string() const { return tuple_string(shape.data(), rank); }
  /// The address element i (row-major) was copied from.
  void const* source_of(std::int64_t i) const {
    std::int64_t off = 0;
    for (int a = rank - 1; a >= 0; --a) {
      off += (i % shape[a]) * source_strides[a];
      i /= shape[a];
    }
    return static_cast<unsigned char const*>(source) + off * static_cast<std::int64_t>(elem_size);
  }
};

/// Copies a view of any element type into an erased gradient (row-major, whatever the strides).
template <class U>
erased_gradient erase_gradient(std::string name, tensor<U> t) {
  using V = std::remove_const_t<U>;
  erased_gradient g;
  g.name = std::move(name);
  g.dtype = dtype_name<V>();
  g.rank = t.rank();
  g.shape = t.shape();
  g.source = t.data();
  g.source_strides = t.strides();
  g.elem_size = sizeof(V);
  if (detail::launch_observer const* ob = detail::current_observer())
    g.traced = ob->writes.size();
  std::int64_t const n = t.numel();
  g.values.resize(static_cast<std::size_t>(n));
  g.bits.resize(static_cast<std::size_t>(n) * sizeof(V));
  for (std::int64_t i = 0; i < n; ++i) {
    V const v = t.data()[t.row_major_offset(i)];
    if constexpr (std::is_arithmetic_v<V>)
      g.values[static_cast<std::size_t>(i)] = static_cast<double>(v);
    else
      g.values[static_cast<std::size_t>(i)] = static_cast<double>(static_cast<float>(v));
    std::memcpy(g.bits.data() + static_cast<std::size_t>(i) * sizeof(V), &v, sizeof(V));
  }
  return g;
}

/// Where two gradients handed back were copied from the same memory, in the same state (the
/// views of two gradients laid over one slice of a packed buffer): "'k' at (0, 1) is element
/// (0, 1) of 'q'", with their names in `names`; else empty. That is no fault by itself (two
/// gradients that are equal, da = db = dy of y = a + b, may be one buffer): check_backward says
/// it only where one of them fails.
TILEGRAD_MACHINERY std::string shared_gradients(std::vector<erased_gradient> const& gs,
                                                std::pair<std::string, std::string>& names)
#if TILEGRAD_MACHINERY_BODIES
{
  for (std::size_t a = 0; a < gs.size(); ++a)
    for (std::size_t b = a + 1; b < gs.size(); ++b) {
      erased_gradient const& x = gs[a];
      erased_gradient const& y = gs[b];
      if (!x.source || !y.source || x.numel() == 0 || y.numel() == 0)
        continue;
      auto span = [](erased_gradient const& g) {
        auto const* lo = static_cast<unsigned char const*>(g.source_of(0));
        auto const* hi = lo;
        for (std::int64_t i : {std::int64_t{0}, g.numel() - 1}) { // (strides may be negative)
          auto const* p = static_cast<unsigned char const*>(g.source_of(i));
          lo = std::min(lo, p), hi = std::max(hi, p);
        }
        return std::pair{lo, hi + g.elem_size};
      };
      auto const [xl, xh] = span(x);
      auto const [yl, yh] = span(y);
      if (xh <= yl || yh <= xl || x.elem_size != y.elem_size)
        continue;
      std::unordered_map<void const*, std::int64_t> at;
      at.reserve(static_cast<std::size_t>(x.numel()));
      for (std::int64_t i = 0; i < x.numel(); ++i)
        at.emplace(x.source_of(i), i);
      std::int64_t first_x = -1, first_y = -1, shared = 0;
      bool same_state = true, nonzero = false;
      for (std::int64_t j = 0; j < y.numel() && same_state; ++j)
        if (auto const it = at.find(y.source_of(j)); it != at.end()) {
          auto const w = x.elem_size;
          unsigned char const* bx = x.bits.data() + static_cast<std::size_t>(it->second) * w;
          unsigned char const* by = y.bits.data() + static_cast<std::size_t>(j) * w;
          same_state = std::memcmp(bx, by, w) == 0;
          nonzero |= x.values[static_cast<std::size_t>(it->second)] != 0;
          if (shared++ == 0)
            first_x = it->second, first_y = j;
        }
      if (shared == 0 || !same_state || !nonzero)
        continue;
      auto coords = [](erased_gradient const& g, std::int64_t i) {
        std::int64_t c[max_tensor_rank] = {};
        for (int ax = g.rank - 1; ax >= 0; --ax) {
          c[ax] = i % g.shape[ax];
          i /= g.shape[ax];
        }
        return tuple_string(c, g.rank);
      };
      names = {x.name, y.name};
      return "the gradients handed back for '" + x.name + "' and '" + y.name + "' share " +
             std::to_string(shared) + " element(s) of memory: '" + y.name + "' at " +
             coords(y, first_y) + " is element " + coords(x, first_x) + " of '" + x.name +
             "' (views laid over one slice of a buffer?): if they should differ, each is judged "
             "on what the other wrote";
    }
  return {};
}
#else
    ;
#endif

/// The gradients a hand-written backward produced, by name. Built from a braced list,
/// `return {{"x", dx}, {"w", dw}};`, or filled with set().
class gradient_set {
public:
  /// One name and a tensor (an owning tensor or a view of any element type).
  struct entry {
    template <class U>
    entry(char const* name, owned_tensor<U> const& t) : g(erase_gradient(name, t.cview())) {}
    template <class U>
    entry(char const* name, tensor<U> t) : g(erase_gradient(name, t)) {}
    erased_gradient g;
  };

  gradient_set() = default;
  gradient_set(std::initializer_list<entry> entries) {
    for (auto const& e : entries)
      add(e.g);
  }

  template <class U>
  void set(std::string const& name, tensor<U> t) {
    add(erase_gradient(name, t));
  }
  template <class U>
  void set(std::string const& name, owned_tensor<U> const& t) {
    add(erase_gradient(name, t.cview()));
  }

  bool contains(std::string const& name) const { return find(name) != nullptr; }
  erased_gradient const* find(std::string const& name) const {
    for (auto const& g : grads_)
      if (g.name == name)
        return &g;
    return nullptr;
  }
  std::vector<erased_gradient> const& entries() const { return grads_; }
  /// Names set more than once (the last one counts); the checker reports them.
  std::vector<std::string> const& duplicates() const { return duplicates_; }

  /// Adds the entries of `o` (a backward may both fill its context and return a set).
  void merge(gradient_set const& o) {
    for (auto const& g : o.grads_)
      add(g);
    duplicates_.insert(duplicates_.end(), o.duplicates_.begin(), o.duplicates_.end());
  }

private:
  TILEGRAD_MACHINERY_MEMBER void add(erased_gradient g)
#if TILEGRAD_MACHINERY_BODIES
  {
    for (auto& old : grads_)
      if (old.name == g.name) {
        duplicates_.push_back(g.name);
        old = std::move(g);
        return;
      }
    grads_.push_back(std::move(g));
  }
#else
  ;
#endif
  std::vector<erased_gradient> grads_;
  std::vector<std::string> duplicates_;
};

} // namespace tilegrad

#if TILEGRAD_SEPARATE_COMPILATION // compiled in tilegrad/separate.hpp
namespace tilegrad {
extern template erased_gradient erase_gradient<float const>(std::string, tensor<float const>);
extern template erased_gradient erase_gradient<float>(std::string, tensor<float>);
extern template erased_gradient erase_gradient<double const>(std::string, tensor<double const>);
extern template erased_gradient erase_gradient<double>(std::string, tensor<double>);
extern template erased_gradient erase_gradient<bf16 const>(std::string, tensor<bf16 const>);
extern template erased_gradient erase_gradient<bf16>(std::string, tensor<bf16>);
} // namespace tilegrad
#endif
