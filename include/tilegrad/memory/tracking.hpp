// Access tracking of a launch that checks for races (launch_options::check_races, and every
// launch of a backward under check_backward): each program records its loads, stores and
// atomics to the tensors the kernel may write, as runs of elements; after each wave of programs
// the records are replayed in program order against what earlier programs did to each element.
// The verdict depends only on what each program accessed, never on which program ran first or
// on the thread count: the first conflict in program order is reported, naming both programs,
// the tensor, the element and both source lines. Accesses made holding one lock, and accesses on
// either side of two tickets drawn from one counter, are ordered and do not conflict.
#pragma once

#include "tilegrad/core/config.hpp"
#include "tilegrad/core/hash.hpp"
#include "tilegrad/grid/program.hpp"
#include "tilegrad/memory/checked.hpp"
#include "tilegrad/memory/runs.hpp"
#include "tilegrad/memory/tensor.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <numeric>
#include <optional>
#include <source_location>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace tilegrad::detail {

// What a program did to an element, as flags. Each kind of atomic is kept apart: atomics of one
// kind commute (add with add, max with max, min with min), of two kinds they do not (max then
// add is not add then max), and an exchange (atomic_xchg, atomic_cas: op_atomic) commutes with
// nothing. Only atomic_add's reordering is excused by the determinism check.
inline constexpr std::uint8_t op_load = 1, op_store = 2, op_atomic_add = 4, op_atomic = 8;
inline constexpr std::uint8_t op_atomic_max = 32, op_atomic_min = 64;
inline constexpr std::uint8_t op_atomics =
    op_atomic_add | op_atomic | op_atomic_max | op_atomic_min;
inline constexpr std::uint8_t op_write = op_store | op_atomics;
/// Written on the host by tilegrad::copy (memory/copy.hpp), from another traced element.
inline constexpr std::uint8_t op_copy = 16;
/// With an atomic, in vjp's logs of the tensors it does not differentiate: kept for tg::loop's
/// replay check (a load replayed in the sweep of an element the program updated after the loop),
/// and not a race (integer locks, flags and counters synchronise programs).
inline constexpr std::uint8_t op_unraced = 128;

/// One access of a program to a tracked tensor: its lanes are runs [first, first + count) of
/// the program's log; an atomic_add of float or double values keeps the magnitude of each
/// lane's value, from `values` on (-1: none); `lock`, the program's outermost lock held then
/// (an index into its log's locks; -1: none).
struct logged_access {
  std::uint8_t op;
  int tensor;
  std::uint32_t first, count;
  std::int64_t values;
  std::source_location loc;
  int lock = -1;
  std::uint8_t locks_held = 0; // how many locks the program held (the check counts `lock`)
};

/// A lock a program took: a successful atomic_cas on one element of an integer tensor that
/// changed it from `unlocked`, or an atomic_xchg that changed it (a test-and-set lock); released
/// when the same program writes `unlocked` back with atomic_xchg or atomic_cas. Only a lock
/// released by the program that took it guards what the program did while holding it (a claim
/// flag, a ticket, or a flag set by atomic_xchg and never given back guards nothing).
struct held_lock {
  int tensor;
  std::int64_t element;
  std::int64_t unlocked;
  bool released;
  std::int64_t held; ///< the value the program wrote to take it
  bool by_xchg = false; ///< taken by atomic_xchg: a lock only if given back
  /// The program's accesses [taken_at, free_at) were made holding it (indices into its log).
  std::uint32_t taken_at = 0, free_at = std::numeric_limits<std::uint32_t>::max();
};

/// A lock programs of a launch took and gave back (launch_tracker, "Locks found held"): its
/// key (launch_tracker::lock_key), and the value that the first program to take it wrote
/// (`program`: its linear id + 1), and `other`, one that another program wrote (a lock whose
/// value names its holder); `unlocked`, what the element holds while nobody holds the lock (the
/// compare value of a taking).
struct known_lock_site {
  std::uint64_t key;
  std::int64_t held;
  std::uint32_t program;
  std::int64_t other;
  bool has_other;
  std::int64_t unlocked;
};

/// A ticket a program drew: an atomic_add of a positive value `add` to one element of an integer
/// tensor (a counter), which returned `old`; `access` is that atomic's index in the program's log.
/// Under acq_rel atomics what a program did before drawing its ticket comes before what a program
/// does after drawing a later one (CUDA's threadFenceReduction: the program that draws the last
/// ticket reduces what the others stored).
struct drawn_ticket {
  int tensor;
  std::int64_t element, old, add;
  std::uint32_t access;
  std::source_location loc;
};

/// A try at a lock that check_backward's probe of locks made fail (launch_tracker, "Locks found
/// held"): an atomic_cas or atomic_xchg on one element of an integer tensor that an earlier run
/// of the same backward saw used as a lock.
struct lock_probe {
  int tensor = -1; ///< -1: none made to fail
  std::int64_t element = 0;
  std::source_location loc;
  bool xchg = false; ///< the try was an atomic_xchg (else an atomic_cas)
};

/// Thrown by every access of a launch whose probe of locks stopped (a program went on too long
/// after a try made to fail without trying again: it waits for something the probe cannot give).
struct lock_probe_stopped : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The accesses of one program, in program order; reused from wave to wave.
struct program_log {
  std::vector<logged_access> accesses;
  std::vector<run> runs, scratch;
  std::vector<float> values;
  std::vector<held_lock> locks;
  std::vector<int> open; // the locks held now, outermost first
  std::vector<drawn_ticket> tickets;
  // The probe of locks: per known lock the program is trying to take, its tries made to fail so
  // far (lock_key, count), and the length of the log at the last of them while it has not taken
  // the lock since (npos: none pending).
  std::vector<std::pair<std::uint64_t, int>> tried;
  std::size_t waiting_since = static_cast<std::size_t>(-1);
  // Accesses not logged because they repeat one of the last two logged (a spin: access_recorder).
  std::size_t repeats = 0;
  lock_probe failed;         // the first try made to fail
  lock_probe pending;        // the last, while waiting_since is set
  std::uint32_t program = 0; // the program's linear id + 1
  void clear() {
    accesses.clear();
    runs.clear();
    values.clear();
    locks.clear();
    open.clear();
    tickets.clear();
    tried.clear();
    waiting_since = static_cast<std::size_t>(-1);
    repeats = 0;
    failed = {};
  }
  /// The accesses the program made so far, repeats included.
  std::size_t made() const { return accesses.size() + repeats; }
  /// Whether the probe makes this try at the lock of `key` fail: the first `fails` tries of each
  /// taking of it do.
  bool fail_try(std::uint64_t key, int fails) {
    auto it =
        std::find_if(tried.begin(), tried.end(), [&](auto const& t) { return t.first == key; });
    if (it == tried.end())
      it = tried.insert(tried.end(), {key, 0});
    if (it->second >= fails) {
      // A try the probe leaves alone: the program tries again, for real. (Its tries at a lock
      // another program really holds, on a thread that is not running, counted as accesses made
      // without trying again, and the probe stopped on a spin lock that waits as it should.)
      waiting_since = static_cast<std::size_t>(-1);
      return false;
    }
    ++it->second;
    waiting_since = made();
    return true;
  }
  /// The program took the lock of `key`: its next taking is probed anew.
  void took(std::uint64_t key) {
    std::erase_if(tried, [&](auto const& t) { return t.first == key; });
    waiting_since = static_cast<std::size_t>(-1);
  }
  /// The lock the next access is made under (-1: none).
  int holding() const { return open.empty() ? -1 : open.front(); }
  /// Whether an atomic_xchg took one of the program's locks: what it held at each access is then
  /// known only at its end (settled_locks).
  bool xchg_locks() const {
    return std::any_of(locks.begin(), locks.end(), [](held_lock const& l) { return l.by_xchg; });
  }
  /// The lock each access was made under, and how many it held, once the program has ended: an
  /// exchange that took an element by atomic_xchg is a lock only if the program gave it back (a
  /// flag set to 1 before a lock is taken looks like a taking, and must not hide the lock). Of
  /// the locks held at an access, the outermost taken by atomic_cas, else the outermost taken by
  /// atomic_xchg and given back.
  void settled_locks(std::vector<std::pair<int, std::uint8_t>>& out) const {
    out.assign(accesses.size(), {-1, 0});
    // (A taking by atomic_xchg moves to the spin's last exchange: by taken_at, not by index.)
    std::vector<int> order(locks.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return locks[static_cast<std::size_t>(a)].taken_at <
             locks[static_cast<std::size_t>(b)].taken_at;
    });
    std::vector<int> active; // in taking order
    std::size_t next = 0;
    for (std::size_t j = 0; j < accesses.size(); ++j) {
      for (; next < order.size() && locks[static_cast<std::size_t>(order[next])].taken_at <= j;
           ++next)
        if (held_lock const& l = locks[static_cast<std::size_t>(order[next])];
            !l.by_xchg || l.released)
          active.push_back(order[next]);
      std::erase_if(active, [&](int i) { return locks[static_cast<std::size_t>(i)].free_at <= j; });
      auto const cas = std::find_if(active.begin(), active.end(), [&](int i) {
        return !locks[static_cast<std::size_t>(i)].by_xchg;
      });
      auto const n = cas != active.end()
                         ? std::count_if(active.begin(), active.end(),
                                         [&](int i) { return !locks[std::size_t(i)].by_xchg; })
                         : static_cast<std::ptrdiff_t>(active.size());
      out[j] = {cas != active.end() ? *cas
                : active.empty()    ? -1
                                    : active.front(),
                static_cast<std::uint8_t>(std::min<std::ptrdiff_t>(n, 255))};
    }
  }
  /// An atomic_xchg (cmp_on false) or atomic_cas of one element of an integer tensor, which
  /// held `old` and was given `v` (by atomic_cas only where old == cmp): takes or releases a
  /// lock.
  void lock_event(int tensor, std::int64_t el, std::int64_t old, std::int64_t v, bool is_cas,
                  std::int64_t cmp) {
    bool const wrote = !is_cas || old == cmp;
    for (std::size_t i = open.size(); i-- > 0;) {
      held_lock& l = locks[static_cast<std::size_t>(open[i])];
      if (l.tensor != tensor || l.element != el)
        continue;
      if (wrote && v == l.unlocked) {
        l.released = true;
        l.free_at = static_cast<std::uint32_t>(accesses.size());
        open.erase(open.begin() + static_cast<std::ptrdiff_t>(i));
      } else if (l.by_xchg && !is_cas && old != v) {
        // A spin on atomic_xchg(lock, id) that found another holder's id took nothing: the last
        // exchange before the element is given back is the taking (it found the free value).
        l.unlocked = old;
        l.held = v;
        l.taken_at = static_cast<std::uint32_t>(accesses.size());
      }
      return;
    }
    if (is_cas ? old == cmp && v != cmp : old != v) {
      open.push_back(static_cast<int>(locks.size()));
      locks.push_back(
          {tensor, el, old, false, v, !is_cas, static_cast<std::uint32_t>(accesses.size())});
    }
  }
};

