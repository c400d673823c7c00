// Tensors that share a buffer, as Triton users pass them: q, k, v as strided views of one packed
// (N, 3, D) buffer, a transposed weight, a strided inout accumulator, outputs interleaved with
// each other and with the inputs in one buffer. Their gradients (vjp in double) are checked
// against central differences of the double forward and against jvp (the dot-product test
// <J u, w> = <u, J^T w>). Tensors that share elements (an in-place kernel marked in + out) are
// refused before any program runs; marked inout, the same kernel is differentiated.
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include "../support/tensors.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_aliasing {

namespace {

namespace tg = tilegrad;
using test_support::fill;
template <class T>
using owned = tg::owned_tensor<T>;

// ---------------------------------------------------------------------------------------------
// Helpers: central differences, inner products over views, random directions.
// ---------------------------------------------------------------------------------------------

// d loss / d x at the current value of x, by central differences (loss runs the double forward).
template <class Loss>
double central(double& x, Loss&& loss, double h = 1e-5) {
  double const x0 = x;
  x = x0 + h;
  double const up = loss();
  x = x0 - h;
  double const down = loss();
  x = x0;
  return (up - down) / (2 * h);
}

// <a, b> over two views of one shape, element by element in row-major order.
template <class A, class B>
double inner(tg::tensor<A> const& a, tg::tensor<B> const& b) {
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    s += double(a.data()[a.row_major_offset(i)]) * double(b.data()[b.row_major_offset(i)]);
  return s;
}
template <class B>
double inner(owned<double> const& a, tg::tensor<B> const& b) {
  return inner(a.cview(), b);
}

// Every element of the gradient g (in x's logical shape) against central differences of `loss`
// in the element of x's memory it belongs to.
template <class E, class Loss>
void expect_central(char const* name, tg::tensor<E> const& x, owned<double> const& g, Loss&& loss) {
  ASSERT_TRUE(x.same_shape(g.cview())) << name;
  auto* const mem = const_cast<double*>(x.data());
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    std::int64_t const off = x.row_major_offset(i);
    double const fd = central(mem[off], loss);
    ASSERT_NEAR(g.data()[i], fd, 1e-7 * (1 + std::abs(fd)))
        << "gradient of '" << name << "' at " << x.coordinates(off);
  }
}

owned<double> random_like(tg::tensor<double const> const& t, unsigned seed) {
  owned<double> r(t.shape().data(), static_cast<std::size_t>(t.rank()));
  fill(r, seed);
  return r;
}

// The dot-product test between forward and reverse mode: sum over outputs of <w, J u> equals sum
// over inputs of <u, J^T w>.
void expect_dot_product(double jvp_side, double vjp_side) {
  EXPECT_NEAR(jvp_side, vjp_side, 1e-10 * (1 + std::abs(vjp_side)));
}

// The message of the std::invalid_argument `f` throws ("" when it throws none).
template <class F>
std::string invalid_argument_of(F&& f) {
  try {
    f();
  } catch (std::invalid_argument const& e) {
    return e.what();
  }
  return "";
}

// ---------------------------------------------------------------------------------------------
// q, k, v as three strided views of one packed (N, 3, D) buffer.
// ---------------------------------------------------------------------------------------------

// o = softmax-free attention: o_i = sum_j exp(q_i . k_j) v_j / sum_j exp(q_i . k_j), one program
// per BM queries, keys in blocks of BN.
template <int BM, int BN, int BD>
constexpr auto attention = []<class T>(tg::program const& p, tg::tensor<T const> q,
                                       tg::tensor<T const> k, tg::tensor<T const> v,
                                       tg::tensor<T> o) {
  using F = tg::fp32<T>;
  int const n = static_cast<int>(k.size(0));
  std::int64_t const q0 = std::int64_t{p.program_id(0)} * BM;
  auto const qi = tg::load(tg::make_block_ptr<BM, BD>(q, {q0, 0}), tg::bounds<0, 1>);
  auto acc = tg::zeros<F, BM, BD>();
  auto l = tg::zeros<F, BM>();
  for (int k0 = 0; k0 < n; k0 += BN) {
    auto const kj = tg::load(tg::make_block_ptr<BN, BD>(k, {k0, 0}), tg::bounds<0, 1>);
    auto const vj = tg::load(tg::make_block_ptr<BN, BD>(v, {k0, 0}), tg::bounds<0, 1>);
    auto const keep = tg::row(k0 + tg::arange<0, BN>() < n);
    tg::tile<F, BM, BN> const s = tg::where(keep, tg::exp(tg::dot(qi, tg::trans(kj))), 0.0);
    l = l + tg::sum<1>(s);
    acc = tg::dot(s, vj, std::move(acc));
  }
  tg::store(tg::make_block_ptr<BM, BD>(o, {q0, 0}), acc / tg::col(l), tg::bounds<0, 1>);
};

// The same per (batch, head): grid (query blocks, B * H), each program on the (N, D) views
// q[b][h], k[b][h], v[b][h], o[b][h].
constexpr auto attention_bh = []<class T>(tg::program const& p, tg::tensor<T const> q,
                                          tg::tensor<T const> k, tg::tensor<T const> v,
                                          tg::tensor<T> o) {
  int const heads = static_cast<int>(q.size(1));
  int const b = p.program_id(1) / heads, h = p.program_id(1) % heads;
  attention<8, 8, 16>(p, q[b][h], k[b][h], v[b][h], o[b][h]);
};

TEST(Aliasing, QKVAsStridedViewsOfOnePackedBuffer) {
  // A fused projection's output, (B, N, 3, H, D) (held as (B * N, 3, H, D)); q, k and v are
  // (B, H, N, D) views of it.
  int const nb = 2, n = 13, nh = 2, d = 12;
  owned<double> qkv({nb * n, 3, nh, d}, "qkv"), o({nb, nh, n, d}, "o"), d_o({nb, nh, n, d}, "do");
  fill(qkv, 1);
  for (double& x : qkv)
    x *= 0.5;
  fill(d_o, 2);
  auto part = [&](int s, char const* name) {
    return tg::tensor<double const>(qkv.data() + s * nh * d, {nb, nh, n, d},
                                    {n * 3 * nh * d, d, 3 * nh * d, 1}, name);
  };
  auto const q = part(0, "q"), k = part(1, "k"), v = part(2, "v");
  tg::grid const g(tg::cdiv(n, 8), nb * nh);

  auto const r = tg::vjp(g, attention_bh, tg::in("q", q), tg::in("k", k), tg::in("v", v),
                         tg::out("o", o, d_o));
  EXPECT_TRUE(r.unread().empty());
  auto loss = [&] {
    owned<double> out({nb, nh, n, d});
    tg::launch(g, attention_bh, q, k, v, out.view());
    return inner(d_o, out.cview());
  };
  expect_central("q", q, r["q"], loss);
  expect_central("k", k, r["k"], loss);
  expect_central("v", v, r["v"], loss);

  auto const uq = random_like(q, 3), uk = random_like(k, 4), uv = random_like(v, 5);
  owned<double> o2({nb, nh, n, d});
  auto const t = tg::jvp(g, attention_bh, tg::tangent_in("q", q, uq), tg::tangent_in("k", k, uk),
                         tg::tangent_in("v", v, uv), tg::tangent_out("o", o2));
  expect_dot_product(inner(d_o, t["o"].cview()), inner(r["q"], uq.cview()) +
                                                     inner(r["k"], uk.cview()) +
                                                     inner(r["v"], uv.cview()));
}

