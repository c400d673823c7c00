// Reverse mode of tg::loop (grid/loop.hpp): a checkpointed scan. The forward pass runs each
// iteration without recording (values only, on the tape, rewound after it), keeping only the
// values carried into the next iteration; one record stands for the whole loop. Its backward
// runs the iterations again, last first, each recorded at the end of the tape from its saved
// carried values, seeded with the adjoint of the values it produced, swept, and rewound. So a
// program's tape holds the carried values of every iteration and one iteration's records, not
// every iteration's records: one more forward of the body buys a tape that stays in cache. A
// loop whose records fit a budget is recorded whole instead, as a plain loop.
#pragma once

#include "tilegrad/ad/adjoint.hpp"
#include "tilegrad/ad/context.hpp"
#include "tilegrad/ad/jitter.hpp"
#include "tilegrad/ad/tape.hpp"
#include "tilegrad/ad/tile.hpp"
#include "tilegrad/core/config.hpp"
#include "tilegrad/grid/loop.hpp"
#include "tilegrad/grid/program.hpp"
#include "tilegrad/memory/block_ptr.hpp"
#include "tilegrad/memory/checked.hpp"
#include "tilegrad/memory/tracking.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <source_location>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#ifdef TILEGRAD_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace tilegrad::ad {

namespace loop_detail {

template <class C>
inline constexpr bool is_block_ptr_v = false;
template <class T, int... Bs>
inline constexpr bool is_block_ptr_v<block_ptr<T, Bs...>> = true;

// (A tile of more than inline_tile_bytes keeps its values on the heap: not trivially copyable,
// and kept by copies all the same.)
template <class C>
inline constexpr bool is_plain_tile_v = requires {
  typename C::shape_type;
  typename C::value_type;
}
&&std::is_copy_constructible_v<C> && !tilegrad::detail::is_adjoint_tile_v<C>;

/// How one carried value that holds no adjoint (a number, a block pointer, a plain tile) is kept:
/// a copy of its value at the start of every iteration.
template <class C>
struct carried_slot {
  static_assert(std::is_arithmetic_v<C> || is_block_ptr_v<C> || is_plain_tile_v<C>,
                "tilegrad::loop: carry tiles, numbers and block pointers (in reverse mode the "
                "loop keeps a copy of each per iteration): a value taken out of a tile (x.item()) "
                "is carried as a rank-0 tile, a pointer tile as the integer offset it moves by");
  std::vector<C> saved;

  void start(tape&, int n, C const& init) {
    saved.reserve(static_cast<std::size_t>(n));
    saved.push_back(init);
  }
  void stage(tape&, C const&) {}
  void keep(int t, int n, tape&, C const& c, bool) { // a value: the rewind leaves it as it is
    if (t < n)
      saved.push_back(c);
  }
  C restore(int t, tape&) const { return saved[static_cast<std::size_t>(t)]; }
  // Whether c, what a replay of iteration t carried on, is what its first run carried on (as far
  // as kept: not the loop's result).
  bool reproduces(int t, C const& c) const {
    std::size_t const k = static_cast<std::size_t>(t) + 1;
    if (k >= saved.size())
      return true;
    C const& was = saved[k];
    if constexpr (std::is_arithmetic_v<C>)
      return std::memcmp(&was, &c, sizeof(C)) == 0;
    else if constexpr (is_block_ptr_v<C>)
      return was.offsets() == c.offsets() && was.data() == c.data();
    else
      return std::memcmp(was.data(), c.data(), sizeof(typename C::value_type) * C::size) == 0;
  }
  void seed(C const&) const {}
  void take(C const&) {}
  void finish() const {}
};

/// An adjoint tile: its values at the start of every iteration and after the last, each on the
/// tape where the iteration before it was rewound (a stack of values, one iteration's records
/// above them at a time). Under rounding jitter (ad/jitter.hpp) their error estimates too, as a
/// plain loop keeps them.
template <class T, int... Ns>
struct carried_slot<tile<adjoint<T>, Ns...>> {
  using tile_type = tile<adjoint<T>, Ns...>;
  static constexpr int size = tile_type::size;
  std::vector<T*> saved; // n + 1
  T* init_adj = nullptr;
  // The adjoint of the loop's result; in the sweep, that of the values at the start of the
  // iteration swept last (the adjoint its previous iteration's result receives).
  T* adj = nullptr;
  T* staging = nullptr; // the values an iteration produced, while its records are rewound
  T* staging_errors = nullptr; // and their error estimates (jitter only)
  bool staged_errors = false;

