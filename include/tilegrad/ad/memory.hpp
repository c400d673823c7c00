// Reverse mode of loads, stores and atomics. Memory semantics are exact:
// - a load records where its lanes' adjoints go: to the adjoint of the value this program stored
//   at that element earlier (if it did), else to the gradient of the tensor (if one is wanted);
//   masked-off lanes, `other` and padding get nothing. Lanes are kept as runs of elements,
//   gathered in the same walk that reads the values (straight onto the tape), so the gradient
//   of a block is a few row copies, not a list of elements;
// - a store writes the primal values and stamps each element with its program; after the
//   forward pass, the last store to each element receives the output cotangent (every store,
//   unless the program stored some element twice: then its table of own stores says which);
// - every atomic_add contribution receives the output cotangent; the old values it returns are
//   constants (they depend on the order programs ran).
// Accesses to tensors the kernel may write are kept in program order for the race check.
#pragma once

#include "tilegrad/ad/context.hpp"
#include "tilegrad/ad/races.hpp"
#include "tilegrad/ad/tile.hpp"
#include "tilegrad/core/config.hpp"
#include "tilegrad/memory/block_ptr.hpp"
#include "tilegrad/memory/pointer.hpp"
#include "tilegrad/tile/elementwise.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <source_location>
#include <stdexcept>
#include <string>
#include <vector>