TEST(Aliasing, AViewMadeInTheKernelThatReachesPastItsTensorIsRefused) {
  // q, k, v marked as views of one packed buffer, and a kernel that reads whole packed rows
  // through a view it makes from q's data (a Triton kernel handed qkv_ptr): those lanes are k's
  // and v's elements, and vjp, which credits an access to the tensor its view was made from,
  // gave k and v no gradient at all. Halves of one buffer read, or written, through a view made
  // from the first half reached past its gradient, stamps and cotangent. Each is now refused,
  // naming the program, both tensors and the line of the view.
  int const n = 5, d = 4;
  owned<double> qkv({n, 3, d}, "qkv"), y({n}, "y"), dy({n}, "dy");
  fill(qkv, 1);
  fill(dy, 2);
  auto part = [&](int s, char const* name) {
    return tg::tensor<double const>(qkv.data() + s * d, {n, d}, {3 * d, 1}, name);
  };
  int const load_line = __LINE__ + 8; // the load through the view
  auto const packed_rows = []<class T>(tg::program const&, tg::tensor<T const> q,
                                       tg::tensor<T const>, tg::tensor<T const>, tg::tensor<T> y) {
    using F = tg::fp32<T>;
    tg::tensor<T const> const rows(q.data(), {q.size(0), 3 * q.size(1)}, {q.stride(0), 1}, "qkv");
    auto const r = tg::arange<0, 8>();
    auto const c = tg::arange<0, 16>();
    auto const m = tg::col(r < rows.size(0)) & tg::row(c < rows.size(1));
    tg::tile<F, 8, 16> const t = tg::load(rows + tg::col(r) * rows.stride(0) + tg::row(c), m, 0.0);
    tg::store(y + r, tg::sum<1>(tg::sin(t)), r < y.size(0));
  };
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (tg::access_error const& e) {
      return e.what();
    }
    return "";
  };
  std::string const packed = message([&] {
    tg::vjp(1, packed_rows, tg::in("q", part(0, "q")), tg::in("k", part(1, "k")),
            tg::in("v", part(2, "v")), tg::out("y", y, dy));
  });
  for (char const* piece :
       {"tilegrad::vjp: program (0, 0, 0) loads an address through a view made from the data of "
        "tensor 'q' (at ",
        ", element offset 4 from its first element, which is not an element of 'q' (it is one of "
        "'k')"})
    EXPECT_NE(packed.find(piece), std::string::npos) << piece << "\n" << packed;
  EXPECT_NE(packed.find("test_aliasing.cpp:" + std::to_string(load_line)), std::string::npos)
      << packed;

  // Halves of one contiguous buffer: read, and written, through a view of the first.
  owned<double> ab({2 * n}, "ab"), yz({2 * n}, "yz"), dyz({2 * n}, "dyz");
  fill(ab, 3);
  fill(dyz, 4);
  auto half = [&](owned<double>& b, int s, char const* name) {
    return tg::tensor<double>(b.data() + s * n, {n}, name);
  };
  auto chalf = [&](owned<double>& b, int s, char const* name) {
    return tg::tensor<double const>(b.data() + s * n, {n}, name);
  };
  auto const read_halves = []<class T>(tg::program const&, tg::tensor<T const> a,
                                       tg::tensor<T const>, tg::tensor<T> y) {
    using F = tg::fp32<T>;
    std::int64_t const m = a.size(0);
    tg::tensor<T const> const whole(a.data(), {2 * m}, "whole");
    auto const o = tg::arange<0, 8>();
    tg::tile<F, 8> const bv = tg::load(whole + m + o, o < m, 0.0);
    tg::store(y + o, bv * bv, o < m);
  };
  std::string const read = message([&] {
    tg::vjp(1, read_halves, tg::in("a", chalf(ab, 0, "a")), tg::in("b", chalf(ab, 1, "b")),
            tg::out("y", y, dy));
  });
  EXPECT_NE(read.find("loads an address through a view made from the data of tensor 'a' (at "),
            std::string::npos)
      << read;
  EXPECT_NE(read.find("which is not an element of 'a' (it is one of 'b')"), std::string::npos)
      << read;
  auto const write_halves = []<class T>(tg::program const&, tg::tensor<T const> a, tg::tensor<T> y,
                                        tg::tensor<T>) {
    std::int64_t const m = a.size(0);
    tg::tensor<T> const whole(y.data(), {2 * m}, "whole");
    auto const o = tg::arange<0, 8>();
    tg::store(whole + m + o, tg::load(a + o, o < m, 0.0) * 2.0, o < m);
  };
  owned<double> a({n}, "a");
  fill(a, 5);
  std::string const written = message([&] {
    tg::vjp(1, write_halves, tg::in("a", a), tg::out("y", half(yz, 0, "y"), chalf(dyz, 0, "dy")),
            tg::out("z", half(yz, 1, "z"), chalf(dyz, 1, "dz")));
  });
  EXPECT_NE(written.find("stores an address through a view made from the data of tensor 'y' ("),
            std::string::npos)
      << written;
  EXPECT_NE(written.find("(it is one of 'z')"), std::string::npos) << written;
  // Into memory that no tensor of the launch holds (the last third of a buffer whose middle
  // third is marked).
  owned<double> abc({3 * n}, "abc");
  fill(abc, 6);
  std::string const beyond = message([&] {
    tg::vjp(1, read_halves, tg::in("a", chalf(abc, 1, "a")), chalf(ab, 0, "w"),
            tg::out("y", y, dy));
  });
  EXPECT_NE(beyond.find("(it is outside every tensor of the launch)"), std::string::npos)
      << beyond;
  // The same views made from the data of a tensor passed without a gradient: its loads recorded
  // nothing, and the marked tensors' elements read through them got no gradient (k and v of the
  // packed rows, b of the halves: all zero), with no error.
  std::string const passive_packed = message([&] {
    tg::vjp(1, packed_rows, part(0, "q"), tg::in("k", part(1, "k")), tg::in("v", part(2, "v")),
            tg::out("y", y, dy));
  });
  EXPECT_NE(passive_packed.find("loads an address through a view made from the data of tensor "
                                "'q' (at "),
            std::string::npos)
      << passive_packed;
  EXPECT_NE(passive_packed.find("which is not an element of 'q' (it is one of 'k')"),
            std::string::npos)
      << passive_packed;
  std::string const passive_read = message([&] {
    tg::vjp(1, read_halves, chalf(ab, 0, "a"), tg::in("b", chalf(ab, 1, "b")), tg::out("y", y, dy));
  });
  EXPECT_NE(passive_read.find("which is not an element of 'a' (it is one of 'b')"),
            std::string::npos)
      << passive_read;
  // An inout tensor's elements (initial values, or what another program stored) read so.
  auto const read_then_write = []<class T>(tg::program const& p, tg::tensor<T const> a,
                                           tg::tensor<T> b, tg::tensor<T> y) {
    using F = tg::fp32<T>;
    std::int64_t const m = a.size(0);
    tg::tensor<T const> const whole(a.data(), {2 * m}, "whole");
    auto const o = tg::arange<0, 8>();
    tg::tile<F, 8> const bv = tg::load(whole + m + o, o < m, 0.0);
    if (p.program_id(0) == 0)
      tg::store(y + o, bv * bv, o < m);
    else
      tg::store(b + o, bv * 3.0, o < m);
  };
  std::string const passive_inout = message([&] {
    tg::vjp(2, read_then_write, chalf(ab, 0, "a"),
            tg::inout("b", half(ab, 1, "b"), chalf(yz, 1, "db")), tg::out("y", y, dy));
  });
  EXPECT_NE(passive_inout.find("which is not an element of 'a' (it is one of 'b')"),
            std::string::npos)
      << passive_inout;
  // Reading a neighbour without a gradient through such a view, or memory of no tensor, is
  // allowed: no gradient goes astray.
  owned<double> w({n}, "w");
  fill(w, 9);
  auto const halves_and_w = []<class T>(tg::program const&, tg::tensor<T const> a,
                                        tg::tensor<T const>, tg::tensor<T const> w,
                                        tg::tensor<T> y) {
    using F = tg::fp32<T>;
    std::int64_t const m = a.size(0);
    tg::tensor<T const> const whole(a.data(), {2 * m}, "whole");
    auto const o = tg::arange<0, 8>();
    tg::tile<F, 8> const bv = tg::load(whole + m + o, o < m, 0.0);
    tg::store(y + o, bv * tg::load(w + o, o < m, 0.0), o < m);
  };
  auto const gw = tg::vjp(1, halves_and_w, chalf(ab, 0, "a"), chalf(ab, 1, "b"), tg::in("w", w),
                          tg::out("y", y, dy));
  for (int i = 0; i < n; ++i)
    EXPECT_EQ(gw["w"].data()[i], ab.data()[n + i] * dy.data()[i]) << i;

  // jvp runs the kernel on a copy of each tensor: the same views read past a copy (the values
  // came back as inf and 6e72 where 1.26 was right). Refused before the access.
  owned<double> uq({n, d}, "uq"), y2({n}, "y2");
  fill(uq, 7);
  std::string const forward_packed = message([&] {
    tg::jvp(1, packed_rows, tg::tangent_in("q", part(0, "q"), uq), part(1, "k"), part(2, "v"),
            tg::tangent_out("y", y2));
  });
  for (char const* piece : {"tilegrad::jvp: program (0, 0, 0), a load at ",
                            " through a view made from the data of tensor 'q', reaches element "
                            "offset 4 from its first element, which is not an element of 'q'"})
    EXPECT_NE(forward_packed.find(piece), std::string::npos) << piece << "\n" << forward_packed;
  EXPECT_NE(forward_packed.find("test_aliasing.cpp:" + std::to_string(load_line)),
            std::string::npos)
      << forward_packed;
  owned<double> ua({n}, "ua");
  fill(ua, 8);
  std::string const forward_halves = message([&] {
    tg::jvp(1, read_halves, tg::tangent_in("a", chalf(ab, 0, "a"), ua), chalf(ab, 1, "b"),
            tg::tangent_out("y", y2));
  });
  EXPECT_NE(forward_halves.find("a load at "), std::string::npos) << forward_halves;
  EXPECT_NE(forward_halves.find("which is not an element of 'a'"), std::string::npos)
      << forward_halves;
  std::string const forward_written = message([&] {
    tg::jvp(1, write_halves, tg::tangent_in("a", a, ua), tg::tangent_out("y", half(yz, 0, "y")),
            tg::tangent_out("z", half(yz, 1, "z")));
  });
  EXPECT_NE(forward_written.find("a store at "), std::string::npos) << forward_written;
  EXPECT_NE(forward_written.find("which is not an element of 'y'"), std::string::npos)
      << forward_written;
  // Views that stay inside their tensor are untouched: the packed buffer passed whole.
  auto const whole_rows = []<class T>(tg::program const&, tg::tensor<T const> qkv_rows,
                                      tg::tensor<T> y) {
    using F = tg::fp32<T>;
    auto const r = tg::arange<0, 8>();
    auto const c = tg::arange<0, 16>();
    auto const m = tg::col(r < qkv_rows.size(0)) & tg::row(c < qkv_rows.size(1));
    tg::tile<F, 8, 16> const t =
        tg::load(qkv_rows + tg::col(r) * qkv_rows.stride(0) + tg::row(c), m, 0.0);
    tg::store(y + r, tg::sum<1>(tg::sin(t)), r < y.size(0));
  };
  tg::tensor<double const> const rows(qkv.data(), {n, 3 * d}, "qkv");
  owned<double> urows({n, 3 * d}, "urows");
  fill(urows, 9);
  auto const g = tg::vjp(1, whole_rows, tg::in("qkv", rows), tg::out("y", y, dy));
  auto const t = tg::jvp(1, whole_rows, tg::tangent_in("qkv", rows, urows), tg::tangent_out("y", y2));
  double jv = 0, vj = 0;
  for (int i = 0; i < n; ++i)
    jv += t["y"](i) * dy(i);
  for (int i = 0; i < n * 3 * d; ++i)
    vj += g["qkv"].data()[i] * urows.data()[i];
  EXPECT_NEAR(jv, vj, 1e-12 * (1 + std::abs(jv)));
  EXPECT_NE(vj, 0.0);
}

