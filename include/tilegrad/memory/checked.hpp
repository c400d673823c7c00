// Checked memory access: the switch, and the error an out-of-bounds access throws (naming the
// program, the tensor, the element, the extent and the source line of the load or store), and
// the error a race between two programs throws.
#pragma once

#include "tilegrad/core/config.hpp"
#include "tilegrad/core/types.hpp"
#include "tilegrad/grid/program.hpp"
#include "tilegrad/memory/access_error.hpp"
#include "tilegrad/memory/runs.hpp"
#include "tilegrad/memory/tensor.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <source_location>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tilegrad {

namespace detail {
inline std::atomic<bool>& checked_flag() {
#if defined(TILEGRAD_CHECKED)
  static std::atomic<bool> on{TILEGRAD_CHECKED != 0};
#elif defined(NDEBUG)
  static std::atomic<bool> on{false};
#else
  static std::atomic<bool> on{true};
#endif
  return on;
}
} // namespace detail

namespace detail {
/// The checked_scope objects open in the process, oldest first, with the value each sets, and
/// the value set_checked() gave (what applies when none is open). Scopes of several threads may
/// end in any order: each leaves the list, and the newest one still open decides.
struct checked_scopes {
  std::mutex m;
  std::vector<std::pair<void const*, bool>> open;
  bool base = checked_flag().load(std::memory_order_relaxed);

  void settle() { checked_flag().store(open.empty() ? base : open.back().second); }
  static checked_scopes& get() {
    static checked_scopes s;
    return s;
  }
};
} // namespace detail

/// Whether loads, stores and atomics check their addresses: on by default in debug builds
/// (without NDEBUG), off in release builds; TILEGRAD_CHECKED=0/1 sets the default.
inline bool checked() { return detail::checked_flag().load(std::memory_order_relaxed); }
/// Sets whether they check, from now on: the value that applies whenever no checked_scope is
/// open (one that is open is overridden until the next scope opens or ends).
inline void set_checked(bool on) {
  auto& s = detail::checked_scopes::get();
  std::lock_guard<std::mutex> lock(s.m);
  s.base = on;
  detail::checked_flag().store(on, std::memory_order_relaxed);
}

/// Turns checking on (or off) for a scope. The switch is the process's, read by every program of
/// every launch: scopes nest, and where scopes of several threads overlap, the one opened last
/// that is still open decides (its end gives the decision back to the one before, or to
/// set_checked()'s value), whatever order they end in. For checking one launch only, set
/// `launch_options::check_bounds`.
class checked_scope {
public:
  explicit checked_scope(bool on = true) {
    auto& s = detail::checked_scopes::get();
    std::lock_guard<std::mutex> lock(s.m);
    s.open.emplace_back(this, on);
    s.settle();
  }
  ~checked_scope() {
    auto& s = detail::checked_scopes::get();
    std::lock_guard<std::mutex> lock(s.m);
    for (auto it = s.open.end(); it != s.open.begin();)
      if ((--it)->first == this) {
        s.open.erase(it);
        break;
      }
    s.settle();
  }
  checked_scope(checked_scope const&) = delete;
  checked_scope& operator=(checked_scope const&) = delete;
};

namespace detail {

class launch_tracker;
struct program_log;

/// A tensor a checked launch takes, as its errors name it: a view made inside a program (x[b][h])
/// is found among them by its memory, and named by its rows ('x[1][2]').
struct arg_layout {
  std::size_t elem_size = 0;
  tensor<std::byte const> layout; // data in bytes; shape and strides in elements
};

/// The layouts of the tensors among a launch's arguments.
template <class... A>
std::vector<arg_layout> arg_layouts(A const&... a) {
  std::vector<arg_layout> out;
  [[maybe_unused]] auto add = [&]<class X>(X const& x) { // (unused when a launch takes nothing)
    if constexpr (requires { typename X::element_type; x.strides(); x.rank(); })
      if (x.numel() > 0)
        out.push_back({sizeof(typename X::element_type),
                       tensor<std::byte const>(reinterpret_cast<std::byte const*>(x.data()),
                                               x.rank(), x.shape(), x.strides(), x.name())});
  };
  (add(a), ...);
  return out;
}

/// A tensor a launch differentiates: vjp's `in`, `inout` and `out` tensors, jvp's tangent ones,
/// and the caller's tensors of which a reference differentiates copies (check_backward's
/// references, vjp_as, dot_product_test, taylor_test). A load of its elements through a view that
/// is not the launch's argument (a view the kernel captures) reads them as constants, and the
/// gradient along that path would be lost with no error: such a load throws, and so does a store or
/// an atomic, which would change values the launch does not follow (captured_access).
struct watched_tensor {
  std::string name;               // the argument's
  tensor<std::byte const> layout; // data: its first element; shape and strides in elements
  std::size_t elem = 1;           // bytes per element
  char const* by = "";            // "tilegrad::vjp", "tilegrad::jvp", for messages
  bool copy = false;              // the launch differentiates a copy of it