  void start(tape& tp, int n, tile_type const& init) {
    saved.reserve(static_cast<std::size_t>(n + 1));
    saved.push_back(init.values()); // below the loop on the tape, and immutable
    init_adj = init.adjoints();
    adj = tp.alloc_zero<T>(size);
    staging = tp.alloc<T>(size);
    if (jitter_active<T>())
      staging_errors = tp.alloc<T>(size);
  }
  void stage(tape& tp, tile_type const& c) {
    std::memcpy(staging, c.values(), sizeof(T) * size);
    staged_errors = false;
    if (staging_errors)
      if (void const* e = tp.errors_of(c.values())) {
        std::memcpy(staging_errors, e, sizeof(T) * size);
        staged_errors = true;
      }
  }
  // After the rewind: the values carried into iteration t (the result, after the last), which
  // the next iteration reads as a constant (the forward runs do not record).
  void keep(int t, int n, tape& tp, tile_type& c, bool recording) {
    T* v = tp.alloc<T>(size);
    std::memcpy(v, staging, sizeof(T) * size);
    if (staged_errors) { // (kept below every later mark: a replay of iteration t finds them)
      T* e = tp.alloc<T>(size);
      std::memcpy(e, staging_errors, sizeof(T) * size);
      tp.set_errors(v, e);
    }
    saved.push_back(v);
    c = tile_type::from_buffers(v, t == n && recording ? adj : nullptr);
  }
  tile_type restore(int t, tape& tp) const {
    return tile_type::from_buffers(saved[static_cast<std::size_t>(t)], tp.alloc_zero<T>(size));
  }
  bool reproduces(int t, tile_type const& c) const {
    return std::memcmp(saved[static_cast<std::size_t>(t) + 1], c.values(), sizeof(T) * size) == 0;
  }
  // The values the iteration produced receive the adjoint the iterations after it handed back.
  void seed(tile_type const& c) const {
    if (!c.active())
      return;
    T* d = c.adjoints();
    for (int i = 0; i < size; ++i)
      d[i] += adj[i];
  }
  void take(tile_type const& start) { std::memcpy(adj, start.adjoints(), sizeof(T) * size); }
  void finish() const {
    if (init_adj)
      for (int i = 0; i < size; ++i)
        init_adj[i] += adj[i];
  }
};

[[gnu::noinline]] inline std::uintptr_t stack_here() {
  return reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
}

/// The addresses a by-reference capture of the kernel's locals would hold: the kernel's stack
/// frames, between this call and the frame of the vjp program that runs the kernel (where its
/// program object lives). Under AddressSanitizer with detect_stack_use_after_return the locals
/// live in heap-allocated fake frames instead: then the fake frame that holds the body itself
/// (the body is a temporary of the frame that defines it, beside the locals it could capture).
/// Any live fake frame would be too wide: a closure's padding bytes hold whatever the stack held
/// before, and a stale pointer into some caller's frame would fail a correct kernel.
struct kernel_frames {
  std::uintptr_t lo = 0, hi = 0;
  bool holds(std::uintptr_t a) const { return a >= lo && a < hi; }
};
inline kernel_frames frames_of(void const* body, program const* p) {
#ifdef TILEGRAD_ASAN
  if (void* fs = __asan_get_current_fake_stack()) {
    void *beg = nullptr, *end = nullptr;
    if (__asan_addr_is_in_fake_stack(fs, const_cast<void*>(body), &beg, &end))
      return {reinterpret_cast<std::uintptr_t>(beg), reinterpret_cast<std::uintptr_t>(end)};
  }
#else
  (void)body;
#endif
  std::uintptr_t const lo = stack_here();
  std::uintptr_t const hi = reinterpret_cast<std::uintptr_t>(p);
  if (hi <= lo || hi - lo > (std::uintptr_t{1} << 26)) // not on this stack
    return {};
  return {lo, hi};
}

/// Whether the closure's padding can be told from its members (below).
#if defined(__has_builtin)
#if __has_builtin(__builtin_clear_padding)
#define TILEGRAD_LOOP_CLEAR_PADDING 1
#endif
#endif

/// Refuses a body that captures a local of the kernel by reference: the sweep runs the body
/// after the kernel returned. A by-reference capture is the address of the local, so a word of
/// the closure pointing into the kernel's stack frames is one. (Tiles, tensors and block pointers
/// captured by value hold addresses of the tape and of tensor data, never of the stack.) Only the
/// members are read: the words of a copy whose padding is cleared. A closure's padding holds what
/// the stack held before, often an address in these very frames (a plain tile is 64-byte
/// aligned, so a body capturing a number and an offset tile has 60 bytes of it).
template <class Body>
void check_captures(Body const& body, std::source_location const& where) {
  program const* p = tilegrad::detail::current_program();
  kernel_frames const frames = frames_of(std::addressof(body), p);
  alignas(Body) unsigned char bytes[sizeof(Body)];
  std::memset(bytes, 0, sizeof bytes);
  // (The zeros must stay where the copy's members leave padding: without this, the compiler may
  // drop the memset as dead before the copy's lifetime begins, and the padding of a closure that
  // cannot be cleared below holds what the stack held.)
  asm volatile("" : : "r"(bytes) : "memory");
  Body* const copy = ::new (static_cast<void*>(bytes)) Body(body);
#ifdef TILEGRAD_LOOP_CLEAR_PADDING
  if constexpr (std::is_trivially_copyable_v<Body>) // the builtin takes no other
    __builtin_clear_padding(copy);
#endif
  bool captured = false;
  for (std::size_t off = 0; off + sizeof(std::uintptr_t) <= sizeof(Body);
       off += alignof(std::uintptr_t)) {
    std::uintptr_t w = 0;
    std::memcpy(&w, bytes + off, sizeof w);
    captured |= frames.holds(w);
  }
  copy->~Body();
  if (captured)
    throw std::invalid_argument(
        "tilegrad::vjp: the body of tg::loop at " + tilegrad::detail::where_string(where) +
        ", run by " + (p ? p->describe() : std::string("host code")) +
        ", holds the address of a local variable of the kernel: in reverse mode the body runs "
        "again in the sweep, after the kernel returned. Either it captures a local by reference "
        "(capture by value, [=]: tiles, tensors and block pointers are small values), or it "
        "captures by value an unevaluated expression that refers to a local tile (auto mask = "
        "offs < n; keeps a reference to offs): give such an expression a tile type "
        "(tg::tile<bool, N> const mask = offs < n;) or write it inside the body.");
}

/// While it lives, the running program is inside a loop body (stores are refused); replaying,
/// its accesses are not recorded again, and loads from tensors in `stored_after` are refused.
class body_scope {
public:
  body_scope(program_state& st, bool replay, std::uint64_t stored_after, std::size_t after_loop,
             std::size_t log_after_loop)
      : st_(st), replaying_(st.replaying), stored_after_(st.stored_after),
        after_loop_(st.after_loop), log_after_loop_(st.log_after_loop) {
    ++st.loop_depth;
    if (replay && !st.replaying) { // the outermost loop replayed: what came after it counts
      st.replaying = true;
      st.stored_after = stored_after;
      st.after_loop = after_loop;
      st.log_after_loop = log_after_loop;
    }
  }
  ~body_scope() {
    --st_.loop_depth;
    st_.replaying = replaying_;
    st_.stored_after = stored_after_;
    st_.after_loop = after_loop_;
    st_.log_after_loop = log_after_loop_;
  }
  body_scope(body_scope const&) = delete;
  body_scope& operator=(body_scope const&) = delete;

private:
  program_state& st_;
  bool replaying_;
  std::uint64_t stored_after_;
  std::size_t after_loop_, log_after_loop_;
};

/// The length of the running program's log of accesses to tensors vjp does not differentiate
/// (0 when it keeps none).
inline std::size_t log_length() {
  tilegrad::detail::access_hooks const* h = tilegrad::detail::current_hooks();
  return h && h->log ? h->log->accesses.size() : 0;
}

/// Refuses a replay of a tg::loop iteration whose body read other values than its first run did
/// from tensors vjp does not differentiate.
[[noreturn]] inline void loads_changed(std::source_location const& where, int index) {
  program const* p = tilegrad::detail::current_program();
  throw std::invalid_argument(
      "tilegrad::vjp: " + (p ? p->describe() : std::string("host code")) +
      ": the body of tg::loop (at " + tilegrad::detail::where_string(where) + "), iteration " +
      std::to_string(index) + ", read other values from a tensor vjp does not differentiate (an " +
      "integer tensor) when the reverse sweep ran it again: another program changed them since " +
      "its first run (an atomic on a counter or flag the body reads), and the replay would " +
      "differentiate another path. Write this loop as a plain for loop, or read the value " +
      "before the loop and carry it.");
}

/// Refuses a replay of a tg::loop iteration that carried on other values than its first run:
/// the body depends on something the loop does not carry.
[[noreturn]] inline void replay_differs(std::source_location const& where, int index, int which) {
  program const* p = tilegrad::detail::current_program();
  throw std::invalid_argument(
      "tilegrad::vjp: " + (p ? p->describe() : std::string("host code")) +
      ": the body of tg::loop (at " + tilegrad::detail::where_string(where) + "), iteration " +
      std::to_string(index) + ", gave carried value " + std::to_string(which) +
      " (counting from 0) other values when the reverse sweep ran it again from the same carried "
      "values: the body reads or changes something the loop does not carry (a tile or number "
      "reached through a pointer or reference it captures, state kept outside the kernel), so "
      "its gradient would be taken along another path. Carry every value that changes from one "
      "iteration to the next.");
}

inline int loop_index(int begin, int step, int t) {
  return static_cast<int>(std::int64_t{begin} + std::int64_t{t} * step);
}

/// Runs one iteration of the body as an iteration of its own on the tape: an adjoint tile made
/// or assigned in it is read after a rewind dropped its records only by mistake (a tile kept
/// through a pointer, not carried), and is refused then (ad/tile.hpp).
template <class Body, class... C>
void run_iteration(tape& tp, std::source_location const& where, Body const& body, int index,
                   C&... carried) {
  struct scope {
    tape& tp;
    std::uint64_t outer;
    ~scope() { tp.end_iteration(outer); }
  } const s{tp, tp.begin_iteration(&where)};
  body(index, carried...);
}

/// The record of a whole loop: the body (a copy), its carried values per iteration.
template <class Body, class... C>
struct loop_record final : record {
  Body body;
  int begin, step, n;
  std::tuple<carried_slot<C>...> slots;
  std::size_t end_access; // the program's accesses recorded up to the end of the loop
  std::size_t end_log;    // and its log's (log_length())
  // Under rounding jitter, the program's stream of draws at the start of each iteration: a replay
  // draws what the forward run drew, and recomputes the values it carried on.
  std::vector<std::uint64_t> draws;
  // Per iteration, the digest of the values its body loaded from tensors vjp does not
  // differentiate (program_state::load_digest): a replay must read the same.
  std::vector<std::uint64_t> digests;
  std::source_location where;