// ---------------------------------------------------------------------------------------------
// A transposed weight, and an accumulator that is a strided view (inout).
// ---------------------------------------------------------------------------------------------

// c += a @ w for a (M, K), w (K, N), c (M, N); w is loaded through a pointer tile with its own
// strides (a transposed view of an (N, K) weight, as `x @ W.T` passes it), a and c through block
// pointers.
template <int BM, int BN, int BK>
constexpr auto linear_accumulate = []<class T>(tg::program const& p, tg::tensor<T const> a,
                                               tg::tensor<T const> w, tg::tensor<T> c) {
  using F = tg::fp32<T>;
  int const K = static_cast<int>(a.size(1)), N = static_cast<int>(w.size(1));
  std::int64_t const m0 = std::int64_t{p.program_id(0)} * BM;
  int const n0 = p.program_id(1) * BN;
  auto const offs_k = tg::arange<0, BK>();
  auto const offs_n = n0 + tg::arange<0, BN>();
  auto w_ptrs = w + (tg::col(offs_k) * w.stride(0) + tg::row(offs_n) * w.stride(1));
  auto acc = tg::zeros<F, BM, BN>();
  for (int k0 = 0; k0 < K; k0 += BK) {
    auto const at = tg::load(tg::make_block_ptr<BM, BK>(a, {m0, k0}), tg::bounds<0, 1>);
    auto const wt = tg::load(w_ptrs, (tg::col(offs_k) < K - k0) & (tg::row(offs_n) < N), 0.0);
    acc = tg::dot(at, wt, std::move(acc));
    w_ptrs += BK * w.stride(0);
  }
  auto const cb = tg::make_block_ptr<BM, BN>(c, {m0, n0});
  tg::store(cb, tg::load(cb, tg::bounds<0, 1>) + acc, tg::bounds<0, 1>);
};

TEST(Aliasing, TransposedWeightAndStridedInoutAccumulator) {
  int const m = 19, kk = 13, n = 11;
  constexpr auto kernel = linear_accumulate<8, 8, 8>;
  owned<double> a({m, kk}, "a"), weight({n, kk}, "weight"), cbuf({m, n + 3}, "cbuf");
  owned<double> dc({m, n}, "dc");
  fill(a, 6), fill(weight, 7), fill(cbuf, 8), fill(dc, 9);
  tg::tensor<double const> const w(weight.data(), {kk, n}, {1, kk}, "w"); // weight.T
  tg::tensor<double> const c(cbuf.data() + 1, {m, n}, {n + 3, 1}, "c");   // columns 1..n
  owned<double> c0(cbuf); // c's initial value (central differences move its elements)
  tg::tensor<double const> const c_start(c0.data() + 1, {m, n}, {n + 3, 1}, "c");
  tg::grid const g(tg::cdiv(m, 8), tg::cdiv(n, 8));

  auto const r = tg::vjp(g, kernel, tg::in("a", a), tg::in("w", w), tg::inout("c", c, dc.cview()));
  ASSERT_EQ(r["w"].size(0), kk); // the gradient of a view has the view's shape
  ASSERT_EQ(r["w"].size(1), n);
  // The forward ran in place: c = c0 + a @ weight.T.
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = c0(i, j + 1);
      for (int q = 0; q < kk; ++q)
        s += a(i, q) * weight(j, q);
      ASSERT_NEAR(c(i, j), s, 1e-12) << i << ", " << j;
    }
  // Columns outside the view are untouched.
  for (int i = 0; i < m; ++i) {
    ASSERT_EQ(cbuf(i, 0), c0(i, 0));
    ASSERT_EQ(cbuf(i, n + 1), c0(i, n + 1));
  }

  auto loss = [&] {
    std::copy(c0.begin(), c0.end(), cbuf.begin()); // c's initial value, then the launch
    tg::launch(g, kernel, a.cview(), w, c);
    return inner(dc, tg::tensor<double const>(c));
  };
  expect_central("a", a.cview(), r["a"], loss);
  expect_central("w", w, r["w"], loss);
  expect_central("c", c_start, r["c"], loss);

  auto const ua = random_like(a.cview(), 10), uw = random_like(w, 11), uc = random_like(c, 12);
  std::copy(c0.begin(), c0.end(), cbuf.begin());
  auto const t = tg::jvp(g, kernel, tg::tangent_in("a", a, ua), tg::tangent_in("w", w, uw),
                         tg::tangent_inout("c", c, uc));
  expect_dot_product(inner(dc, t["c"].cview()), inner(r["a"], ua.cview()) +
                                                    inner(r["w"], uw.cview()) +
                                                    inner(r["c"], uc.cview()));
}

