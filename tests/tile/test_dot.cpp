// dot(a, b[, acc]) of tile/dot.hpp against a triple loop in double, for (M, K, N) mixes of 1, 3,
// 16, 17, 33 and 64 (square and not, multiples of 16 and not, so every edge of the register
// blocking runs), with and without an accumulator, with operands given as expressions (a * 2,
// trans(b)) and as bf16 tiles. Inputs are multiples of 1/8: every product and partial sum is
// exact in float, so results must equal the double reference exactly, whatever the order of
// accumulation. Two bf16 operands also on general values, through the bf16 dot-product kernel
// (where the build has it) and the float path, each within the rounding error bound of a sum
// of K terms.
#include "../support/reference.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_dot {

namespace {

using namespace tilegrad;
using tg_test::make_rng;

// C = A (M x K) @ B (K x N) + acc, in double; A and B read through accessors.
template <int M, int K, int N, class A, class B, class Acc>
std::vector<double> matmul_ref(A a, B b, Acc acc) {
  std::vector<double> c(static_cast<std::size_t>(M * N));
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = acc(i, j);
      for (int k = 0; k < K; ++k)
        s += a(i, k) * b(k, j);
      c[static_cast<std::size_t>(i * N + j)] = s;
    }
  return c;
}

template <class T, int M, int N>
void expect_matrix_eq(tile<T, M, N> const& got, std::vector<double> const& want, char const* what) {
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j)
      EXPECT_EQ(double(got(i, j)), want[static_cast<std::size_t>(i * N + j)])
          << what << " at (" << i << ", " << j << ")";
}

template <class T>
class Dot : public ::testing::Test {};
using FloatTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Dot, FloatTypes);

template <class T, int M, int K, int N>
void check_dot() {
  auto rng = make_rng(M * 10000 + K * 100 + N);
  tile<T, M, K> a;
  tile<T, K, N> b;
  tile<T, N, K> bt; // b given transposed: dot(a, trans(bt))
  tile<T, M, N> acc;
  tg_test::fill_dyadic(a, rng);
  tg_test::fill_dyadic(b, rng);
  tg_test::fill_dyadic(bt, rng);
  tg_test::fill_dyadic(acc, rng);
  auto A = [&](int i, int k) { return double(a(i, k)); };
  auto B = [&](int k, int j) { return double(b(k, j)); };
  auto zero = [](int, int) { return 0.0; };

  tile<T, M, N> const c = dot(a, b);
  static_assert(std::is_same_v<value_of_t<decltype(dot(a, b))>, T>);
  expect_matrix_eq(c, matmul_ref<M, K, N>(A, B, zero), "dot(a, b)");

  tile<T, M, N> const ca = dot(a, b, acc);
  expect_matrix_eq(ca, matmul_ref<M, K, N>(A, B, [&](int i, int j) { return double(acc(i, j)); }),
                   "dot(a, b, acc)");

  // Operands as expressions: a * 2 and the transpose of bt; an accumulator expression.
  tile<T, M, N> const ce = dot(a * 2, trans(bt), acc * 0.5);
  expect_matrix_eq(ce,
                   matmul_ref<M, K, N>([&](int i, int k) { return 2 * double(a(i, k)); },
                                       [&](int k, int j) { return double(bt(j, k)); },
                                       [&](int i, int j) { return 0.5 * double(acc(i, j)); }),
                   "dot(a * 2, trans(bt), acc * 0.5)");

  // The left operand transposed: read in place from a tile (lvalue) or a temporary tile.
  tile<T, K, M> at;
  tg_test::fill_dyadic(at, rng);
  auto const AT = [&](int i, int k) { return double(at(k, i)); };
  expect_matrix_eq(tile<T, M, N>(dot(trans(at), b)), matmul_ref<M, K, N>(AT, B, zero),
                   "dot(trans(at), b)");
  expect_matrix_eq(tile<T, M, N>(dot(trans(tile<T, K, M>(at)), b, acc)),
                   matmul_ref<M, K, N>(AT, B, [&](int i, int j) { return double(acc(i, j)); }),
                   "dot(trans(tile(at)), b, acc)");
  expect_matrix_eq(tile<T, M, N>(dot(trans(at), trans(bt))),
                   matmul_ref<M, K, N>(AT, [&](int k, int j) { return double(bt(j, k)); }, zero),
                   "dot(trans(at), trans(bt))");

  // The accumulator passed as a temporary, as a K loop writes it.
  tile<T, M, N> run = acc;
  run = dot(a, b, std::move(run));
  run = dot(a * -1, b, std::move(run));
  expect_matrix_eq(run,
                   matmul_ref<M, K, N>(zero, zero, [&](int i, int j) { return double(acc(i, j)); }),
                   "acc = dot(a, b, acc); acc = dot(-a, b, acc)");
}