namespace tilegrad::ad {

template <class A>
auto primal_view(tensor<A> const& t) {
  using T = primal_of_t<A>;
  using P = std::conditional_t<std::is_const_v<A>, T const, T>;
  return tensor<P>(reinterpret_cast<P*>(t.data()), t.rank(), t.shape(), t.strides(), t.name());
}

/// A lane whose adjoint goes to the adjoint of an earlier store by the same program.
template <class T>
struct routed_lane {
  int pos;
  T* slot;
};

template <class T>
struct load_record final : record {
  T* adj;
  int tensor;
  run const* runs; // lanes whose adjoint is a gradient contribution to the tensor
  int nruns;
  routed_lane<T> const* routed;
  int nrouted;
  load_record(T* a, int t, run const* r, int nr, routed_lane<T> const* rt, int nrt)
      : adj(a), tensor(t), runs(r), nruns(nr), routed(rt), nrouted(nrt) {}
  void backward() override {
    for (int i = 0; i < nrouted; ++i)
      *routed[i].slot += adj[routed[i].pos];
    if (nruns == 0)
      return;
    program_state* st = current_state();
    for (int i = 0; i < nruns; ++i)
      st->contribute(tensor, runs[i], adj + runs[i].pos);
  }
};

/// The grid of the running launch, for naming programs in messages.
inline std::array<int, 3> launch_dims() {
  program const* p = detail::current_program();
  return p ? std::array<int, 3>{p->num_programs(0), p->num_programs(1), p->num_programs(2)}
           : std::array<int, 3>{1, 1, 1};
}

template <class X>
X const* copy_to_tape(tape& tp, std::vector<X> const& v) {
  if (v.empty())
    return nullptr;
  X* p = tp.alloc<X>(v.size());
  std::memcpy(static_cast<void*>(p), v.data(), sizeof(X) * v.size());
  return p;
}

/// Whether a view of `bytes` bytes of memory at `base`, made from the data of e, reaches an
/// element of another tensor of the launch that has a gradient or that the kernel may write.
inline bool reaches_active(program_state const& st, tensor_entry const& e, void const* base,
                           std::int64_t bytes) {
  auto const* lo = static_cast<std::byte const*>(base);
  auto const* hi = lo + bytes;
  if (!e.shared_range && lo >= e.lo && hi <= e.hi)
    return false;
  for (tensor_entry const& o : *st.tensors)
    if (&o != &e && (o.writable || o.wants_grad()) && o.lo < hi && lo < o.hi)
      return true;
  return false;
}

/// The entry of the tensor a load reads through a view of `bytes` bytes at `base`, when the load
/// must be recorded (the tensor is one of the launch's and wants a gradient or may be written),
/// or its lanes checked (a read-only tensor without a gradient, whose view reaches another
/// tensor's memory: record_load refuses lanes that read an element of one with a gradient or
/// written, whose gradient or race check would miss them); marks the tensor as read.
inline tensor_entry const* tracked_load(program_state* st, void const* base, std::int64_t bytes) {
  if (!st)
    return nullptr;
  tensor_entry const* e = st->find(base);
  if (!e)
    return nullptr;
  st->out->reads |= std::uint64_t{1} << e->index;
  // Not recording (a checkpointed loop's forward run), a read-only tensor needs nothing.
  if (e->writable || (e->wants_grad() && st->t.recording()))
    return e;
  return !e->wants_grad() && reaches_active(*st, *e, base, bytes) ? e : nullptr;
}

/// Whether a block load from base may leave its values in the tensor instead of copying them to
/// the tape: the memory of a tensor of the launch passed read-only, which no other tensor's range
/// overlaps (so no store of the launch reaches it), outside rounding jitter (whose records key
/// their error estimates by the address of the values).
template <class T>
bool reads_in_place(program_state const* st, void const* base) {
  if (!st || jitter_active<T>())
    return false;
  tensor_entry const* e = st->find(base);
  return e && !e->writable && !e->shared_range && e->bytes == sizeof(T);
}

/// Refuses a lane of an access that is not an element of the tensor its view was made from: a
/// view the kernel made from the tensor's data (`tensor(q.data(), ...)`) reaching past it, into a
/// neighbour in the same buffer or beyond. Its gradient would go to the wrong tensor, or past the
/// end of the tensor's own buffers.
[[noreturn]] TILEGRAD_MACHINERY void lane_outside(program_state const& st, tensor_entry const& e,
                                                  std::int64_t off, char const* what,
                                                  std::source_location const& loc)
#if TILEGRAD_MACHINERY_BODIES
{
  program const* p = detail::current_program();
  std::byte const* const at = e.lo + off * static_cast<std::int64_t>(e.bytes);
  tensor_entry const* other = st.find(at);
  std::string const who = p ? p->describe() : std::string("host code");
  throw access_error(
      "tilegrad::vjp: " + who + " " + what +
      " an address through a view made from the data of tensor " + detail::tensor_label(e.name) +
      " (at " + detail::where_string(loc) + "), element offset " + std::to_string(off) +
      " from its first element, which is not an element of " + detail::tensor_label(e.name) +
      (other && other != &e ? std::string(" (it is one of ") + detail::tensor_label(other->name) +
                                  ")"
                            : std::string(" (it is outside every tensor of the launch)")) +
      ": vjp credits an access to the tensor its view was made from, and this one's gradient "
      "would go astray. Make the view from the tensor that holds the element, or pass the whole "
      "buffer as one tensor and its parts as views made in the kernel.",
      who, detail::tensor_label(e.name), "offset " + std::to_string(off), loc);
}
#else
;
#endif

/// Whether every lane of run r (offsets from e's first element) is an element of e.
inline bool run_inside(tensor_entry const& e, run const& r) {
  std::int64_t const last = r.element(r.count - 1);
  std::int64_t const span = (e.hi - e.lo) / static_cast<std::ptrdiff_t>(e.bytes);
  if (std::min(r.offset, last) < 0 || std::max(r.offset, last) >= span)
    return false;
  if (!e.strided_grad && !e.shared_range) // contiguous: every offset in the span is an element
    return true;
  if (!e.layout.contains(r.offset) || !e.layout.contains(last))
    return false;
  if (r.count <= 2 || r.step == 0)
    return true;
  // A run along one axis from an element to an element holds elements only.
  std::int64_t const s = r.step < 0 ? -r.step : r.step;
  extents const& n = e.layout.shape();
  for (int a = 0; a < e.layout.rank(); ++a)
    if (n[a] > 1 && e.layout.strides()[a] == s) {
      std::int64_t at = 0;
      e.logical_index(r.offset, a, &at);
      std::int64_t const end = at + (r.step < 0 ? 1 - r.count : r.count - 1);
      if (end >= 0 && end < n[a])
        return true;
    }
  for (int k = 1; k + 1 < r.count; ++k)
    if (!e.layout.contains(r.element(k)))
      return false;
  return true;
}

/// Lanes are walked as offsets from the view the kernel accessed (t[b][h], say); the runs of
/// a tensor's accesses are offsets from the tensor's own first element. Every lane must be one
/// of the tensor's elements (lane_outside).
template <class T>
void shift_runs(program_state const& st, std::vector<run>& runs, tensor_entry const& e,
                void const* base, char const* what, std::source_location const& loc) {
  std::int64_t const d = e.shift<T>(base);
  for (run& r : runs) {
    r.offset += d;
    if (!run_inside(e, r)) [[unlikely]]
      for (int k = 0; k < r.count; ++k)
        if (!run_inside(e, run{r.pos + k, 1, r.element(k), 0}))
          lane_outside(st, e, r.element(k), what, loc);
  }
}

/// A load, in an iteration of a checkpointed loop replayed by the sweep, from a tensor this
/// program writes after the loop: which of its stores a lane saw when the loop ran is no longer
/// known (the stamps and the table of own stores moved on).
[[noreturn]] TILEGRAD_MACHINERY void loop_replay_refused(tensor_entry const& e, std::int64_t el,
                                                         std::source_location const& loc)
#if TILEGRAD_MACHINERY_BODIES
{
  program const* p = detail::current_program();
  throw std::invalid_argument(
      "tilegrad::vjp: " + (p ? p->describe() : std::string("host code")) + " loads tensor " +
      detail::tensor_label(e.name) + ", element " + e.layout.coordinates(el) +
      ", inside the body of tg::loop (the load at " + detail::where_string(loc) + ")" +
      " and writes that element after the loop: the reverse sweep runs the body again, and can "
      "no longer tell which of the program's stores the load saw. Write this loop as a plain "
      "for loop. (A loop whose records fit tg::set_loop_record_budget, 8 MiB by default, is "
      "recorded whole and not replayed: the same kernel at a smaller size works.)");
}
#else
;
#endif

/// Refuses a store or an atomic inside the body of a checkpointed loop (reverse mode re-runs
/// the body in its sweep; a write there would be made, and recorded, twice).
[[noreturn]] TILEGRAD_MACHINERY void write_in_loop_refused(char const* what,
                                                           std::source_location const& loc)
#if TILEGRAD_MACHINERY_BODIES
{
  program const* p = detail::current_program();
  throw std::invalid_argument(
      std::string("tilegrad::vjp: ") + what + " by " +
      (p ? p->describe() : std::string("host code")) + " inside the body of tg::loop (the " +
      what + " at " + detail::where_string(loc) + ")" +
      ": in reverse mode a tg::loop body may load but not store (its sweep runs the body "
      "again). Carry the values out of the loop and store them after it, or write the loop as "
      "a plain for loop.");
}
#else
;
#endif

inline void refuse_write_in_loop(program_state const* st, char const* what,
                                 std::source_location const& loc) {
  if (st && st->loop_depth != 0)
    write_in_loop_refused(what, loc);
}

// vjp's hooks on the tensors it does not differentiate (integer tensors: their accesses take
// the plain path, tracked as a launch that checks races tracks them). A store or an atomic inside
// a tg::loop body is refused as on float tensors, and a replayed load of an element the program
// wrote after the loop too: the replay would read the later value (a work list the program
// marks consumed after its loop), where the first run read the earlier one.
inline void plain_write_hook(char const* what, std::source_location const& loc) {
  refuse_write_in_loop(current_state(), what, loc);
}

// Returns whether the load joins the program's log: a replayed one does not (its first run's
// did), so that the log does not grow with the replays.
TILEGRAD_MACHINERY bool plain_load_hook(tilegrad::detail::access_hooks const& h, int t,
                                        std::vector<run> const& lanes,
                                        std::source_location const& loc)
#if TILEGRAD_MACHINERY_BODIES
{
  program_state* st = current_state();
  if (st && st->loop_depth > 0 && h.tracker) { // the values the body reads, for its replays
    auto const& tt = h.tracker->tensor_at(t);
    for (run const& l : lanes)
      for (int k = 0; k < l.count; ++k) {
        std::uint64_t v = 0;
        std::memcpy(&v, tt.lo + tt.elem * static_cast<std::size_t>(l.element(k)),
                    std::min(tt.elem, sizeof v));
        st->load_digest = mix_digest(st->load_digest, v, l.element(k));
      }
  }
  if (!st || !st->replaying || !h.log || !h.tracker)
    return true;
  auto const& log = *h.log;
  for (std::size_t i = st->log_after_loop; i < log.accesses.size(); ++i) {
    auto const& a = log.accesses[i];
    if (a.tensor != t || !(a.op & tilegrad::detail::op_write))
      continue;
    for (std::uint32_t j = a.first; j < a.first + a.count; ++j)
      for (run const& l : lanes)
        for (int k = 0; k < l.count; ++k)
          if (run_holds(log.runs[j], l.element(k))) {
            auto const& tt = h.tracker->tensor_at(t);
            auto const [view, coords] = tt.element(l.element(k));
            program const* p = tilegrad::detail::current_program();
            throw std::invalid_argument(
                "tilegrad::vjp: " + (p ? p->describe() : std::string("host code")) +
                " loads tensor " + tt.label(view) + ", element " + coords +
                ", inside the body of tg::loop (the load at " +
                tilegrad::detail::where_string(loc) + ") and writes that element after the loop " +
                "(at " + tilegrad::detail::where_string(a.loc) + "): the reverse sweep runs the " +
                "body again and would read the new value. Write into another tensor, or write this "
                "loop as a plain for loop.");
          }
  }
  return false;
}
#else
;
#endif

/// Records a load of `size` lanes whose runs are in st.scratch (filled while the values were
/// read). Returns the load's adjoint buffer, or null when no gradient can flow through it.
template <class T>
T* record_load(program_state& st, tensor_entry const& e, void const* base, int size,
               std::source_location const& loc) {
  if (!e.writable && !e.wants_grad()) { // (tracked_load: only its lanes are checked)
    std::int64_t const d = e.shift<T>(base);
    for (run r : st.scratch) {
      r.offset += d;
      if (!run_inside(e, r)) [[unlikely]]
        for (int k = 0; k < r.count; ++k) {
          std::int64_t const el = r.element(k);
          tensor_entry const* o = st.find(e.lo + el * static_cast<std::int64_t>(e.bytes));
          if (o && o != &e && (o->writable || o->wants_grad()))
            lane_outside(st, e, el, "loads", loc);
        }
    }
    return nullptr;
  }
  shift_runs<T>(st, st.scratch, e, base, "loads", loc);
  tape& tp = st.t;
  std::vector<run> const& lanes = st.scratch;
  // The gradient of a tensor that is not contiguous is indexed by coordinates, not by offset.
  auto grad_runs = [&e](std::vector<run> const& r) -> std::vector<run> const& {
    return e.strided_grad ? logical_runs(e, r) : r;
  };
  if (!e.writable) { // an input: every lane reads the tensor's own value
    T* adj = tp.alloc_zero<T>(size);
    std::vector<run> const& g = grad_runs(lanes);
    tp.push<load_record<T>>(adj, e.index, copy_to_tape(tp, g), static_cast<int>(g.size()), nullptr,
                            0);
    return adj;
  }
  // A tensor the kernel may write: lane by lane, a value this program stored or the initial one.
  // Most runs hold neither: no lane this program stored, none an earlier wave wrote.
  thread_local std::vector<run> initial;
  thread_local std::vector<routed_lane<T>> routed;
  routed.clear();
  run_builder init(initial);
  std::uint32_t const mine = st.stamp();
  if (st.replaying && (st.stored_after >> e.index & 1))
    for (run const& r : lanes)
      for (int k = 0; k < r.count; ++k)
        if (st.written_after_loop(e.index, r.element(k)))
          loop_replay_refused(e, r.element(k), loc);
  for (run const& r : lanes) {
    if (!st.replaying) // (a replayed iteration's loads were recorded by its first run)
      st.out->accesses.push_back({access_kind::load, e.index, r, nullptr, loc});
    std::uint32_t* const stamps = e.stamp + r.offset;
    bool plain = true;
    for (int k = 0; k < r.count; ++k) {
      std::uint32_t const s =
          std::atomic_ref<std::uint32_t>(stamps[r.step * k]).load(std::memory_order_relaxed);
      plain &= s != mine && !st.earlier(stamp_program(s));
    }
    if (plain) {
      if (e.wants_grad())
        init.add(r);
      continue;
    }
    for (int k = 0; k < r.count; ++k) {
      std::int64_t const off = r.element(k);
      std::uint32_t const s =
          std::atomic_ref<std::uint32_t>(e.stamp[off]).load(std::memory_order_relaxed);
      if (st.earlier(stamp_program(s)))
        race(e, off, st.id, stamp_program(s), "loads",
             s & atomic_stamp ? "updates it atomically" : "stores it", loc, launch_dims());
      if (s == mine) {
        if (T* slot = st.stored_slot<T>(e.index, off))
          routed.push_back({r.pos + k, slot});
      } else if (e.wants_grad()) {
        init.add(r.pos + k, off);
      }
    }
  }
  init.finish();
  if ((routed.empty() && initial.empty()) || !tp.recording())
    return nullptr;
  T* adj = tp.alloc_zero<T>(size);
  std::vector<run> const& g = grad_runs(initial);
  tp.push<load_record<T>>(adj, e.index, copy_to_tape(tp, g), static_cast<int>(g.size()),
                          copy_to_tape(tp, routed), static_cast<int>(routed.size()));
  return adj;
}

/// The slow path of a write that may race with a program of an earlier wave: finds the
/// element and throws. (Programs of the same wave are checked after it, in program order.)
TILEGRAD_MACHINERY void check_write(program_state const& st, tensor_entry const& e, run const& r,
                                    bool atomic, std::source_location const& loc)
#if TILEGRAD_MACHINERY_BODIES
{
  std::uint32_t const me = st.id;
  for (int k = 0; k < r.count; ++k) {
    std::int64_t const el = r.element(k);
    std::uint32_t const old =
        std::atomic_ref<std::uint32_t>(e.stamp[el]).load(std::memory_order_relaxed);
    if (st.earlier(stamp_program(old))) {
      bool const old_atomic = (old & atomic_stamp) != 0;
      if (atomic && !old_atomic)
        race(e, el, me, stamp_program(old), "atomically updates", "stores it", loc, launch_dims());
      if (!atomic && (old_atomic || stamp_program(old) != me))
        race(e, el, me, stamp_program(old), "stores",
             old_atomic ? "updates it atomically" : "stores it too", loc, launch_dims());
    }
    if (std::uint32_t const rd = other_reader(e, el, atomic ? 0 : me))
      race(e, el, me, rd, atomic ? "atomically updates" : "stores", "loads it", loc, launch_dims());
  }
}
#else
;
#endif

// Stamps are read and written with relaxed atomics: programs of one wave may touch the same
// stamps at once (atomic_add, or a racy kernel, which is reported). Atomics do not vectorise, so
// the loops over a contiguous run are unrolled by hand; with AVX-512 (and no ThreadSanitizer) a
// contiguous run is read and written 16 stamps at a time. C++ has no vector atomics, but on x86
// each aligned 4-byte lane of a vector load or store is one access that no other core sees torn,
// which is all the relaxed atomics promise: a stamp is read as some value it held, in some order.
#if defined(__AVX512F__) && !defined(__SANITIZE_THREAD__)
#define TILEGRAD_VECTOR_STAMPS 1
#endif

inline std::uint32_t or_stamps(std::uint32_t* s, std::int64_t step, int n) {
  auto at = [s](std::int64_t i) {
    return std::atomic_ref<std::uint32_t>(s[i]).load(std::memory_order_relaxed);
  };
  std::uint32_t a = 0, b = 0, c = 0, d = 0;
  int k = 0;
#ifdef TILEGRAD_VECTOR_STAMPS
  if (step == 1 && n >= 16) {
    __m512i lanes = _mm512_setzero_si512();
    for (; k + 16 <= n; k += 16)
      lanes = _mm512_or_si512(lanes, _mm512_loadu_si512(static_cast<void const*>(s + k)));
    a = static_cast<std::uint32_t>(_mm512_reduce_or_epi32(lanes));
  }
#endif
  if (step == 1)
    for (; k + 4 <= n; k += 4) {
      a |= at(k);
      b |= at(k + 1);
      c |= at(k + 2);
      d |= at(k + 3);
    }
  for (; k < n; ++k)
    a |= at(step * k);
  return a | b | c | d;
}

inline void set_stamps(std::uint32_t* s, std::int64_t step, int n, std::uint32_t v) {
  auto set = [s, v](std::int64_t i) {
    std::atomic_ref<std::uint32_t>(s[i]).store(v, std::memory_order_relaxed);
  };
  int k = 0;
#ifdef TILEGRAD_VECTOR_STAMPS
  if (step == 1 && n >= 16) {
    __m512i const lanes = _mm512_set1_epi32(static_cast<int>(v));
    for (; k + 16 <= n; k += 16)
      _mm512_storeu_si512(static_cast<void*>(s + k), lanes);
  }
#endif
  if (step == 1)
    for (; k + 4 <= n; k += 4) {
      set(k);
      set(k + 1);
      set(k + 2);
      set(k + 3);
    }
  for (; k < n; ++k)
    set(step * k);
}

/// Records a store (or an atomic update) of the lanes in st.scratch (runs), whose values'
/// adjoints are `adj` (null: constants), to tensor e, which the kernel may write.
template <class T>
void record_write(program_state& st, tensor_entry const& e, void const* base, access_kind kind,
                  T* adj, std::source_location const& loc) {
  shift_runs<T>(st, st.scratch, e, base, kind == access_kind::atomic ? "updates" : "stores",
                loc);
  auto& acc = st.out->accesses;
  bool const atomic = kind == access_kind::atomic;
  std::uint32_t const mine = st.stamp();
  std::uint32_t const stamp = atomic ? mine | atomic_stamp : mine;
  std::size_t const first = acc.size();
  bool own = false; // a store over this program's own: the last store to an element must be known
  for (run const& r : st.scratch) {
    acc.push_back({kind, e.index, r, adj ? static_cast<void*>(adj + r.pos) : nullptr, loc});
    // A store may overwrite only its own program's stores, an atomic only atomics; the slow
    // path reports a conflict with an earlier wave (the wave's own are checked after it).
    std::uint32_t* const stamps = e.stamp + r.offset;
    std::int64_t const step = r.step;
    int const n = r.count;
    // Usually no element was written before: one pass that only ORs the old stamps.
    std::uint32_t const written = or_stamps(stamps, step, n);
    bool bad = false, mine_seen = false;
    if (written != 0) {
      for (int k = 0; k < n; ++k) {
        std::uint32_t const old =
            std::atomic_ref<std::uint32_t>(stamps[step * k]).load(std::memory_order_relaxed);
        bad |= atomic ? old != 0 && !(old & atomic_stamp) : old != 0 && old != mine;
        mine_seen |= old == mine;
      }
    }
    if (bad || e.readers)
      check_write(st, e, r, atomic, loc);
    own |= !atomic && (mine_seen || step == 0);
    set_stamps(stamps, step, n, stamp);
  }
  if (atomic)
    return;
  if (st.own.active()) {
    for (std::size_t i = first; i < acc.size(); ++i)
      st.own.add(static_cast<std::uint32_t>(i), acc[i]);
  } else if (own) {
    st.own.start(acc);
  }
}

/// The entry of the tensor a write goes to, when the write must be recorded (the tensor is one
/// of the launch's; those the kernel writes all carry stamps).
inline tensor_entry const* tracked_write(program_state* st, void const* base) {
  if (!st)
    return nullptr;
  tensor_entry const* e = st->find(base);
  return e && e->stamp ? e : nullptr;
}

// The lanes of a pointer-tile access (an atomic), listed for record_write.
template <class S, class T, class Off, class Mask>
auto pointer_lanes(ptr_tile<T, Off> const& fp, Mask const& mask) {
  return [&fp, &mask](auto&& vec, auto&& one) {
    constexpr int W = detail::access_width<std::remove_const_t<T>, Mask, detail::no_mask>;
    detail::for_each_access<S, W>(
        fp, mask, [&](int r, int c, std::int64_t e) { one(r * S::inner + c, e); },
        [&](int r, int c, std::int64_t e) { vec(r * S::inner + c, e, W); });
  };
}

// A lane hook that gathers the lanes of an access as runs (when there is a builder).
inline auto gather_lanes(std::optional<run_builder>& lanes) {
  return [&lanes](int pos, std::int64_t off, int n) {
    if (!lanes)
      return;
    if (n == 1)
      lanes->add(pos, off);
    else
      lanes->add(pos, off, n);
  };
}

template <class A, class Off, class Mask, class Other>
auto load_ptr(ptr_tile<A, Off> const& p, Mask const& mask, Other const& other,
              std::source_location const& loc) {
  using T = primal_of_t<A>;
  using S = detail::access_shape_t<Off, Mask>;
  ptr_tile<T const, Off> fp(primal_view(p.base), p.offsets, p.shift);
  program_state* st = current_state();
  tensor_entry const* e =
      tracked_load(st, p.base.data(), p.extent * static_cast<std::int64_t>(sizeof(T)));
  // The values go straight to the tape; the lanes read are gathered as runs on the way.
  T* v = current_tape().alloc<T>(S::size);
  std::optional<run_builder> lanes;
  if (e)
    lanes.emplace(st->scratch);
  auto const lane = gather_lanes(lanes);
  if constexpr (std::is_same_v<Other, detail::no_mask>)
    detail::load_into<S>(v, fp, detail::broadcast_mask<S>(mask), other, loc, true, lane);
  else
    detail::load_into<S>(v, fp, detail::broadcast_mask<S>(mask), to_primal(other), loc, true, lane);
  if (lanes)
    lanes->finish();
  T* a = e ? record_load<T>(*st, *e, p.base.data(), S::size, loc) : nullptr;
  auto loaded = detail::tile_t<adjoint<T>, S>::from_buffers(v, a);
  if constexpr (!std::is_same_v<Other, detail::no_mask>) {
    // A tile given as `other` passes its adjoint to the masked-off lanes, as in forward mode.
    if constexpr (is_active_v<decltype(to_primal(other))>)
      if (any_active(to_primal(other)))
        return detail::tile_t<adjoint<T>, S>(
            where(detail::broadcast_mask<S>(mask), loaded,
                  detail::bcast<S>(detail::convert_as<adjoint<T>>(other))));
  }
  return loaded;
}

/// The values a store writes: the tile's own, or under rounding jitter the values as a reader
/// sees them (moved by their rounding errors), so that a program that reloads what it stored
/// reads them moved, as it reads them moved where it reads the tile (the reload carries no error
/// estimate of its own).
template <class Tile>
auto const* as_stored(Tile const& v) {
  using T = std::remove_cvref_t<decltype(*v.values())>;
  if constexpr (std::is_same_v<T, double>)
    if (jitter_active<T>()) [[unlikely]]
      return jittered(current_tape(), v.values(), Tile::size);
  return static_cast<T const*>(v.values());
}

template <class A, class Off, class Val, class Mask>
void store_ptr(ptr_tile<A, Off> const& p, Val const& val, Mask const& mask,
               std::source_location const& loc) {
  using T = primal_of_t<A>;
  using S = detail::access_shape_t<Off, Mask>;
  refuse_write_in_loop(current_state(), "store", loc);
  detail::tile_t<adjoint<T>, S> const v(detail::bcast<S>(detail::convert_as<adjoint<T>>(val)));
  ptr_tile<T, Off> fp(primal_view(p.base), p.offsets, p.shift);
  program_state* st = current_state();
  tensor_entry const* e = tracked_write(st, p.base.data());
  // The lanes written are gathered as runs as they are written.
  std::optional<run_builder> lanes;
  if (e)
    lanes.emplace(st->scratch);
  detail::store_from<S>(fp, tile_ref<T, S>{{}, as_stored(v)}, detail::broadcast_mask<S>(mask), loc,
                        true, gather_lanes(lanes));
  if (!e)
    return;
  lanes->finish();
  record_write<T>(*st, *e, p.base.data(), access_kind::store, v.adjoints(), loc);
}

/// The old values an atomic returned. Reverse mode does not differentiate them: they hold what
/// other programs added before, in an order no gradient follows (and a program adding alone
/// would need its own additions replayed). Where they reach what the program stores, the
/// gradient would silently lack their share, so the sweep refuses it instead.
template <class T>
struct atomic_old_values_record final : record {
  T const* adj;
  int n;
  char const* what;
  char const* tensor;
  std::source_location loc;
  atomic_old_values_record(T const* a, int size, char const* w, char const* t,
                           std::source_location const& l)
      : adj(a), n(size), what(w), tensor(t), loc(l) {}
  void backward() override {
    for (int i = 0; i < n; ++i)
      if (adj[i] != T(0)) {
        program const* p = detail::current_program();
        throw std::invalid_argument(
            "tilegrad::vjp: " + (p ? p->describe() : std::string("host code")) +
            " uses the old values " + what + " returned (tensor " + detail::tensor_label(tensor) +
            ", at " + detail::where_string(loc) +
            ") in what reaches its outputs: reverse mode takes an atomic's old values as "
            "constants, so this gradient would lack their share. Load the values before the "
            "atomic, or compute what is needed without them.");
      }
  }
};

/// Atomics on a tensor of adjoint<T>: the update is done on the primal values; atomic_add is
/// differentiated (each contribution receives the output cotangent), the others are not and
/// refuse a tensor that has a cotangent. The old values come back without a derivative (using
/// them in what reaches an output is refused by the sweep: atomic_old_values_record).
template <class A, class Off, class Val, class Mask, class F>
auto atomic_ptr(ptr_tile<A, Off> const& p, Val const& val, Mask const& mask, F&& f,
                char const* what, std::source_location const& loc) {
  using T = primal_of_t<A>;
  using S = detail::access_shape_t<Off, Mask>;
  bool const additive = std::string_view(what) == "atomic_add";
  refuse_write_in_loop(current_state(), what, loc);
  if (program_state* st = current_state()) {
    tensor_entry const* e = st->find(p.base.data());
    if (!additive && e && e->has_cotangent())
      throw std::invalid_argument(std::string("tilegrad::vjp: ") + what + " on tensor '" + e->name +
                                  "', which has a cotangent: only atomic_add is differentiated "
                                  "(at " +
                                  detail::where_string(loc) + ")");
  }
  detail::tile_t<adjoint<T>, S> const v(detail::bcast<S>(detail::convert_as<adjoint<T>>(val)));
  ptr_tile<T, Off> fp(primal_view(p.base), p.offsets, p.shift);
  auto const old =
      detail::atomic_impl(fp, tile_ref<T, S>{{}, v.values()}, mask, f, what, loc, nullptr, true);
  if (program_state* st = current_state()) {
    if (tensor_entry const* e = tracked_write(st, p.base.data())) {
      st->out->reads |= std::uint64_t{1} << e->index; // an atomic reads the old value
      auto const maskb = detail::broadcast_mask<S>(mask);
      run_builder b(st->scratch);
      pointer_lanes<S>(fp, maskb)([&](int pos, std::int64_t off, int n) { b.add(pos, off, n); },
                                  [&](int pos, std::int64_t off) { b.add(pos, off); });
      b.finish();
      record_write<T>(*st, *e, p.base.data(), access_kind::atomic,
                      additive ? v.adjoints() : nullptr, loc);
    }
  }
  tape& tp = current_tape();
  T* ov = tp.alloc<T>(S::size);
  std::memcpy(ov, old.data(), sizeof(T) * S::size);
  T* oa = nullptr;
  if (program_state* st = current_state(); st && tp.recording()) {
    tensor_entry const* e = st->find(p.base.data());
    oa = tp.alloc_zero<T>(S::size);
    tp.push<atomic_old_values_record<T>>(oa, S::size, what, e ? e->name : p.base.name(), loc);
  }
  return detail::tile_t<adjoint<T>, S>::from_buffers(ov, oa);
}

template <class A, int... Bs>
auto primal_block(block_ptr<A, Bs...> const& bp) {
  using T = primal_of_t<A>;
  using P = std::conditional_t<std::is_const_v<A>, T const, T>;
  return block_ptr<P, Bs...>(reinterpret_cast<P*>(bp.data()), bp.extent(), bp.name(), bp.shape(),
                             bp.strides(), bp.offsets());
}

template <class A, int... Bs, int... Axes>
auto load_block(block_ptr<A, Bs...> const& bp, boundary_check<Axes...>, padding pad,
                std::source_location const& loc) {
  using T = primal_of_t<A>;
  using S = shape<Bs...>;
  constexpr int L = S::inner;
  auto const fbp = primal_block(bp);
  program_state* st = current_state();
  tensor_entry const* e =
      tracked_load(st, bp.data(), bp.extent() * static_cast<std::int64_t>(sizeof(T)));
  // A block of a read-only tensor that shares its memory with no other, inside it and laid out
  // as the tile is: the tile's values are the tensor's own (nothing writes them while the vjp
  // lasts), one run of lanes.
  if (T const* src = reads_in_place<T>(st, bp.data()) ? detail::dense_block_inside(fbp) : nullptr) {
    T* a = nullptr;
    if (e) {
      {
        run_builder lanes(st->scratch);
        lanes.add(0, src - fbp.data(), S::size);
      }
      a = record_load<T>(*st, *e, bp.data(), S::size, loc);
    }
    return tile<adjoint<T>, Bs...>::from_buffers(const_cast<T*>(src), a);
  }
  // The values go straight to the tape; the lanes read are gathered as runs on the way.
  T* v = current_tape().alloc<T>(S::size);
  std::optional<run_builder> lanes;
  if (e)
    lanes.emplace(st->scratch);
  std::int64_t const sc = fbp.strides()[S::rank - 1];
  detail::load_block_into<boundary_check<Axes...>>(v, fbp, pad, loc, true,
                                                   [&](int r, std::int64_t mem, int lo, int hi) {
                                                     if (!lanes || lo >= hi)
                                                       return;
                                                     if (sc == 1)
                                                       lanes->add(r * L + lo, mem + lo, hi - lo);
                                                     else
                                                       for (int c = lo; c < hi; ++c)
                                                         lanes->add(r * L + c, mem + c * sc);
                                                   });
  if (lanes)
    lanes->finish();
  T* a = e ? record_load<T>(*st, *e, bp.data(), S::size, loc) : nullptr;
  return tile<adjoint<T>, Bs...>::from_buffers(v, a);
}

template <class A, int... Bs, class E, int... Axes>
void store_block(block_ptr<A, Bs...> const& bp, E&& value, boundary_check<Axes...>,
                 std::source_location const& loc) {
  using T = primal_of_t<A>;
  using S = shape<Bs...>;
  refuse_write_in_loop(current_state(), "store", loc);
  tile<adjoint<T>, Bs...> const v(value);
  auto const fbp = primal_block(bp);
  program_state* st = current_state();
  tensor_entry const* e = tracked_write(st, bp.data());
  // The lanes written are gathered as runs as they are written.
  std::optional<run_builder> lanes;
  if (e)
    lanes.emplace(st->scratch);
  std::int64_t const sc = fbp.strides()[S::rank - 1];
  detail::store_block_from<boundary_check<Axes...>>(
      fbp, as_stored(v), loc, true, [&](int r, std::int64_t mem, int lo, int hi) {
        if (!lanes || lo >= hi)
          return;
        if (sc == 1)
          lanes->add(r * S::inner + lo, mem + lo, hi - lo);
        else
          for (int c = lo; c < hi; ++c)
            lanes->add(r * S::inner + c, mem + c * sc);
      });
  if (!e)
    return;
  lanes->finish();
  record_write<T>(*st, *e, bp.data(), access_kind::store, v.adjoints(), loc);
}

} // namespace tilegrad::ad

#if TILEGRAD_SEPARATE_COMPILATION // compiled in tilegrad/separate.hpp
namespace tilegrad::ad {
extern template struct load_record<float>;
extern template struct load_record<double>;
extern template float* record_load<float>(program_state&, tensor_entry const&, void const*, int,
                                          std::source_location const&);
extern template double* record_load<double>(program_state&, tensor_entry const&, void const*, int,
                                            std::source_location const&);
extern template void record_write<float>(program_state&, tensor_entry const&, void const*,
                                         access_kind, float*, std::source_location const&);
extern template void record_write<double>(program_state&, tensor_entry const&, void const*,
                                          access_kind, double*, std::source_location const&);
} // namespace tilegrad::ad
#endif