/// Moves a stored bf16 value by one unit in the last place, its magnitude up or down as bit 0 of
/// `h` says; zeros, infinities, NaNs and the largest finite values stay.
inline void move_bf16_ulp(std::uint16_t& bits, std::uint64_t h) {
  std::uint16_t const mag = bits & 0x7fffu;
  if (mag == 0 || mag >= 0x7f7fu)
    return;
  bits = static_cast<std::uint16_t>(h & 1u ? bits + 1u : bits - 1u);
}

/// Zeroed blocks kept for reuse by the thread that checks launches: fresh memory costs a page
/// fault per 4 KiB touched, on every launch (measured: a third of the time of a tracked
/// FlashAttention backward), while a block handed back is cleared only where it was used.
class zeroed_pool {
public:
  ~zeroed_pool() {
    for (auto const& b : blocks_)
      std::free(b.p);
  }
  /// A zeroed block of at least `bytes` bytes; its size in `got`.
  void* take(std::size_t bytes, std::size_t& got) {
    std::size_t best = blocks_.size();
    for (std::size_t i = 0; i < blocks_.size(); ++i)
      if (blocks_[i].bytes >= bytes &&
          (best == blocks_.size() || blocks_[i].bytes < blocks_[best].bytes))
        best = i;
    if (best != blocks_.size()) {
      block const b = blocks_[best];
      blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(best));
      got = b.bytes;
      return b.p;
    }
    void* p = std::calloc(bytes, 1);
    if (!p)
      throw std::bad_alloc();
    got = bytes;
    return p;
  }
  /// Takes back a block whose bytes [lo, hi) may be nonzero.
  void give(void* p, std::size_t bytes, std::size_t lo, std::size_t hi) {
    if (blocks_.size() >= max_blocks) {
      std::free(p);
      return;
    }
    if (hi > lo)
      std::memset(static_cast<unsigned char*>(p) + lo, 0, hi - lo);
    blocks_.push_back({p, bytes});
  }
  static zeroed_pool& of_thread() {
    thread_local zeroed_pool pool;
    return pool;
  }

private:
  static constexpr std::size_t max_blocks = 16;
  struct block {
    void* p;
    std::size_t bytes;
  };
  std::vector<block> blocks_;
};

/// n zeroed values of a trivial type, from the thread's pool; `touch` marks the elements that
/// may be written, so that only those are cleared when the array goes back.
template <class U>
class zeroed_array {
public:
  zeroed_array() = default;
  explicit zeroed_array(std::size_t n) {
    if (n == 0)
      return;
    p_ = static_cast<U*>(zeroed_pool::of_thread().take(n * sizeof(U), bytes_));
  }
  zeroed_array(zeroed_array&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), bytes_(o.bytes_), lo_(o.lo_), hi_(o.hi_) {}
  zeroed_array& operator=(zeroed_array&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    std::swap(lo_, o.lo_);
    std::swap(hi_, o.hi_);
    return *this;
  }
  ~zeroed_array() {
    if (p_)
      zeroed_pool::of_thread().give(p_, bytes_, lo_ * sizeof(U), hi_ * sizeof(U));
  }
  U* get() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }
  void touch(std::int64_t lo, std::int64_t hi) { // elements [lo, hi)
    if (hi_ <= lo_) {
      lo_ = static_cast<std::size_t>(lo);
      hi_ = static_cast<std::size_t>(hi);
    } else {
      lo_ = std::min(lo_, static_cast<std::size_t>(lo));
      hi_ = std::max(hi_, static_cast<std::size_t>(hi));
    }
  }

private:
  U* p_ = nullptr;
  std::size_t bytes_ = 0, lo_ = 0, hi_ = 0;
};

/// What earlier programs (in program order) did to one element. Without a conflict so far an
/// element holds loads by any programs, atomics by any programs, or anything by one program, so
/// the first two programs that touched it always name one that differs from the next: each
/// with the source line (a site, 1-based; 0 past 65535 sites) of its weightiest access (store,
/// atomic, load), and the lock every access so far was made under (1 + its index among the
/// launch's locks; 0: none, or not one lock for all). 16 bytes, no padding: a run of elements in
/// one state is compared whole.
struct element_state {
  std::uint32_t first, second; // linear program id + 1; 0: none
  std::uint16_t first_site, second_site;
  std::uint16_t lock_lo; // the lock, in 24 bits (lock())
  std::uint8_t ops;
  std::uint8_t lock_hi;
  std::uint32_t lock() const { return std::uint32_t{lock_hi} << 16 | lock_lo; }
  void set_lock(std::uint32_t l) {
    lock_lo = static_cast<std::uint16_t>(l);
    lock_hi = static_cast<std::uint8_t>(l >> 16);
  }
};
static_assert(sizeof(element_state) == 16);

/// Where accesses stand among the tickets of a launch. For one access: the latest ticket its
/// program drew before it (or with it) and the earliest it drew after it (or with it), from one
/// counter; the program and its site. For the accesses of one kind to an element (loads, stores,
/// atomics): the smallest of the first, the largest of the second, and the program and site of an
/// access with the largest second. Zeros say "none": `acq` holds the ticket + 1, `rel`
/// 0xffffffff - the ticket (a ticket after it: none, later than any), `program` 0: not known.
/// 16 bytes, no padding.
struct ticket_order {
  std::uint32_t acq, rel;
  std::uint32_t program; // linear program id + 1
  std::uint16_t site;
  std::uint16_t counter; // 1 + its index among the launch's counters, | many
  static constexpr std::uint16_t many = 0x8000; // from more than one program

  std::int64_t acquired() const { return std::int64_t{acq} - 1; }
  std::int64_t released() const { return std::int64_t{0xffffffffu} - rel; }
  std::uint16_t which() const { return counter & static_cast<std::uint16_t>(~many); }
  /// Whether this access comes after every access summarised in s: its program drew a ticket
  /// before it no earlier than any drawn after them (equal only for the program that drew it, in
  /// its own order).
  bool after(ticket_order const& s) const {
    return acq && s.rel && which() == s.which() && acquired() >= s.released();
  }
  /// Whether it comes before every access summarised in s.
  bool before(ticket_order const& s) const {
    return rel && s.acq && which() == s.which() && released() <= s.acquired();
  }
  /// Adds access b to the summary (which holds at least one access).
  void merge(ticket_order const& b) {
    bool const same = which() == b.which();
    bool const later = !b.rel || (rel && b.rel < rel); // b's ticket after it is later
    std::uint16_t const m = (counter & many) || b.program != program ? many : 0;
    acq = same && acq && b.acq ? std::min(acq, b.acq) : 0;
    rel = same && rel && b.rel ? std::min(rel, b.rel) : 0;
    if (later)
      program = b.program, site = b.site;
    counter = static_cast<std::uint16_t>(which() | m);
  }
};
static_assert(sizeof(ticket_order) == 16);

/// The tickets around an element's loads, stores and atomics.
struct ticket_orders {
  ticket_order load, store, atomic;
};

/// The atomic_add contributions to one element: how many, and the sum of their magnitudes.
struct add_sum {
  float abs;
  std::uint32_t n;
};

/// A view of a tracked tensor's memory, for naming its elements: its data() is `shift` elements
/// past the memory's first.
struct tracked_view {
  char const* name = "";
  tensor<std::byte const> layout; // shape and strides
  std::int64_t shift = 0;
  int arg = 0; // its place among the kernel's arguments after the program (1-based; 0: unknown)
};

/// A tensor the kernel of a tracked launch may write (it takes it as a non-const view). Writable
/// views whose memory overlaps (a packed buffer passed as several views, a view and a slice of
/// it) are one tracked tensor: their elements are tracked by address, and named through the
/// view that holds them.
struct tracked_tensor {
  std::byte const* lo = nullptr; // its memory: lo + elem * [0, span)
  std::byte const* hi = nullptr;
  std::size_t elem = 0;
  std::int64_t span = 0;
  bool bf16 = false;                 // of bf16 elements (a view of any of its views)
  bool jitter = false;               // bf16 stores to it are moved (access_hooks::bf16_jitter)
  char const* name = "";             // the first view's
  std::vector<tracked_view> views;   // every view, the first first
  zeroed_array<element_state> state; // allocated when the check first meets it
  zeroed_array<add_sum> sums;        // allocated at its first atomic_add
  zeroed_array<ticket_orders> order; // allocated when the launch's programs draw tickets

  /// The view holding element el (from lo; null: none) and its coordinates there.
  std::pair<tracked_view const*, std::string> element(std::int64_t el) const {
    for (auto const& v : views)
      if (v.layout.contains(el - v.shift))
        return {&v, v.layout.coordinates(el - v.shift)};
    if (views.empty())
      return {nullptr, std::to_string(el)};
    return {&views[0], views[0].layout.coordinates(el - views[0].shift)};
  }
  /// How messages name the view holding element el: 'name', or its place among the kernel's
  /// arguments when it has no name.
  std::string label(tracked_view const* v) const {
    char const* const n = v ? v->name : name;
    if ((n && *n) || !v || v->arg == 0)
      return tensor_label(n);
    return "(unnamed: the kernel's argument " + std::to_string(v->arg) + " after the program)";
  }
};

/// A race the check found: the message and its parts.
struct race_found {
  std::string message, program, other, tensor, element;
  std::source_location where;
  void const* address = nullptr; // of the element
  bool unnamed = false;          // the tensor has no name: messages name it by its argument
  race_error error() const { return race_error(message, program, other, tensor, element, where); }
};

/// The tensors of one launch that checks for races, and what the programs checked so far did to
/// their elements.
class launch_tracker {
public:
  /// `who` begins its race messages ("tilegrad::vjp" for the integer tensors of a vjp).
  explicit launch_tracker(grid g, char const* who = "tilegrad::launch") : g_(g), who_(who) {}
  launch_tracker(launch_tracker const&) = delete;
  launch_tracker& operator=(launch_tracker const&) = delete;

  /// Tracks an argument of the launch if it is a tensor the kernel may write; `arg` is its
  /// place among the kernel's arguments after the program (1-based; 0: unknown).
  template <class A>
  void add_arg(A const& a, int arg = 0) {
    if constexpr (is_view<std::remove_cvref_t<A>>::value) {
      if (a.numel() > 0)
        spans_.push_back({reinterpret_cast<std::byte const*>(a.data()),
                          reinterpret_cast<std::byte const*>(a.data() + a.span())});
      if constexpr (!std::is_const_v<typename std::remove_cvref_t<A>::element_type>)
        if (a.numel() > 0)
          add(a, arg);
    }
  }
  /// The memory of every tensor the launch takes, const or not: [lo, hi) byte ranges.
  std::vector<std::pair<std::byte const*, std::byte const*>> const& spans() const {
    return spans_;
  }

