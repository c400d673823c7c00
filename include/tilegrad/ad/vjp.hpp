// vjp: reference gradients of a whole launch. The same kernel runs with adjoint<T> tensors;
// each program records its tape, seeds the adjoints of what it stored from the output
// cotangents, sweeps its tape backwards and drops it. Programs run in waves, after which their
// accesses are checked for races. Within a wave they stream: a bounded number are begun and not
// added at a time, and finished ones are added in groups, in program order, block by block on
// every thread while other programs run, each element's contributions in program order, so
// gradients are bitwise identical for any thread count, executor and group size.
#pragma once

#include "tilegrad/ad/aliasing.hpp"
#include "tilegrad/ad/context.hpp"
#include "tilegrad/ad/expr.hpp"
#include "tilegrad/ad/loop.hpp"
#include "tilegrad/ad/memory.hpp"
#include "tilegrad/ad/races.hpp"
#include "tilegrad/ad/reduce.hpp"
#include "tilegrad/ad/tile.hpp"
#include "tilegrad/core/bf16.hpp"
#include "tilegrad/grid/launch.hpp"
#include "tilegrad/memory/tensor.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

namespace tilegrad {

namespace detail {
/// Element types of the float tensors a launch marks: float, double and bf16 storage.
template <class T>
inline constexpr bool float_storage_v = std::is_floating_point_v<T> || std::is_same_v<T, bf16>;
} // namespace detail

/// A float tensor of a vjp launch, marked by name: in (gradient wanted), out (with its
/// cotangent), or inout.
template <class T, ad::role R>
struct marked_tensor {
  static constexpr ad::role r = R;
  char const* name;
  tensor<T> t;
  tensor<T const> cotangent;
};

/// in("x", x): the kernel reads x (as a const view); its gradient is wanted.
template <class T>
marked_tensor<T, ad::role::in> in(char const* name, tensor<T const> t) {
  static_assert(detail::float_storage_v<T>,
                "tilegrad::in: only float tensors have gradients (pass integer tensors as they "
                "are)");
  return {name, tensor<T>(const_cast<T*>(t.data()), t.rank(), t.shape(), t.strides(), name), {}};
}
template <class T>
marked_tensor<T, ad::role::in> in(char const* name, tensor<T> t) {
  return in(name, tensor<T const>(t));
}
template <class T>
marked_tensor<T, ad::role::in> in(char const* name, owned_tensor<T> const& t) {
  return in(name, t.cview());
}
/// out("y", y, dy): the kernel writes y; dy (same shape) is the cotangent of y. y and dy are
/// views or owning tensors, in any mix (dy converts to a const view: a non-deduced parameter).
template <class T>
marked_tensor<T, ad::role::out> out(char const* name, tensor<T> t,
                                    std::type_identity_t<tensor<T const>> cotangent) {
  static_assert(detail::float_storage_v<T>, "tilegrad::out: only float tensors");
  return {name, t, cotangent};
}
template <class T>
marked_tensor<T, ad::role::out> out(char const* name, owned_tensor<T> const& t,
                                    std::type_identity_t<tensor<T const>> cotangent) {
  return out(name, t.view(), cotangent);
}

/// inout("y", y, dy): the kernel reads and writes y. Elements read before any store are inputs
/// (their gradient is wanted); dy is the cotangent of y's final values. An element no program
/// stores passes its cotangent to its initial value. y and dy as for out.
template <class T>
marked_tensor<T, ad::role::inout> inout(char const* name, tensor<T> t,
                                        std::type_identity_t<tensor<T const>> cotangent) {
  static_assert(detail::float_storage_v<T>, "tilegrad::inout: only float tensors");
  return {name, t, cotangent};
}
template <class T>
marked_tensor<T, ad::role::inout> inout(char const* name, owned_tensor<T>& t,
                                        std::type_identity_t<tensor<T const>> cotangent) {
  return inout(name, t.view(), cotangent);
}

/// The gradients of a vjp, by tensor name.
template <class T>
class gradients {
public:
  owned_tensor<T> const& operator[](std::string const& name) const {
    auto it = grads_.find(name);
    if (it == grads_.end())
      throw std::out_of_range("tilegrad::vjp: no gradient named '" + name + "' (mark it in)");
    return it->second;
  }
  bool contains(std::string const& name) const { return grads_.count(name) != 0; }
  /// Tensors marked `in` or `inout` that no program read (loaded, or updated with an atomic,
  /// which reads the old value): usually a tensor captured by the kernel instead of passed as an
  /// argument, whose gradient is then silently zero (or, for inout, only its cotangent).
  std::vector<std::string> const& unread() const { return unread_; }
  /// The largest tape of any program, in bytes.
  std::size_t peak_tape_bytes() const { return peak_tape_; }
  /// The most memory held at once by gradient contributions that programs made and that were
  /// not added to the gradients yet, in bytes.
  std::size_t peak_contribution_bytes() const { return peak_contributions_; }

