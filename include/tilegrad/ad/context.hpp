// What reverse mode knows while one program runs: its tape, the tensors of the launch (their
// roles, cotangents and per-element ownership), the accesses it makes to tensors the kernel may
// write (for exact store/load semantics and race detection) and the gradient contributions it
// produces for input tensors, kept as runs of elements rather than element by element.
#pragma once

#include "tilegrad/ad/accumulate.hpp"
#include "tilegrad/ad/tape.hpp"
#include "tilegrad/core/config.hpp"
#include "tilegrad/core/hash.hpp"
#include "tilegrad/core/simd.hpp"
#include "tilegrad/memory/runs.hpp"
#include "tilegrad/memory/tensor.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <source_location>
#include <stdexcept>
#include <string>
#include <vector>

namespace tilegrad::ad {

enum class role { passive, in, out, inout };

/// A float tensor of a vjp launch, by address range (and by element, where ranges overlap).
struct tensor_entry {
  std::byte const* lo = nullptr; // first byte of its data
  std::byte const* hi = nullptr; // one past the last element it spans
  int index = 0;
  role r = role::passive;
  bool writable = false; // the kernel receives it non-const: its accesses are tracked
  // Its address range overlaps another tensor's (views of one buffer that share no element):
  // an address in the range is its own only if it is one of its elements.
  bool shared_range = false;
  // A gradient of a tensor that is not contiguous: runs of elements (offsets in memory) are
  // mapped to the row-major indices of the gradient, which has the tensor's logical shape.
  bool strided_grad = false;
  std::uint32_t bytes = 0; // per element
  char const* name = "";
  tensor<std::byte const> layout;       // shape and strides: elements, and their names in messages
  void const* cotangent = nullptr;      // out / inout: indexed by the tensor's element offset
  std::uint32_t* stamp = nullptr;       // writable: the last writer, (program + 1) << 1 | atomic
  std::uint64_t* readers = nullptr;     // writable, once loaded: the first two readers + 1
  /// Offsets from `base` (a view into this tensor, such as t[b][h]) plus this are offsets from
  /// the tensor's own first element, which stamps, cotangents and gradients are indexed by.
  template <class T>
  std::int64_t shift(void const* base) const {
    return (static_cast<std::byte const*>(base) - lo) / static_cast<std::ptrdiff_t>(sizeof(T));
  }
  bool wants_grad() const { return r == role::in || r == role::inout; }
  bool has_cotangent() const { return r == role::out || r == role::inout; }

  /// Whether address b (in [lo, hi)) is one of this tensor's elements. (Out of line: only
  /// tensors whose ranges overlap take it, and the loads and stores that look tensors up stay
  /// small.)
  [[gnu::noinline]] bool holds(std::byte const* b) const {
    std::int64_t const d = b - lo;
    return d % bytes == 0 && layout.contains(d / bytes);
  }

  /// The row-major index of the element at offset `off` (a valid element: the layout nests,
  /// which vjp checks before any program runs), and its coordinate along axis `axis` in *at.
  std::int64_t logical_index(std::int64_t off, int axis, std::int64_t* at) const {
    // Dividing by the strides from the largest down finds the coordinates of a nested layout.
    extents const& n = layout.shape();
    extents const& st = layout.strides();
    std::int64_t idx[max_tensor_rank] = {};
    std::int64_t rem = off;
    for (int i = 0; i < layout.rank(); ++i) {
      int const a = by_stride[i];
      if (n[a] > 1) {
        idx[a] = rem / st[a];
        rem -= idx[a] * st[a];
      }
    }
    std::int64_t l = 0;
    for (int a = 0; a < layout.rank(); ++a)
      l = l * n[a] + idx[a];
    if (at)
      *at = idx[axis];
    return l;
  }
  // Axes by decreasing stride (set with strided_grad), and each axis's stride in the gradient.
  int by_stride[max_tensor_rank] = {0, 1, 2, 3};
  std::int64_t grad_stride[max_tensor_rank] = {1, 1, 1, 1};