// y[i, j] = x[i, n - 1 - j] * x[i, 3 j mod n]: a row read backwards and a gather, through x's
// strides (the lanes of a transposed view's row are a run with a negative step, and lanes that
// follow no axis).
constexpr auto reverse_gather = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                            tg::tensor<T> y) {
  std::int64_t const i = p.program_id(0);
  int const n = static_cast<int>(x.size(1));
  auto const j = tg::arange<0, 16>();
  auto const m = j < n;
  auto const row = x + i * x.stride(0);
  auto const a = tg::load(row + (n - 1 - j) * x.stride(1), m, 0.0);
  auto const b = tg::load(row + ((3 * j) % n) * x.stride(1), m, 0.0);
  tg::store(y + i * y.stride(0) + j * y.stride(1), a * b, m);
};

TEST(Aliasing, TransposedViewReadBackwardsAndGathered) {
  int const rows = 7, n = 13;
  owned<double> storage({n, rows}, "storage"), y({rows, n}, "y"), dy({rows, n}, "dy");
  fill(storage, 29), fill(dy, 30);
  tg::tensor<double const> const x(storage.data(), {rows, n}, {1, rows}, "x"); // storage.T
  auto const r = tg::vjp(rows, reverse_gather, tg::in("x", x), tg::out("y", y, dy));
  auto loss = [&] {
    owned<double> out({rows, n});
    tg::launch(rows, reverse_gather, x, out.view());
    return inner(dy, out.cview());
  };
  expect_central("x", x, r["x"], loss);
  auto const u = random_like(x, 31);
  owned<double> y2({rows, n});
  auto const t = tg::jvp(rows, reverse_gather, tg::tangent_in("x", x, u), tg::tangent_out("y", y2));
  expect_dot_product(inner(dy, t["y"].cview()), inner(r["x"], u.cview()));
}

// ---------------------------------------------------------------------------------------------
// Inputs and outputs interleaved in one buffer.
// ---------------------------------------------------------------------------------------------

// Polar to Cartesian, element by element: re = r cos(theta), im = r sin(theta), all four (N, D)
// tensors with any strides.
constexpr auto polar = []<class T>(tg::program const& p, tg::tensor<T const> r,
                                   tg::tensor<T const> th, tg::tensor<T> re, tg::tensor<T> im) {
  auto const i = tg::col(p.program_id(0) * 8 + tg::arange<0, 8>());
  auto const j = tg::row(tg::arange<0, 16>());
  auto const mask = (i < r.size(0)) & (j < r.size(1));
  auto at = [&](auto const& t) { return t + (i * t.stride(0) + j * t.stride(1)); };
  auto const rv = tg::load(at(r), mask, 0.0);
  auto const tv = tg::load(at(th), mask, 0.0);
  tg::store(at(re), rv * tg::cos(tv), mask);
  tg::store(at(im), rv * tg::sin(tv), mask);
};

TEST(Aliasing, InputsAndOutputsInterleavedInOneBuffer) {
  int const n = 13, d = 10;
  {
    // Two outputs interleaved in one (N, D, 2) buffer, the inputs tensors of their own.
    owned<double> r({n, d}, "r"), th({n, d}, "theta"), z({n, d, 2}, "z");
    owned<double> dre({n, d}, "dre"), dim({n, d}, "dim");
    fill(r, 10), fill(th, 11), fill(dre, 12), fill(dim, 26);
    tg::tensor<double> const re(z.data(), {n, d}, {2 * d, 2}, "re"),
        im(z.data() + 1, {n, d}, {2 * d, 2}, "im");
    auto const gr = tg::vjp(tg::cdiv(n, 8), polar, tg::in("r", r), tg::in("theta", th),
                            tg::out("re", re, dre.cview()), tg::out("im", im, dim.cview()));
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < d; ++b) {
        ASSERT_DOUBLE_EQ(z(a, b, 1), r(a, b) * std::sin(th(a, b)));
        double const dr = dre(a, b) * std::cos(th(a, b)) + dim(a, b) * std::sin(th(a, b));
        ASSERT_NEAR(gr["r"](a, b), dr, 1e-14) << a << ", " << b;
      }
  }
  // One (N, D, 4) buffer holds r, theta, re, im at slots 0, 1, 2, 3: ranges overlap, elements not.
  owned<double> buf({n, d, 4}, "buf"), dre({n, d}, "dre"), dim({n, d}, "dim");
  fill(buf, 13), fill(dre, 14), fill(dim, 15);
  auto slot = [&](int s, char const* name) {
    return tg::tensor<double>(buf.data() + s, {n, d}, {4 * d, 4}, name);
  };
  tg::tensor<double const> const r = slot(0, "r"), th = slot(1, "theta");
  tg::tensor<double> const re = slot(2, "re"), im = slot(3, "im");
  tg::grid const g(tg::cdiv(n, 8));

  auto const g1 = tg::vjp(g, polar, tg::in("r", r), tg::in("theta", th),
                          tg::out("re", re, dre.cview()), tg::out("im", im, dim.cview()));
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < d; ++b) {
      ASSERT_DOUBLE_EQ(re(a, b), r(a, b) * std::cos(th(a, b)));
      ASSERT_DOUBLE_EQ(im(a, b), r(a, b) * std::sin(th(a, b)));
      double const dr = dre(a, b) * std::cos(th(a, b)) + dim(a, b) * std::sin(th(a, b));
      double const dth =
          r(a, b) * (dim(a, b) * std::cos(th(a, b)) - dre(a, b) * std::sin(th(a, b)));
      ASSERT_NEAR(g1["r"](a, b), dr, 1e-14) << a << ", " << b;
      ASSERT_NEAR(g1["theta"](a, b), dth, 1e-14) << a << ", " << b;
    }
  auto const g2 = tg::vjp(g, polar, r, tg::in("theta", th), tg::out("re", re, dre.cview()),
                          tg::out("im", im, dim.cview())); // r passive
  EXPECT_FALSE(g2.contains("r"));
  for (std::int64_t e = 0; e < g1["theta"].numel(); ++e)
    ASSERT_EQ(g2["theta"].data()[e], g1["theta"].data()[e]);

  auto loss = [&] {
    tg::launch(g, polar, r, th, re, im);
    return inner(dre, tg::tensor<double const>(re)) + inner(dim, tg::tensor<double const>(im));
  };
  expect_central("r", r, g1["r"], loss);
  expect_central("theta", th, g1["theta"], loss);

  auto const ur = random_like(r, 16), ut = random_like(th, 17);
  auto const t = tg::jvp(g, polar, tg::tangent_in("r", r, ur), tg::tangent_in("theta", th, ut),
                         tg::tangent_out("re", re), tg::tangent_out("im", im));
  expect_dot_product(inner(dre, t["re"].cview()) + inner(dim, t["im"].cview()),
                     inner(g1["r"], ur.cview()) + inner(g1["theta"], ut.cview()));

  // Read-only tensors without a gradient may share elements: nothing tracks them. A tensor
  // marked in may not: reads through the other argument would be taken for its own.
  tg::tensor<double const> const r_again = r.named("r_again");
  EXPECT_NO_THROW(tg::vjp(g, polar, r, r_again, tg::out("re", re, dre.cview()),
                          tg::out("im", im, dim.cview())));
  std::string const passive = invalid_argument_of([&] {
    tg::vjp(g, polar, tg::in("r", r), r_again, tg::out("re", re, dre.cview()),
            tg::out("im", im, dim.cview()));
  });
  EXPECT_NE(passive.find("'r'"), std::string::npos) << passive;
  EXPECT_NE(passive.find("'r_again'"), std::string::npos) << passive;

  // The fast path's mode (adjoint<float>) looks tensors up the same way.
  owned<float> fbuf({n, d, 4}, "buf"), fdre({n, d}), fdim({n, d});
  for (std::int64_t e = 0; e < buf.numel(); ++e)
    fbuf.data()[e] = static_cast<float>(buf.data()[e]);
  for (std::int64_t e = 0; e < dre.numel(); ++e) {
    fdre.data()[e] = static_cast<float>(dre.data()[e]);
    fdim.data()[e] = static_cast<float>(dim.data()[e]);
  }
  auto fslot = [&](int s, char const* name) {
    return tg::tensor<float>(fbuf.data() + s, {n, d}, {4 * d, 4}, name);
  };
  auto const gf = tg::vjp(g, polar, tg::in("r", tg::tensor<float const>(fslot(0, "r"))),
                          tg::in("theta", tg::tensor<float const>(fslot(1, "theta"))),
                          tg::out("re", fslot(2, "re"), fdre.cview()),
                          tg::out("im", fslot(3, "im"), fdim.cview()));
  for (std::int64_t e = 0; e < g1["r"].numel(); ++e) {
    ASSERT_NEAR(gf["r"].data()[e], g1["r"].data()[e], 1e-5) << e;
    ASSERT_NEAR(gf["theta"].data()[e], g1["theta"].data()[e], 1e-5) << e;
  }
}