TYPED_TEST(Dot, AgainstTripleLoop) {
  using T = TypeParam;
  check_dot<T, 1, 1, 1>();
  check_dot<T, 1, 3, 16>();
  check_dot<T, 3, 17, 33>();
  check_dot<T, 16, 16, 16>();
  check_dot<T, 17, 33, 3>();
  check_dot<T, 33, 64, 17>();
  check_dot<T, 17, 1, 64>();
  check_dot<T, 64, 64, 64>();
}

// General (non-dyadic) inputs: rounding differs with the order of accumulation, so the
// comparison allows K ulp-sized errors per element, scaled by sum |a_ik b_kj|.
TYPED_TEST(Dot, GeneralValuesWithinRoundingError) {
  using T = TypeParam;
  constexpr int M = 33, K = 64, N = 17;
  auto rng = make_rng(99);
  tile<T, M, K> a;
  tile<T, K, N> b;
  tg_test::fill_uniform(a, rng, -1, 1);
  tg_test::fill_uniform(b, rng, -1, 1);
  tile<T, M, N> const c = dot(a, b);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0, mag = 0;
      for (int k = 0; k < K; ++k) {
        s += double(a(i, k)) * double(b(k, j));
        mag += std::abs(double(a(i, k)) * double(b(k, j)));
      }
      EXPECT_NEAR(double(c(i, j)), s, K * std::numeric_limits<T>::epsilon() * mag)
          << "at (" << i << ", " << j << ")";
    }
}

// bf16 operands compute in float (Triton's tl.dot on bf16 accumulates in fp32).
template <int M, int K, int N>
void check_bf16_dot() {
  auto rng = make_rng(7 + M + K + N);
  tile<float, M, K> af;
  tile<float, K, N> bf;
  tile<float, M, N> acc;
  tg_test::fill_dyadic(af, rng); // multiples of 1/8 up to 2: exact in bf16
  tg_test::fill_dyadic(bf, rng);
  tg_test::fill_dyadic(acc, rng);
  tile<bf16, M, K> const a = to<bf16>(af);
  tile<bf16, K, N> const b = to<bf16>(bf);
  static_assert(std::is_same_v<value_of_t<decltype(dot(a, b))>, float>);
  tile<float, M, N> const c = dot(a, b);
  tile<float, M, N> const ca = dot(a, b, acc);
  tile<float, M, N> const cm = dot(a, to<bf16>(bf * 2)); // a bf16 expression operand
  auto A = [&](int i, int k) { return double(af(i, k)); };
  auto B = [&](int k, int j) { return double(bf(k, j)); };
  expect_matrix_eq(c, matmul_ref<M, K, N>(A, B, [](int, int) { return 0.0; }), "bf16 dot(a, b)");
  expect_matrix_eq(ca, matmul_ref<M, K, N>(A, B, [&](int i, int j) { return double(acc(i, j)); }),
                   "bf16 dot(a, b, acc)");
  expect_matrix_eq(
      cm,
      matmul_ref<M, K, N>(
          A, [&](int k, int j) { return 2 * double(bf(k, j)); }, [](int, int) { return 0.0; }),
      "dot(a, to<bf16>(b * 2))");
}