  /// The tracked tensor whose memory meets that of a view the kernel accesses, [base, base +
  /// extent elements) of `elem` bytes (extent < 0: unknown, base alone), at whole elements from
  /// its start; -1 if none. (A const view of memory a writable one also covers is read there.)
  int find(void const* base, std::size_t elem, std::int64_t extent = -1) const {
    auto const* b = static_cast<std::byte const*>(base);
    auto const* e = extent < 0 ? b + 1 : b + extent * static_cast<std::int64_t>(elem);
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      auto const& t = tensors_[i];
      if (b < t.hi && e > t.lo && t.elem == elem &&
          (b - t.lo) % static_cast<std::ptrdiff_t>(elem) == 0)
        return static_cast<int>(i);
    }
    return -1;
  }
  tracked_tensor const& tensor_at(int i) const { return tensors_[static_cast<std::size_t>(i)]; }
  /// A tensor whose memory the `extent` elements of `elem` bytes from base overlap, though find
  /// does not take them as its elements (another element size, or not at whole elements); -1:
  /// none.
  int find_foreign(void const* base, std::size_t elem, std::int64_t extent) const {
    auto const* b = static_cast<std::byte const*>(base);
    auto const* e = b + std::max<std::int64_t>(extent, 1) * static_cast<std::int64_t>(elem);
    for (std::size_t i = 0; i < tensors_.size(); ++i)
      if (b < tensors_[i].hi && e > tensors_[i].lo)
        return static_cast<int>(i);
    return -1;
  }
  /// Two writable tensors of the launch that share memory with elements of different sizes (or
  /// not at whole elements), as messages name them; empty: none.
  std::string const& unmergeable() const { return unmergeable_; }
  std::vector<tracked_tensor>& tensors() { return tensors_; }
  bool empty() const { return tensors_.empty(); }

  /// Replays the logs of programs first, first + 1, ..., first + n - 1 in program order; stops
  /// at the first conflict (race()).
  void check(std::int64_t first, program_log const* logs, std::int64_t n) {
    count_tickets(static_cast<std::uint32_t>(first + 1), logs, n);
    for (std::int64_t i = 0; i < n && !race_; ++i)
      check_program(static_cast<std::uint32_t>(first + i + 1), logs[i]);
  }
  std::optional<race_found> const& race() const { return race_; }
  /// A tensor a program wrote holding a lock, as messages name it (empty: none).
  std::string const& locked_writes() const { return locked_; }

  // ---- Locks found held
  // A spin lock that does not wait (atomic_cas's result ignored, a loop whose condition is the
  // wrong way round) holds the lock whenever no other program does, and only contention shows
  // the bug, which a check cannot wait for: programs that share a lock may never run at once.
  // So in check_backward's probe run (launch_observer::probe_locks), the first probe_failures
  // tries of each taking of an element that an earlier run of the same backward
  // (launch_observer::known_locks) took and gave back find it held: the try
  // returns what another program wrote to take it, and writes nothing, as while another program
  // holds the lock. A spin lock tries until it gets it; one that does not wait goes on without
  // the lock, and its accesses race. A program that goes on probe_patience accesses after such a
  // try without trying again stops the probe (probe_watch).

  /// Key of the element `el` of tracked tensor `tensor`, as a lock.
  static std::uint64_t lock_key(int tensor, std::int64_t el) {
    return (static_cast<std::uint64_t>(tensor) << 48) ^ static_cast<std::uint64_t>(el);
  }
  /// The tries at a lock of one taking that the probe makes fail.
  static constexpr int probe_failures = 256;
  /// The accesses a program may make after a try made to fail without trying again (a try-lock's
  /// other path, or a wait for something the probe cannot give) before the probe stops.
  static constexpr std::size_t probe_patience = std::size_t{1} << 16;
  /// Turns the probe of locks on for this launch (check_backward's probe run): `stopped` receives
  /// why it stopped, if it does.
  void probe_locks(std::string* stopped) { probe_ = stopped; }
  /// Checks plain loads and stores of integer elements against atomic_xchg and atomic_cas of
  /// them by other programs (a launch that checks races; vjp leaves its integer atomics alone).
  void check_exchanges(bool on) { exchanges_ = on; }
  bool probing() const { return probe_ != nullptr; }
  /// Whether the probe stopped (every access of the launch then throws lock_probe_stopped).
  bool probe_stopped() const { return stopped_.load(std::memory_order_relaxed); }
  /// Before each access of a probed launch: throws lock_probe_stopped once the probe stopped, and
  /// stops it when the program has gone on too long after a try made to fail.
  void probe_watch(program_log const& log) {
    if (probe_stopped())
      throw lock_probe_stopped("tilegrad: the probe of locks stopped");
    if (log.waiting_since != static_cast<std::size_t>(-1) &&
        log.made() - log.waiting_since > probe_patience)
      stop_probe(describe(log.program) + " made " + std::to_string(probe_patience) +
                 " accesses after its try at the lock at " + probe_site(log.pending) +
                 " was made to find it held, without trying it again: a wait for something the "
                 "probe cannot give (a number that the holder changes as it gives the lock "
                 "back), or another path for a lock found held that long");
  }
  /// The lock of a try made to fail and where it was tried, as messages name them.
  TILEGRAD_MACHINERY_MEMBER std::string probe_site(lock_probe const& f) const
#if TILEGRAD_MACHINERY_BODIES
  {
    tracked_tensor const& t = tensors_[static_cast<std::size_t>(f.tensor)];
    auto const [view, coordinates] = t.element(f.element);
    return t.label(view) + ", element " + coordinates + " (" + where_string(f.loc) + ")";
  }
#else
      ;
#endif
  /// Stops the probe, for `why`, and throws lock_probe_stopped.
  [[noreturn]] void stop_probe(std::string const& why) {
    {
      std::lock_guard<std::mutex> const lock(stop_m_);
      if (!stopped_.exchange(true) && probe_->empty())
        *probe_ = why;
    }
    throw lock_probe_stopped("tilegrad: the probe of locks stopped: " + why);
  }

  /// Where programs took the element of `key` and gave it back (in the waves checked so far, or
  /// in an earlier run: know_locks), what program `me` (linear id + 1) finds it holding when it
  /// tries atomic_cas(*cmp, v) on it (atomic_xchg(v) where cmp is null): what another program
  /// wrote to take it, or else `v`, what `me` would write; null where they did not, or where the
  /// try is no taking (its compare value is not the lock's free value, or the exchange writes the
  /// free value: a release must go through, or the lock stays held for ever). (Read by the
  /// programs of a wave; written between waves only.)
  std::optional<std::int64_t> held_value(std::uint64_t key, std::uint32_t me,
                                         std::int64_t const* cmp, std::int64_t v) const {
    auto const it = locks_.find(key);
    if (it == locks_.end() ||
        (cmp ? *cmp != it->second.site.unlocked : v == it->second.site.unlocked))
      return std::nullopt;
    known_lock_site const& s = it->second.site;
    return s.program != me ? s.held : s.has_other ? s.other : v;
  }
  /// Locks an earlier run of the same launch saw (lock_sites()).
  void know_locks(std::vector<known_lock_site> const& sites) {
    for (known_lock_site const& s : sites)
      if (locks_.size() < max_locks)
        locks_.try_emplace(s.key, known_lock{static_cast<std::uint32_t>(locks_.size() + 1), s});
  }
  /// Every lock the launch knows, by key.
  std::vector<known_lock_site> lock_sites() const {
    std::vector<known_lock_site> sites;
    sites.reserve(locks_.size());
    for (auto const& kv : locks_)
      sites.push_back(kv.second.site);
    std::sort(sites.begin(), sites.end(),
              [](known_lock_site const& a, known_lock_site const& b) { return a.key < b.key; });
    return sites;
  }

private:
  template <class X>
  struct is_view : std::false_type {};
  template <class E>
  struct is_view<tensor<E>> : std::true_type {};

  template <class E>
  void add(tensor<E> const& t, int arg) {
    // What a small integer tensor holds before the programs run: a counter's first ticket.
    if constexpr (std::is_integral_v<E>)
      if (t.span() <= max_saved_counters) {
        saved_ints s{reinterpret_cast<std::byte const*>(t.data()), sizeof(E), {}};
        s.values.assign(t.data(), t.data() + t.span());
        saved_.push_back(std::move(s));
      }
    add_layout(tensor<std::byte const>(reinterpret_cast<std::byte const*>(t.data()), t.rank(),
                                       t.shape(), t.strides(), t.name()),
               sizeof(E), std::is_same_v<std::remove_const_t<E>, tilegrad::bf16>, arg);
  }
  /// Tracks the tensor of layout t (its data the tensor's), of elements of `elem` bytes.
  TILEGRAD_MACHINERY_MEMBER void add_layout(tensor<std::byte const> const& t, std::size_t elem,
                                            bool bf16, int arg)
#if TILEGRAD_MACHINERY_BODIES
  {
    tracked_tensor e;
    e.span = t.span();
    e.elem = elem;
    e.bf16 = bf16;
    e.lo = t.data();
    e.hi = e.lo + e.span * static_cast<std::int64_t>(elem);
    e.name = t.name();
    e.views.push_back({t.name(), t, 0, arg});
    // Merge with every tracked tensor whose memory overlaps at whole elements.
    auto const step = static_cast<std::ptrdiff_t>(elem);
    for (std::size_t i = 0; i < tensors_.size();) {
      tracked_tensor& o = tensors_[i];
      bool const overlap = o.lo < e.hi && e.lo < o.hi;
      if (overlap && (o.elem != elem || (o.lo - e.lo) % step != 0) && unmergeable_.empty())
        // (Elements of another size, or not at whole elements: the check follows elements, and
        // a conflict between such views would pass unseen.)
        unmergeable_ = "tensors " + tensor_label(o.name) + " (" + std::to_string(o.elem) +
                       "-byte elements) and " + tensor_label(e.name) + " (" +
                       std::to_string(elem) + "-byte elements" +
                       (o.elem == elem ? ", not at whole elements of the other" : "") +
                       ") share memory";
      if (o.elem != elem || !overlap || (o.lo - e.lo) % step != 0) {
        ++i;
        continue;
      }
      std::byte const* const lo = std::min(o.lo, e.lo);
      for (auto& v : e.views) v.shift += (e.lo - lo) / step;
      for (auto& v : o.views) v.shift += (o.lo - lo) / step;
      o.views.insert(o.views.end(), e.views.begin(), e.views.end());
      e.views = std::move(o.views);
      e.name = o.name;
      e.bf16 = e.bf16 || o.bf16;
      e.hi = std::max(o.hi, e.hi);
      e.lo = lo;
      e.span = (e.hi - e.lo) / step;
      tensors_.erase(tensors_.begin() + static_cast<std::ptrdiff_t>(i));
      i = 0; // the union may meet one passed over
    }
    tensors_.push_back(std::move(e));
  }
#else
  ;