  /// Sets up strided_grad for a tensor with a gradient that is not contiguous.
  void set_strided_grad() {
    strided_grad = true;
    int const n = layout.rank();
    for (int i = 1; i < n; ++i) // insertion sort of at most 4 axes
      for (int j = i; j > 0 && layout.stride(by_stride[j - 1]) < layout.stride(by_stride[j]); --j)
        std::swap(by_stride[j - 1], by_stride[j]);
    std::int64_t s = 1;
    for (int a = n - 1; a >= 0; --a) {
      grad_stride[a] = s;
      s *= layout.size(a);
    }
  }
};

// Runs of lanes (memory/runs.hpp) are shared with the access tracking of plain launches.
using detail::run;
using detail::run_builder;

/// The runs `in` of tensor e (offsets in memory from its first element) as runs of row-major
/// indices of its gradient, for a tensor with strided_grad (in a per-thread buffer, valid until
/// the next call). A run along one axis (a row, or a column of a transposed view) stays one
/// run; others are taken lane by lane.
TILEGRAD_MACHINERY std::vector<run> const& logical_runs(tensor_entry const& e,
                                                        std::vector<run> const& in)
#if TILEGRAD_MACHINERY_BODIES
{
  thread_local std::vector<run> out;
  run_builder b(out);
  for (run const& r : in) {
    if (r.count == 1 || r.step == 0) {
      b.add(run{r.pos, r.count, e.logical_index(r.offset, 0, nullptr), r.step == 0 ? 0 : 1});
      continue;
    }
    std::int64_t const s = r.step < 0 ? -r.step : r.step;
    extents const& n = e.layout.shape();
    int axis = -1;
    for (int a = 0; a < e.layout.rank() && axis < 0; ++a)
      if (n[a] > 1 && e.layout.strides()[a] == s)
        axis = a;
    if (axis >= 0) {
      std::int64_t at = 0;
      std::int64_t const l = e.logical_index(r.offset, axis, &at);
      std::int64_t const last = at + (r.step < 0 ? 1 - r.count : r.count - 1);
      if (last >= 0 && last < n[axis]) {
        std::int64_t const g = e.grad_stride[axis];
        b.add(run{r.pos, r.count, l, r.step < 0 ? -g : g});
        continue;
      }
    }
    for (int k = 0; k < r.count; ++k)
      if (e.layout.contains(r.element(k))) // (an access outside the tensor, unchecked, is lost)
        b.add(r.pos + k, e.logical_index(r.element(k), 0, nullptr));
  }
  b.finish();
  return out;
}
#else
;
#endif

/// Whether run r holds element el.
inline bool run_holds(run const& r, std::int64_t el) {
  std::int64_t const d = el - r.offset;
  if (r.step == 0)
    return d == 0;
  return d % r.step == 0 && d / r.step >= 0 && d / r.step < r.count;
}

enum class access_kind : std::uint8_t { load, store, atomic };

/// A program's access to a tensor the kernel may write, in program order.
struct access {
  access_kind kind;
  int tensor;
  run r;
  void* adj; // store / atomic: the adjoints of the lanes written (lane r.pos first), or null
  std::source_location loc;
};

/// The gradient of an input tensor, as the programs' contributions reach it in program order.
/// Its memory starts uninitialised: the first contribution to an element is written, later ones
/// added (`written`, one bit per element, says which is which), so the gradient is not zeroed
/// first and then read back; elements no contribution reached are zeroed at the end (fill_unwritten).
struct gradient_sink {
  void* data = nullptr;
  std::uint64_t* written = nullptr;
  // A gradient larger than a core's caches, aligned: the first write of a whole word of 64
  // elements streams past the cache (no read for ownership of lines about to be overwritten).
  bool stream = false;

  /// Adds the values v to the elements of run r (the first contribution to an element is
  /// written: 0 + v is v, but for the sign of a zero).
  template <class T>
  void add(run const& r, T const* v) const {
    T* const g = static_cast<T*>(data);
    if (r.step != 1) {
      for (int k = 0; k < r.count; ++k) {
        std::int64_t const el = r.element(k);
        std::uint64_t& w = written[el >> 6];
        std::uint64_t const bit = std::uint64_t{1} << (el & 63);
        g[el] = (w & bit) ? g[el] + v[k] : v[k];
        w |= bit;
      }
      return;
    }
    // A word of bits at a time: all unwritten (copy), all written (add), or mixed.
    for (int k = 0; k < r.count;) {
      std::int64_t const el = r.offset + k;
      int const lo = static_cast<int>(el & 63);
      int const m = std::min(64 - lo, r.count - k);
      std::uint64_t const mask = (m == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << m) - 1) << lo;
      std::uint64_t& w = written[el >> 6];
      std::uint64_t const have = w & mask;
      T* const d = g + el;
      T const* const s = v + k;
      if (have == 0) {
        if (stream && m == 64)
          simd::stream_copy(d, s, sizeof(T) * 64);
        else
          for (int j = 0; j < m; ++j) d[j] = s[j];
      } else if (have == mask) {
        for (int j = 0; j < m; ++j) d[j] += s[j];
      } else {
        for (int j = 0; j < m; ++j) d[j] = (have >> (lo + j)) & 1 ? d[j] + s[j] : s[j];
      }
      w |= mask;
      k += m;
    }
  }