// ---------------------------------------------------------------------------------------------
// In-place kernels: one buffer read and written.
// ---------------------------------------------------------------------------------------------

// y = x * sigmoid(x), element by element; launched with y = x it runs in place.
constexpr auto silu = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
  auto const i = p.program_id(0) * 16 + tg::arange<0, 16>();
  auto const v = tg::load(x + i, i < x.size(0), 0.0);
  tg::store(y + i, v * tg::sigmoid(v), i < y.size(0));
};
// The same with its arguments the other way round (the output listed first).
constexpr auto silu_yx = []<class T>(tg::program const& p, tg::tensor<T> y, tg::tensor<T const> x) {
  silu(p, x, y);
};
// The same kernel written for one tensor, read and written in place.
constexpr auto silu_in_place = []<class T>(tg::program const& p, tg::tensor<T> x) {
  auto const i = p.program_id(0) * 16 + tg::arange<0, 16>();
  auto const v = tg::load(x + i, i < x.size(0), 0.0);
  tg::store(x + i, v * tg::sigmoid(v), i < x.size(0));
};
// y[i] = x[i] + x[i + 1]; in place, program b reads the first element of program b + 1's block.
constexpr auto add_next = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                      tg::tensor<T> y) {
  auto const i = p.program_id(0) * 16 + tg::arange<0, 16>();
  auto const v =
      tg::load(x + i, i < x.size(0), 0.0) + tg::load(x + (i + 1), i + 1 < x.size(0), 0.0);
  tg::store(y + i, v, i < y.size(0));
};
constexpr auto add_next_in_place = []<class T>(tg::program const& p, tg::tensor<T> x) {
  add_next(p, tg::tensor<T const>(x), x);
};