#endif

  std::uint16_t site(std::source_location const& loc) {
    for (std::size_t i = 0; i < sites_.size(); ++i)
      if (sites_[i].line() == loc.line() && sites_[i].column() == loc.column() &&
          (sites_[i].file_name() == loc.file_name() ||
           std::string_view(sites_[i].file_name()) == loc.file_name()))
        return static_cast<std::uint16_t>(i + 1);
    if (sites_.size() >= 0xffff)
      return 0;
    sites_.push_back(loc);
    return static_cast<std::uint16_t>(sites_.size());
  }

  /// The launch's id of lock `i` of the log of program `me` (1-based; 0: none, a lock the
  /// program did not give back, or past 2^24 - 1 locks).
  std::uint32_t lock_id(program_log const& log, int i, std::uint32_t me) {
    if (i < 0)
      return 0;
    held_lock const& l = log.locks[static_cast<std::size_t>(i)];
    if (!l.released)
      return 0;
    auto const key = lock_key(l.tensor, l.element);
    auto const [it, added] =
        locks_.try_emplace(key, known_lock{static_cast<std::uint32_t>(locks_.size() + 1),
                                           known_lock_site{key, l.held, me, 0, false, l.unlocked}});
    if (added && locks_.size() > max_locks) {
      locks_.erase(it);
      return 0;
    }
    known_lock_site& site = it->second.site;
    if (!added && !site.has_other && site.program != me && site.held != l.held)
      site.other = l.held, site.has_other = true;
    return it->second.id;
  }

  static int weight(std::uint8_t ops) {
    return ops & op_store ? 3 : ops & (op_atomics | op_unraced) ? 2 : ops & op_load ? 1 : 0;
  }
  /// What a race message adds where a plain load or store meets an atomic exchange.
  static char const* exchange_note() {
    return " A plain load or store of an integer element that programs exchange atomically (a "
           "flag, a count) is a race unless both accesses hold one lock: read it with an "
           "atomic, or under the lock.";
  }

  std::string describe(std::uint32_t id) const {
    std::int64_t const lin = static_cast<std::int64_t>(id) - 1;
    auto const& d = g_.dims;
    return program({static_cast<int>(lin % d[0]), static_cast<int>((lin / d[0]) % d[1]),
                    static_cast<int>(lin / (std::int64_t{d[0]} * d[1]))},
                   d)
        .describe();
  }

  TILEGRAD_MACHINERY_MEMBER void
  report(tracked_tensor const& t, std::int64_t el, std::uint32_t me, std::source_location const& at,
         char const* mine, std::uint32_t other, std::uint16_t site_other, char const* theirs,
         std::string const& note)
#if TILEGRAD_MACHINERY_BODIES
  {
    race_found r;
    r.program = describe(me);
    r.other = describe(other);
    auto [view, coordinates] = t.element(el);
    r.tensor = view ? view->name : t.name;
    r.element = std::move(coordinates);
    r.where = at;
    r.address = t.lo + el * static_cast<std::int64_t>(t.elem);
    r.unnamed = r.tensor.empty();
    // Overlapping writable views are tracked as one memory: the other access may have gone
    // through another of them, so the message names the element in each view that holds it.
    std::string also;
    for (auto const& v : t.views)
      if (&v != view && v.layout.contains(el - v.shift))
        also += (also.empty() ? "" : ", ") + std::string("element ") +
                v.layout.coordinates(el - v.shift) + " of " + t.label(&v);
    if (!also.empty())
      also = " (the same memory as " + also + ")";
    r.message = std::string(who_) + ": race on tensor " + t.label(view) + ", element " + r.element +
                also + ": " + r.program + " " + mine + " it at " + where_string(at) + ", and " +
                r.other + " " + theirs +
                (site_other ? " at " + where_string(sites_[site_other - 1u]) : std::string()) +
                ". Within one launch each element is written by one program (or only "
                "accumulated with atomics), and no program reads what another writes, unless "
                "both hold one lock (taken by atomic_cas or atomic_xchg on an integer tensor and "
                "given back by the same program with atomic_xchg or atomic_cas)." +
                note + failed_try(me) + (other != me ? failed_try(other) : std::string());
    race_ = std::move(r);
  }
#else
  ;
#endif

  /// What makes `op` by one program conflict with `ops` done by another (null: nothing). Order
  /// matters wherever a store meets anything, loads meet atomics, or atomics of two kinds (or an
  /// exchange) meet; atomics of one kind commute.
  static char const* conflict(std::uint8_t ops, std::uint8_t op) {
    if ((ops & op_unraced) && (op == op_load || op == op_store))
      return "exchanges it atomically (atomic_xchg or atomic_cas)";
    if (ops & op_store)
      return op == op_store ? "stores it too" : "stores it";
    if (ops & op_atomics) {
      if (!(op & op_atomics))
        return "updates it atomically";
      if (ops & op_load)
        return "loads it";
      if ((ops & op_atomics) != op || op == op_atomic)
        return "updates it with another atomic";
      return nullptr;
    }
    if (ops & op_load)
      return op == op_load ? nullptr : "loads it";
    return nullptr;
  }

  /// Applies access `op` (at site `at`) by program me to an element in state s: the conflict it
  /// makes (false, reported), or the new state (true).
  /// With tickets: the kind of access to an element, among those op conflicts with, whose
  /// accesses the tickets do not order against `tag` (null: none), and what it does (as
  /// conflict() says it). A kind done only by this program is in its own order.
  std::pair<ticket_order const*, char const*> unordered_by_tickets(ticket_orders const& o,
                                                                   std::uint8_t ops, std::uint8_t op,
                                                                   ticket_order const& tag,
                                                                   std::uint32_t me) {
    struct kind {
      ticket_order const& k;
      bool conflicts;
      char const* does;
    } const kinds[] = {
        {o.store, (ops & op_store) != 0, op == op_store ? "stores it too" : "stores it"},
        {o.atomic,
         (ops & op_atomics) &&
             (!(op & op_atomics) || (ops & op_atomics) != op || op == op_atomic),
         op & op_atomics ? "updates it with another atomic" : "updates it atomically"},
        {o.load, (ops & op_load) && (op & op_write), "loads it"}};
    for (kind const& k : kinds) {
      if (!k.conflicts || (!(k.k.counter & ticket_order::many) && k.k.program == me))
        continue;
      if (!tag.after(k.k) && !tag.before(k.k))
        return {&k.k, k.does};
      counters_[tag.which() - 1u].used = true;
    }
    return {nullptr, nullptr};
  }

  /// `o`, where the element's accesses stand among the launch's tickets (null: no counter orders
  /// programs), and `tag`, where this one does.
  bool apply(element_state& s, ticket_orders* o, ticket_order const& tag, std::uint32_t me,
             std::uint8_t op, std::uint16_t at, tracked_tensor const& t, std::int64_t el,
             logged_access const& a, std::uint32_t lock) {
    // The other program in the state, if any (the first two always hold one).
    auto [other, other_site] = other_than(s, me);
    // Accesses every program made holding one lock are ordered by it (lockset, as in Eraser), and
    // accesses on either side of two tickets by those tickets.
    if (other && !(lock && s.lock() == lock))
      if (char const* theirs = conflict(s.ops, op)) {
        ticket_order const* unordered = nullptr;
        if (o) {
          std::tie(unordered, theirs) = unordered_by_tickets(*o, s.ops, op, tag, me);
          if (unordered && unordered->program)
            other = unordered->program, other_site = unordered->site;
        }
        if (!o || unordered) {
          char const* const mine = op == op_load    ? "loads"
                                   : op == op_store ? "stores"
                                                    : "atomically updates";
          report(t, el, me, a.loc, mine, other, other_site, theirs,
                 (o ? ticket_note(tag, *unordered, op, me, other) : disorder_note()) +
                     ((s.ops & op_unraced) && (op == op_load || op == op_store) ? exchange_note()
                                                                                : "") +
                     (a.locks_held > 1
                          ? " " + describe(me) + " held " + std::to_string(a.locks_held) +
                                " locks at its access: a lock taken while another is held is "
                                "not followed (the check counts the first the program took)."
                          : std::string()));
          return false;
        }
      }
    if (o) {
      ticket_order& k = op == op_load ? o->load : op == op_store ? o->store : o->atomic;
      std::uint8_t const kind = op == op_load ? op_load : op == op_store ? op_store : op_atomics;
      if (s.ops & kind)
        k.merge(tag);
      else
        k = tag;
    }
    enter(s, me, op, at, lock);
    return true;
  }

  /// The program other than me that the state names (first or second), and its site (0: none).
  static std::pair<std::uint32_t, std::uint16_t> other_than(element_state const& s,
                                                            std::uint32_t me) {
    if (s.first && s.first != me)
      return {s.first, s.first_site};
    if (s.second && s.second != me)
      return {s.second, s.second_site};
    return {0, 0};
  }
  /// Records access `op` by me at site `at`, holding `lock`, in the state: me as its first or
  /// second program with the site of my weightiest access, the lock common to every access, op.
  static void enter(element_state& s, std::uint32_t me, std::uint8_t op, std::uint16_t at,
                    std::uint32_t lock) {
    if (s.first == 0 || s.first == me) {
      if (s.first == 0 || weight(op) > weight(s.ops))
        s.first_site = at;
      s.first = me;
    } else if (s.second == 0) {
      s.second = me;
      s.second_site = at;
    }
    if (s.ops == 0)
      s.set_lock(lock);
    else if (s.lock() != lock)
      s.set_lock(0);
    s.ops |= op;
  }

  /// An atomic_xchg or atomic_cas by program me of element `el` of an integer tensor (the
  /// access a, holding `lock`): a race with another program's plain load or store of it, unless
  /// both hold one lock or the element is a lock's word (read by plain loads while spinning).
  void exchange(std::uint32_t me, logged_access const& a, std::int64_t el, std::uint32_t lock) {
    tracked_tensor& t = tensors_[static_cast<std::size_t>(a.tensor)];
    if (el < 0 || el >= t.span || lock_words_.count(lock_key(a.tensor, el)))
      return;
    if (!t.state)
      t.state = zeroed_array<element_state>(static_cast<std::size_t>(t.span));
    t.state.touch(el, el + 1);
    element_state& s = t.state.get()[el];
    auto const [other, other_site] = other_than(s, me);
    if (other && (s.ops & (op_load | op_store)) && !(lock && s.lock() == lock)) {
      report(t, el, me, a.loc, "atomically exchanges", other, other_site,
             s.ops & op_store ? "stores it" : "loads it", exchange_note());
      return;
    }
    enter(s, me, op_unraced, site(a.loc), lock);
  }

  /// What a race message says of a try at a lock by program `id` made to fail (empty: none).
  TILEGRAD_MACHINERY_MEMBER std::string failed_try(std::uint32_t id) const
#if TILEGRAD_MACHINERY_BODIES
  {
    auto const it = failed_.find(id);
    if (it == failed_.end())
      return {};
    return " " + describe(id) + "'s " + (it->second.xchg ? "atomic_xchg" : "atomic_cas") +
           " on the lock at " + probe_site(it->second) +
           " was made to find it held, as it finds it while another program holds it (the "
           "probe of locks makes the first " +
           std::to_string(probe_failures) +
           " tries of each taking fail; a spin lock tries until it gets it): did it go on "
           "without the lock?";
  }