  /// Zeroes the elements of n no contribution reached.
  template <class T>
  void fill_unwritten(std::int64_t n) const {
    T* const g = static_cast<T*>(data);
    for (std::int64_t w0 = 0; w0 < n; w0 += 64) {
      std::uint64_t const w = written[w0 >> 6];
      if (w == ~std::uint64_t{0}) continue;
      std::int64_t const m = std::min<std::int64_t>(64, n - w0);
      for (std::int64_t j = 0; j < m; ++j)
        if (!((w >> j) & 1)) g[w0 + j] = T(0);
    }
  }
};

/// Everything one program hands to the launch after it ran; reused from wave to wave.
struct program_result {
  std::vector<access> accesses;
  // Contributions kept until they are added (in chunks of the launch's pool), and the same split
  // by block of gradient elements once the program is done.
  held_contributions held;
  std::vector<block_piece> pieces;
  contribution_pool* pool = nullptr;
  std::size_t contributed = 0; // bytes of contributions made, held or added at once
  std::uint64_t reads = 0;     // bit i: tensor i was loaded from

  void clear() {
    accesses.clear();
    held.clear();
    pieces.clear();
    contributed = 0;
    reads = 0;
  }
  /// Keeps the n values at v as a contribution to the elements of run r of tensor t.
  template <class T>
  void contribute(int t, run const& r, T const* v) {
    held.add(*pool, t, r, v);
  }
};

/// A stamp: the program that wrote an element last, as (linear program id + 1) << 1, with bit 0
/// set when it was an atomic update; 0 for an element no program wrote.
inline constexpr std::uint32_t atomic_stamp = 1;
inline std::uint32_t stamp_program(std::uint32_t s) { return s >> 1; }

/// The last store of one program to each element it stored: which access, which lane. Stamps
/// name only the program, which is all that most programs need (each element stored once, never
/// read back); a program that stores an element twice, or loads one it stored, needs to know
/// which store was last. The map is built then, from its accesses so far, and kept up to date
/// for the rest of that program.
class own_stores {
public:
  bool active() const { return active_; }

  void clear() {
    if (size_ != 0) std::fill(keys_.begin(), keys_.end(), empty);
    size_ = 0;
    active_ = false;
  }
  /// Starts the map from a program's accesses so far.
  TILEGRAD_MACHINERY_MEMBER void start(std::vector<access> const& acc)
#if TILEGRAD_MACHINERY_BODIES
  {
    active_ = true;
    for (std::size_t i = 0; i < acc.size(); ++i)
      if (acc[i].kind == access_kind::store) add(static_cast<std::uint32_t>(i), acc[i]);
  }
#else
  ;
#endif
  /// Access i, a store, is now the last store to each of its elements (its last lane, for a
  /// run that repeats one element).
  void add(std::uint32_t i, access const& a) {
    for (int k = 0; k < a.r.count; ++k) put(key(a.tensor, a.r.element(k)), {i, k});
  }
  struct last {
    std::uint32_t access;
    int lane;
  };
  /// The last store to element el of tensor t, if the program stored it.
  bool find(int t, std::int64_t el, last& out) const {
    if (size_ == 0) return false;
    std::uint64_t const k = key(t, el);
    for (std::size_t h = hash(k);; h = (h + 1) & (keys_.size() - 1)) {
      if (keys_[h] == empty) return false;
      if (keys_[h] == k) {
        out = vals_[h];
        return true;
      }
    }
  }

private:
  static constexpr std::uint64_t empty = ~std::uint64_t{0};
  static std::uint64_t key(int t, std::int64_t el) {
    return static_cast<std::uint64_t>(el) << 6 | static_cast<std::uint64_t>(t);
  }
  std::size_t hash(std::uint64_t k) const {
    return static_cast<std::size_t>((k * 0x9e3779b97f4a7c15ull) >> 32) & (keys_.size() - 1);
  }
  void put(std::uint64_t k, last v) {
    if (2 * (size_ + 1) > keys_.size()) grow();
    for (std::size_t h = hash(k);; h = (h + 1) & (keys_.size() - 1)) {
      if (keys_[h] == k) {
        vals_[h] = v;
        return;
      }
      if (keys_[h] == empty) {
        keys_[h] = k;
        vals_[h] = v;
        ++size_;
        return;
      }
    }
  }
  TILEGRAD_MACHINERY_MEMBER void grow()
#if TILEGRAD_MACHINERY_BODIES
  {
    std::vector<std::uint64_t> keys(std::max<std::size_t>(1024, 2 * keys_.size()), empty);
    std::vector<last> vals(keys.size());
    std::swap(keys, keys_);
    std::swap(vals, vals_);
    size_ = 0;
    for (std::size_t h = 0; h < keys.size(); ++h)
      if (keys[h] != empty) put(keys[h], vals[h]);
  }
#else
  ;
#endif
  std::vector<std::uint64_t> keys_;
  std::vector<last> vals_;
  std::size_t size_ = 0;
  bool active_ = false;
};