TEST(Aliasing, InPlaceKernelMarkedInAndOutIsRefusedAndMarkedInoutIsDifferentiated) {
  int const n = 37;
  tg::grid const g(tg::cdiv(n, 16));
  owned<double> x({n}, "buffer"), dx({n}, "dx");
  fill(x, 18), fill(dx, 19);
  owned<double> const x0(x);
  auto const xs = x.view();
  auto expect_names_both = [](std::string const& msg) {
    EXPECT_NE(msg.find("'x'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'y'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("inout"), std::string::npos) << msg;
  };
  // Marked in and out, in either order: refused before any program runs.
  expect_names_both(invalid_argument_of(
      [&] { tg::vjp(g, silu, tg::in("x", xs), tg::out("y", xs, dx.cview())); }));
  expect_names_both(invalid_argument_of(
      [&] { tg::vjp(g, silu_yx, tg::out("y", xs, dx.cview()), tg::in("x", xs)); }));
  // A neighbour read that races (through the `in` view, which carries no stamps): refused too.
  expect_names_both(invalid_argument_of(
      [&] { tg::vjp(g, add_next, tg::in("x", xs), tg::out("y", xs, dx.cview())); }));
  // y one element behind x: they share all but one element.
  tg::tensor<double const> const head(x.data(), {n - 1}, "x");
  tg::tensor<double> const tail(x.data() + 1, {n - 1}, "y");
  tg::tensor<double const> const d_tail(dx.data(), {n - 1});
  expect_names_both(invalid_argument_of(
      [&] { tg::vjp(g, silu, tg::in("x", head), tg::out("y", tail, d_tail)); }));
  for (int i = 0; i < n; ++i)
    ASSERT_EQ(x(i), x0(i)) << "a program ran";
  // A broadcast view (stride 0) has no gradient of its own elements.
  owned<double> y({4, 8}, "y"), dy({4, 8});
  tg::tensor<double const> const row(x.data(), {4, 8}, {0, 1}, "x");
  EXPECT_NE(invalid_argument_of([&] {
              tg::vjp(1, silu, tg::in("x", row), tg::out("y", y, dy));
            }).find("strides (0, 1)"),
            std::string::npos);

  // Marked inout, the in-place kernel is differentiated: its elements are read before a store.
  auto const r = tg::vjp(g, silu_in_place, tg::inout("x", xs, dx.cview()));
  for (int i = 0; i < n; ++i) {
    double const s = 1 / (1 + std::exp(-x0(i)));
    ASSERT_NEAR(x(i), x0(i) * s, 1e-15);
    ASSERT_NEAR(r["x"](i), dx(i) * (s + x0(i) * s * (1 - s)), 1e-14) << i;
  }
  owned<double> start(x0); // the initial value, which central differences move
  auto loss = [&] {
    owned<double> z(start);
    tg::launch(g, silu_in_place, z.view());
    return inner(dx, z.cview());
  };
  expect_central("x", start.cview(), r["x"], loss);
  owned<double> z(x0), u({n});
  fill(u, 22);
  auto const t = tg::jvp(g, silu_in_place, tg::tangent_inout("x", z, u));
  expect_dot_product(inner(dx, t["x"].cview()), inner(r["x"], u.cview()));

  // Marked inout, the racy neighbour read is found, wherever the programs ran.
  owned<double> w(x0);
  try {
    tg::vjp(g, add_next_in_place, tg::inout("x", w.view(), dx.cview()));
    FAIL() << "expected a race_error";
  } catch (tg::race_error const& e) {
    EXPECT_EQ(e.tensor(), "x");
    EXPECT_EQ(e.element(), "(16)");
  }
}

// ---------------------------------------------------------------------------------------------
// An inout tensor only accumulated into with atomic_add.
// ---------------------------------------------------------------------------------------------

// y[j] += sum over this program's rows i of x[i, j]^2.
constexpr auto column_square_sums = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                                tg::tensor<T> y) {
  auto const r = p.program_id(0) * 8 + tg::arange<0, 8>();
  auto const c = tg::arange<0, 16>();
  auto const m = tg::col(r < x.size(0)) & tg::row(c < x.size(1));
  auto const v = tg::load(x + tg::col(r) * x.stride(0) + tg::row(c), m, 0.0);
  tg::atomic_add(y + c * y.stride(0), tg::sum<0>(v * v), c < x.size(1));
};

TEST(Aliasing, InoutOnlyUpdatedAtomicallyIsRead) {
  int const n = 19, d = 11;
  owned<double> x({n, d}, "x"), ybuf({d, 2}, "ybuf"), dy({d}, "dy");
  fill(x, 23), fill(ybuf, 24), fill(dy, 25);
  {
    owned<double> y({d}, "y");
    auto const r = tg::vjp(tg::cdiv(n, 8), column_square_sums, tg::in("x", x),
                           tg::inout("y", y.view(), dy.cview()));
    EXPECT_TRUE(r.unread().empty()) << r.unread().front();
  }
  // y is every other element of a buffer: its unwritten elements pass their cotangent through.
  tg::tensor<double> const y(ybuf.data(), {d}, {2}, "y");
  owned<double> const y0(ybuf);
  auto const r =
      tg::vjp(tg::cdiv(n, 8), column_square_sums, tg::in("x", x), tg::inout("y", y, dy.cview()));
  EXPECT_TRUE(r.unread().empty()) << r.unread().front();
  for (int j = 0; j < d; ++j) {
    ASSERT_EQ(r["y"](j), dy(j)); // y's initial value passes through
    ASSERT_EQ(ybuf(j, 1), y0(j, 1));
  }
  auto loss = [&] {
    owned<double> yy(y0);
    tg::launch(tg::cdiv(n, 8), column_square_sums, x.cview(),
               tg::tensor<double>(yy.data(), {d}, {2}));
    return inner(dy, tg::tensor<double const>(yy.data(), {d}, {2}));
  };
  expect_central("x", x.cview(), r["x"], loss);
  owned<double> ux({n, d}), uy({d});
  fill(ux, 27), fill(uy, 28);
  std::copy(y0.begin(), y0.end(), ybuf.begin());
  auto const t = tg::jvp(tg::cdiv(n, 8), column_square_sums, tg::tangent_in("x", x, ux),
                         tg::tangent_inout("y", y, uy));
  expect_dot_product(inner(dy, t["y"].cview()),
                     inner(r["x"], ux.cview()) + inner(r["y"], uy.cview()));
}

// ---------------------------------------------------------------------------------------------
// check_backward on strided views of one buffer.
// ---------------------------------------------------------------------------------------------

// y = q * k + v, element by element, through any strides.
constexpr auto multiply_add = []<class T>(tg::program const& p, tg::tensor<T const> q,
                                          tg::tensor<T const> k, tg::tensor<T const> v,
                                          tg::tensor<T> y) {
  auto const i = tg::col(p.program_id(0) * 8 + tg::arange<0, 8>());
  auto const j = tg::row(tg::arange<0, 16>());
  auto const mask = (i < y.size(0)) & (j < y.size(1));
  auto at = [&](auto const& t) { return t + (i * t.stride(0) + j * t.stride(1)); };
  tg::store(at(y),
            tg::load(at(q), mask, 0.0f) * tg::load(at(k), mask, 0.0f) + tg::load(at(v), mask, 0.0f),
            mask);
};

TEST(Aliasing, CheckBackwardTakesStridedViewsAndRefusesSharedElements) {
  int const n = 21, d = 12;
  owned<float> qkv({n, 3, d}, "qkv"), y({n, d}, "y");
  auto part = [&](int s, char const* name) {
    return tg::tensor<float const>(qkv.data() + s * d, {n, d}, {3 * d, 1}, name);
  };
  // The hand-written backward reads the inputs through their strided views.
  auto backward = [](tg::backward_context<float>& ctx) -> tg::gradient_set {
    auto const q = ctx.input("q"), k = ctx.input("k");
    auto const dy = ctx.cotangent("y");
    owned<float> dq({q.size(0), q.size(1)}), dk({q.size(0), q.size(1)}), dv({q.size(0), q.size(1)});
    for (std::int64_t a = 0; a < q.size(0); ++a)
      for (std::int64_t b = 0; b < q.size(1); ++b) {
        dq(a, b) = dy(a, b) * k(a, b);
        dk(a, b) = dy(a, b) * q(a, b);
        dv(a, b) = dy(a, b);
      }
    return {{"q", dq}, {"k", dk}, {"v", dv}};
  };
  auto const rep = tg::check_backward(
      tg::forward(tg::cdiv(n, 8), multiply_add, tg::in("q", part(0, "q")),
                  tg::in("k", part(1, "k")), tg::in("v", part(2, "v")), tg::out("y", y)),
      backward);
  EXPECT_TRUE(rep) << rep;

  // The output written over q's elements (an in-place kernel marked in and out): refused.
  tg::tensor<float> const over_q(qkv.data(), {n, d}, {3 * d, 1}, "y");
  auto const bad = tg::check_backward(
      tg::forward(tg::cdiv(n, 8), multiply_add, tg::in("q", part(0, "q")),
                  tg::in("k", part(1, "k")), tg::in("v", part(2, "v")), tg::out("y", over_q)),
      backward);
  EXPECT_FALSE(bad);
  EXPECT_TRUE(bad.mentions("share memory")) << bad;
  EXPECT_TRUE(bad.mentions("'q'") && bad.mentions("'y'")) << bad;
}

// y = sigmoid(s x) x by rows of 8, x and y indexed with strides passed as numbers, as Triton
// kernels take them (stride_xm, stride_xn, stride_ym, stride_yn).
constexpr auto strided_by_numbers = []<class T, class S>(tg::program const& p,
                                                         tg::tensor<T const> x, tg::tensor<T> y,
                                                         std::int64_t sxm, std::int64_t sxn,
                                                         std::int64_t sym, std::int64_t syn, S s) {
  using F = tg::fp32<T>;
  auto const r = p.program_id(0) * 8 + tg::arange<0, 8>();
  auto const c = tg::arange<0, 16>();
  auto const m = tg::col(r < x.size(0)) & tg::row(c < x.size(1));
  tg::tile<F, 8, 16> const v =
      tg::to<F>(tg::load(x + tg::col(r) * sxm + tg::row(c) * sxn, m, 0.0f));
  tg::store(y + tg::col(r) * sym + tg::row(c) * syn, tg::sigmoid(v * s) * v, m);
};

TEST(Aliasing, CopiesInAnotherPrecisionAreLaidOutAsTheCallersTensors) {
  // vjp_as<double>, vjp of bf16 tensors and check_backward's references run on copies. They were
  // contiguous: a kernel given the caller's strides as numbers read a transposed view's copy in
  // another order, inside its bounds, and the gradients came out wrong with no error (2.9 off
  // where they are about 1), and check_backward failed a correct backward on every element off
  // the diagonal. The copies now keep the caller's offsets and strides.
  int const m = 13, n = 11;
  auto transposed = []<class E>(std::vector<E>& storage, char const* name) {
    return tg::tensor<E>(storage.data(), {13, 11}, {1, 13}, name); // storage (n, m)
  };
  std::vector<float> xs(m * n);
  for (int i = 0; i < m * n; ++i)
    xs[static_cast<std::size_t>(i)] = std::sin(0.7f * static_cast<float>(i) + 0.3f);
  owned<float> dy({m, n}, "dy");
  fill(dy, 3);
  // x transposed, y row-major: layouts that differ, so that an element read from the wrong
  // place is stored to the right one (inside the bounds: no error).
  owned<float> y({m, n}, "y"), y2({m, n}, "y");
  auto const x = transposed(xs, "x");
  int const grid = tg::cdiv(m, 8);
  // The float vjp runs on the caller's tensors: no copy.
  auto const gf = tg::vjp(grid, strided_by_numbers, tg::in("x", tg::tensor<float const>(x)),
                          tg::out("y", y.view(), dy.cview()), x.stride(0), x.stride(1),
                          y.view().stride(0), y.view().stride(1), 0.75f);
  auto const gd =
      tg::vjp_as<double>(grid, strided_by_numbers, tg::in("x", tg::tensor<float const>(x)),
                         tg::out("y", y2.view(), dy.cview()), x.stride(0), x.stride(1),
                         y.view().stride(0), y.view().stride(1), 0.75f);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      EXPECT_NEAR(gd["x"](i, j), gf["x"](i, j), 1e-5) << i << "," << j;
      EXPECT_NEAR(y2(i, j), y(i, j), 1e-6) << i << "," << j;
    }
  // bf16: vjp runs on float copies; against the float vjp of the same values laid out so.
  std::vector<tg::bf16> xb(xs.size()), yb(xs.size()), yl(xs.size());
  std::vector<float> xbf(xs.size()), ybf(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    xb[i] = tg::bf16(xs[i]);
    xbf[i] = static_cast<float>(xb[i]);
  }
  owned<tg::bf16> dyb({m, n}, "dy");
  for (std::int64_t i = 0; i < dyb.numel(); ++i)
    dyb.data()[i] = tg::bf16(dy.data()[i]);
  auto const xbv = transposed(xb, "x");
  tg::tensor<tg::bf16> const ybv(yb.data(), {13, 11}, {11, 1}, "y");
  auto const gb = tg::vjp(grid, strided_by_numbers, tg::in("x", tg::tensor<tg::bf16 const>(xbv)),
                          tg::out("y", ybv, dyb.cview()), x.stride(0), x.stride(1),
                          std::int64_t{11}, std::int64_t{1}, 0.75f);
  owned<float> dyf({m, n}, "dy");
  for (std::int64_t i = 0; i < dyf.numel(); ++i)
    dyf.data()[i] = static_cast<float>(dyb.data()[i]);
  auto const xfv = transposed(xbf, "x");
  tg::tensor<float> const yfv(ybf.data(), {13, 11}, {11, 1}, "y");
  auto const gbf = tg::vjp(grid, strided_by_numbers, tg::in("x", tg::tensor<float const>(xfv)),
                           tg::out("y", yfv, dyf.cview()), x.stride(0), x.stride(1),
                           std::int64_t{11}, std::int64_t{1}, 0.75f);
  tg::tensor<tg::bf16> const ylv(yl.data(), {13, 11}, {11, 1}, "y");
  tg::launch(grid, strided_by_numbers, tg::tensor<tg::bf16 const>(xbv), ylv, x.stride(0),
             x.stride(1), std::int64_t{11}, std::int64_t{1}, 0.75f);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      EXPECT_EQ(gb["x"](i, j), gbf["x"](i, j)) << i << "," << j;
      EXPECT_EQ(static_cast<float>(ybv(i, j)), static_cast<float>(ylv(i, j))) << i << "," << j;
    }
  // check_backward: a correct backward that reads the inputs through their views passes.
  auto const backward = [](tg::backward_context<float>& ctx) -> tg::gradient_set {
    auto const xv = ctx.input("x");
    auto const g = ctx.cotangent("y");
    owned<float> dx({xv.size(0), xv.size(1)});
    for (std::int64_t a = 0; a < xv.size(0); ++a)
      for (std::int64_t b = 0; b < xv.size(1); ++b) {
        double const v = xv(a, b), sg = 1 / (1 + std::exp(-0.75 * v));
        dx(a, b) = static_cast<float>(g(a, b) * (sg + 0.75 * v * sg * (1 - sg)));
      }
    return {{"x", dx}};
  };
  // (Its output every other element of a wider buffer: the reference's buffer is laid out so.)
  std::vector<float> wide(2 * m * n);
  tg::tensor<float> const yw(wide.data(), {13, 11}, {22, 2}, "y");
  auto const rep = tg::check_backward(
      tg::forward(grid, strided_by_numbers, tg::in("x", tg::tensor<float const>(x)),
                  tg::out("y", yw), x.stride(0), x.stride(1), yw.stride(0), yw.stride(1), 0.75f),
      backward);
  EXPECT_TRUE(rep) << rep;
}