#else
      ;
#endif

  TILEGRAD_MACHINERY_MEMBER void check_program(std::uint32_t me, program_log const& log)
#if TILEGRAD_MACHINERY_BODIES
  {
    if (log.failed.tensor >= 0)
      failed_.emplace(me, log.failed);
    for (held_lock const& l : log.locks) // (by atomic_cas: given back or not)
      if (!l.by_xchg || l.released)
        lock_words_.insert(lock_key(l.tensor, l.element));
    // The program's tickets from counters that order programs, in program order.
    bool const ordering = ordering_;
    mine_.clear();
    for (drawn_ticket const& k : log.tickets)
      if (std::uint16_t const c = counter_of(k.tensor, k.element); c && counters_[c - 1u].valid)
        mine_.push_back({k.access, static_cast<std::uint32_t>(k.old), c});
    std::size_t next = 0; // the first of them not before the access
    bool const settle = log.xchg_locks();
    if (settle)
      log.settled_locks(settled_);
    for (std::uint32_t j = 0; j < log.accesses.size(); ++j) {
      logged_access a = log.accesses[j];
      if (settle)
        std::tie(a.lock, a.locks_held) = settled_[j];
      if (a.op & op_unraced) {
        // An atomic_xchg or atomic_cas of integer elements: not a race with another (locks and
        // flags), but with another program's plain load or store of the element (a flag read
        // outside the lock its exchanges hold), unless the element is a lock's word.
        if (exchanges_ && (a.op & ~op_unraced) == op_atomic)
          for (std::uint32_t ri = a.first; ri < a.first + a.count && !race_; ++ri)
            for (int k = 0; k < log.runs[ri].count && !race_; ++k)
              exchange(me, a, log.runs[ri].element(k), lock_id(log, a.lock, me));
        if (race_)
          return;
        continue;
      }
      std::uint16_t const at = site(a.loc);
      ticket_order tag{0, 0, me, at, 0};
      if (ordering) {
        while (next < mine_.size() && mine_[next].access < j)
          ++next;
        ordinal const* acq = next < mine_.size() && mine_[next].access == j ? &mine_[next]
                             : next > 0                                     ? &mine_[next - 1]
                                                                            : nullptr;
        ordinal const* rel = next < mine_.size() ? &mine_[next] : nullptr;
        if (acq)
          tag.acq = acq->value + 1u, tag.counter = acq->counter;
        if (rel && (!acq || rel->counter == acq->counter)) // (one counter: the first's)
          tag.rel = 0xffffffffu - rel->value, tag.counter = rel->counter;
      }
      tracked_tensor& t = tensors_[static_cast<std::size_t>(a.tensor)];
      if (!t.state)
        t.state = zeroed_array<element_state>(static_cast<std::size_t>(t.span));
      if (a.values >= 0 && !t.sums)
        t.sums = zeroed_array<add_sum>(static_cast<std::size_t>(t.span));
      if (ordering && !t.order)
        t.order = zeroed_array<ticket_orders>(static_cast<std::size_t>(t.span));
      ticket_orders* const ord = ordering ? t.order.get() : nullptr;
      std::uint32_t const lock = lock_id(log, a.lock, me);
      if (lock && (a.op & op_write) && locked_.empty())
        locked_ = t.label(t.element(log.runs[a.first].offset).first);
      float const* v = a.values >= 0 ? log.values.data() + a.values : nullptr;
      element_state* const st = t.state.get();
      for (std::uint32_t ri = a.first; ri < a.first + a.count; ++ri) {
        run const& r = log.runs[ri];
        std::int64_t const last = r.element(r.count - 1);
        std::int64_t const lo = std::min(r.offset, last), hi = std::max(r.offset, last) + 1;
        if (lo < 0 || hi > t.span) {
          // A view reaching past the tracked memory (made from one tensor's data, over its
          // neighbour's too): each lane outside goes to the tracked tensor that holds its address,
          // if any (before, it was dropped, and a race on the neighbour passed unseen).
          for (int k = 0; k < r.count; ++k) {
            std::int64_t el = r.element(k);
            tracked_tensor* u = &t;
            if (el < 0 || el >= t.span) {
              std::byte const* const addr = t.lo + el * static_cast<std::int64_t>(t.elem);
              int const ui = find(addr, t.elem);
              if (ui < 0)
                continue;
              u = &tensors_[static_cast<std::size_t>(ui)];
              el = (addr - u->lo) / static_cast<std::ptrdiff_t>(u->elem);
              if (!u->state)
                u->state = zeroed_array<element_state>(static_cast<std::size_t>(u->span));
              if (v && !u->sums)
                u->sums = zeroed_array<add_sum>(static_cast<std::size_t>(u->span));
              if (ordering && !u->order)
                u->order = zeroed_array<ticket_orders>(static_cast<std::size_t>(u->span));
            }
            u->state.touch(el, el + 1);
            ticket_orders* const uo = ordering ? u->order.get() : nullptr;
            if (uo)
              u->order.touch(el, el + 1);
            if (v) {
              u->sums.touch(el, el + 1);
              u->sums.get()[el].abs += v[k];
              ++u->sums.get()[el].n;
            }
            if (!apply(u->state.get()[el], uo ? uo + el : nullptr, tag, me, a.op, at, *u, el, a,
                       lock))
              return;
          }
          if (v)
            v += r.count;
          continue;
        }
        t.state.touch(lo, hi);
        if (ord)
          t.order.touch(lo, hi);
        if (v) {
          t.sums.touch(lo, hi);
          for (int k = 0; k < r.count; ++k) {
            add_sum& sum = t.sums.get()[r.element(k)];
            sum.abs += v[k];
            ++sum.n;
          }
          v += r.count;
        }
        // Most runs meet elements that all are in one state (untouched, or written alike by
        // the same programs): decided once. (A run repeating one element, step 0, is too: an
        // access after my own by me changes no verdict.)
        element_state const s0 = st[r.offset];
        ticket_orders const o0 = ord ? ord[r.offset] : ticket_orders{};
        bool uniform = true;
        for (int k = 1; k < r.count && uniform; ++k)
          uniform = std::memcmp(&st[r.element(k)], &s0, sizeof s0) == 0 &&
                    (!ord || std::memcmp(&ord[r.element(k)], &o0, sizeof o0) == 0);
        if (uniform) {
          element_state s1 = s0;
          ticket_orders o1 = o0;
          if (!apply(s1, ord ? &o1 : nullptr, tag, me, a.op, at, t, r.offset, a, lock))
            return;
          // Usually nothing changes (the next program adding atomically to the same elements).
          if (std::memcmp(&s1, &s0, sizeof s1) != 0 ||
              (ord && std::memcmp(&o1, &o0, sizeof o1) != 0))
            for (int k = 0; k < r.count; ++k) {
              std::memcpy(&st[r.element(k)], &s1, sizeof s1);
              if (ord)
                std::memcpy(&ord[r.element(k)], &o1, sizeof o1);
            }
          continue;
        }
        for (int k = 0; k < r.count; ++k) {
          std::int64_t const el = r.element(k);
          if (!apply(st[el], ord ? ord + el : nullptr, tag, me, a.op, at, t, el, a, lock))
            return;
        }
      }
    }
  }
#else
  ;
#endif

  // ---- Tickets

  /// A counter programs drew tickets from: one element of an integer tensor.
  struct ticket_counter {
    int tensor;
    std::int64_t element;
    std::source_location loc;                               // of the first ticket counted
    std::vector<std::pair<std::int64_t, std::int64_t>> drawn; // every ticket: (value, added)
    struct other_write {
      std::int64_t after; // the last ticket its program drew from the counter before it (-1)
      std::uint32_t program;
      std::source_location loc;
    };
    std::vector<other_write> writes; // every other write to it
    bool checked = true, valid = true, used = false;
    std::string why; // why its tickets do not order programs (once they do not)
  };
  /// A ticket of the program being checked: the index of its atomic in the log, its value and
  /// its counter.
  struct ordinal {
    std::uint32_t access, value;
    std::uint16_t counter;
  };
  /// What an integer tensor of at most max_saved_counters elements held when the launch began.
  struct saved_ints {
    std::byte const* lo;
    std::size_t elem;
    std::vector<std::int64_t> values;
  };
  static constexpr std::int64_t max_saved_counters = 65536;

  static std::uint64_t counter_key(int tensor, std::int64_t element) {
    return (static_cast<std::uint64_t>(tensor) << 48) ^ static_cast<std::uint64_t>(element);
  }
  /// The counter of an element (1 + its index; 0: none).
  std::uint16_t counter_of(int tensor, std::int64_t element) const {
    auto const it = counter_ids_.find(counter_key(tensor, element));
    return it == counter_ids_.end() ? std::uint16_t{0} : it->second;
  }

  TILEGRAD_MACHINERY_MEMBER void count_tickets(std::uint32_t first, program_log const* logs,
                                               std::int64_t n)
#if TILEGRAD_MACHINERY_BODIES
  {
    // The tickets drawn (the counters of the first 32767 elements drawn from).
    for (std::int64_t i = 0; i < n; ++i)
      for (drawn_ticket const& k : logs[i].tickets) {
        auto [it, added] = counter_ids_.try_emplace(counter_key(k.tensor, k.element),
                                                    static_cast<std::uint16_t>(counters_.size() + 1));
        if (added) {
          if (counters_.size() >= 0x7fff) {
            counter_ids_.erase(it);
            counters_capped_ = true;
            continue;
          }
          counters_.push_back({k.tensor, k.element, k.loc, {}, {}, true, true, false, {}});
          counts_.resize(tensors_.size());
          counts_[static_cast<std::size_t>(k.tensor)] = true;
        }
        ticket_counter& c = counters_[it->second - 1u];
        c.drawn.push_back({k.old, k.add});
        c.checked = false;
      }
    if (counters_.empty())
      return;
    // Every other write to a counter: a reset, an atomic_xchg, a store.
    for (std::int64_t i = 0; i < n; ++i) {
      program_log const& log = logs[i];
      std::size_t next = 0;
      for (std::uint32_t j = 0; j < log.accesses.size(); ++j) {
        logged_access const& a = log.accesses[j];
        while (next < log.tickets.size() && log.tickets[next].access < j)
          ++next;
        if (!(a.op & op_write) || !counts_[static_cast<std::size_t>(a.tensor)] ||
            (next < log.tickets.size() && log.tickets[next].access == j))
          continue;
        for (std::uint32_t ri = a.first; ri < a.first + a.count; ++ri)
          for (int k = 0; k < log.runs[ri].count; ++k) {
            std::uint16_t const c = counter_of(a.tensor, log.runs[ri].element(k));
            if (!c)
              continue;
            ticket_counter& tc = counters_[c - 1u];
            std::int64_t after = -1;
            for (std::size_t q = next; q-- > 0;)
              if (log.tickets[q].tensor == tc.tensor && log.tickets[q].element == tc.element) {
                after = log.tickets[q].old;
                break;
              }
            tc.writes.push_back({after, first + static_cast<std::uint32_t>(i), a.loc});
            tc.checked = false;
          }
      }
    }
    ordering_ = false;
    for (ticket_counter& c : counters_) {
      if (!c.checked && c.valid)
        if (std::string why = disorder(c); !why.empty()) {
          c.valid = false;
          c.why = std::move(why);
          if (c.used && !race_) {
            race_found r;
            auto [view, coordinates] = tensors_[static_cast<std::size_t>(c.tensor)].element(c.element);
            r.tensor = view ? view->name : tensors_[static_cast<std::size_t>(c.tensor)].name;
            r.element = coordinates;
            r.where = c.loc;
            r.message = std::string(who_) + ": tickets drawn from " + counter_label(c) +
                        " ordered what programs did, but they cannot: " + c.why +
                        ". Tickets order programs only when the counter counts up from what it "
                        "held when the launch began, by atomic_add of positive values, and only "
                        "the program that draws the last ticket writes it otherwise (a reset), "
                        "after drawing it.";
            race_ = std::move(r);
          }
        }
      c.checked = true;
      ordering_ = ordering_ || c.valid;
    }
  }