struct program_state {
  tape t;
  std::vector<tensor_entry> const* tensors = nullptr;
  program_result* out = nullptr;
  std::uint32_t id = 0; // linear program id + 1
  // Programs before this one in program order ran in earlier waves (ids + 1 up to this one):
  // a conflict with them is reported at once; conflicts within a wave after it, in program order.
  std::uint32_t earlier_waves = 0;
  bool earlier(std::uint32_t pid) const { return pid - 1 < earlier_waves; } // pid 0: nobody
  std::vector<run> scratch;
  own_stores own; // active once the program stores an element twice or loads one it stored
  // The gradients, by tensor; when `direct`, every earlier program's contributions are applied
  // and this program's go straight to the gradients, else they are kept in `out` for later.
  gradient_sink const* grads = nullptr;
  bool direct = false;
  // Inside the body of a checkpointed tg::loop (ad/loop.hpp): stores are refused there; while an
  // iteration is replayed in the sweep, its accesses were already recorded by its first run, and
  // a load of an element this program wrote after the loop (accesses from `after_loop` on; the
  // tensors they wrote are the bits of `stored_after`) cannot be replayed as it ran.
  int loop_depth = 0;
  bool replaying = false;
  std::uint64_t stored_after = 0;
  std::size_t after_loop = 0;
  // The same for tensors vjp does not differentiate (integer tensors), whose accesses go to the
  // program's log of a tracked launch (current_hooks()->log): its accesses from this one on.
  std::size_t log_after_loop = 0;
  // Rounding jitter (rounding_jitter()): the program's random stream, seeded from its id.
  std::uint64_t jitter_state = 0;
  // Inside a tg::loop body: a digest of the values it loaded from tensors vjp does not
  // differentiate (integer tensors; plain_load_hook), per iteration, so that a replay that reads
  // other values (another program's atomic on a counter or flag the body reads) is refused.
  std::uint64_t load_digest = 0;
  /// Whether this program wrote element el of tensor t after the loop being replayed.
  bool written_after_loop(int t, std::int64_t el) const {
    auto const& acc = out->accesses;
    for (std::size_t i = after_loop; i < acc.size(); ++i)
      if (acc[i].kind != access_kind::load && acc[i].tensor == t && run_holds(acc[i].r, el))
        return true;
    return false;
  }

  /// This program's contribution v to the elements of run r of tensor t.
  template <class T>
  void contribute(int t, run const& r, T const* v) {
    out->contributed += sizeof(T) * static_cast<std::size_t>(r.count);
    if (direct)
      grads[t].add(r, v);
    else
      out->contribute(t, r, v);
  }

  /// This program's stamp on the elements it stores.
  std::uint32_t stamp() const { return id << 1; }

  /// The tensor whose memory holds address p (null for memory of no vjp tensor): the one whose
  /// range holds it, or where ranges overlap (views of one buffer), whose elements hold it.
  tensor_entry const* find(void const* p) const {
    if (!tensors) return nullptr;
    auto const* b = static_cast<std::byte const*>(p);
    for (auto const& e : *tensors)
      if (b >= e.lo && b < e.hi && (!e.shared_range || e.holds(b)))
        return &e;
    return nullptr;
  }