  /// The offset from the first element of an element whose bytes overlap the `bytes` bytes at
  /// `at`; -1: none.
  std::int64_t element_at(void const* at, std::size_t bytes) const {
    auto const lo = reinterpret_cast<std::intptr_t>(layout.data());
    auto const e = static_cast<std::intptr_t>(elem);
    std::intptr_t const from = std::max<std::intptr_t>(reinterpret_cast<std::intptr_t>(at) - lo, 0);
    std::intptr_t const to = std::min<std::intptr_t>(reinterpret_cast<std::intptr_t>(at) +
                                                         static_cast<std::intptr_t>(bytes) - lo,
                                                     static_cast<std::intptr_t>(layout.span()) * e);
    for (std::intptr_t d = from / e * e; d < to; d += e)
      if (layout.contains(d / e))
        return d / e;
    return -1;
  }
  /// Whether the `bytes` bytes at `at` overlap its span.
  bool overlaps(void const* at, std::int64_t bytes) const {
    auto const lo = reinterpret_cast<std::intptr_t>(layout.data());
    auto const b = reinterpret_cast<std::intptr_t>(at);
    return b < lo + static_cast<std::intptr_t>(layout.span() * static_cast<std::int64_t>(elem)) &&
           lo < b + static_cast<std::intptr_t>(bytes);
  }
};

template <class E>
watched_tensor watched_of(std::string name, tensor<E> const& t) {
  return {std::move(name),
          tensor<std::byte const>(reinterpret_cast<std::byte const*>(t.data()), t.rank(), t.shape(),
                                  t.strides()),
          sizeof(E)};
}

/// The caller's tensors of which the vjp and jvp calls of this thread differentiate copies (a
/// reference of check_backward, vjp_as): watched by their launches besides their own tensors.
/// A watching_originals scope adds them.
inline std::vector<watched_tensor>& watched_originals() {
  thread_local std::vector<watched_tensor> v;
  return v;
}
class watching_originals {
public:
  explicit watching_originals(std::vector<watched_tensor> const& t)
      : size_(watched_originals().size()) {
    watched_originals().insert(watched_originals().end(), t.begin(), t.end());
  }
  ~watching_originals() {
    auto& v = watched_originals();
    v.erase(v.begin() + static_cast<std::ptrdiff_t>(size_), v.end());
  }
  watching_originals(watching_originals const&) = delete;
  watching_originals& operator=(watching_originals const&) = delete;

private:
  std::size_t size_;
};

/// Set by jvp around its launch, on the thread that launches: the tensors the launch's hooks
/// watch (access_hooks::watched).
inline std::vector<watched_tensor> const*& watched_memory() {
  thread_local std::vector<watched_tensor> const* w = nullptr;
  return w;
}

/// What loads, stores and atomics consult (current_hooks()) while a program of a checked launch
/// runs: with a tracker, they record into the program's log; without, they only check bounds.
struct access_hooks {
  launch_tracker* tracker = nullptr;
  program_log* log = nullptr;
  // Reverse mode (vjp) on tensors that are not differentiated (integer tensors): called before a
  // store or an atomic, and with each load's lanes (the tracked tensor and its runs) before it
  // joins the log (false: it does not, a load replayed in a sweep); each may throw (a write
  // inside a tg::loop body; a replayed load of an element the program wrote after the loop).
  void (*before_write)(char const* what, std::source_location const& loc) = nullptr;
  bool (*on_load)(access_hooks const& h, int tensor, std::vector<run> const& runs,
                  std::source_location const& loc) = nullptr;
  // vjp: writes to tensors the launch does not take (captures) are not refused, and atomics are
  // logged as op_unraced (integer locks, flags and counters synchronise programs; they are not
  // races, but a tg::loop replayed after one would read the value it left).
  bool lenient = false;
  // A launch that checks races and takes no writable tensor (it tracks none): every write goes to
  // a tensor it does not take (a capture), and is refused as in a launch that tracks some.
  bool refuse_writes = false;
  // check_backward's measure of bf16 sums kept in memory: stores to the tracked bf16 tensors
  // marked `jitter` move each element stored by one unit in the last place, up or down as this
  // seed (mixed with the program, the access and the element) says; 0: off.
  std::uint64_t bf16_jitter = 0;
  // The launch's tensors, for the names of views made inside a program in error messages.
  std::vector<arg_layout> const* args = nullptr;
  // jvp: the tensors are copies (of duals), each an allocation of its own, so every element an
  // access of a custom scalar reaches must be one of the tensor's its view was made from
  // (confine_run); a view made in the kernel from one's data reaching past it would read memory
  // that holds no copy of anything.
  bool confined = false;
  // vjp and jvp: the tensors the launch differentiates (watched_tensor); a load through a view
  // that is not an argument (its element type is not the launch's) that reads one throws.
  std::vector<watched_tensor> const* watched = nullptr;
};

/// Set by jvp around its launch, on the thread that launches: the launch's hooks confine accesses
/// (access_hooks::confined).
inline bool& confine_accesses() {
  thread_local bool on = false;
  return on;
}

TILEGRAD_MACHINERY std::string where_string(std::source_location const& loc)
#if TILEGRAD_MACHINERY_BODIES
{
  return std::string(loc.file_name()) + ":" + std::to_string(loc.line());
}
#else
;
#endif

TILEGRAD_MACHINERY std::string tensor_label(char const* name)
#if TILEGRAD_MACHINERY_BODIES
{
  return name && *name ? std::string("'") + name + "'" : std::string("(unnamed)");
}
#else
;
#endif

/// tensor_label of a view of `rank` axes at `data` (elements of elem_size bytes, extents
/// `shape`): a view made inside a program of a launch that takes its tensor (t[i], t[b][h]) is
/// named by its rows, 'x[1][2]', where the running launch's tensors show them.
TILEGRAD_MACHINERY std::string view_label(char const* name, void const* data,
                                          std::size_t elem_size, int rank,
                                          std::int64_t const* shape)
#if TILEGRAD_MACHINERY_BODIES
{
  access_hooks const* h = current_hooks();
  if (!h || !h->args || !name || !*name)
    return tensor_label(name);
  auto const* at = static_cast<std::byte const*>(data);
  for (arg_layout const& a : *h->args) {
    tensor<std::byte const> const& t = a.layout;
    int const lead = t.rank() - rank;
    if (a.elem_size != elem_size || lead <= 0 || std::string_view(t.name()) != name ||
        at < t.data() || (at - t.data()) % static_cast<std::ptrdiff_t>(elem_size) != 0)
      continue;
    bool same = true; // the view's axes are the tensor's last ones
    for (int d = 0; d < rank; ++d)
      same = same && t.size(lead + d) == shape[d];
    std::int64_t off = (at - t.data()) / static_cast<std::ptrdiff_t>(elem_size);
    if (!same || off >= t.span())
      continue;
    // The leading indices, outermost first, then checked: the stride order is not assumed.
    std::string rows;
    for (int d = 0; d < lead && same; ++d) {
      std::int64_t const s = t.stride(d);
      std::int64_t const i = s > 0 ? off / s : 0;
      same = i >= 0 && i < t.size(d);
      off -= i * s;
      rows += "[" + std::to_string(i) + "]";
    }
    if (same && off == 0)
      return "'" + std::string(name) + rows + "'";
  }
  return tensor_label(name);
}
#else
;
#endif

/// Throws access_error for an access of `what` ("load", "store", ...) at `offset` elements
/// from the start of the tensor whose layout is t, which lies outside it.
[[noreturn]] TILEGRAD_MACHINERY void out_of_bounds_of(tensor<std::byte const> const& t,
                                                      std::size_t elem_size, std::int64_t offset,
                                                      char const* what,
                                                      std::source_location const& loc)
#if TILEGRAD_MACHINERY_BODIES
{
  program const* p = current_program();
  std::string const prog = p ? p->describe() : std::string("host code");
  std::string const elem = t.coordinates(offset);
  std::string const head = "tilegrad: out-of-bounds " + std::string(what) + " by " + prog +
                           ": tensor " +
                           view_label(t.name(), t.data(), elem_size, t.rank(), t.shape().data()) +
                           " has shape " + t.shape_string();
  if (offset >= 0 && t.element_at_or_before(offset) >= 0) {
    // Between two elements of the view (a stride left out of an offset).
    std::string strides = "(";
    for (int a = 0; a < t.rank(); ++a)
      strides += (a ? ", " : "") + std::to_string(t.stride(a));
    throw access_error(head + " and strides " + strides + "), offset " + std::to_string(offset) +
                           " lies between its elements (after element " + elem +
                           "): was an offset not multiplied by its stride? At " +
                           where_string(loc),
                       prog, t.name(), elem, loc);
  }
  throw access_error(head + ", element " + elem + " (offset " + std::to_string(offset) +
                         ") is outside it, at " + where_string(loc),
                     prog, t.name(), elem, loc);
}
#else
;
#endif

/// Throws access_error for a program whose try at element `offset` of t (an atomic_cas that
/// finds another value than its compare value, or an atomic_xchg that finds the value it writes)
/// has failed again and again for `seconds`: a wait for something no program running beside it
/// does.
[[noreturn]] TILEGRAD_MACHINERY void
waited_too_long(tensor<std::byte const> const& t, std::size_t elem_size, std::int64_t offset,
                char const* what, std::uint64_t tries, double seconds,
                std::source_location const& loc)
#if TILEGRAD_MACHINERY_BODIES
{
  program const* p = current_program();
  std::string const prog = p ? p->describe() : std::string("host code");
  std::string const elem = t.coordinates(offset);
  throw access_error(
      "tilegrad: " + prog + " waits at " + where_string(loc) + ": its " + what + " on tensor " +
          view_label(t.name(), t.data(), elem_size, t.rank(), t.shape().data()) + ", element " +
          elem + " failed " + std::to_string(tries) + " times in a row over " +
          std::to_string(static_cast<long long>(seconds)) +
          " s. A program may wait for a lock that another running program holds, not for another "
          "program to start or to get somewhere: the programs of a launch run in any order, each "
          "thread runs its programs one after another (the sequential executor all of them), "
          "and a launch that checks races runs them in waves. Set the limit with "
          "tilegrad::set_wait_limit (seconds; 0: wait for ever).",
      prog, t.name(), elem, loc);
}
#else
    ;
#endif

/// Throws access_error for an access (op: a load, a store or an atomic) by a program of vjp or
/// jvp, through the view `view` (the name it carries), of element `offset` of t, a tensor the
/// launch differentiates: the view is not the launch's argument (a view the kernel captures), so
/// a load reads constants, and a write changes memory the launch does not follow.
[[noreturn]] TILEGRAD_MACHINERY void captured_access(watched_tensor const& t, std::int64_t offset,
                                                     char const* view, std::uint8_t op,
                                                     std::source_location const& loc)
#if TILEGRAD_MACHINERY_BODIES
{
  program const* p = current_program();
  std::string const prog = p ? p->describe() : std::string("host code");
  std::string const elem = t.layout.coordinates(offset);
  std::string const name = tensor_label(t.name.c_str());
  std::string const through =
      view && *view && t.name != view ? "a view named " + tensor_label(view) : "a view";
  bool const load = (op & 127) == 1; // op_load (tracking.hpp), without op_unraced
  std::string const verb = load ? "loads" : (op & 127) == 2 ? "stores to" : "writes atomically to";
  std::string const differentiates = t.copy ? "a copy of " + name : name;
  std::string const why =
      load ? ", and a load" + std::string(t.copy ? " of " + name + " itself" : "") +
                 " through such a view reads constants: the gradient along it would be lost."
           : ", and a write" + std::string(t.copy ? " to " + name + " itself" : "") +
                 " through such a view changes values the launch does not follow: the "
                 "derivatives would be those of another function.";
  std::string const fix =
      load ? " and read it through the argument."
           : " and write it through the argument (tg::inout where the launch reads it too).";
  throw access_error(std::string(t.by) + ": " + prog + " " + verb + " element " + elem + " of " +
                         name + " at " + where_string(loc) + " through " + through +
                         " that is not an argument of the launch (a tensor the kernel "
                         "captures?). The launch differentiates " +
                         differentiates + why + " Pass " + name + " to the kernel as an argument" +
                         fix,
                     prog, t.name, elem, loc);
}
#else
    ;
#endif

/// out_of_bounds_of for tensor t; only the layout matters, so one function serves every type.
template <class T>
[[noreturn]] void out_of_bounds(tensor<T> const& t, std::int64_t offset, char const* what,
                                std::source_location const& loc) {
  out_of_bounds_of(tensor<std::byte const>(reinterpret_cast<std::byte const*>(t.data()), t.rank(),
                                           t.shape(), t.strides(), t.name()),
                   sizeof(T), offset, what, loc);
}

/// Under confining hooks (jvp): refuses a run of n elements (elem bytes each) from `first`, with
/// `step` bytes between them, of which one is not an element of the launch's tensor that holds
/// `view` (the data of the view the kernel accessed), before it is accessed.
TILEGRAD_MACHINERY void confine_run(void const* view, void const* first, std::size_t elem,
                                    std::ptrdiff_t step, int n, char const* what,
                                    std::source_location const& loc)
#if TILEGRAD_MACHINERY_BODIES
{
  access_hooks const* h = current_hooks();
  if (!h || !h->confined || !h->args || n <= 0)
    return;
  auto const* v = static_cast<std::byte const*>(view);
  for (arg_layout const& a : *h->args) {
    std::byte const* const lo = a.layout.data();
    std::byte const* const hi = lo + a.layout.span() * static_cast<std::ptrdiff_t>(a.elem_size);
    if (a.elem_size != elem || v < lo || v >= hi)
      continue;
    auto const* f = static_cast<std::byte const*>(first);
    auto const e = static_cast<std::ptrdiff_t>(elem);
    bool const dense = a.layout.is_contiguous();
    // (A contiguous tensor holds every element of its span: a run inside it needs its ends.)
    if (dense && f >= lo && f + (n - 1) * step >= lo && f + (n - 1) * step < hi && f < hi &&
        (f - lo) % e == 0 && step % e == 0)
      return;
    for (int k = 0; k < n; ++k) {
      std::ptrdiff_t const d = f + k * step - lo;
      if (d >= 0 && d % e == 0 && a.layout.contains(d / e))
        continue;
      program const* p = current_program();
      std::string const who = p ? p->describe() : std::string("host code");
      std::string const name = tensor_label(a.layout.name());
      throw access_error("tilegrad::jvp: " + who + ", a " + what + " at " + where_string(loc) +
                         " through a view made from the data of tensor " + name +
                         ", reaches element offset " + std::to_string(d / std::ptrdiff_t(elem)) +
                         " from its first element, which is not an element of " + name +
                         ": jvp runs the kernel on a copy of each tensor, and a view reaching "
                         "past one reads no copy of anything. Pass the whole buffer as one tensor "
                         "and take its parts as views in the kernel.",
                         who, name, "offset " + std::to_string(d / std::ptrdiff_t(elem)), loc);
    }
    return;
  }
}
#else
;
#endif

/// Checks one offset (when checking is on).
template <class T>
TILEGRAD_INLINE void check_offset(tensor<T> const& t, std::int64_t offset, char const* what,
                                  std::source_location const& loc) {
  if (!t.contains(offset)) out_of_bounds(t, offset, what, loc);
  if constexpr (!is_builtin_v<std::remove_const_t<T>>) // (a custom scalar: jvp's duals)
    confine_run(t.data(), t.data() + offset, sizeof(T), 0, 1, what, loc);
}

/// Checks a contiguous run of n offsets from e; reports the first one outside.
template <class T>
TILEGRAD_INLINE void check_run(tensor<T> const& t, std::int64_t e, int n, char const* what,
                               std::source_location const& loc) {
  if (e < 0 || e + n > t.span() || !t.is_contiguous())
    for (int l = 0; l < n; ++l) check_offset(t, e + l, what, loc);
  else if constexpr (!is_builtin_v<std::remove_const_t<T>>)
    confine_run(t.data(), t.data() + e, sizeof(T), sizeof(T), n, what, loc);
}

} // namespace detail
} // namespace tilegrad
