// launch(grid, kernel, args...): runs a kernel once per program id, on TBB, OpenMP or a plain
// loop. The one header that includes TBB and OpenMP, so the rest of the library stays free of
// both and a build without them (the `scalar` preset) only loses the parallel executors.
#pragma once

#include "tilegrad/core/config.hpp"
#include "tilegrad/core/simd.hpp" // before TBB: immintrin.h is read under simd.hpp's pragmas
#include "tilegrad/core/types.hpp"
#include "tilegrad/grid/program.hpp"
#include "tilegrad/memory/tracking.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// (The executors below are machinery: with separate compilation only the file that compiles them
// reads TBB's headers, about 0.5 s of every other file's compile.)
#if TILEGRAD_USE_TBB && TILEGRAD_MACHINERY_BODIES
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/parallel_pipeline.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>
#include <tbb/task_group.h>
#endif

#if TILEGRAD_USE_OPENMP
#if !defined(_OPENMP)
// Without -fopenmp the pragma would be ignored and the "openmp" executor silently sequential.
#error "tilegrad: TILEGRAD_USE_OPENMP=1 needs -fopenmp (link OpenMP::OpenMP_CXX, or set it to 0)"
#endif
#if TILEGRAD_MACHINERY_BODIES
#include <mutex>
#include <omp.h>
#endif
#endif