// y = x * a + b, a row per program, b read through its own argument.
constexpr int BC = 8;
constexpr auto scale_shift = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                         tg::tensor<T const> a, tg::tensor<T const> b,
                                         tg::tensor<T> y) {
  int const r = p.program_id(0);
  for (int c0 = 0; c0 < x.size(1); c0 += BC) {
    auto const cols = c0 + tg::arange<0, BC>();
    auto const m = cols < x.size(1);
    tg::tile<tg::fp32<T>, BC> const xv = tg::load(x + r * x.stride(0) + cols, m);
    tg::tile<tg::fp32<T>, BC> const av = tg::load(a + r * a.stride(0) + cols, m);
    tg::tile<tg::fp32<T>, BC> const bv = tg::load(b + r * b.stride(0) + cols, m);
    tg::store(y + r * y.stride(0) + cols, xv * av + bv, m);
  }
};

// Unmarked read-only tensors keep their views' names, which repeat: one tensor passed twice, or
// two rows of one tensor (t[0] and t[1] are both 't'). vjp refused them as "the name 'a' is given
// twice" where jvp and launch took them; the names of marked tensors must still differ, and a
// marked tensor passed again unmarked is refused for sharing memory (tied weights), not for its
// name.
TEST(Aliasing, UnmarkedTensorsWhoseNamesRepeatAreTaken) {
  int const n = 3, d = 13;
  owned<float> x({n, d}, "x"), a({n, d}, "a"), y({n, d}, "y"), dy({n, d}, "dy");
  owned<float> rows({2, n, d}, "rows");
  fill(x, 1), fill(a, 2), fill(dy, 3), fill(rows, 4);
  auto const g = tg::vjp(n, scale_shift, tg::in("x", x), a.cview(), a.cview(), tg::out("y", y, dy));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < d; ++j) {
      ASSERT_FLOAT_EQ(g["x"](i, j), a(i, j) * dy(i, j)) << i << "," << j;
      ASSERT_FLOAT_EQ(y(i, j), x(i, j) * a(i, j) + a(i, j)) << i << "," << j;
    }
  auto const r0 = tg::tensor<float const>(rows.view()[0]),
             r1 = tg::tensor<float const>(rows.view()[1]);
  ASSERT_STREQ(r0.name(), r1.name());
  auto const h = tg::vjp(n, scale_shift, tg::in("x", x), r0, r1, tg::out("y", y, dy));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < d; ++j)
      ASSERT_FLOAT_EQ(h["x"](i, j), rows(0, i, j) * dy(i, j)) << i << "," << j;
  // Two marked tensors of one name are still refused.
  owned<float> a2({n, d}, "a");
  fill(a2, 5);
  EXPECT_THROW((void)tg::vjp(n, scale_shift, tg::in("x", x), tg::in("a", a), a2.cview(),
                             tg::out("a", y, dy)),
               std::invalid_argument);
  // x marked and passed again unmarked, under its own name: the shared-memory refusal.
  try {
    (void)tg::vjp(n, scale_shift, tg::in("x", x), x.cview(), a.cview(), tg::out("y", y, dy));
    ADD_FAILURE() << "x marked in and passed again unmarked was taken";
  } catch (std::invalid_argument const& e) {
    std::string const what = e.what();
    EXPECT_EQ(what.find("given twice"), std::string::npos) << what;
    EXPECT_NE(what.find("tied"), std::string::npos) << what;
  }
}