  loop_record(Body const& b, int b0, int s, int count, std::tuple<carried_slot<C>...>&& sl,
              std::size_t acc, std::size_t log, std::vector<std::uint64_t>&& d,
              std::vector<std::uint64_t>&& dg, std::source_location const& w)
      : body(b), begin(b0), step(s), n(count), slots(std::move(sl)), end_access(acc),
        end_log(log), draws(std::move(d)), digests(std::move(dg)), where(w) {}

  void backward() override { replay(std::index_sequence_for<C...>{}); }

  template <std::size_t... I>
  void replay(std::index_sequence<I...>) {
    program_state& st = *current_state();
    tape& tp = st.t;
    std::uint64_t stored_after = 0; // tensors the program wrote after the loop
    auto const& acc = st.out->accesses;
    for (std::size_t i = end_access; i < acc.size(); ++i)
      if (acc[i].kind != access_kind::load)
        stored_after |= std::uint64_t{1} << acc[i].tensor;
    body_scope const scope(st, true, stored_after, end_access, end_log);
    std::uint64_t const outer = st.load_digest;
    for (int t = n - 1; t >= 0; --t) {
      auto const m = tp.mark();
      if (!draws.empty())
        st.jitter_state = draws[static_cast<std::size_t>(t)];
      std::tuple<C...> const start{std::get<I>(slots).restore(t, tp)...};
      std::tuple<C...> cur = start;
      st.load_digest = 0;
      run_iteration(tp, where, body, loop_index(begin, step, t), std::get<I>(cur)...);
      if (st.load_digest != digests[static_cast<std::size_t>(t)])
        loads_changed(where, loop_index(begin, step, t));
      // (Not under whole moves of the rounding jitter: an inner loop recorded whole in the replay
      // but checkpointed in the first run draws a captured value's move once, not per iteration,
      // and the replay moves the values a little otherwise; the estimate allows that.)
      int differs = -1, k = 0; // the first carried value the replay did not reproduce
      if (!whole_moves())
        ((differs =
              differs < 0 && !std::get<I>(slots).reproduces(t, std::get<I>(cur)) ? k : differs,
          ++k),
         ...);
      if (differs >= 0)
        replay_differs(where, loop_index(begin, step, t), differs);
      (std::get<I>(slots).seed(std::get<I>(cur)), ...);
      tp.sweep_from(m);
      (std::get<I>(slots).take(std::get<I>(start)), ...);
      tp.rewind(m);
    }
    (std::get<I>(slots).finish(), ...);
    st.load_digest = outer;
  }
};

/// Loops whose records would take at most this many bytes of a program's tape (estimated from
/// their first iteration) record them, as a plain loop: below a few MiB, replaying each iteration
/// in the sweep costs more than the cache misses of the tape it saves (docs/performance.md,
/// FlashAttention at N = 1024). 0 checkpoints every tg::loop. One setting for all threads.
inline std::atomic<std::size_t>& loop_record_budget_setting() {
  static std::atomic<std::size_t> bytes{std::size_t{8} << 20};
  return bytes;
}
inline std::size_t loop_record_budget() {
  return loop_record_budget_setting().load(std::memory_order_relaxed);
}

/// Turns recording off while it lives (restoring what it was).
class recording_off {
public:
  explicit recording_off(tape& tp) : tp_(tp), was_(tp.recording()) { tp.set_recording(false); }
  ~recording_off() { tp_.set_recording(was_); }
  recording_off(recording_off const&) = delete;
  recording_off& operator=(recording_off const&) = delete;

private:
  tape& tp_;
  bool was_;
};

template <class Body, class... C, std::size_t... I>
void run_checkpointed(program_state& st, int begin, int step, int n, Body const& body,
                      std::source_location const& where, std::index_sequence<I...>,
                      C&... carried) {
  tape& tp = st.t;
  bool const recording = tp.recording(); // off: inside the forward run of an enclosing loop
  bool rerun_first = false;              // iteration 0 ran already: its accesses are recorded
  std::uint64_t const first_draw = st.jitter_state;
  std::uint64_t const outer_digest = st.load_digest;
  if (recording) {
    // The first iteration, recorded: if the whole loop's records fit the budget, it goes on as
    // a plain loop (a replay costs more than the cache misses of a tape that small).
    std::tuple<C...> const init{carried...};
    std::size_t const before = tp.in_use();
    auto const m0 = tp.mark();
    body_scope const scope(st, false, 0, 0, 0);
    // (Each iteration's digest is folded into the enclosing one's the same way on every path, so
    // that an enclosing loop's replay, which records this loop, reads what its first run did.)
    st.load_digest = 0;
    run_iteration(tp, where, body, loop_index(begin, step, 0), carried...);
    std::size_t const per_iteration = tp.in_use() - before;
    if (per_iteration * static_cast<std::size_t>(n) <= loop_record_budget()) {
      std::uint64_t fold = mix_digest(outer_digest, st.load_digest, 0);
      for (int t = 1; t < n; ++t) {
        st.load_digest = 0;
        run_iteration(tp, where, body, loop_index(begin, step, t), carried...);
        fold = mix_digest(fold, st.load_digest, t);
      }
      st.load_digest = fold;
      return;
    }
    tp.rewind(m0);
    std::tie(carried...) = init;
    st.jitter_state = first_draw; // (drawn again as they were)
    rerun_first = true;
  }
  std::vector<std::uint64_t> digests(static_cast<std::size_t>(recording ? n : 0));
  std::vector<std::uint64_t> draws;
  if (recording && rounding_jitter().seed != 0)
    draws.reserve(static_cast<std::size_t>(n));
  std::tuple<carried_slot<C>...> slots;
  (std::get<I>(slots).start(tp, n, carried), ...);
  std::uint64_t outer_fold = outer_digest; // what an enclosing loop's iteration read, this loop's
  {
    recording_off const values_only(tp);
    for (int t = 0; t < n; ++t) {
      // (Iteration 0 again: nothing was written after the loop yet.)
      body_scope const scope(st, t == 0 && rerun_first, 0, st.out->accesses.size(), log_length());
      auto const m = tp.mark();
      if (draws.capacity() != 0)
        draws.push_back(st.jitter_state);
      st.load_digest = 0;
      run_iteration(tp, where, body, loop_index(begin, step, t), carried...);
      if (recording)
        digests[static_cast<std::size_t>(t)] = st.load_digest;
      outer_fold = mix_digest(outer_fold, st.load_digest, t);
      (std::get<I>(slots).stage(tp, carried), ...);
      tp.rewind(m);
      (std::get<I>(slots).keep(t + 1, n, tp, carried, recording), ...);
    }
  }
  st.load_digest = outer_fold;
  if (recording)
    tp.push<loop_record<Body, C...>>(body, begin, step, n, std::move(slots),
                                     st.out->accesses.size(), log_length(), std::move(draws),
                                     std::move(digests), where);
}

} // namespace loop_detail