  std::map<std::string, owned_tensor<T>> grads_;
  std::vector<std::string> unread_;
  std::size_t peak_tape_ = 0;
  std::size_t peak_contributions_ = 0;
};

namespace ad {

template <class X>
struct float_of {
  using type = void;
};
template <class T, role R>
struct float_of<marked_tensor<T, R>> {
  using type = T;
};
template <class T>
  requires detail::float_storage_v<std::remove_const_t<T>>
struct float_of<tensor<T>> {
  using type = std::remove_const_t<T>;
};
template <class T>
  requires detail::float_storage_v<T>
struct float_of<owned_tensor<T>> {
  using type = T;
};

// The float type of a launch: bf16 when a marked tensor is bf16 (a float logsumexp beside bf16
// tensors then computes in float as they do); else that of the first marked tensor; else that of
// the first float tensor (void if none). An unmarked bf16 table passed before the marked float or
// double tensors does not make a launch bf16 (it did: a double launch ran in float).
template <class X>
struct marked_float_of {
  using type = void;
};
template <class T, role R>
struct marked_float_of<marked_tensor<T, R>> {
  using type = T;
};
template <class... X>
struct first_float {
  using marked =
      typename tilegrad::detail::first_non_void<typename marked_float_of<X>::type...>::type;
  static constexpr bool bf16_marked =
      (std::is_same_v<typename marked_float_of<X>::type, bf16> || ... || false);
  using type = std::conditional_t<bf16_marked, bf16,
                                  std::conditional_t<!std::is_void_v<marked>, marked,
                                                     typename tilegrad::detail::first_non_void<
                                                         typename float_of<X>::type...>::type>>;
};

[[noreturn]] TILEGRAD_MACHINERY void cotangent_shape_refused(char const* name,
                                                             std::string const& tensor_shape,
                                                             std::string const& cotangent_shape)
#if TILEGRAD_MACHINERY_BODIES
{
  throw std::invalid_argument(std::string("tilegrad::vjp: cotangent of '") + name +
                              "' has shape " + cotangent_shape + ", the tensor " + tensor_shape);
}
#else
;
#endif

template <class T>
void check_cotangent(char const* name, tensor<T> const& t, tensor<T const> const& cot) {
  if (!t.same_shape(cot))
    cotangent_shape_refused(name, t.shape_string(), cot.shape_string());
}

/// What a vjp launch keeps per float tensor besides its entry: the per-element stamps of a
/// tensor the kernel may write, and the cotangent laid out like the tensor where it is not.
template <class T>
struct tensor_shadow {
  stamp_buffer<std::uint32_t> stamp{0};
  std::unique_ptr<T[]> cotangent;
};

template <class X, class T>
void add_entry(X const& x, std::vector<tensor_entry>& entries, std::vector<std::string>& names,
               std::vector<tensor_shadow<T>>& shadows) {
  using D = std::remove_cvref_t<X>;
  auto push = [&](auto const& t, role r, bool writable, tensor<T const> const* cot, char const* name) {
    tensor_entry e;
    std::int64_t const span = t.numel() == 0 ? 0 : t.span();
    e.lo = reinterpret_cast<std::byte const*>(t.data());
    e.hi = e.lo + span * static_cast<std::int64_t>(sizeof(T));
    e.index = static_cast<int>(entries.size());
    e.r = r;
    e.writable = writable;
    e.bytes = static_cast<std::uint32_t>(sizeof(T));
    e.name = name;
    e.layout = tensor<std::byte const>(e.lo, t.rank(), t.shape(), t.strides(), name);
    tensor_shadow<T> sh;
    if (writable) {
      sh.stamp = stamp_buffer<std::uint32_t>(static_cast<std::size_t>(span));
      e.stamp = sh.stamp.p;
    }
    if (cot) {
      if (cot->strides() == t.strides()) {
        e.cotangent = cot->data();
      } else { // lay the cotangent out like the tensor, so an element's offset finds it
        sh.cotangent = std::make_unique<T[]>(static_cast<std::size_t>(span));
        for (std::int64_t i = 0; i < t.numel(); ++i)
          sh.cotangent[t.row_major_offset(i)] = cot->data()[cot->row_major_offset(i)];
        e.cotangent = sh.cotangent.get();
      }
    }
    entries.push_back(e);
    shadows.push_back(std::move(sh));
    names.emplace_back(name);
  };
  if constexpr (std::is_same_v<typename float_of<D>::type, T>) {
    if constexpr (requires { x.cotangent; }) {
      bool const cot = x.r == role::out || x.r == role::inout;
      if (cot) check_cotangent(x.name, x.t, x.cotangent);
      push(x.t, x.r, x.r != role::in, cot ? &x.cotangent : nullptr, x.name);
    } else if constexpr (requires { x.view(); }) {
      push(x.view(), role::passive, true, nullptr, x.name());
    } else {
      push(x, role::passive, !std::is_const_v<typename D::element_type>, nullptr, x.name());
    }
  }
}

inline char const* role_name(role r, bool writable) {
  switch (r) {
  case role::in:
    return "in";
  case role::out:
    return "out";
  case role::inout:
    return "inout";
  default:
    return writable ? "passive, written" : "passive";
  }
}

/// What vjp says to write instead when two tensors share elements.
inline constexpr char const* shared_memory_hint =
    "An in-place kernel takes the buffer once, as one tensor marked inout (tg::inout(\"x\", x, "
    "dx): elements read before a store are inputs); views of one buffer (q, k, v of a packed "
    "qkv) may share it as long as they share no element. A tensor read twice, as it is and "
    "transposed (tied weights), is passed once: make the other view in the kernel from its data "
    "and strides.";

/// Refuses tensors of a launch that share elements (before any program runs) and marks those
/// whose address ranges overlap another's, to be looked up by element.
inline void check_shared_memory(std::vector<tensor_entry>& entries) {
  std::vector<memory_ref> refs;
  for (auto const& e : entries)
    refs.push_back({e.name, role_name(e.r, e.writable), e.lo, e.layout, e.bytes,
                    e.writable || e.r != role::passive, e.r != role::passive});
  std::vector<bool> const shared = check_overlaps(refs, "tilegrad::vjp", shared_memory_hint);
  for (std::size_t i = 0; i < entries.size(); ++i)
    entries[i].shared_range = shared[i];
}

/// The memory of a float tensor argument of type T, for check_shared_memory before the
/// arguments are copied (a vjp of bf16 tensors runs on float copies, which share nothing).
template <class T, class X>
void add_memory_ref(X const& x, std::vector<memory_ref>& refs) {
  using D = std::remove_cvref_t<X>;
  auto push = [&](auto const& t, role r, bool writable, char const* name) {
    refs.push_back({name, role_name(r, writable), reinterpret_cast<std::byte const*>(t.data()),
                    tensor<std::byte const>(reinterpret_cast<std::byte const*>(t.data()), t.rank(),
                                            t.shape(), t.strides(), name),
                    sizeof(T), writable || r != role::passive, r != role::passive});
  };
  if constexpr (std::is_same_v<typename float_of<D>::type, T>) {
    if constexpr (requires { x.cotangent; })
      push(x.t, x.r, x.r != role::in, x.name);
    else if constexpr (requires { x.view(); })
      push(x.view(), role::passive, true, x.name());
    else
      push(x, role::passive, !std::is_const_v<typename D::element_type>, x.name());
  }
}

// The argument the kernel receives in reverse mode.
template <class T, class X>
auto convert_arg(X const& x) {
  using D = std::remove_cvref_t<X>;
  using A = adjoint<T>;
  auto as_adj = []<class E>(tensor<E> const& t) {
    using P = std::conditional_t<std::is_const_v<E>, A const, A>;
    return tensor<P>(reinterpret_cast<P*>(const_cast<std::remove_const_t<E>*>(t.data())),
                     t.rank(), t.shape(), t.strides(), t.name());
  };
  if constexpr (!std::is_same_v<typename float_of<D>::type, T>) {
    return detail::prepare_arg(x); // integer tensors, numbers: as they are
  } else if constexpr (requires { x.cotangent; }) {
    if constexpr (D::r == role::in)
      return as_adj(tensor<T const>(x.t)).named(x.name);
    else
      return as_adj(x.t).named(x.name);
  } else if constexpr (requires { x.view(); }) {
    return as_adj(x.view());
  } else {
    return as_adj(x);
  }
}

/// After a program's forward pass: the value it stored last at each element of a tensor with a
/// cotangent, and each of its atomic_add contributions there, receive the cotangent.
template <class T>
void seed_outputs(program_state const& st, std::vector<tensor_entry> const& entries) {
  auto const& acc = st.out->accesses;
  for (std::size_t i = 0; i < acc.size(); ++i) {
    access const& a = acc[i];
    if (a.kind == access_kind::load || !a.adj) continue;
    tensor_entry const& e = entries[static_cast<std::size_t>(a.tensor)];
    if (!e.has_cotangent()) continue;
    T const* cot = static_cast<T const*>(e.cotangent);
    T* adj = static_cast<T*>(a.adj);
    // Every atomic contribution is seeded; so is every store, unless the program stored some
    // element twice: then only the last store to each element.
    if (a.kind == access_kind::atomic || !st.own.active()) {
      if (a.r.step == 1) {
        T const* c = cot + a.r.offset;
        for (int k = 0; k < a.r.count; ++k) adj[k] += c[k];
      } else {
        for (int k = 0; k < a.r.count; ++k) adj[k] += cot[a.r.element(k)];
      }
      continue;
    }
    for (int k = 0; k < a.r.count; ++k) {
      std::int64_t const el = a.r.element(k);
      own_stores::last l{};
      bool const last = st.own.find(a.tensor, el, l) && l.access == i && l.lane == k;
      adj[k] += last ? cot[el] : T(0);
    }
  }
}

/// Adds the held contributions of programs res[0..n) (in program order) to the gradients, over
/// the launch's threads: block by block of gradient elements, each block by one thread, which
/// takes the pieces that fall in it program by program, each program's in the order it made
/// them. So every element receives its contributions in program order, whatever the threads.
template <class T>
void add_held(launch_options const& opts, program_result* res, std::int64_t n, block_plan& plan,
              std::vector<gradient_sink> const& sinks, bool stream) {
  plan.build(n, [&](std::int64_t i) -> std::vector<block_piece> const& { return res[i].pieces; });
  if (plan.blocks() == 0)
    return;
  detail::launch_untracked(opts, grid(static_cast<int>(plan.blocks())), [&](program const& p) {
    auto const b = static_cast<std::size_t>(p.program_id(0));
    for (std::size_t i = plan.starts[b]; i < plan.starts[b + 1]; ++i) {
      block_plan::part const& part = plan.parts[i];
      std::vector<block_piece> const& pieces = res[part.program].pieces;
      for (std::uint32_t j = part.begin; j < part.end; ++j)
        sinks[static_cast<std::size_t>(pieces[j].s.tensor)].add(
            pieces[j].s.r, static_cast<T const*>(pieces[j].s.values));
    }
    if (stream)
      simd::stream_fence();
  });
}

/// contribution_budget()'s value until it is set: max(64 MiB, 8 MiB x the launch's threads).
inline constexpr std::size_t automatic_budget = static_cast<std::size_t>(-1);

/// Bytes of gradient contributions that the programs of a vjp may hold before they are added,
/// for the vjp calls this thread makes (see vjp). By default 64 MiB, and 8 MiB per thread from
/// 8 threads on. It bounds the programs begun and not added (at least two per thread, so that a
/// thread finds a program to run while earlier ones finish), and the finished programs waiting
/// to be added together (a quarter of it).
inline std::size_t& contribution_budget() {
  thread_local std::size_t b = automatic_budget;
  return b;
}

inline std::size_t contribution_budget_for(int workers) {
  std::size_t const b = contribution_budget();
  if (b != automatic_budget)
    return std::max<std::size_t>(b, 1);
  return std::max(std::size_t{64} << 20, (std::size_t{8} << 20) * static_cast<std::size_t>(workers));
}

template <class T>
gradients<T> vjp_core(launch_options const& opts, grid g, std::vector<tensor_entry>& entries,
                      std::vector<std::string> const& names, tilegrad::detail::program_call call,
                      tilegrad::detail::launch_tracker& plain,
                      std::vector<tilegrad::detail::arg_layout> const& args);

/// Tracks a writable tensor of another type than the gradients' (an integer tensor: vjp does not
/// differentiate it) for races, as a launch that checks races does.
template <class T, class X>
void track_plain(X const& x, tilegrad::detail::launch_tracker& plain) {
  using D = std::remove_cvref_t<X>;
  if constexpr (!std::is_same_v<typename float_of<D>::type, T>) {
    if constexpr (requires { x.view(); })
      plain.add_arg(x.view());
    else
      plain.add_arg(x);
  }
}
} // namespace ad

/// Gradients of the launch `kernel` over `g` with respect to the tensors marked `in` (and
/// `inout`), for the cotangents given with the tensors marked `out` (and `inout`). Unmarked
/// float tensors are passive; integer tensors and numbers pass through. Throws race_error when
/// two programs write one element, or one reads what another writes.
template <class Kernel, class... Args>
auto vjp(launch_options const& opts, grid g, Kernel&& kernel, Args const&... args) {
  using T = typename ad::first_float<std::remove_cvref_t<Args>...>::type;
  static_assert(std::is_floating_point_v<T>, "tilegrad::vjp: no float tensor among the arguments");
  constexpr bool callable =
      detail::kernel_callable<Kernel, decltype(ad::convert_arg<T>(args))...>();
  std::vector<ad::tensor_entry> entries;
  std::vector<std::string> names;
  std::vector<ad::tensor_shadow<T>> shadows;
  (ad::add_entry<Args, T>(args, entries, names, shadows), ...);
  detail::launch_tracker plain(g, "tilegrad::vjp");
  (ad::track_plain<T>(args, plain), ...);
  auto converted = std::make_tuple(ad::convert_arg<T>(args)...);
  auto call = [&](program const& p) {
    if constexpr (callable)
      std::apply([&](auto&... a) { kernel(p, a...); }, converted);
  };
  std::vector<detail::arg_layout> const layouts = std::apply(
      [](auto const&... a) { return detail::arg_layouts(a...); }, converted);
  return ad::vjp_core<T>(opts, g, entries, names, detail::program_call(call), plain, layouts);
}

namespace ad {

/// vjp's body: all of it but the call of the kernel, which `call` makes for one program (inside
/// the program's scope, with the tape of the calling thread current). It depends on the
/// gradients' type only, so it is compiled once per type, not once per kernel (and, with
/// TILEGRAD_SEPARATE_COMPILATION, once per program: tilegrad/separate.hpp).
template <class T>
gradients<T> vjp_core(launch_options const& opts, grid g, std::vector<tensor_entry>& entries,
                      std::vector<std::string> const& names, tilegrad::detail::program_call call,
                      tilegrad::detail::launch_tracker& plain,
                      std::vector<tilegrad::detail::arg_layout> const& args) {
  // A program of a vjp keeps its state in this thread's tape and records; a vjp called inside it
  // would run its own programs on them (the outer program then wrote through freed records).
  if (ad::current_state() != nullptr) {
    program const* p = tilegrad::detail::current_program();
    throw std::logic_error(
        "tilegrad::vjp: called inside " + (p ? p->describe() : std::string("a program")) +
        " of another vjp (or check_backward). A program of a vjp cannot run a vjp of its own: "
        "take the inner gradients before or after the outer vjp, or in a plain launch's program");
  }
  bool const magnitudes = ad::magnitude_sweep();
  ad::magnitude_kind const kind = ad::magnitude_scope::current();
  ad::jitter_settings const jitter = ad::rounding_jitter();
  // Names find gradients and cotangents: two marked tensors may not share one. Unmarked tensors
  // keep their views' names, which repeat (a tensor passed twice, rows t[0] and t[1] of one
  // tensor): they share no harm, and shared memory is judged by check_shared_memory below.
  for (std::size_t i = 0; i < names.size(); ++i)
    for (std::size_t j = i + 1; j < names.size(); ++j)
      if (!names[i].empty() && names[i] == names[j] && entries[i].r != role::passive &&
          entries[j].r != role::passive)
        throw std::invalid_argument("tilegrad::vjp: the name '" + names[i] + "' is given twice");
  if (entries.size() > 63) throw std::invalid_argument("tilegrad::vjp: at most 63 float tensors");
  // As launch: a negative extent throws, an extent 0 runs no program.
  detail::validate(opts, g, "tilegrad::vjp");
  ad::check_shared_memory(entries);
  if (g.size() >= 0x7fffffff)
    throw std::invalid_argument("tilegrad::vjp: a grid of " + std::to_string(g.size()) +
                                " programs (" + std::to_string(g.dims[0]) + " x " +
                                std::to_string(g.dims[1]) + " x " + std::to_string(g.dims[2]) +
                                "): vjp numbers programs in an int, at most 2^31 - 2 of them");

  gradients<T> result;
  std::vector<ad::gradient_sink> sinks(entries.size());
  std::vector<ad::stamp_buffer<std::uint64_t>> written;
  // Gradients from this size on are written past the cache the first time (ad::gradient_sink).
  constexpr std::size_t stream_bytes = std::size_t{8} << 20;
  bool any_stream = false;
  for (auto& e : entries) {
    if (!e.wants_grad()) continue;
    if (!e.layout.is_contiguous())
      e.set_strided_grad(); // (its layout nests: checked above)
    auto [it, ok] = result.grads_.emplace(
        e.name, owned_tensor<T>(uninitialized, e.layout.shape().data(),
                                static_cast<std::size_t>(e.layout.rank()), e.name));
    (void)ok;
    written.emplace_back(static_cast<std::size_t>((e.layout.numel() + 63) / 64));
    bool const stream = sizeof(T) * static_cast<std::size_t>(e.layout.numel()) >= stream_bytes &&
                        reinterpret_cast<std::uintptr_t>(it->second.data()) % 64 == 0;
    sinks[static_cast<std::size_t>(e.index)] = {it->second.data(), written.back().p, stream};
    any_stream |= stream;
  }

  std::int64_t const total = g.size();
  int const threads = opts.num_threads > 0 ? opts.num_threads : 64;
  // Waves of 16 programs per thread: the end of a wave waits for its slowest program.
  std::int64_t const wave = std::max<std::int64_t>(64, 16 * threads);
  // Per-program results live as long as the calling thread, so their buffers are reused.
  thread_local std::vector<ad::program_result> pool;
  if (pool.size() < static_cast<std::size_t>(std::min(wave, total)))
    pool.resize(static_cast<std::size_t>(std::min(wave, total)));
  std::vector<ad::program_result>& results = pool;
  std::vector<ad::stamp_buffer<std::uint64_t>> readers;
  for (std::size_t i = 0; i < entries.size(); ++i) readers.emplace_back(0);
  std::size_t peak = 0;
  std::uint64_t reads = 0;
  // vjp checks its own races; its programs always check bounds (hooks without a tracker), and
  // its launches are never tracked as plain ones, whatever the options or the thread's observer.
  // Writable tensors it does not differentiate (integer tensors) are tracked as a launch that
  // checks races tracks them, each program logging its accesses to them (ad::plain_load_hook).
  detail::access_hooks bounds_only;
  bounds_only.args = &args;
  bounds_only.before_write = &ad::plain_write_hook;
  bounds_only.lenient = true;
  // The tensors with a gradient or a cotangent, and the caller's of which this vjp differentiates
  // copies: a load of one through a view that is not an argument (a view the kernel captures, of
  // the plain element type) reads constants, and the gradients would miss that path; a store or
  // an atomic through one changes values the tape does not follow. Either throws.
  std::vector<tilegrad::detail::watched_tensor> watched;
  for (auto const& e : entries)
    if ((e.wants_grad() || e.has_cotangent()) && e.layout.numel() > 0)
      watched.push_back({e.name, e.layout, e.bytes});
  for (auto const& w : tilegrad::detail::watched_originals()) {
    watched.push_back(w);
    watched.back().copy = true;
  }
  for (auto& w : watched)
    w.by = "tilegrad::vjp";
  if (!watched.empty())
    bounds_only.watched = &watched;
  std::vector<detail::program_log> plain_logs;
  if (!plain.empty())
    plain_logs.resize(static_cast<std::size_t>(std::min(wave, total)));

  // Contributions: a program whose predecessors are all added adds its own as its sweep makes
  // them; the others hold theirs (chunks of `chunks`) until they are added, in program order, with
  // the finished programs before them (ad::add_held, block by block in parallel, while the next
  // programs run: detail::run_ordered). The programs begun and not added are at most the budget
  // over the largest contribution of a program so far (and at least two per thread): the memory
  // held stays near the budget, whatever the grid or the sizes of the gradients.
  int const workers = opts.exec == executor::sequential ? 1
                      : opts.num_threads > 0
                          ? opts.num_threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::size_t const budget = ad::contribution_budget_for(workers);
  ad::contribution_pool chunks;
  ad::gradient_blocks blocks;
  for (auto const& e : entries)
    blocks.add_tensor(e.wants_grad() ? e.layout.numel() : 0);
  ad::block_plan plan;
  std::size_t largest = 0; // the most bytes of contributions of one program so far
  std::mutex merge;

  for (std::int64_t w0 = 0; w0 < total; w0 += wave) {
    std::int64_t const n = std::min(wave, total - w0);
    // At most `window` programs begun and not done (three quarters of the budget, or two per
    // thread), and the group of done ones waiting to be added (a quarter): what is held.
    // (One thread: one at a time, so each program adds its contributions as its sweep makes them.)
    std::int64_t window = 1;
    if (workers > 1) {
      std::size_t const room = budget / 4 * 3;
      auto const most = static_cast<std::size_t>(n);
      std::int64_t const fit =
          largest > 0 ? static_cast<std::int64_t>(std::min<std::size_t>(room / largest, most))
          : w0 == 0   ? workers // nothing known yet
                      : n;
      window = std::min(n, std::max<std::int64_t>(2 * workers, fit));
    }
    std::int64_t next = 0; // the first program of the wave whose contributions are not added
    std::int64_t group = 0; // the first program of the finished ones not added yet
    std::size_t group_bytes = 0;
    auto run = [&](std::int64_t me) {
      std::int64_t const lin = w0 + me;
      int const x = static_cast<int>(lin % g.dims[0]);
      int const y = static_cast<int>((lin / g.dims[0]) % g.dims[1]);
      int const z = static_cast<int>(lin / (std::int64_t{g.dims[0]} * g.dims[1]));
      program const p({x, y, z}, g.dims);
      detail::access_hooks hooks = bounds_only;
      if (!plain.empty()) {
        hooks.tracker = &plain;
        hooks.log = &plain_logs[static_cast<std::size_t>(me)];
        hooks.log->clear();
        hooks.on_load = &ad::plain_load_hook;
      }
      detail::program_scope scope(p, &hooks);
      thread_local ad::program_state state;
      ad::program_result& res = results[static_cast<std::size_t>(me)];
      res.clear();
      res.pool = &chunks;
      state.reset();
      state.tensors = &entries;
      state.out = &res;
      state.id = static_cast<std::uint32_t>(lin + 1);
      state.earlier_waves = static_cast<std::uint32_t>(w0);
      state.grads = sinks.data();
      state.direct = false;
      // Rounding jitter: the caller's choice, on this thread; each program's stream from its id.
      ad::jitter_scope const jittering(jitter);
      state.jitter_state = jitter.seed ^ (0x9e3779b97f4a7c15ull * state.id);
      ad::program_state* saved = ad::current_state();
      ad::current_state() = &state;
      try {
        call(p);
        ad::seed_outputs<T>(state, entries);
        {
          std::lock_guard<std::mutex> lock(merge);
          state.direct = next == me; // every earlier program's contributions are added
        }
        {
          // the caller's choice, on this thread
          ad::magnitude_scope const sweeping(magnitudes, kind);
          state.t.sweep();
        }
        if (any_stream && state.direct)
          simd::stream_fence();
      } catch (...) {
        ad::current_state() = saved;
        throw;
      }
      ad::current_state() = saved;
      if (!state.direct)
        ad::split_by_block<T>(res.held.segments(), blocks, res.pieces);
      std::lock_guard<std::mutex> lock(merge);
      peak = std::max(peak, state.t.peak());
      largest = std::max(largest, res.contributed);
      if (state.direct)
        next = me + 1;
    };
    // In program order: a finished program joins the group; the group is added (block by block,
    // in parallel) once it holds a quarter of the budget, and at the end of the wave.
    auto done = [&](std::int64_t i) {
      ad::program_result const& r = results[static_cast<std::size_t>(i)];
      if (!r.held.segments().empty())
        group_bytes += r.contributed;
      if (group_bytes < budget / 4 && i + 1 < n)
        return;
      if (group_bytes > 0) {
        ad::add_held<T>(opts, results.data() + group, i + 1 - group, plan, sinks, any_stream);
        for (std::int64_t j = group; j <= i; ++j) {
          results[static_cast<std::size_t>(j)].held.release(chunks);
          results[static_cast<std::size_t>(j)].pieces.clear();
        }
        std::lock_guard<std::mutex> lock(merge);
        next = i + 1;
      }
      group = i + 1;
      group_bytes = 0;
    };
    detail::run_ordered(opts, n, static_cast<int>(window), detail::program_runner(run),
                        detail::program_runner(done)); // (window <= n <= wave: an int)
    // Races: each program's accesses against the wave's final stamps, in program order.
    for (std::int64_t i = 0; i < n; ++i) {
      auto const& res = results[static_cast<std::size_t>(i)];
      ad::check_wave_program(entries, readers, w0 + i, res.accesses, g.dims);
      reads |= res.reads;
    }
    if (!plain.empty()) {
      plain.check(w0, plain_logs.data(), n);
      if (plain.race())
        throw plain.race()->error();
    }
  }
  for (auto const& e : entries)
    if (e.wants_grad()) sinks[static_cast<std::size_t>(e.index)].fill_unwritten<T>(e.layout.numel());
  // inout: an element no program stored keeps its value, so its cotangent reaches the input.
  for (auto const& e : entries) {
    if (e.r != ad::role::inout) continue;
    T* gr = static_cast<T*>(sinks[static_cast<std::size_t>(e.index)].data);
    T const* cot = static_cast<T const*>(e.cotangent);
    std::int64_t el = 0; // stamps and the cotangent by offset, the gradient by row-major index
    ad::for_each_offset(e.layout, [&](std::int64_t off) {
      std::uint32_t const s = e.stamp[off];
      if (s == 0 || (s & ad::atomic_stamp))
        gr[el] += cot[off];
      ++el;
    });
  }
  for (auto const& e : entries)
    if (e.wants_grad() && !(reads & (std::uint64_t{1} << e.index))) result.unread_.emplace_back(e.name);
  result.peak_tape_ = peak;
  result.peak_contributions_ = chunks.bytes();
  return result;
}

/// The copies a vjp in another precision runs on, and the tensors its results go back to.
template <class U>
struct rebound_args {
  std::deque<owned_tensor<U>> keep;
  std::vector<std::function<void()>> write_back; // copies the results into the caller's tensors
};

/// An argument of a vjp re-made in precision U: float tensors (marked or not, any float
/// storage type) become copies of element type U laid out as they are (the same offsets and
/// strides, in a buffer of their span: a kernel that takes its strides as numbers, as Triton
/// kernels do, reads the same elements; contiguous copies gave a transposed view's elements
/// another order, and wrong gradients with no error), `float` numbers become U (so a scale or
/// eps follows the reference's precision); integer tensors and other numbers pass through. A
/// tensor the kernel may write gets its result back, converted, after the launch.
template <class U, class X>
auto rebind_arg(X const& x, rebound_args<U>& r) {
  auto copy = [&](auto const& t, char const* name) -> tensor<U> {
    return tilegrad::detail::laid_out_copy<U>(t, r.keep, name);
  };
  auto give_back = [&]<class E>(tensor<E> const& t, tensor<U> const& c) {
    r.write_back.emplace_back([t, c] {
      for (std::int64_t i = 0; i < t.numel(); ++i) {
        std::int64_t const off = t.row_major_offset(i);
        if constexpr (std::is_same_v<E, bf16>)
          t.data()[off] = bf16(static_cast<float>(c.data()[off]));
        else
          t.data()[off] = static_cast<E>(c.data()[off]);
      }
    });
  };
  using F = typename float_of<X>::type;
  if constexpr (std::is_same_v<X, float>) {
    return static_cast<U>(x);
  } else if constexpr (std::is_void_v<F>) {
    return x; // integer tensors, other numbers
  } else if constexpr (requires { x.cotangent; }) {
    tensor<U> const c = copy(x.t, x.name);
    if constexpr (X::r == role::in) {
      return marked_tensor<U, X::r>{x.name, c, {}};
    } else {
      give_back(x.t, c);
      return marked_tensor<U, X::r>{x.name, c, copy(x.cotangent, x.name)};
    }
  } else if constexpr (requires { x.view(); }) {
    return rebind_arg<U>(x.view(), r); // an owning tensor: as its view
  } else {
    tensor<U> const c = copy(x, x.name());
    if constexpr (std::is_const_v<typename X::element_type>) {
      return tensor<U const>(c);
    } else {
      give_back(x, c);
      return c;
    }
  }
}

/// vjp of the launch with every argument rebound to U (rebind_arg), the caller's tensors
/// checked for shared elements first (the copies share nothing).
template <class U, class T, class Kernel, class... Args>
auto vjp_rebound(launch_options const& opts, grid g, Kernel&& kernel, Args const&... args) {
  std::vector<memory_ref> refs;
  (add_memory_ref<T>(args, refs), ...);
  check_overlaps(refs, "tilegrad::vjp", shared_memory_hint);
  // The caller's marked tensors: the kernel reads and writes their copies
  // (access_hooks::watched).
  std::vector<tilegrad::detail::watched_tensor> originals;
  auto add_original = [&]<class X>(X const& x) {
    if constexpr (requires { x.cotangent; })
      if (x.t.numel() > 0)
        originals.push_back(tilegrad::detail::watched_of(x.name, x.t));
  };
  (add_original(args), ...);
  tilegrad::detail::watching_originals const watching(originals);
  rebound_args<U> r;
  std::tuple<decltype(rebind_arg<U>(args, r))...> copies{
      rebind_arg<U>(args, r)...}; // braces: left to right
  auto result = std::apply(
      [&](auto const&... a) { return vjp(opts, g, std::forward<Kernel>(kernel), a...); }, copies);
  for (auto const& f : r.write_back)
    f();
  return result;
}
} // namespace ad

/// vjp of a launch whose float tensors are bf16: the kernel runs on float copies (as
/// adjoint<float>), so bf16 rounding is differentiated as identity, and the gradients are float.
/// The tensors the kernel writes receive its float results rounded to bf16.
template <class Kernel, class... Args>
  requires std::is_same_v<typename ad::first_float<std::remove_cvref_t<Args>...>::type, bf16>
auto vjp(launch_options const& opts, grid g, Kernel&& kernel, Args const&... args) {
  return ad::vjp_rebound<float, bf16>(opts, g, std::forward<Kernel>(kernel), args...);
}

/// vjp_as<U>(grid, kernel, args...): the vjp of the same launch computed in precision U (float
/// or double), whatever the tensors' own type: every float tensor is copied to U, and `float`
/// numbers among the arguments (a scale, an eps) become U, so `vjp_as<double>` of a float kernel
/// is its fp64 reference with no copy written by hand. Returns gradients<U>. The caller's tensors
/// are read, not changed, except those the kernel writes, which receive its results converted
/// back to their type. Shared elements among the caller's tensors are refused as by vjp.
template <class U, class Kernel, class... Args>
auto vjp_as(launch_options const& opts, grid g, Kernel&& kernel, Args const&... args) {
  static_assert(std::is_same_v<U, float> || std::is_same_v<U, double>,
                "tilegrad::vjp_as: the precision is float or double");
  using T = typename ad::first_float<std::remove_cvref_t<Args>...>::type;
  static_assert(!std::is_void_v<T>, "tilegrad::vjp_as: no float tensor among the arguments");
  return ad::vjp_rebound<U, T>(opts, g, std::forward<Kernel>(kernel), args...);
}
template <class U, class Kernel, class... Args>
auto vjp_as(grid g, Kernel&& kernel, Args const&... args) {
  return vjp_as<U>(default_options(), g, std::forward<Kernel>(kernel), args...);
}

template <class Kernel, class... Args>
auto vjp(grid g, Kernel&& kernel, Args const&... args) {
  return vjp(default_options(), g, std::forward<Kernel>(kernel), args...);
}

} // namespace tilegrad

#if TILEGRAD_SEPARATE_COMPILATION // compiled in tilegrad/separate.hpp
namespace tilegrad::ad {
extern template gradients<float> vjp_core<float>(launch_options const&, grid,
                                                 std::vector<tensor_entry>&,
                                                 std::vector<std::string> const&,
                                                 tilegrad::detail::program_call,
                                                 tilegrad::detail::launch_tracker&,
                                                 std::vector<tilegrad::detail::arg_layout> const&);
extern template gradients<double> vjp_core<double>(
    launch_options const&, grid, std::vector<tensor_entry>&, std::vector<std::string> const&,
    tilegrad::detail::program_call, tilegrad::detail::launch_tracker&,
    std::vector<tilegrad::detail::arg_layout> const&);
} // namespace tilegrad::ad
#endif