#else
  ;
#endif

  /// Why the tickets of counter c may not follow the order in which they were drawn (empty: they
  /// do): the values drawn, sorted, must go up one atomic_add at a time from what the counter held
  /// when the launch began, and only the program that drew the last ticket may write it otherwise,
  /// after drawing it. Then every ticket was drawn before every other write, in the order of its
  /// value.
  TILEGRAD_MACHINERY_MEMBER std::string disorder(ticket_counter& c) const
#if TILEGRAD_MACHINERY_BODIES
  {
    auto& d = c.drawn;
    std::sort(d.begin(), d.end());
    if (d.front().first < 0 || d.back().first > 0xfffffffdLL)
      return "its tickets run outside 0 to 2^32 - 3";
    for (std::size_t i = 0; i + 1 < d.size(); ++i) {
      if (d[i + 1].first == d[i].first)
        return "ticket " + std::to_string(d[i].first) + " was drawn twice (the counter went back)";
      if (d[i + 1].first != d[i].first + d[i].second)
        return "ticket " + std::to_string(d[i].first) + " (adding " +
               std::to_string(d[i].second) + ") was followed by ticket " +
               std::to_string(d[i + 1].first) + ": something else changed the counter between";
    }
    tracked_tensor const& t = tensors_[static_cast<std::size_t>(c.tensor)];
    auto const* at = t.lo + c.element * static_cast<std::int64_t>(t.elem);
    std::optional<std::int64_t> start;
    for (saved_ints const& s : saved_)
      if (s.elem == t.elem && at >= s.lo &&
          at < s.lo + static_cast<std::int64_t>(s.values.size() * s.elem) &&
          (at - s.lo) % static_cast<std::ptrdiff_t>(s.elem) == 0) {
        start = s.values[static_cast<std::size_t>((at - s.lo) / static_cast<std::ptrdiff_t>(s.elem))];
        break;
      }
    if (!start)
      return "its tensor has more than " + std::to_string(max_saved_counters) +
             " elements, so what it held when the launch began is not known";
    if (*start != d.front().first)
      return "the first ticket is " + std::to_string(d.front().first) + ", but the counter held " +
             std::to_string(*start) + " when the launch began";
    for (auto const& w : c.writes)
      if (w.after != d.back().first)
        return describe(w.program) + " writes it at " + where_string(w.loc) +
               (w.after < 0 ? std::string(" without drawing a ticket first")
                            : " after drawing ticket " + std::to_string(w.after)) +
               ", not after the last ticket, " + std::to_string(d.back().first);
    return {};
  }
#else
  ;
#endif

  std::string counter_label(ticket_counter const& c) const {
    tracked_tensor const& t = tensors_[static_cast<std::size_t>(c.tensor)];
    auto const [view, coordinates] = t.element(c.element);
    return "tensor " + t.label(view) + ", element " + coordinates + " (atomic_add at " +
           where_string(c.loc) + ")";
  }

  /// What a race message adds where programs drew tickets that cannot order them: why.
  std::string disorder_note() const {
    for (ticket_counter const& c : counters_)
      if (!c.valid)
        return " Tickets drawn from " + counter_label(c) + " do not order programs here: " + c.why +
               ".";
    return {};
  }

  /// What a race message adds where tickets order programs: where the access and those of the
  /// other program stand among them (`theirs`: the accesses of one kind the access is not
  /// ordered against).
  TILEGRAD_MACHINERY_MEMBER std::string ticket_note(ticket_order const& mine,
                                                    ticket_order const& theirs, std::uint8_t op,
                                                    std::uint32_t me, std::uint32_t other) const
#if TILEGRAD_MACHINERY_BODIES
  {
    std::uint16_t c = mine.which() ? mine.which() : theirs.which();
    for (std::size_t i = 0; !c && i < counters_.size(); ++i)
      if (counters_[i].valid)
        c = static_cast<std::uint16_t>(i + 1);
    if (!c)
      return {};
    if (counters_capped_ && !mine.which() && !theirs.which())
      return " Tickets drawn from more than 32,767 elements as counters: those past the "
             "32,767th are not followed, and neither access is placed among tickets.";
    // Each access is placed among the tickets of one counter: where the two are placed by two
    // counters, each ticket is named with its counter.
    bool const two = mine.which() && theirs.which() && mine.which() != theirs.which();
    auto ticket = [&](std::uint32_t present, std::int64_t v, char const* none,
                      ticket_order const& of) {
      if (!present)
        return std::string(none);
      return "ticket " + std::to_string(v) +
             (two ? " of " + counter_label(counters_[of.which() - 1u]) : std::string());
    };
    char const* const noun = op == op_load ? "load" : op == op_store ? "store" : "atomic";
    std::string note = " Programs draw tickets from " +
                       (two ? std::string("several counters") : counter_label(counters_[c - 1u])) +
                       ": what a program does before drawing a ticket comes before what a program "
                       "does after drawing a later one" +
                       (two ? " from the same counter" : "") + ". Here " + describe(me) +
                       " draws " + ticket(mine.acq, mine.acquired(), "no ticket", mine) +
                       " before its " + noun + " and " +
                       ticket(mine.rel, mine.released(), "none", mine) + " after it; ";
    std::string const placed =
        two ? " Each access is placed among the tickets of one counter (the last its program "
              "drew before it, or else the first it draws after it), and accesses placed by two "
              "counters are not ordered: draw the tickets that order these accesses from one "
              "counter (one ticket after storing every partial row)."
            : std::string();
    std::string const capped =
        counters_capped_ ? " (More than 32,767 elements were drawn from as counters: tickets "
                           "from those past the 32,767th are not followed, and count as none.)"
                         : std::string();
    if (theirs.counter & ticket_order::many)
      return note + describe(other) + " draws " +
             ticket(theirs.rel, theirs.released(), "none", theirs) +
             " after its access (one of several programs that access it)." + placed + capped;
    return note + describe(other) + " draws " +
           ticket(theirs.acq, theirs.acquired(), "no ticket", theirs) + " before its access and " +
           ticket(theirs.rel, theirs.released(), "none", theirs) + " after it." + placed + capped;
  }
#else
  ;
#endif

  grid g_;
  char const* who_;
  std::vector<tracked_tensor> tensors_;
  std::string unmergeable_;
  std::vector<std::pair<std::byte const*, std::byte const*>> spans_;
  std::vector<std::source_location> sites_;
  std::optional<race_found> race_;
  // The locks programs took and gave back, by key: the launch's id of each (1-based), and what
  // the probe of locks makes a try at it find.
  struct known_lock {
    std::uint32_t id;
    known_lock_site site;
  };
  std::unordered_map<std::uint64_t, known_lock> locks_;
  static constexpr std::size_t max_locks = (std::size_t{1} << 24) - 1;
  std::unordered_map<std::uint32_t, lock_probe> failed_; // by program: a try made to fail
  std::string* probe_ = nullptr;                         // probing locks: where why it stopped goes
  std::atomic<bool> stopped_{false};
  std::mutex stop_m_;
  std::string locked_;
  std::vector<saved_ints> saved_;
  std::vector<ticket_counter> counters_;
  std::unordered_map<std::uint64_t, std::uint16_t> counter_ids_;
  std::vector<bool> counts_; // per tensor: whether it holds a counter
  std::vector<ordinal> mine_;
  std::vector<std::pair<int, std::uint8_t>> settled_; // program_log::settled_locks
  bool ordering_ = false; // whether a counter orders programs
  bool exchanges_ = false;                       // check_exchanges
  std::unordered_set<std::uint64_t> lock_words_; // elements a program took as a lock
  bool counters_capped_ = false; // tickets were drawn from more than 32767 counters
};

/// Throws access_error for a write by a program of a tracked launch to a tensor `name` that
/// the launch does not take (a view the kernel captures): its races would go unseen.
[[noreturn]] TILEGRAD_MACHINERY void untracked_write(char const* name,
                                                     std::source_location const& loc)
#if TILEGRAD_MACHINERY_BODIES
{
  program const* p = current_program();
  std::string const prog = p ? p->describe() : std::string("host code");
  throw access_error("tilegrad::launch: " + prog + " writes tensor " + tensor_label(name) + " at " +
                         where_string(loc) +
                         ", which the launch does not take as an argument: a launch that checks "
                         "races (check_backward's backward launches, launch_options::check_races) "
                         "tracks the tensors passed to the kernel, each as an argument of its own. "
                         "Pass it to the kernel as an argument instead of capturing it (or of "
                         "passing it inside a struct or a container).",
                     prog, name, "", loc);
}
#else
;
#endif

/// Throws access_error for a load, through the view `view` of `elem`-byte elements, of bytes of
/// element `el` (from its first byte) of t, a tensor the launch tracks with elements of another
/// size: the race check follows t's elements, and cannot tell which stores such a load meets.
[[noreturn]] TILEGRAD_MACHINERY void foreign_read(tracked_tensor const& t, std::int64_t el,
                                                  char const* view, std::size_t elem,
                                                  std::source_location const& loc)
#if TILEGRAD_MACHINERY_BODIES
{
  program const* p = current_program();
  std::string const prog = p ? p->describe() : std::string("host code");
  auto const [v, coords] = t.element(el);
  std::string const name = t.label(v);
  throw access_error(
      "tilegrad::launch: " + prog + " loads bytes of element " + coords + " of tensor " + name +
          " at " + where_string(loc) + " through " +
          (view && *view ? "a view named " + tensor_label(view) : std::string("a view")) + " of " +
          std::to_string(elem) + "-byte elements, where the tensor's are " +
          std::to_string(t.elem) +
          " bytes: a launch that checks races follows the elements of the tensors it may write, "
          "and cannot tell which of their stores such a load meets. Read the tensor through a "
          "view of its own element type (or copy the values into a buffer of their own).",
      prog, v ? v->name : t.name, coords, loc);
}
#else
    ;