TEST(DotBf16, OperandsComputeInFloat) {
  check_bf16_dot<16, 16, 16>();
  check_bf16_dot<3, 17, 33>();
  check_bf16_dot<33, 64, 17>();
}

// bf16 operands on general values: the bf16 dot-product kernel (dot itself, where the build has
// it) and the float path (detail::dot_impl<false>), on shapes that fill no register block
// (rows in blocks of 6, columns in vectors of 16 and blocks of 4 vectors, k in pairs: odd K
// leaves a pair half empty). Products of two bf16 are exact in float, and the kernel adds each
// one with its own rounding to nearest (measured on Zen 4: vdpbf16ps adds the odd product of a
// pair, then the even one, bit for bit), so both paths make K roundings of a running sum:
//   |dot - exact| <= K 2^-24 (|acc| + sum_k |a_ik b_kj|)
// plus 2^-126 per addition for the kernel's flushing of denormal results to zero (none of these
// sums comes near the denormals, so the term is there for rigour only).
template <int M, int K, int N>
void check_bf16_dot_general() {
  auto rng = make_rng(M * 10000 + K * 100 + N + 5);
  tile<bf16, M, K> a;
  tile<bf16, K, M> at; // A given transposed, as dot(trans(p), v) in attention
  tile<bf16, K, N> b;
  tile<bf16, N, K> bt; // B given transposed, as dot(q, trans(k))
  tile<float, M, N> acc;
  tg_test::fill_uniform(a, rng, -1, 1);
  tg_test::fill_uniform(at, rng, -1, 1);
  tg_test::fill_uniform(b, rng, -1, 1);
  tg_test::fill_uniform(bt, rng, -1, 1);
  tg_test::fill_uniform(acc, rng, -4, 4);
  auto f = [](bf16 x) { return double(float(x)); };
  auto expect_within_bound = [&](tile<float, M, N> const& got, auto A, auto B, bool with_acc,
                                 char const* what) {
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        double s = with_acc ? double(acc(i, j)) : 0.0;
        double mag = std::abs(s);
        for (int k = 0; k < K; ++k) {
          s += A(i, k) * B(k, j); // exact: 8-bit significands
          mag += std::abs(A(i, k) * B(k, j));
        }
        double const bound = K * 0x1p-24 * mag + (K + 1) * 0x1p-126;
        ASSERT_LE(std::abs(double(got(i, j)) - s), bound)
            << what << " at (" << i << ", " << j << "), M=" << M << " K=" << K << " N=" << N;
      }
  };
  auto A = [&](int i, int k) { return f(a(i, k)); };
  auto AT = [&](int i, int k) { return f(at(k, i)); };
  auto B = [&](int k, int j) { return f(b(k, j)); };
  auto BT = [&](int k, int j) { return f(bt(j, k)); };
  // The dot of the build (the bf16 kernel where there is one), then the float path.
  expect_within_bound(dot(a, b), A, B, false, "dot(a, b)");
  expect_within_bound(dot(a, b, acc), A, B, true, "dot(a, b, acc)");
  expect_within_bound(dot(trans(at), b, acc), AT, B, true, "dot(trans(at), b, acc)");
  expect_within_bound(dot(a, trans(bt)), A, BT, false, "dot(a, trans(bt))");
  expect_within_bound(detail::dot_impl<false>(a, b, acc), A, B, true, "float path: dot(a, b, acc)");
  expect_within_bound(detail::dot_impl<false>(trans(at), b, acc), AT, B, true,
                      "float path: dot(trans(at), b, acc)");
  // The accumulator as a temporary, as a K loop writes it: acc + a b - a b.
  tile<float, M, N> run = acc;
  run = dot(a, b, std::move(run));
  run = dot(a, to<bf16>(to<float>(b) * -1), std::move(run));
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double mag = std::abs(double(acc(i, j)));
      for (int k = 0; k < K; ++k) mag += 2 * std::abs(A(i, k) * B(k, j));
      ASSERT_LE(std::abs(double(run(i, j)) - double(acc(i, j))), 2 * K * 0x1p-24 * mag)
          << "acc = dot(a, b, acc); acc = dot(a, -b, acc) at (" << i << ", " << j << ")";
    }
}