namespace tilegrad {

/// How the programs of a launch are run.
enum class executor {
  tbb,        ///< tbb::parallel_for over runs of consecutive programs (the default when TBB is
              ///< compiled in; see program_chunk)
  openmp,     ///< `omp parallel for schedule(dynamic, program_chunk(...))`
  sequential, ///< a plain loop in linear order on the calling thread: deterministic, debuggable
};

/// "tbb", "openmp", "sequential", or "executor(<n>)" for a value that names none of them.
inline std::string to_string(executor e) {
  switch (e) {
  case executor::tbb:
    return "tbb";
  case executor::openmp:
    return "openmp";
  case executor::sequential:
    return "sequential";
  }
  return "executor(" + std::to_string(static_cast<int>(e)) + ")";
}

/// Whether `e` is compiled into this build (TILEGRAD_USE_TBB / TILEGRAD_USE_OPENMP).
constexpr bool executor_available(executor e) {
  switch (e) {
  case executor::tbb:
    return TILEGRAD_USE_TBB != 0;
  case executor::openmp:
    return TILEGRAD_USE_OPENMP != 0;
  case executor::sequential:
    return true;
  }
  return false;
}

namespace detail {
inline constexpr executor compiled_default_executor = TILEGRAD_USE_TBB      ? executor::tbb
                                                      : TILEGRAD_USE_OPENMP ? executor::openmp
                                                                            : executor::sequential;

// Process-wide defaults; atomics so that setting them races with no launch.
inline std::atomic<executor> default_executor{compiled_default_executor};
inline std::atomic<int> default_num_threads{0};

TILEGRAD_MACHINERY void check_executor(executor e, char const* who)
#if TILEGRAD_MACHINERY_BODIES
{
  if (!executor_available(e)) {
    auto const name = to_string(e);
    if (name.starts_with("executor("))
      throw std::invalid_argument(std::string(who) + ": unknown executor " + name);
    throw std::invalid_argument(std::string(who) + ": executor " + name +
                                " is not compiled into this build (TILEGRAD_USE_" +
                                (e == executor::tbb ? "TBB" : "OPENMP") + "=0)");
  }
}
#else
;
#endif

inline void check_num_threads(int n, char const* who) {
  if (n < 0)
    throw std::invalid_argument(std::string(who) + ": num_threads is " + std::to_string(n) +
                                "; it must be 0 (all hardware threads) or positive");
}
} // namespace detail

/// Options of one launch. A default-constructed value holds the process-wide defaults at the
/// moment of construction (see set_default_executor / set_num_threads), so
/// `launch_options{.num_threads = 2}` changes the thread count and keeps the default executor.
struct launch_options {
  executor exec = detail::default_executor.load(std::memory_order_relaxed);
  /// Most threads the launch uses; 0 = all hardware threads (TBB: the concurrency of the
  /// enclosing task arena, so a nested launch inherits its caller's limit; OpenMP:
  /// omp_get_max_threads(), which OMP_NUM_THREADS sets). Ignored by the sequential executor.
  int num_threads = detail::default_num_threads.load(std::memory_order_relaxed);
  /// Check every load, store and atomic of the launch against its tensor (access_error), whatever
  /// checked() says.
  bool check_bounds = false;
  /// Check the launch for races, and bounds: two programs writing one element (unless both only
  /// with atomics), or one reading an element another writes, throws race_error naming both
  /// programs, the tensor, the element and the source lines, unless both hold one lock or tickets
  /// order them (docs/checking.md). The programs record their accesses
  /// to the tensors the kernel takes as non-const views and run in waves; after each wave the
  /// records are replayed in program order, so the same race is reported whatever ran first and
  /// whatever the thread count. Costs a record per access and 16 bytes per element touched.
  bool check_races = false;
};

/// Process-wide default executor of launch(grid, ...) and of launch_options{}.
/// @throws std::invalid_argument when `e` is not compiled in.
inline void set_default_executor(executor e) {
  detail::check_executor(e, "tilegrad::set_default_executor");
  detail::default_executor.store(e, std::memory_order_relaxed);
}

/// Process-wide default thread count (0 = all hardware threads).
/// @throws std::invalid_argument when `n` is negative.
inline void set_num_threads(int n) {
  detail::check_num_threads(n, "tilegrad::set_num_threads");
  detail::default_num_threads.store(n, std::memory_order_relaxed);
}

/// The process-wide defaults.
inline launch_options default_options() {
  return launch_options{};
}

namespace detail {

/// Customization hook applied once per launch to every kernel argument; identity by default.
/// A type that should reach kernels as something else (an owning tensor as its view) declares
/// an overload found by argument-dependent lookup, best as a hidden friend:
///   friend tensor<T> kernel_arg(owning_tensor& t) { return t.view(); }
/// ADL finds it wherever its header is included relative to this one; an overload in
/// tilegrad::detail itself is only seen when declared before this header. What kernel_arg
/// returns must stay valid until launch returns (a value, or a reference into the argument).
template <class A>
constexpr A&& kernel_arg(A&& a) noexcept {
  return std::forward<A>(a);
}

// How a prepared argument is held for the duration of a launch, and so what the kernel sees:
// an lvalue reference stays one (the caller's object, its constness kept); a reference to a
// temporary is seen as a const lvalue (programs share it; none may change it for the others);
// a value returned by kernel_arg is stored once and seen as a const lvalue.
template <class R>
struct held_arg {
  using type = R const;
};
template <class R>
struct held_arg<R&> {
  using type = R&;
};
template <class R>
struct held_arg<R&&> {
  using type = R const&;
};

// The unqualified call, made from inside tilegrad::detail, finds the identity above by ordinary
// lookup and the argument type's own overloads by ADL (a qualified call would skip ADL).
template <class A>
constexpr decltype(auto) prepare_arg(A&& a) {
  return kernel_arg(std::forward<A>(a));
}
template <class A>
using held_arg_t = typename held_arg<decltype(prepare_arg(std::declval<A>()))>::type;

TILEGRAD_MACHINERY void validate(launch_options const& opts, grid const& g,
                                 char const* who = "tilegrad::launch")
#if TILEGRAD_MACHINERY_BODIES
{
  check_executor(opts.exec, who);
  check_num_threads(opts.num_threads, who);
  if (g.rank < 1 || g.rank > 3)
    throw std::invalid_argument(std::string(who) + ": grid rank is " + std::to_string(g.rank) +
                                "; it must be 1, 2 or 3");
  for (int axis = 0; axis < g.rank; ++axis) {
    int const extent = g.dims[static_cast<std::size_t>(axis)];
    if (extent < 0)
      throw std::invalid_argument(std::string(who) + ": grid extent " + std::to_string(axis) +
                                  " is " + std::to_string(extent) +
                                  "; extents must not be negative");
  }
  for (int axis = g.rank; axis < 3; ++axis) {
    if (g.dims[static_cast<std::size_t>(axis)] != 1)
      throw std::invalid_argument(std::string(who) + ": grid of rank " + std::to_string(g.rank) +
                                  " has extent " + std::to_string(axis) + " = " +
                                  std::to_string(g.dims[static_cast<std::size_t>(axis)]) +
                                  "; extents past the rank must be 1");
  }
}
#else
;
#endif

// A view type of a const element type, made writable: tensor<float const> -> tensor<float>.
template <class A>
struct writable {
  using type = A;
};
template <template <class> class View, class E>
struct writable<View<E const>> {
  using type = View<E>;
};
template <class A>
using writable_t = typename writable<std::remove_cvref_t<A>>::type;

/// How a launch runs the kernel, from the element types of its tensors: vjp passes tensors of
/// adjoint<F>, jvp of dual<F, N> (told apart by their tags, so that this header needs neither).
template <class A>
struct argument_element {
  using type = void;
};
template <template <class> class View, class E>
struct argument_element<View<E>> {
  using type = std::remove_const_t<E>;
};
template <class A>
using argument_element_t = typename argument_element<std::remove_cvref_t<A>>::type;
template <class E>
inline constexpr bool is_adjoint_element = requires {
  typename E::adjoint_tag;
};
template <class E>
inline constexpr bool is_dual_element = requires {
  typename E::dual_tag;
};

/// The largest k < sizeof...(A) such that kernel(p, a_0, ..., a_{k-1}) can be called, or -1: a
/// kernel written with fewer parameters than the launch passes arguments.
template <class Kernel, class... A>
consteval int callable_prefix() {
  using Args = std::tuple<A&...>;
  int k = -1;
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    (([&]<std::size_t... I>(std::index_sequence<I...>) {
       if constexpr (std::is_invocable_v<Kernel&, program const&, std::tuple_element_t<I, Args>...>)
         k = static_cast<int>(sizeof...(I));
     }(std::make_index_sequence<K>{})),
     ...);
  }
  (std::make_index_sequence<sizeof...(A)>{});
  return k;
}

/// A kernel that takes Takes arguments after `program const&` where the launch passes Passes:
/// the numbers stand in the instantiation the compiler prints beside the message.
template <int Takes, int Passes>
struct kernel_argument_count {
  static_assert(Takes == Passes,
                "tilegrad: the kernel takes fewer arguments after `program const&` than the "
                "launch passes (kernel_argument_count<takes, passes>, in this instantiation): "
                "give the launch one argument per kernel parameter, in order");
  static constexpr bool value = false;
};

/// Whether kernel(p, args...) can be called with the arguments a launch passes (lvalues of types
/// A...); when not, a compile error that says what to write instead of a bare "no match for
/// call". A kernel that would take the arguments with every tensor writable has a read-only
/// tensor meet a parameter declared tensor<T>.
template <class Kernel, class... A>
consteval bool kernel_callable() {
  constexpr bool reverse = (is_adjoint_element<argument_element_t<A>> || ...);
  constexpr bool forward = (is_dual_element<argument_element_t<A>> || ...);
  if constexpr (std::is_invocable_v<Kernel&, program const&, A&...>) {
    return true;
  } else if constexpr (std::is_invocable_v<Kernel&, program const&, writable_t<A>&...>) {
    static_assert(dependent_false<Kernel>,
                  "tilegrad: the kernel takes tensor<T> (writable) where a read-only tensor "
                  "arrives (tensor<T const>: x.cview(), or a tensor marked in(...) or "
                  "tangent_in(...)): declare that parameter tensor<T const>");
    return false;
  } else if constexpr (std::is_invocable_v<Kernel&, A&...>) {
    static_assert(dependent_false<Kernel>,
                  "tilegrad: the kernel's first parameter is the program it runs as: "
                  "[]<class T>(tilegrad::program const& p, tensor<T const> x, ...)");
    return false;
  } else if constexpr (constexpr int k = callable_prefix<Kernel, A...>(); k >= 0) {
    return kernel_argument_count<k, static_cast<int>(sizeof...(A))>::value;
  } else if constexpr (reverse) {
    static_assert(dependent_false<Kernel>,
                  "tilegrad::vjp: the kernel cannot be called as kernel(program const&, args...) "
                  "with these arguments: check their number and order. vjp passes in(...) "
                  "tensors as tensor<adjoint<F> const> and out(...)/inout(...) ones as "
                  "tensor<adjoint<F>>, F the float type: write the kernel generic over its "
                  "element type, []<class T>(program const& p, tensor<T const> x, tensor<T> y, "
                  "...)");
    return false;
  } else if constexpr (forward) {
    static_assert(dependent_false<Kernel>,
                  "tilegrad::jvp: the kernel cannot be called as kernel(program const&, args...) "
                  "with these arguments: check their number and order. jvp passes tensors of "
                  "dual<F, N>, F the float type: write the kernel generic over its element type, "
                  "[]<class T>(program const& p, tensor<T const> x, tensor<T> y, ...)");
    return false;
  } else {
    static_assert(dependent_false<Kernel>,
                  "tilegrad::launch: the kernel cannot be called as kernel(program const&, "
                  "args...) with these arguments: check their number, order and types. An "
                  "owned_tensor or a writable view passed where the kernel takes tensor<T const> "
                  "does not deduce T: pass x.cview(). (Written for one element type, the kernel "
                  "also cannot run under vjp or jvp: write it generic, []<class T>(program "
                  "const& p, tensor<T const> x, tensor<T> y, ...).)");
    return false;
  }
}

/// The program with linear index `linear` (axis 0 fastest).
inline program program_at(grid const& g, std::int64_t linear) {
  auto const n0 = std::int64_t{g.dims[0]};
  auto const n1 = std::int64_t{g.dims[1]};
  return program({static_cast<int>(linear % n0), static_cast<int>((linear / n0) % n1),
                  static_cast<int>(linear / (n0 * n1))},
                 g.dims);
}

// ----- executors: each calls run(linear) for every linear id in [0, n) ----------------------

/// What an executor runs: a reference to a callable taking a linear program id. The executors
/// are compiled once, not once per kernel and way of running it (TBB's parallel_for is heavy to
/// instantiate); the indirect call costs a few ns per program, next to ~50 ns of scheduling.
/// Made on the launching thread, it carries that thread's float64_reference() to the threads that
/// run the programs (none on the fast path: one test per program).
class program_runner {
public:
  template <class F>
  explicit program_runner(F& f)
      : obj_(&f), fn_([](void* o, std::int64_t i) { (*static_cast<F*>(o))(i); }),
        reference_(float64_reference()) {}
  void operator()(std::int64_t i) const {
    if (!reference_) {
      fn_(obj_, i);
      return;
    }
    float64_reference_scope const scope(reference_);
    fn_(obj_, i);
  }

private:
  void* obj_;
  void (*fn_)(void*, std::int64_t);
  float64_run const* reference_;
};

/// How many consecutive programs a thread takes at a time: n / (64 x threads), at least 1. The
/// end of a task (TBB's reference counts, OpenMP's next-chunk counter) is a locked instruction,
/// which waits for every store the program issued to reach the cache: a row kernel whose output
/// misses the cache paid one memory latency per program (measured on a 16-core Xeon: a plain
/// layer-norm row loop over TBB at 0.49-0.50 of the triad with a task per row, 0.73-0.74 with
/// rows in runs). 64 runs per thread keep uneven programs (causal masks, block-sparse rows)
/// balanced: a launch of n <= 64 x threads programs still runs one program per task.
constexpr std::int64_t program_chunk(std::int64_t n, int threads) {
  std::int64_t const per = std::int64_t{64} * std::max(threads, 1);
  return std::max<std::int64_t>(1, n / per);
}

template <class Run>
void run_sequential(std::int64_t n, Run& run) {
  for (std::int64_t i = 0; i < n; ++i)
    run(i);
}

#if TILEGRAD_USE_TBB && TILEGRAD_MACHINERY_BODIES
/// Runs body(ctx) capped at num_threads (0: the enclosing arena's), isolated, with a task group
/// context bound to the caller's: the frame of every TBB executor.
template <class Body>
void in_tbb_arena(int num_threads, Body&& body) {
  auto isolated = [&] {
    // A bound context: cancelling an enclosing TBB task group (such as that of an outer
    // launch in the same arena whose program threw) also stops this launch.
    tbb::task_group_context ctx;
    // isolate(): a thread waiting for this launch runs only this launch's programs, never
    // an outer program (a nested launch's thread would otherwise pick up a sibling of the
    // program that launched it, which breaks per-thread state and can self-deadlock on a lock).
    tbb::this_task_arena::isolate([&] { body(ctx); });
    // A program that throws makes TBB rethrow; a cancellation from outside returns normally
    // with programs skipped, which must not pass for success.
    if (ctx.is_group_execution_cancelled())
      throw std::runtime_error("tilegrad::launch: cancelled by an enclosing TBB task group; "
                               "some programs did not run");
  };
  if (num_threads > 0 && num_threads < tbb::this_task_arena::max_concurrency()) {
    // A fresh arena per launch, not one cached per thread count: the caller always finds a
    // free slot in it, so a nested launch never waits for a slot held by a thread that waits
    // for it in turn, and concurrent launches never share a cap. The cost is ~1 us to create
    // it plus the time for workers to join (~35 us at 8 threads for an empty 1000-program
    // launch on a 16-core machine), small beside a launch of real tile programs.
    tbb::task_arena arena(num_threads);
    arena.execute(isolated);
  } else {
    isolated(); // the enclosing arena already caps the launch at num_threads or fewer
  }
}

#endif

/// The error of a parallel launch: the exception of the program with the lowest linear id among
/// those that threw, whatever the order the threads ran them in (programs after it are skipped,
/// those before it still run: one of them may throw too). So a launch reports the same program
/// as the sequential executor, on every run.
class first_failure {
public:
  explicit first_failure(std::int64_t n) : id_(n) {}
  /// Whether program i may still matter (no program before it threw).
  bool wanted(std::int64_t i) const { return i < id_.load(std::memory_order_relaxed); }
  /// Runs run(i), keeping its exception if it is the first in program order so far.
  template <class Run>
  void run(Run& run, std::int64_t i) {
    try {
      run(i);
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (i < id_.load(std::memory_order_relaxed)) {
        error_ = std::current_exception();
        id_.store(i, std::memory_order_relaxed);
      }
    }
  }
  void rethrow() const {
    if (error_)
      std::rethrow_exception(error_);
  }

private:
  std::atomic<std::int64_t> id_;
  std::exception_ptr error_;
  std::mutex mutex_;
};

#if TILEGRAD_USE_TBB && TILEGRAD_MACHINERY_BODIES
template <class Run>
void run_tbb(std::int64_t n, int num_threads, Run& run) {
  first_failure failure(n);
  in_tbb_arena(num_threads, [&](tbb::task_group_context& ctx) {
    // simple_partitioner: tasks of at most program_chunk programs, split no further.
    std::int64_t const chunk = program_chunk(n, tbb::this_task_arena::max_concurrency());
    tbb::parallel_for(
        tbb::blocked_range<std::int64_t>(0, n, static_cast<std::size_t>(chunk)),
        [&](tbb::blocked_range<std::int64_t> const& r) {
          for (std::int64_t i = r.begin(); i != r.end() && failure.wanted(i); ++i)
            failure.run(run, i);
        },
        tbb::simple_partitioner{}, ctx);
  });
  failure.rethrow();
}
#endif

#if TILEGRAD_USE_OPENMP && TILEGRAD_MACHINERY_BODIES
template <class Run>
void run_openmp(std::int64_t n, int num_threads, Run& run) {
  int const threads = num_threads > 0 ? num_threads : omp_get_max_threads();
  // An exception must not leave the parallel region: keep the first in program order, skip the
  // programs after it, rethrow.
  first_failure failure(n);
  int const chunk = static_cast<int>(std::min<std::int64_t>(program_chunk(n, threads), 1 << 30));
#pragma omp parallel for schedule(dynamic, chunk) num_threads(threads)
  for (std::int64_t i = 0; i < n; ++i)
    if (failure.wanted(i))
      failure.run(run, i);
  failure.rethrow();
}
#endif

/// Runs run(linear) for every linear id in [0, n) with the executor of opts.
///
/// Non-temporal stores (a block stored with a streaming hint) are weakly ordered: they must be
/// fenced before another thread is told they are done. A fence per program waited for each
/// program's stores to reach memory (a row kernel lost what the stores saved), so the launch
/// fences once, on the calling thread, when every program has run. A worker thread tells the
/// caller its program is done by a locked read-modify-write (TBB's and OpenMP's completion
/// counts), which on x86, the only target with streaming stores here, waits for every earlier
/// store, non-temporal ones included (Intel SDM vol. 3A, 8.1.2 and 8.2.2; AMD APM vol. 2, 7.4).
TILEGRAD_MACHINERY void run_programs(launch_options const& opts, std::int64_t n,
                                    program_runner run)
#if TILEGRAD_MACHINERY_BODIES
{
  struct fence_at_end {
    ~fence_at_end() { simd::finish_streaming(); }
  } fence;
  switch (opts.exec) {
  case executor::tbb:
#if TILEGRAD_USE_TBB
    run_tbb(n, opts.num_threads, run);
#endif
    return;
  case executor::openmp:
#if TILEGRAD_USE_OPENMP
    run_openmp(n, opts.num_threads, run);
#endif
    return;
  case executor::sequential:
    run_sequential(n, run);
    return;
  }
}
#else
;
#endif

/// Runs run(i) for every i in [0, n), in parallel, at most `window` of them begun and not yet
/// done at a time, and done(i) for every i in order (0 first), one at a time, each after run(i)
/// returned; done may launch in parallel itself. A stream, not batches: programs keep starting
/// while done works through the finished ones, so no thread waits for the slowest program of a
/// batch. (OpenMP and the sequential executor run batches of `window`, then their done calls.)
TILEGRAD_MACHINERY void run_ordered(launch_options const& opts, std::int64_t n, int window,
                                   program_runner run, program_runner done)
#if TILEGRAD_MACHINERY_BODIES
{
  window = std::max(window, 1);
#if TILEGRAD_USE_TBB
  if (opts.exec == executor::tbb) {
    // (done's own launches run in the same arena, so they keep to num_threads too.)
    // The error of the first program in program order that threw, as run_programs reports it
    // (the pipeline would rethrow whichever came first in time); done(i) only while no program
    // up to i threw (done runs in order, after run(i), so every earlier failure is known).
    first_failure failure(n);
    in_tbb_arena(opts.num_threads, [&](tbb::task_group_context& ctx) {
      std::int64_t next = 0;
      tbb::parallel_pipeline(
          static_cast<std::size_t>(window),
          tbb::make_filter<void, std::int64_t>(tbb::filter_mode::serial_in_order,
                                               [&](tbb::flow_control& fc) -> std::int64_t {
                                                 if (next == n || !failure.wanted(next)) {
                                                   fc.stop();
                                                   return 0;
                                                 }
                                                 return next++;
                                               }) &
              tbb::make_filter<std::int64_t, std::int64_t>(tbb::filter_mode::parallel,
                                                           [&](std::int64_t i) {
                                                             if (failure.wanted(i))
                                                               failure.run(run, i);
                                                             return i;
                                                           }) &
              tbb::make_filter<std::int64_t, void>(tbb::filter_mode::serial_in_order,
                                                   [&](std::int64_t i) {
                                                     if (failure.wanted(i))
                                                       failure.run(done, i);
                                                   }),
          ctx);
    });
    failure.rethrow();
    return;
  }
#endif
  for (std::int64_t b0 = 0; b0 < n; b0 += window) {
    std::int64_t const k = std::min<std::int64_t>(window, n - b0);
    auto batch = [&](std::int64_t i) { run(b0 + i); };
    run_programs(opts, k, program_runner(batch));
    for (std::int64_t i = b0; i < b0 + k; ++i)
      done(i);
  }
}
#else
;
#endif

/// Runs call(p) for every program p of g, each inside a program_scope with the given hooks
/// (none: the fast path; a hooks object without tracker: bounds checked).
template <class Call>
void launch_untracked(launch_options const& opts, grid g, Call&& call,
                      access_hooks* hooks = nullptr) {
  auto run = [&](std::int64_t linear) {
    program const p = program_at(g, linear);
    program_scope const scope(p, hooks);
    call(p);
  };
  run_programs(opts, g.size(), program_runner(run));
}

/// The program logs of tracked launches, kept by the thread between launches.
inline std::vector<program_log>& spare_logs() {
  thread_local std::vector<program_log> logs;
  return logs;
}

/// A reference to a callable taking a program: launch_tracked is compiled once, not once per
/// kernel (it runs only with race tracking, where an indirect call per program costs nothing).
class program_call {
public:
  template <class F>
  explicit program_call(F& f)
      : obj_(&f), fn_([](void* o, program const& p) { (*static_cast<F*>(o))(p); }) {}
  void operator()(program const& p) const { fn_(obj_, p); }

private:
  void* obj_;
  void (*fn_)(void*, program const&);
};

/// Runs call(p) for every program p of g with access tracking: in waves, each program recording
/// into its own log, the logs replayed in program order after each wave. A race throws, or goes
/// to the thread's launch_observer, which also keeps what the launch wrote.
TILEGRAD_MACHINERY void launch_tracked(launch_options const& opts, grid g, launch_tracker& tracker,
                                       program_call call, std::vector<arg_layout> const* args)
#if TILEGRAD_MACHINERY_BODIES
{
  if (!tracker.unmergeable().empty())
    throw std::invalid_argument(
        "tilegrad::launch: " + tracker.unmergeable() + ": the race check follows elements, and "
        "cannot tell whether a store to one meets another program's access to the other. Write "
        "the converted values into a buffer of their own.");
  launch_observer* const observer = current_observer();
  bool const confined = confine_accesses(); // (read here: the programs run on other threads)
  std::vector<watched_tensor> const* const watched = watched_memory();
  tracker.check_exchanges(true);
  if (observer && observer->launches.size() < observer->known_locks.size())
    tracker.know_locks(observer->known_locks[observer->launches.size()]);
  if (observer && observer->probe_locks)
    tracker.probe_locks(&observer->probe_stopped);
  std::int64_t const total = g.size();
  if (tracker.empty()) { // nothing the kernel may write: bounds only, and writes refused
    access_hooks bounds_only;
    bounds_only.refuse_writes = true;
    bounds_only.args = args;
    bounds_only.confined = confine_accesses();
    bounds_only.watched = watched;
    launch_untracked(
        opts, g,
        [&](program const& p) {
          observer_scope const nested(nullptr);
          call(p);
        },
        &bounds_only);
    if (observer)
      observer->add(tracker, g);
    return;
  }
  // Waves bound the records kept; the verdict does not depend on their size.
  int const threads = opts.num_threads > 0 ? opts.num_threads : 64;
  std::int64_t const wave = std::min<std::int64_t>(total, std::max(64, 4 * threads));
  // The logs are kept by the thread from launch to launch, so their buffers are reused (taken
  // out while in use: a tracked launch nested in a program finds none and makes its own).
  struct give_back {
    std::vector<program_log> logs;
    ~give_back() { spare_logs() = std::move(logs); }
  } held{std::move(spare_logs())};
  std::vector<program_log>& logs = held.logs;
  if (logs.size() < static_cast<std::size_t>(wave))
    logs.resize(static_cast<std::size_t>(wave));
  std::uint64_t const jitter = observer ? observer->bf16_jitter : 0;
  if (jitter)
    for (tracked_tensor& t : tracker.tensors())
      for (auto const& v : t.views)
        t.jitter = t.jitter || (t.bf16 && std::find(observer->jitter_targets.begin(),
                                                    observer->jitter_targets.end(),
                                                    std::pair<std::size_t, int>(
                                                        observer->launches.size(), v.arg)) !=
                                              observer->jitter_targets.end());
  // check_backward's determinism rerun takes the waves from the last to the first and the
  // programs of each wave from the last to the first: every program in the reverse order. (With
  // the waves in order, a program alone in the last wave ran last in both runs, and a reduction
  // by the last id passed.)
  bool const reverse = observer && observer->reverse_order;
  std::int64_t const waves = (total + wave - 1) / wave;
  for (std::int64_t k = 0; k < waves; ++k) {
    std::int64_t const w0 = (reverse ? waves - 1 - k : k) * wave;
    std::int64_t const n = std::min(wave, total - w0);
    auto run = [&](std::int64_t at) {
      std::int64_t const i = reverse ? n - 1 - at : at; // (the logs stay in program order)
      program const p = program_at(g, w0 + i);
      program_log& log = logs[static_cast<std::size_t>(i)];
      log.clear();
      log.program = static_cast<std::uint32_t>(w0 + i + 1);
      access_hooks h{&tracker, &log};
      h.args = args;
      h.confined = confined;
      h.watched = watched;
      if (jitter)
        h.bf16_jitter = mix64(jitter ^ static_cast<std::uint64_t>(w0 + i));
      program_scope const scope(p, &h);
      observer_scope const nested(nullptr); // a launch inside a program is not observed
      call(p);
    };
    run_programs(opts, n, program_runner(run));
    if (!tracker.race())
      tracker.check(w0, logs.data(), n);
    if (tracker.race() && !observer)
      throw tracker.race()->error();
  }
  if (observer)
    observer->add(tracker, g);
}
#else
;
#endif

} // namespace detail