#endif

/// Gathers the lanes of one access of the running program into its log when the access goes to
/// a tracked tensor, and does nothing otherwise (a write to no tracked tensor throws, and so does
/// an access of an element of a tensor vjp or jvp differentiates: access_hooks::watched). Called as
/// the lane hook of the loops of loads, stores and atomics: lane(pos, offset, n) for n contiguous
/// elements.
class access_recorder {
public:
  /// `argument`: the primal values of a launch argument (a tensor of adjoints), which
  /// access_hooks::watched does not concern.
  access_recorder(access_hooks const& h, void const* base, std::size_t elem, std::int64_t extent,
                  char const* name, bool argument = false) {
    if (h.watched && !argument) [[unlikely]]
      watch(*h.watched, base, elem, extent, name);
    if (!h.tracker) {
      if (h.refuse_writes)
        untracked_ = name;
      return;
    }
    int const t = h.tracker->find(base, elem, extent);
    if (t < 0) {
      if (!h.lenient)
        untracked_ = name;
      // A load of a tracked tensor's bytes through a view of another element size: the race
      // check could not tell which of its elements the load meets (foreign_read).
      if (int const f = h.tracker->find_foreign(base, elem, extent); f >= 0) {
        foreign_ = &h.tracker->tensor_at(f);
        view_ = static_cast<std::byte const*>(base);
        elem_ = elem;
        name_ = name;
      }
      return;
    }
    tensor_ = t;
    log_ = h.log;
    hooks_ = &h;
    if (h.tracker->probing()) [[unlikely]]
      h.tracker->probe_watch(*log_);
    auto const& e = h.tracker->tensor_at(t);
    shift_ = (static_cast<std::byte const*>(base) - e.lo) / static_cast<std::ptrdiff_t>(elem);
    builder_.emplace(log_->scratch);
  }
  access_recorder(access_recorder const&) = delete;
  access_recorder& operator=(access_recorder const&) = delete;

  bool active() const { return log_ != nullptr; }
  /// Moves every lane of this access, a store of bf16 values at `base`, by one unit in the last
  /// place where the hooks ask for it (access_hooks::bf16_jitter) for its tensor.
  void move_stored_bf16(void* base) {
    if (log_ && hooks_->bf16_jitter && hooks_->tracker->tensor_at(tensor_).jitter) {
      moved_ = static_cast<std::uint16_t*>(base);
      seed_ = mix64(hooks_->bf16_jitter ^ mix64(log_->accesses.size() + 1));
    }
  }
  /// The tracked tensor, and the element (from its first) of the last lane recorded, and how
  /// many lanes were.
  int tensor() const { return tensor_; }
  std::int64_t last_element() const { return last_; }
  int lanes() const { return pos_; }
  /// Whether the access must still visit its lanes: it records them, or it is a write of `op` to
  /// an untracked tensor, refused if a lane is written (commit).
  bool wanted(std::uint8_t op) const {
    return log_ || (untracked_ && (op & op_write)) || watched_ || (foreign_ && op == op_load);
  }
  void operator()(int, std::int64_t off, int n) {
    if (watched_ && !hit_) [[unlikely]]
      find_watched(off, n);
    if (foreign_ && foreign_offset_ < 0) [[unlikely]]
      find_foreign(off, n);
    if (!log_ || n <= 0) {
      touched_ |= n > 0;
      return;
    }
    if (n == 1)
      builder_->add(pos_, off + shift_);
    else
      builder_->add(pos_, off + shift_, n);
    if (moved_)
      for (int k = 0; k < n; ++k)
        move_bf16_ulp(moved_[off + k], mix64(seed_ ^ static_cast<std::uint64_t>(off + k)));
    last_ = off + shift_ + n - 1;
    pos_ += n; // lane positions only chain the runs: consecutive calls merge by offset
  }
  /// Room for the values of n lanes of an atomic_add (before its lanes).
  void expect_values(int n) {
    if (!log_)
      return;
    values_ = static_cast<std::int64_t>(log_->values.size());
    log_->values.resize(log_->values.size() + static_cast<std::size_t>(n));
    next_ = log_->values.data() + values_;
  }
  /// The value an atomic_add lane adds (after its lane), for the determinism check.
  void value(double v) {
    if (next_)
      *next_++ = static_cast<float>(std::abs(v));
  }
  /// Appends the access to the log.
  void commit(std::uint8_t op, std::source_location const& loc) {
    if (hit_) [[unlikely]]
      captured_access(*hit_, hit_offset_, name_, op, loc);
    if (foreign_offset_ >= 0 && op == op_load) [[unlikely]]
      foreign_read(*foreign_, foreign_offset_, name_, elem_, loc);
    if (log_)
      append(op, loc);
    else if (untracked_ && touched_ && (op & op_write))
      untracked_write(untracked_, loc);
  }

private:
  /// Keeps the watched tensors when a view that is not an argument of the launch (its element
  /// type is not the launch's: a view the kernel captures) spans memory of one.
  void watch(std::vector<watched_tensor> const& w, void const* base, std::size_t elem,
             std::int64_t extent, char const* name) {
    for (watched_tensor const& t : w)
      if (t.overlaps(base, std::max<std::int64_t>(extent, 1) * static_cast<std::int64_t>(elem))) {
        watched_ = &w;
        view_ = static_cast<std::byte const*>(base);
        elem_ = elem;
        name_ = name;
        return;
      }
  }
  /// The first lane of n from offset `off` (of elem_ bytes each) that shares a byte with an
  /// element of foreign_, and that element (from its lo) in foreign_offset_.
  void find_foreign(std::int64_t off, int n) {
    auto const te = static_cast<std::int64_t>(foreign_->elem);
    for (int k = 0; k < n && foreign_offset_ < 0; ++k) {
      std::int64_t const from = view_ + (off + k) * static_cast<std::int64_t>(elem_) - foreign_->lo;
      std::int64_t const to = from + static_cast<std::int64_t>(elem_); // one past its last byte
      for (std::int64_t el = std::max<std::int64_t>(from, 0) / te;
           el * te < to && el < foreign_->span && foreign_offset_ < 0; ++el)
        for (tracked_view const& v : foreign_->views)
          if (v.layout.contains(el - v.shift)) {
            foreign_offset_ = el;
            break;
          }
    }
  }
  /// The first lane of n from offset `off` of the view that reaches an element of a watched
  /// tensor.
  void find_watched(std::int64_t off, int n) {
    for (int k = 0; k < n; ++k) {
      std::byte const* const at = view_ + (off + k) * static_cast<std::int64_t>(elem_);
      for (watched_tensor const& t : *watched_)
        if (std::int64_t const e = t.element_at(at, elem_); e >= 0) {
          hit_ = &t;
          hit_offset_ = e;
          return;
        }
    }
  }

  TILEGRAD_MACHINERY_MEMBER void append(std::uint8_t op, std::source_location const& loc)
#if TILEGRAD_MACHINERY_BODIES
  {
    if (next_) // lanes masked off wrote no value
      log_->values.resize(static_cast<std::size_t>(next_ - log_->values.data()));
    builder_->finish();
    if (log_->scratch.empty())
      return; // every lane masked off
    if (op == op_load && hooks_->on_load && !hooks_->on_load(*hooks_, tensor_, log_->scratch, loc))
      return;
    // A program spinning on a flag or a lock makes the same access again and again (a load, or
    // a try at one element, or the two in turn): it is logged once, since a repeat changes no
    // verdict, and a long wait must not fill memory.
    if ((op == op_load || (op & op_unraced)) && log_->scratch.size() == 1 &&
        log_->scratch[0].count == 1)
      for (std::size_t back = 1; back <= 2 && back <= log_->accesses.size(); ++back) {
        logged_access const& a = log_->accesses[log_->accesses.size() - back];
        run const& r = log_->runs[a.first];
        if (a.op == op && a.tensor == tensor_ && a.count == 1 && r.count == 1 &&
            r.offset == log_->scratch[0].offset && a.lock == log_->holding() &&
            a.locks_held == std::min<std::size_t>(log_->open.size(), 255) &&
            a.loc.line() == loc.line() && a.loc.column() == loc.column() &&
            a.loc.file_name() == loc.file_name()) {
          ++log_->repeats;
          return;
        }
      }
    auto const first = static_cast<std::uint32_t>(log_->runs.size());
    log_->runs.insert(log_->runs.end(), log_->scratch.begin(), log_->scratch.end());
    log_->accesses.push_back(
        {op, tensor_, first, static_cast<std::uint32_t>(log_->scratch.size()),
         op == op_atomic_add ? values_ : -1, loc, log_->holding(),
         static_cast<std::uint8_t>(std::min<std::size_t>(log_->open.size(), 255))});
  }
#else
  ;
#endif

  program_log* log_ = nullptr;
  access_hooks const* hooks_ = nullptr;
  char const* untracked_ = nullptr; // the name of an untracked tensor accessed
  bool touched_ = false;            // whether a lane of it was
  int tensor_ = -1;
  int pos_ = 0;
  std::int64_t shift_ = 0, values_ = -1, last_ = -1;
  float* next_ = nullptr;
  std::uint16_t* moved_ = nullptr; // the bf16 elements a store moves (move_stored_bf16)
  std::uint64_t seed_ = 0;
  std::optional<run_builder> builder_;
  std::vector<watched_tensor> const* watched_ = nullptr; // a view over memory of one of them
  std::byte const* view_ = nullptr;
  std::size_t elem_ = 0;
  char const* name_ = nullptr;
  watched_tensor const* hit_ = nullptr; // the tensor of the first lane that reaches one
  std::int64_t hit_offset_ = -1;
  tracked_tensor const* foreign_ = nullptr; // a tracked tensor the view's memory overlaps
  std::int64_t foreign_offset_ = -1;        // its element a lane shares a byte with
};

/// The writes of one tracked launch to one tensor, kept after the launch: per element (offset
/// from the tensor's first element), what the launch's programs did to it, and for elements
/// atomic_add reached, the count and summed magnitude of its contributions.
struct launch_writes {
  std::size_t launch = 0; ///< its place among the observer's launches
  std::byte const* lo = nullptr;
  std::byte const* hi = nullptr;
  std::size_t elem = 0;
  std::vector<std::uint8_t> ops;
  std::vector<add_sum> sums; // empty without atomic_add
  // A copy (op_copy): each element's source, of from_elem bytes and unit roundoff from_unit.
  std::vector<std::byte const*> from;
  std::size_t from_elem = 0;
  double from_unit = 0;
  bool bf16 = false; ///< of bf16 elements
  std::string name; ///< the tensor's (its first view's; a copy: the view may not outlive it)
  int arg = 0; ///< its first view's place among the kernel's arguments (1-based; 0: unknown)
  /// Per element, whether it was stored, and every access to it made, holding one lock (empty:
  /// none was).
  std::vector<std::uint8_t> locked;
};