TEST(DotBf16, GeneralValuesWithinTheRoundingBoundOnBothPaths) {
  check_bf16_dot_general<1, 1, 1>();
  check_bf16_dot_general<3, 17, 31>();
  check_bf16_dot_general<17, 31, 64>();
  check_bf16_dot_general<31, 64, 65>();
  check_bf16_dot_general<64, 65, 3>();
  check_bf16_dot_general<65, 3, 17>();
  check_bf16_dot_general<64, 64, 64>();
  // Shapes AMX takes where the target has it: blocks of 32 x 32, and of 16 x 16.
  check_bf16_dot_general<32, 64, 96>();
  check_bf16_dot_general<48, 32, 16>();
}

// The bf16 kernel runs where the build has it: it counts a denormal bf16 operand as zero (the
// instruction's rule), the float path multiplies it out. The native result is 0, the float one
// 2^-130 * 2^10 = 2^-120 (a normal float).
TEST(DotBf16, TheBuildsKernelRuns) {
  tile<bf16, 2, 3> a;
  tile<bf16, 3, 17> b;
  a(1, 2) = bf16(0x1p-130f); // denormal in bf16 as in float
  b(2, 16) = bf16(1024.0f);
  ASSERT_NE(float(a(1, 2)), 0.0f);
  tile<float, 2, 17> const native = dot(a, b);
  tile<float, 2, 17> const generic = detail::dot_impl<false>(a, b, tile<float, 2, 17>());
  EXPECT_EQ(generic(1, 16), 0x1p-120f);
  EXPECT_EQ(native(1, 16), detail::bf16_dot_native ? 0.0f : 0x1p-120f)
      << "bf16_dot_native = " << detail::bf16_dot_native;
#if TILEGRAD_USE_XSIMD && defined(__AVX512BF16__) && !defined(TILEGRAD_NO_BF16_DOT) && \
    (!defined(__AMX_BF16__) || defined(TILEGRAD_BF16_DOT))
  EXPECT_TRUE(detail::bf16_dot_native) << "the target has AVX512-BF16: dot should use it";
#endif
}

// On AMX targets, shapes of whole 16 x 16 blocks of C and 32-deep blocks of k run on the tiles,
// which count a denormal bf16 operand as zero as vdpbf16ps does; other shapes take the float path.
TEST(DotBf16, AmxRunsWhereTheTargetHasIt) {
  tile<bf16, 32, 64> a;
  tile<bf16, 64, 32> b;
  a(17, 40) = bf16(0x1p-130f);
  b(40, 31) = bf16(1024.0f);
  tile<float, 32, 32> const got = dot(a, b);
  tile<float, 32, 32> const generic = detail::dot_impl<false>(a, b, tile<float, 32, 32>());
  EXPECT_EQ(generic(17, 31), 0x1p-120f);
  bool const kernel = detail::bf16_kernel_runs<32, 32, 64>();
  EXPECT_EQ(got(17, 31), kernel ? 0.0f : 0x1p-120f) << "bf16 kernel runs: " << kernel;
#if TILEGRAD_HAVE_AMX_BF16
  if (!detail::amx::permitted())
    GTEST_SKIP() << "this process may not use AMX tiles";
  EXPECT_TRUE(kernel);
  EXPECT_EQ((detail::bf16_kernel_runs<32, 32, 48>()), detail::bf16_dot_native)
      << "K = 48 is no whole number of AMX blocks";
  // Other code of the process configures the tiles its own way between two products.
  auto rng = make_rng(3);
  tg_test::fill_uniform(a, rng, -1, 1);
  tg_test::fill_uniform(b, rng, -1, 1);
  tile<float, 32, 32> const first = dot(a, b);
  detail::amx::tile_config other;
  for (int t = 0; t < 8; ++t) {
    other.rows[t] = 4;
    other.colsb[t] = 16;
  }
  _tile_loadconfig(&other);
  tile<float, 32, 32> const second = dot(a, b);
  for (int i = 0; i < 32; ++i)
    for (int j = 0; j < 32; ++j)
      ASSERT_EQ(first(i, j), second(i, j))
          << "after a foreign tile configuration, at (" << i << ", " << j << ")";
#endif
}