/// Runs `kernel(p, args...)` once for every program `p` of grid `g`, in any order and possibly
/// in parallel, each inside a detail::program_scope (so memory operations can name the program
/// in errors), and returns when all have run. Every argument goes through detail::kernel_arg
/// once, then reaches every call as an lvalue: the caller's object (constness kept) for an
/// lvalue, a const lvalue for a temporary. Nothing is moved into a call or copied per program.
///
/// A grid with an extent of 0 (cdiv(n, B) of an empty tensor) runs no program, as in Triton.
/// @throws std::invalid_argument before any program runs when a grid extent is negative, the
///   rank is not 1-3, num_threads is negative, or the executor is not compiled in.
/// @throws whatever a program throws (with the TBB and OpenMP executors, the first one caught
///   when several throw). Remaining programs may then be skipped, and outputs may hold the
///   partial results of the programs that did run: the call throws, so none is reported as a
///   success.
/// A launch from inside a running program (nested launch) is allowed with every executor; a
/// nested OpenMP launch runs on one thread unless nested parallelism is enabled (the OpenMP
/// default). A nested launch is not part of its parent's race check.
/// @throws race_error with opts.check_races (or inside check_backward, which reports it
///   instead) when two programs race; programs of later waves are then skipped.
template <class Kernel, class... Args>
void launch(launch_options const& opts, grid g, Kernel&& kernel, Args&&... args) {
  constexpr bool callable = detail::kernel_callable<Kernel, detail::held_arg_t<Args&&>...>();
  detail::validate(opts, g);
  if (g.size() == 0) return;
  std::tuple<detail::held_arg_t<Args&&>...> held{detail::prepare_arg(std::forward<Args>(args))...};
  // Out of line: the kernel is compiled once, whichever way its programs are run.
  auto call = [&](program const& p) TILEGRAD_NOINLINE_LAMBDA {
    if constexpr (callable) std::apply([&](auto&... a) { kernel(p, a...); }, held);
  };
  if (opts.check_races || detail::current_observer()) [[unlikely]] {
    detail::launch_tracker tracker(g);
    std::apply([&](auto const&... a) {
      int arg = 0;
      (tracker.add_arg(a, ++arg), ...);
    }, held);
    std::vector<detail::arg_layout> const layouts = std::apply(
        [](auto const&... a) { return detail::arg_layouts(a...); }, held);
    detail::launch_tracked(opts, g, tracker, detail::program_call(call), &layouts);
    return;
  }
  if (opts.check_bounds) [[unlikely]] {
    std::vector<detail::arg_layout> const layouts = std::apply(
        [](auto const&... a) { return detail::arg_layouts(a...); }, held);
    detail::access_hooks bounds_only;
    bounds_only.args = &layouts;
    bounds_only.confined = detail::confine_accesses();
    bounds_only.watched = detail::watched_memory();
    detail::launch_untracked(opts, g, call, &bounds_only);
    return;
  }
  detail::launch_untracked(opts, g, call);
}

/// launch with default_options(). (The constraint keeps `launch({}, g, kernel)` unambiguous: a
/// grid where the kernel goes means the braces were the options.)
template <class Kernel, class... Args>
  requires(!std::is_same_v<std::remove_cvref_t<Kernel>, grid>)
void launch(grid g, Kernel&& kernel, Args&&... args) {
  launch(default_options(), g, std::forward<Kernel>(kernel), std::forward<Args>(args)...);
}

} // namespace tilegrad