/// What the last write of an element was, followed through copies to the launch that made it.
struct traced_write {
  std::uint8_t ops = 0; ///< that launch's writes to it (0: none traced)
  std::ptrdiff_t launch = -1; ///< that launch's place among the observer's launches
  add_sum sum{0, 0};    ///< with op_atomic_add alone: its additions
  double copied_from_unit = 0; ///< when reached through copies: the source's unit roundoff
  bool locked = false;  ///< stored, and every access to it made, holding one lock
};

/// Collects what the tracked launches started on one thread found (check_backward installs one
/// around a hand-written backward): a race is kept rather than thrown, and the launch runs to its
/// end, so the backward still returns gradients to compare; and the writes of every launch, so
/// that run-to-run differences can be traced to atomic_add.
class launch_observer {
public:
  struct launch_record {
    grid g;
    std::optional<race_found> race;
    std::string locked; ///< a tensor written holding a lock, as messages name it (empty: none)
    /// The memory of every tensor it took, [lo, hi) (empty for a copy).
    std::vector<std::pair<std::byte const*, std::byte const*>> spans;
  };
  std::vector<launch_record> launches;
  std::vector<launch_writes> writes; // launch by launch, in order
  /// check_backward's probe of locks: whether this run's launches probe them (launch_tracker,
  /// "Locks found held"), and why the probe stopped, if it did (empty: it did not).
  bool probe_locks = false;
  std::string probe_stopped;
  /// check_backward's determinism rerun: each launch runs its waves, and the programs of each
  /// wave, in reverse order (the last program first on one thread), so that a result that
  /// depends on which program runs first or last differs from the first run's whatever the
  /// timing.
  bool reverse_order = false;
  /// check_backward's measure of bf16 sums kept in memory: a seed (0: off), and the tensors
  /// whose bf16 stores are moved, as (launch, argument) (launch_writes::launch, ::arg).
  std::uint64_t bf16_jitter = 0;
  std::vector<std::pair<std::size_t, int>> jitter_targets;
  /// The locks each launch, in order, knew at its end: check_backward hands them to the next run
  /// of the same backward, and its probe run makes tries at them fail.
  std::vector<std::vector<known_lock_site>> known_locks;
  /// launch_writes::launch of a host copy.
  static constexpr std::size_t no_launch = static_cast<std::size_t>(-1);

  /// Takes what a launch's tracker found.
  TILEGRAD_MACHINERY_MEMBER void add(launch_tracker& tr, grid g)
#if TILEGRAD_MACHINERY_BODIES
  {
    launches.push_back({g, tr.race(), tr.locked_writes(), tr.spans()});
    known_locks.resize(std::max(known_locks.size(), launches.size()));
    known_locks[launches.size() - 1] = tr.lock_sites();
    for (auto& t : tr.tensors()) {
      if (!t.state)
        continue;
      launch_writes w{launches.size() - 1, t.lo, t.hi, t.elem, {}, {}, {}, 0, 0, t.bf16, t.name,
                      t.views.empty() ? 0 : t.views[0].arg, {}};
      w.ops.resize(static_cast<std::size_t>(t.span));
      bool any = false;
      for (std::int64_t i = 0; i < t.span; ++i) {
        element_state const& e = t.state.get()[i];
        w.ops[static_cast<std::size_t>(i)] = e.ops & ~op_unraced;
        any |= (e.ops & op_write) != 0;
        if (e.lock() && (e.ops & op_store)) {
          w.locked.resize(static_cast<std::size_t>(t.span), 0);
          w.locked[static_cast<std::size_t>(i)] = 1;
        }
      }
      if (!any)
        continue;
      if (t.sums)
        w.sums.assign(t.sums.get(), t.sums.get() + t.span);
      writes.push_back(std::move(w));
    }
  }
#else
  ;
#endif

  /// Records a host copy (tilegrad::copy) of n elements: element i of the destination, at
  /// dst(i), comes from src(i); `unit` is the source's unit roundoff.
  template <class Dst, class Src>
  void add_copy(tensor<Dst> const& dst, tensor<Src const> const& src, double unit) {
    std::int64_t const n = dst.numel();
    if (n == 0)
      return;
    std::byte const* lo = nullptr;
    std::byte const* hi = nullptr;
    for (std::int64_t i = 0; i < n; ++i) {
      auto const* b = reinterpret_cast<std::byte const*>(dst.data() + dst.row_major_offset(i));
      lo = i == 0 ? b : std::min(lo, b);
      hi = i == 0 ? b + sizeof(Dst) : std::max(hi, b + sizeof(Dst));
    }
    launch_writes w{no_launch, lo, hi, sizeof(Dst), {}, {}, {}, sizeof(Src), unit,
                    std::is_same_v<std::remove_const_t<Dst>, tilegrad::bf16>, dst.name(), 0, {}};
    auto const span = static_cast<std::size_t>((hi - lo) / static_cast<std::ptrdiff_t>(sizeof(Dst)));
    w.ops.assign(span, 0);
    w.from.assign(span, nullptr);
    for (std::int64_t i = 0; i < n; ++i) {
      auto const* b = reinterpret_cast<std::byte const*>(dst.data() + dst.row_major_offset(i));
      auto const at = static_cast<std::size_t>((b - lo) / static_cast<std::ptrdiff_t>(sizeof(Dst)));
      w.ops[at] = op_copy;
      w.from[at] = reinterpret_cast<std::byte const*>(src.data() + src.row_major_offset(i));
    }
    writes.push_back(std::move(w));
  }

  /// The names of the tensors whose memory launch `l` took and of which some element was written
  /// last, before it, by atomic_add alone or holding a lock, or stored by an earlier launch that
  /// took such sums itself (through any number of launches), or which launch `l` wrote by
  /// atomic_add alone and loaded (after every addition: the race check orders the loads by
  /// tickets) ("'a'", "'a' and 'b'", "'a', 'b' and an unnamed tensor"); empty where there is
  /// none. (Every one of them: a launch that reduces two buffers of sums into two gradients
  /// takes both, and a note on either gradient named the first.)
  /// (A launch that loads sums made in an order the run chose and stores what it makes of them
  /// passes their run-to-run differences on, and so does every launch after it that takes what it
  /// stored.)
  std::string takes_atomic_sums(std::ptrdiff_t l) const {
    std::vector<std::optional<std::string>> taken(launches.size());
    return takes_atomic_sums(l, taken);
  }

private:
  // taken[k]: takes_atomic_sums(k), once worked out.
  std::string takes_atomic_sums(std::ptrdiff_t l,
                                std::vector<std::optional<std::string>>& taken) const {
    if (l < 0 || static_cast<std::size_t>(l) >= launches.size())
      return {};
    std::optional<std::string>& memo = taken[static_cast<std::size_t>(l)];
    if (memo)
      return *memo;
    memo = std::string();
    std::size_t before = 0; // writes of the launches before l (and of copies between)
    while (before < writes.size() &&
           (writes[before].launch == no_launch || writes[before].launch < std::size_t(l)))
      ++before;
    std::vector<std::string> names;
    auto add = [&](launch_writes const& w) {
      std::string n = w.name.empty() ? std::string("an unnamed tensor") : "'" + w.name + "'";
      if (std::find(names.begin(), names.end(), n) == names.end())
        names.push_back(std::move(n));
    };
    for (std::size_t k = before; k < writes.size() && writes[k].launch == std::size_t(l); ++k) {
      launch_writes const& w = writes[k];
      if (!w.sums.empty())
        for (std::uint8_t const ops : w.ops)
          if ((ops & op_write) == op_atomic_add && (ops & op_load)) {
            add(w);
            break;
          }
    }
    for (auto const& [lo, hi] : launches[static_cast<std::size_t>(l)].spans)
      for (std::size_t k = 0; k < before; ++k) {
        launch_writes const& w = writes[k];
        if (w.launch == no_launch || w.hi <= lo || hi <= w.lo)
          continue;
        // A launch that stored what it made of such sums passes them on in turn.
        bool const stores_sums =
            !takes_atomic_sums(static_cast<std::ptrdiff_t>(w.launch), taken).empty();
        if (w.sums.empty() && w.locked.empty() && !stores_sums)
          continue;
        auto const step = static_cast<std::ptrdiff_t>(w.elem);
        for (std::size_t i = 0; i < w.ops.size(); ++i) {
          std::byte const* const b = w.lo + static_cast<std::ptrdiff_t>(i) * step;
          bool const locked = !w.locked.empty() && w.locked[i];
          bool const stored = stores_sums && (w.ops[i] & op_write) == op_store;
          if (b < lo || b >= hi || ((w.ops[i] & op_write) != op_atomic_add && !locked && !stored))
            continue;
          if (traced_write const last = last_write(b, w.elem, before);
              last.ops == op_atomic_add || last.locked ||
              (last.ops == op_store && last.launch == static_cast<std::ptrdiff_t>(w.launch) &&
               stores_sums)) {
            add(w);
            break;
          }
        }
      }
    std::string joined;
    for (std::size_t i = 0; i < names.size(); ++i)
      joined += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
    return *(memo = joined);
  }

public:
  /// What wrote the element at p last, among the first `upto` entries of `writes` (a gradient
  /// handed over before later launches reused its buffer is traced as it was then).
  traced_write last_write(void const* p, std::size_t elem,
                          std::size_t upto = static_cast<std::size_t>(-1)) const {
    traced_write t;
    auto const* b = static_cast<std::byte const*>(p);
    auto const first = writes.rbegin() +
                       static_cast<std::ptrdiff_t>(writes.size() - std::min(upto, writes.size()));
    for (auto it = first; it != writes.rend(); ++it) {
      if (b < it->lo || b >= it->hi || it->elem != elem)
        continue;
      auto const i = static_cast<std::size_t>((b - it->lo) / static_cast<std::ptrdiff_t>(elem));
      if (it->ops[i] & op_copy) {
        b = it->from[i];
        elem = it->from_elem;
        t.copied_from_unit = it->from_unit;
        continue; // the source was written before the copy
      }
      std::uint8_t const ops = it->ops[i] & op_write;
      if (!ops)
        continue;
      t.ops = ops;
      t.launch = static_cast<std::ptrdiff_t>(it->launch);
      t.sum = it->sums.empty() ? add_sum{0, 0} : it->sums[i];
      t.locked = !it->locked.empty() && it->locked[i];
      return t;
    }
    return {};
  }
};

/// The observer of the launches started on this thread (null: a race throws race_error).
inline launch_observer*& current_observer() {
  thread_local launch_observer* o = nullptr;
  return o;
}

/// Installs an observer (or none) for the launches started on this thread, for the guard's
/// lifetime: with one, every one of them is tracked, whatever its options say.
class observer_scope {
public:
  explicit observer_scope(launch_observer* o) : saved_(current_observer()) {
    current_observer() = o;
  }
  ~observer_scope() { current_observer() = saved_; }
  observer_scope(observer_scope const&) = delete;
  observer_scope& operator=(observer_scope const&) = delete;

private:
  launch_observer* saved_;
};

} // namespace tilegrad::detail