// dot(a, b) writes its products into a tile it does not zero first: a block of the per-thread
// cache that held NaN just before must not show through, on any path (vector blocks, column
// tails, the bf16 kernels, the float path of bf16), with either operand given transposed
// (dot(trans(at), b), Triton's tl.dot(tl.trans(p), v): the bf16 kernel added its products to
// what the block held, 1017 where 16 was right).
template <class E, int M, int K, int N>
void check_product_ignores_old_storage() {
  auto rng = make_rng(M * 7 + K * 3 + N);
  tile<E, M, K> a;
  tile<E, K, N> b;
  tg_test::fill_uniform(a, rng, -1, 1);
  tg_test::fill_uniform(b, rng, -1, 1);
  tile<E, K, M> at; // a and b transposed, stored
  tile<E, N, K> bt;
  for (int i = 0; i < M; ++i)
    for (int k = 0; k < K; ++k)
      at(k, i) = a(i, k);
  for (int k = 0; k < K; ++k)
    for (int j = 0; j < N; ++j)
      bt(j, k) = b(k, j);
  using C = std::conditional_t<std::is_same_v<E, double>, double, float>;
  for (int round = 0; round < 5; ++round) {
    {
      tile<C, M, N> poison;
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j)
          poison(i, j) = std::numeric_limits<C>::quiet_NaN();
    } // its block goes back to the cache, for the product below
    tile<C, M, N> const c =
        round == 0   ? tile<C, M, N>(dot(a, b))
        : round == 1 ? tile<C, M, N>(detail::dot_impl<false, true>(a, b, tile<C, M, N>(
                           uninitialized)))
        : round == 2 ? tile<C, M, N>(dot(trans(at), b))
        : round == 3 ? tile<C, M, N>(dot(a, trans(bt)))
                     : tile<C, M, N>(dot(trans(at), trans(bt)));
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        double s = 0, mag = 0;
        for (int k = 0; k < K; ++k) {
          s += double(C(a(i, k))) * double(C(b(k, j)));
          mag += std::abs(double(C(a(i, k))) * double(C(b(k, j))));
        }
        ASSERT_LE(std::abs(double(c(i, j)) - s), K * 0x1p-24 * mag + 1e-30)
            << "round " << round << " at (" << i << ", " << j << "), M=" << M << " K=" << K
            << " N=" << N;
      }
  }
}

TEST(Dot, AProductNeverReadsTheTileItIsWrittenTo) {
  check_product_ignores_old_storage<float, 64, 64, 64>();
  check_product_ignores_old_storage<float, 33, 17, 19>();
  check_product_ignores_old_storage<double, 40, 9, 24>();
  check_product_ignores_old_storage<bf16, 64, 64, 64>();
  check_product_ignores_old_storage<bf16, 32, 64, 48>();
  check_product_ignores_old_storage<bf16, 17, 31, 65>();
}