namespace loop_detail {

/// Refuses one variable carried twice (`loop(0, n, 1, acc, acc, body)`): each carried value keeps
/// its own copies per iteration and hands its own adjoints back, and two of them writing one
/// variable would lose one's share of the gradient once the loop is checkpointed.
template <class... C>
void check_distinct(std::source_location const& where, C const&... carried) {
  void const* const at[] = {static_cast<void const*>(std::addressof(carried))...};
  for (std::size_t i = 0; i < sizeof...(C); ++i)
    for (std::size_t j = i + 1; j < sizeof...(C); ++j)
      if (at[i] == at[j])
        throw std::invalid_argument(
            "tilegrad::vjp: tg::loop at " + tilegrad::detail::where_string(where) +
            " carries one variable twice (carried values " + std::to_string(i + 1) + " and " +
            std::to_string(j + 1) + "): carry each variable once, and copy it first where the "
            "body needs two values that start equal.");
}

} // namespace loop_detail

template <class Body, class... C>
void checkpointed_loop(int begin, int end, int step, Body const& body,
                       std::source_location const& where, C&... carried) {
  if constexpr (sizeof...(C) > 1)
    loop_detail::check_distinct(where, carried...);
  int const n = tilegrad::detail::trip_count(begin, end, step, where);
  program_state* st = current_state();
  if (!st) { // adjoint tiles outside vjp: recorded, never swept
    for (int t = 0; t < n; ++t)
      body(loop_detail::loop_index(begin, step, t), carried...);
    return;
  }
  if (n == 0)
    return;
  loop_detail::check_captures(body, where);
  loop_detail::run_checkpointed(*st, begin, step, n, body, where,
                                std::index_sequence_for<C...>{}, carried...);
}

} // namespace tilegrad::ad

namespace tilegrad {

/// Sets the tape budget of tg::loop in reverse mode (bytes; default 8 MiB): a loop whose records
/// would fit it records them as a plain loop, a larger one is checkpointed; 0 checkpoints every
/// loop. Returns the previous budget. Gradients are the same either way, bitwise.
inline std::size_t set_loop_record_budget(std::size_t bytes) {
  return ad::loop_detail::loop_record_budget_setting().exchange(bytes);
}

} // namespace tilegrad