// out and inout take the tensor and its cotangent as views or owning tensors in any mix (a view of
// a packed buffer with an owned cotangent did not compile).
TEST(Aliasing, MarkersTakeViewsAndOwnedTensorsMixed) {
  int const n = 3, d = 13;
  owned<float> x({n, d}, "x"), a({n, d}, "a"), packed({n, 2 * d}, "packed"), dy({n, d}, "dy");
  fill(x, 1), fill(a, 2), fill(dy, 3);
  tg::tensor<float> const y(packed.data() + d, {n, d}, {2 * d, 1}, "y"); // the odd halves
  owned<float> y_owned({n, d}, "y");
  auto const want =
      tg::vjp(n, scale_shift, tg::in("x", x), a.cview(), a.cview(), tg::out("y", y, dy.cview()));
  auto const check = [&](tg::gradients<float> const& g) {
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < d; ++j)
        ASSERT_EQ(g["x"](i, j), want["x"](i, j)) << i << "," << j;
  };
  check(tg::vjp(n, scale_shift, tg::in("x", x), a.cview(), a.cview(), tg::out("y", y, dy)));
  check(tg::vjp(n, scale_shift, tg::in("x", x), a.cview(), a.cview(), tg::out("y", y, dy.view())));
  check(tg::vjp(n, scale_shift, tg::in("x", x), a.cview(), a.cview(),
                tg::out("y", y_owned, dy.cview())));
  check(tg::vjp(n, scale_shift, tg::in("x", x), a.cview(), a.cview(),
                tg::out("y", y_owned, dy.view())));
  check(tg::vjp(n, scale_shift, tg::in("x", x), a.cview(), a.cview(), tg::inout("y", y, dy)));
  check(
      tg::vjp(n, scale_shift, tg::in("x", x), a.cview(), a.cview(), tg::inout("y", y, dy.view())));
  check(tg::vjp(n, scale_shift, tg::in("x", x), a.cview(), a.cview(),
                tg::inout("y", y_owned, dy.cview())));
  check(tg::vjp(n, scale_shift, tg::in("x", x), a.cview(), a.cview(),
                tg::inout("y", y_owned, dy.view())));
  // A cotangent made in braces, as before these forms (the non-const view forms made it ambiguous).
  check(tg::vjp(n, scale_shift, tg::in("x", x), a.cview(), a.cview(),
                tg::out("y", y, {dy.data(), {n, d}})));
  check(tg::vjp(n, scale_shift, tg::in("x", x), a.cview(), a.cview(),
                tg::inout("y", y, {dy.data(), {n, d}})));
}

// ---------------------------------------------------------------------------------------------
// One tile in several roles of one operation: both operands of dot, its accumulator, both sides
// of an expression, a carried tile updated in place by tg::loop (recorded whole and replayed).
// Each record's backward adds into an adjoint that another operand of the same record also
// adds into.
// ---------------------------------------------------------------------------------------------

constexpr int self_rows = 13, self_block = 16; // a 13 x 13 tensor under 16 x 16 blocks

#define TILEGRAD_SELF_KERNEL(...)                                                                  \
  []<class T>(tg::program const&, tg::tensor<T const> xt, tg::tensor<T const> zt,                  \
              tg::tensor<T> yt) {                                                                  \
    using F = tg::fp32<T>;                                                                         \
    constexpr int Bs = self_block;                                                                 \
    tg::tile<F, Bs, Bs> a = tg::load(tg::make_block_ptr<Bs, Bs>(xt, {0, 0}), tg::bounds<0, 1>);    \
    tg::tile<F, Bs, Bs> c = tg::load(tg::make_block_ptr<Bs, Bs>(zt, {0, 0}), tg::bounds<0, 1>);    \
    tg::tile<F, Bs, Bs> y = tg::zeros<F, Bs, Bs>();                                                \
    __VA_ARGS__;                                                                                   \
    tg::store(tg::make_block_ptr<Bs, Bs>(yt, {0, 0}), y, tg::bounds<0, 1>);                        \
  }

// dx and dz of <w, y> against central differences, and against jvp.
template <class K>
void expect_self_aliasing_gradients(char const* what, K kernel) {
  owned<double> x({self_rows, self_rows}, "x"), z({self_rows, self_rows}, "z");
  owned<double> w({self_rows, self_rows}, "w"), ux(x), uz(z), y({self_rows, self_rows}, "y");
  fill(x, 1);
  fill(z, 2);
  fill(w, 3);
  fill(ux, 4);
  fill(uz, 5);
  auto const g = tg::vjp(1, kernel, tg::in("x", x), tg::in("z", z), tg::out("y", y, w));
  auto loss = [&] {
    owned<double> yy({self_rows, self_rows}, "y");
    tg::launch(1, kernel, x.cview(), z.cview(), yy.view());
    return inner(w, yy.cview());
  };
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    double const dx = central(x.data()[i], loss), dz = central(z.data()[i], loss);
    EXPECT_NEAR(g["x"].data()[i], dx, 1e-7 * (1 + std::abs(dx))) << what << ": dx, element " << i;
    EXPECT_NEAR(g["z"].data()[i], dz, 1e-7 * (1 + std::abs(dz))) << what << ": dz, element " << i;
  }
  owned<double> yt({self_rows, self_rows}, "y");
  auto const t = tg::jvp(1, kernel, tg::tangent_in("x", x, ux), tg::tangent_in("z", z, uz),
                         tg::tangent_out("y", yt));
  double const jvp_side = inner(w, t["y"].cview());
  double const vjp_side = inner(ux, g["x"].cview()) + inner(uz, g["z"].cview());
  EXPECT_NEAR(jvp_side, vjp_side, 1e-11 * (1 + std::abs(jvp_side))) << what;
}

TEST(Aliasing, OneTileAsBothOperandsOfDotAndAsItsAccumulator) {
  expect_self_aliasing_gradients("dot(a, trans(a)) + c",
                                 TILEGRAD_SELF_KERNEL(y = tg::dot(a, tg::trans(a)) + c));
  expect_self_aliasing_gradients("dot(a, a, a) * c",
                                 TILEGRAD_SELF_KERNEL(y = tg::dot(a, a, a) * c));
  expect_self_aliasing_gradients("a = dot(a, a, move(a))",
                                 TILEGRAD_SELF_KERNEL(a = tg::dot(a, a, std::move(a)); y = a + c));
  expect_self_aliasing_gradients("dot(trans(a), a, c)",
                                 TILEGRAD_SELF_KERNEL(y = tg::dot(tg::trans(a), a, c)));
  expect_self_aliasing_gradients("a = a * a + a; a *= a; a += a",
                                 TILEGRAD_SELF_KERNEL(a = a * a + a; a *= a; a += a; y = a * c));
  expect_self_aliasing_gradients("a = trans(a) * a",
                                 TILEGRAD_SELF_KERNEL(a = tg::trans(a) * a; y = a + tg::trans(c)));
}

TEST(Aliasing, ACarriedTileAsDotsOperandAndAccumulatorInTgLoop) {
  auto const kernel = []<class T>(tg::program const&, tg::tensor<T const> xt,
                                  tg::tensor<T const> zt, tg::tensor<T> yt) {
    using F = tg::fp32<T>;
    constexpr int Bs = self_block;
    tg::tile<F, Bs, Bs> const a =
        tg::load(tg::make_block_ptr<Bs, Bs>(xt, {0, 0}), tg::bounds<0, 1>);
    tg::tile<F, Bs, Bs> acc = tg::load(tg::make_block_ptr<Bs, Bs>(zt, {0, 0}), tg::bounds<0, 1>);
    tg::loop(0, 3, 1, acc, [=](int, auto& s) {
      s = tg::dot(s, a, s) * 0.5;
      s = s * a;
    });
    tg::store(tg::make_block_ptr<Bs, Bs>(yt, {0, 0}), acc, tg::bounds<0, 1>);
  };
  std::size_t const saved = tg::set_loop_record_budget(0); // every iteration replayed
  expect_self_aliasing_gradients("tg::loop, replayed", kernel);
  tg::set_loop_record_budget(saved); // recorded whole
  expect_self_aliasing_gradients("tg::loop, recorded whole", kernel);
}

#undef TILEGRAD_SELF_KERNEL

} // namespace

} // namespace test_aliasing