// Triton's `acc = tl.dot(acc, w, acc)`, written `acc = dot(acc, w, std::move(acc))`: the
// accumulator was moved into the result before the product read it as its left operand (a
// tile over 512 bytes: a crash in gemm). It is copied where an operand reads it. An operand that
// is an expression of acc (Triton's `acc = tl.dot(acc * s, w, acc)`) read it through its storage
// after the move emptied it (a crash too): the operands are evaluated before acc is taken.
template <class E>
void check_accumulator_read_as_operand() {
  constexpr int N = 16;
  using C = std::conditional_t<std::is_same_v<E, double>, double, float>;
  auto rng = make_rng(N);
  tile<C, N, N> acc;
  tile<E, N, N> w;
  tg_test::fill_uniform(acc, rng, -1, 1);
  tg_test::fill_uniform(w, rng, -1, 1);
  tile<C, N, N> const start = acc;
  tile<C, N, N> wc = w; // (the right operand of the forms that read acc there)
  for (int form = 0; form < 5; ++form) {
    acc = start;
    if (form == 0)
      acc = dot(acc, w, std::move(acc)); // acc @ w + acc
    else if (form == 1)
      acc = dot(trans(acc), w, std::move(acc)); // acc^T @ w + acc
    else if (form == 2)
      acc = dot(acc * C(0.5), w, std::move(acc)); // (acc / 2) @ w + acc
    else if (form == 3)
      acc = dot(wc, acc + C(1), std::move(acc)); // w @ (acc + 1) + acc
    else
      acc = dot(trans(acc * C(2)), w, std::move(acc)); // (2 acc)^T @ w + acc
    for (int i = 0; i < N; ++i)
      for (int j = 0; j < N; ++j) {
        double s = start(i, j), mag = std::abs(s);
        for (int k = 0; k < N; ++k) {
          double const x = form == 0   ? start(i, k)
                           : form == 1 ? start(k, i)
                           : form == 2 ? 0.5 * start(i, k)
                           : form == 3 ? double(C(w(i, k)))
                                       : 2 * start(k, i);
          double const y = form == 3 ? start(k, j) + 1 : double(C(w(k, j)));
          s += x * y;
          mag += std::abs(x * y);
        }
        ASSERT_LE(std::abs(double(acc(i, j)) - s), 2 * N * 0x1p-24 * mag)
            << "form " << form << " at (" << i << ", " << j << ")";
      }
  }
}

TEST(Dot, AnAccumulatorReadAsAnOperandIsReadBeforeItIsReused) {
  check_accumulator_read_as_operand<float>();
  check_accumulator_read_as_operand<double>();
}

TEST(DotMixed, IntegerAndMixedPrecisionOperands) {
  auto rng = make_rng(11);
  tile<std::int32_t, 3, 17> ia;
  tile<std::int32_t, 17, 5> ib;
  tg_test::fill_uniform(ia, rng, -20, 20);
  tg_test::fill_uniform(ib, rng, -20, 20);
  static_assert(std::is_same_v<value_of_t<decltype(dot(ia, ib))>, float>);
  tile<float, 3, 5> const c = dot(ia, ib);
  expect_matrix_eq(c,
                   matmul_ref<3, 17, 5>([&](int i, int k) { return double(ia(i, k)); },
                                        [&](int k, int j) { return double(ib(k, j)); },
                                        [](int, int) { return 0.0; }),
                   "int32 dot");
  tile<float, 3, 17> fa;
  tile<double, 17, 5> db;
  tg_test::fill_dyadic(fa, rng);
  tg_test::fill_dyadic(db, rng);
  static_assert(std::is_same_v<value_of_t<decltype(dot(fa, db))>, double>);
  tile<double, 3, 5> const d = dot(fa, db);
  expect_matrix_eq(d,
                   matmul_ref<3, 17, 5>([&](int i, int k) { return double(fa(i, k)); },
                                        [&](int k, int j) { return db(k, j); },
                                        [](int, int) { return 0.0; }),
                   "float @ double");
}

} // namespace

} // namespace test_dot