  /// The adjoint slot of the value this program stored last at element el of tensor t (its
  /// stamp says this program stored it); null when it stored a constant.
  template <class T>
  T* stored_slot(int t, std::int64_t el) {
    if (!own.active()) own.start(out->accesses);
    own_stores::last l{};
    if (!own.find(t, el, l)) return nullptr;
    access const& a = out->accesses[l.access];
    return a.adj ? static_cast<T*>(a.adj) + l.lane : nullptr;
  }

  void reset() {
    t.reset();
    own.clear();
    t.reset_peak();
    loop_depth = 0;
    replaying = false;
    stored_after = 0;
    after_loop = 0;
    log_after_loop = 0;
    load_digest = 0;
  }
};

/// Folds the value v of element el into a digest (program_state::load_digest).
inline std::uint64_t mix_digest(std::uint64_t h, std::uint64_t v, std::int64_t el) {
  h ^= v + 0x9e3779b97f4a7c15u + (static_cast<std::uint64_t>(el) << 6) + (h >> 2);
  h *= 0xbf58476d1ce4e5b9u;
  return h ^ (h >> 31);
}

/// The reverse-mode state of the program running on this thread.
inline program_state*& current_state() {
  thread_local program_state* s = nullptr;
  return s;
}

/// Whether the sweep running on this thread propagates magnitudes: every rule's contribution is
/// |g * d| (dot's operands are taken as absolute values), so that, seeded with |cotangents|, the
/// sweep yields the gradient of the same kernel taken on absolute values, |J|^T |w|: the weight
/// of each element's running error bound (check_backward's pass rule).
inline bool& magnitude_sweep() {
  thread_local bool m = false;
  return m;
}

/// In a magnitude sweep, whether it sums squares: every rule's contribution is g * d^2 (the
/// rule applied twice: rules are linear in g) and dot's operands are squared, so that, seeded
/// with squared cotangents, the sweep yields per element the sum over the terms of its gradient
/// (the products of partials along each path) of their squares, |J|^2^T w^2 taken term by term:
/// the size of a random walk of one independent rounding per term (the bf16 pass rule).
inline bool& squares_sweep() {
  thread_local bool s = false;
  return s;
}

/// In a magnitude sweep, whether it counts terms: every rule's contribution is g where its partial
/// is nonzero (dot's operands are taken as 1 where nonzero), so that, seeded with 1 where a
/// cotangent is nonzero, the sweep yields per element the number of terms of its gradient (the
/// paths along which every partial is nonzero): how many roundings a sum of them in sequence
/// takes, however unequal the terms (check_backward's allowance for long sums).
inline bool& counts_sweep() {
  thread_local bool c = false;
  return c;
}

/// In a sweep of counts, whether it marks branches: a term that takes the second choice of a
/// where(), maximum() or minimum(), or passes abs() at a negative value, counts 2 at each such
/// choice (powers of two, exact in float), so that the counts of an element differ between two
/// runs where a branch on a path to it went otherwise, even where both branches keep the term (a
/// leaky relu, a sign): check_backward's test of where the fp32 reference took other branches.
inline bool& branches_sweep() {
  thread_local bool b = false;
  return b;
}

/// What a magnitude sweep sums per term: |partials| (the default), their squares, counts, or
/// counts that mark the branches taken (branches_sweep).
enum class magnitude_kind { absolute, squares, counts, branches };

/// While it lives, the sweeps on this thread (and the vjp calls made from it, which pass the
/// choice on to their worker threads) sweep magnitudes or not (see magnitude_sweep), of absolute
/// values, of squares (squares_sweep) or counts (counts_sweep); the flags are restored after, so
/// a worker thread never keeps them.
class magnitude_scope {
public:
  explicit magnitude_scope(bool on = true, magnitude_kind kind = magnitude_kind::absolute)
      : saved_(magnitude_sweep()), saved_squares_(squares_sweep()), saved_counts_(counts_sweep()),
        saved_branches_(branches_sweep()) {
    magnitude_sweep() = on;
    squares_sweep() = on && kind == magnitude_kind::squares;
    counts_sweep() = on && (kind == magnitude_kind::counts || kind == magnitude_kind::branches);
    branches_sweep() = on && kind == magnitude_kind::branches;
  }
  ~magnitude_scope() {
    magnitude_sweep() = saved_;
    squares_sweep() = saved_squares_;
    counts_sweep() = saved_counts_;
    branches_sweep() = saved_branches_;
  }
  magnitude_scope(magnitude_scope const&) = delete;
  magnitude_scope& operator=(magnitude_scope const&) = delete;

  /// The kind of the sweep running on this thread.
  static magnitude_kind current() {
    return squares_sweep()    ? magnitude_kind::squares
           : branches_sweep() ? magnitude_kind::branches
           : counts_sweep()   ? magnitude_kind::counts
                              : magnitude_kind::absolute;
  }

private:
  bool saved_, saved_squares_, saved_counts_, saved_branches_;
};

/// A reference run with rounding jitter (check_backward's second look): the float64 forward
/// keeps, beside each value it computes, a bound of the rounding error a float computation of it
/// would carry (`unit` is that precision's unit roundoff), and each operation that reads such a
/// value reads it moved by a random fraction of that bound, drawn anew per reader (see
/// ad/jitter.hpp). seed 0: off. The draws depend on the seed and the program only, so a run with
/// another `scale` moves every value by that multiple of the same amount.
struct jitter_settings {
  std::uint64_t seed = 0;
  double unit = 0;
  double scale = 1; ///< the readers' moves, times this (the same draws at another size)
  /// Values move by their whole error bound, up or down at random, one draw per value that all
  /// its readers read (as a float computation's rounding is), not by a random fraction of it
  /// drawn per reader: a gradient element one rounding reaches moves by all it can do.
  bool whole = false;
};
inline jitter_settings& rounding_jitter() {
  thread_local jitter_settings j;
  return j;
}

/// A random number in [-1, 1) from the running program's stream (splitmix64).
inline double jitter_draw() {
  std::uint64_t const z = tilegrad::detail::splitmix_next(current_state()->jitter_state);
  return static_cast<double>(z >> 11) * 0x1.0p-52 - 1.0;
}

/// While it lives, the vjp calls made from this thread (and their worker threads) run with
/// rounding jitter; restored after.
class jitter_scope {
public:
  explicit jitter_scope(jitter_settings j) : saved_(rounding_jitter()) { rounding_jitter() = j; }
  ~jitter_scope() { rounding_jitter() = saved_; }
  jitter_scope(jitter_scope const&) = delete;
  jitter_scope& operator=(jitter_scope const&) = delete;

private:
  jitter_settings saved_;
};

/// The tape adjoint tiles record on: the running program's, or a per-thread scratch tape for
/// adjoint tiles used outside vjp (recorded, never swept).
inline tape& current_tape() {
  if (program_state* s = current_state()) return s->t;
  thread_local tape scratch;
  return scratch;
}

/// Refuses a read of an adjoint tile made or assigned in an iteration of a tg::loop whose
/// records the loop has rewound (ad/tile.hpp).
[[noreturn]] TILEGRAD_NOINLINE inline void read_after_rewind(tape const& tp,
                                                             std::uint64_t tile_iteration) {
  program const* p = tilegrad::detail::current_program();
  std::source_location const* w = tp.loop_of(tile_iteration);
  throw std::invalid_argument(
      "tilegrad::vjp: " + (p ? p->describe() : std::string("host code")) +
      ": a tile made or assigned in the body of tg::loop" +
      (w ? " (at " + std::string(w->file_name()) + ":" + std::to_string(w->line()) + ")"
         : std::string()) +
      " is read after its iteration, kept through a pointer or a container the body captures: "
      "the loop is checkpointed (its records exceed the record budget, "
      "tg::set_loop_record_budget) and dropped what the iteration recorded, so the values are "
      "gone and its gradient would be lost. Carry it: loop(begin, end, step, acc, ..., body), "
      "the body taking it as auto&.");
}

/// An expression of a tile assigned again before the expression was evaluated (adjoint_leaf).
[[noreturn]] TILEGRAD_NOINLINE inline void tile_assigned_before_evaluation() {
  program const* p = tilegrad::detail::current_program();
  throw std::invalid_argument(
      "tilegrad::vjp: " + (p ? p->describe() : std::string("host code")) +
      ": an expression read a tile that was assigned again after the expression was made and "
      "before it was evaluated (auto const e = w * w; w = ...; then e used). C++ expressions "
      "are lazy: the fast path and forward mode read w's new values, where Triton computes e "
      "at once, from the old ones; reverse mode refuses rather than differentiate either. Give e "
      "a tile type (tg::tile<F, N> const e = w * w;) to compute it at once, or make it after "
      "the assignment");
}

} // namespace tilegrad::ad
