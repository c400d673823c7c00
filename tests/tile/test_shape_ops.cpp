// Shape operations of tile/shape_ops.hpp: reshape (vectorised and element-wise paths, reshape of
// a reshape, of an expression), permute (every permutation of a rank-3 tile), trans, col and
// row, and assignment of a transposed view to its own source (the aliasing path). Every result
// is checked against a plain loop over coordinates.
#include "../support/reference.hpp"

#include <type_traits>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_shape_ops {

namespace {

using namespace tilegrad;
using tg_test::make_rng;

template <class T>
class ShapeOps : public ::testing::Test {};
using FloatTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(ShapeOps, FloatTypes);

TYPED_TEST(ShapeOps, ReshapeKeepsRowMajorOrder) {
  using T = TypeParam;
  auto rng = make_rng(1);
  tile<T, 5, 37> m;
  tg_test::fill_uniform(m, rng, -4, 4);
  T const* M = m.data();

  tile<T, 37, 5> r = reshape<37, 5>(m); // rows of 37 do not split into rows of 5: scalar path
  tile<T, 185> flat = reshape<185>(m);
  tile<T, 5, 1, 37> r3 = reshape<5, 1, 37>(m);
  tile<T, 5, 37> back = reshape<5, 37>(reshape<185>(m)); // a reshape of a reshape
  tile<T, 37, 5> ex = reshape<37, 5>(m * 2 + 1);         // of an expression
  tile<T, 37> v;
  tg_test::fill_uniform(v, rng, -4, 4);
  // Of an expression that reads a broadcast row: a vector load must not run past a row of 37.
  tile<T, 37, 5> rb = reshape<37, 5>(m - row(v));
  for (int i = 0; i < 37; ++i)
    for (int j = 0; j < 5; ++j) {
      EXPECT_EQ(r(i, j), M[i * 5 + j]) << "reshape<37, 5> at (" << i << ", " << j << ")";
      EXPECT_EQ(ex(i, j), M[i * 5 + j] * T(2) + T(1))
          << "reshape<37, 5>(m * 2 + 1) at (" << i << ", " << j << ")";
      EXPECT_EQ(rb(i, j), M[i * 5 + j] - v((i * 5 + j) % 37))
          << "reshape<37, 5>(m - row(v)) at (" << i << ", " << j << ")";
    }
  for (int i = 0; i < 185; ++i)
    EXPECT_EQ(flat(i), M[i]) << "reshape<185> at (" << i << ")";
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 37; ++j) {
      EXPECT_EQ(r3(i, 0, j), m(i, j)) << "reshape<5, 1, 37> at (" << i << ", 0, " << j << ")";
      EXPECT_EQ(back(i, j), m(i, j)) << "reshape of reshape at (" << i << ", " << j << ")";
    }
}

TYPED_TEST(ShapeOps, ReshapeVectorisedPath) {
  using T = TypeParam;
  auto rng = make_rng(2);
  tile<T, 64, 64> m;
  tg_test::fill_uniform(m, rng, -4, 4);
  T const* M = m.data();
  // Rows of 64 split into rows of 16: whole vectors stay inside one source row.
  tile<T, 256, 16> narrow = reshape<256, 16>(m);
  // Rows of 256 span four source rows: element by element.
  tile<T, 16, 256> wide = reshape<16, 256>(m);
  tile<T, 4, 16, 64> r3 = reshape<4, 16, 64>(m + 1);
  for (int i = 0; i < 256; ++i)
    for (int j = 0; j < 16; ++j)
      EXPECT_EQ(narrow(i, j), M[i * 16 + j]) << "reshape<256, 16> at (" << i << ", " << j << ")";
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 256; ++j)
      EXPECT_EQ(wide(i, j), M[i * 256 + j]) << "reshape<16, 256> at (" << i << ", " << j << ")";
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 16; ++j)
      for (int k = 0; k < 64; ++k)
        EXPECT_EQ(r3(i, j, k), M[(i * 16 + j) * 64 + k] + T(1))
            << "reshape<4, 16, 64>(m + 1) at (" << i << ", " << j << ", " << k << ")";
}

TYPED_TEST(ShapeOps, ReshapeOfRankZeroAndOne) {
  using T = TypeParam;
  tile<T> s(T(3.5));
  tile<T, 1, 1> s2 = reshape<1, 1>(s);
  tile<T> s0 = reshape<>(s2);
  tile<T, 1> one = reshape<1>(s * 2);
  EXPECT_EQ(s2(0, 0), T(3.5));
  EXPECT_EQ(s0.item(), T(3.5));
  EXPECT_EQ(one(0), T(7));
}

// permute<P...>: output axis a is input axis P[a].
template <class T, int P0, int P1, int P2>
void check_permute3(tile<T, 3, 4, 19> const& x) {
  constexpr int ext[3] = {3, 4, 19};
  using out_t = tile<T, ext[P0], ext[P1], ext[P2]>;
  out_t y = permute<P0, P1, P2>(x);
  out_t z = permute<P0, P1, P2>(x * 2); // of an expression
  for (int i = 0; i < ext[P0]; ++i)
    for (int j = 0; j < ext[P1]; ++j)
      for (int k = 0; k < ext[P2]; ++k) {
        int in[3];
        in[P0] = i, in[P1] = j, in[P2] = k;
        EXPECT_EQ(y(i, j, k), x(in[0], in[1], in[2]))
            << "permute<" << P0 << ", " << P1 << ", " << P2 << "> at (" << i << ", " << j << ", "
            << k << ")";
        EXPECT_EQ(z(i, j, k), x(in[0], in[1], in[2]) * T(2))
            << "permute<" << P0 << ", " << P1 << ", " << P2 << ">(x * 2) at (" << i << ", " << j
            << ", " << k << ")";
      }
}

TYPED_TEST(ShapeOps, PermuteEveryAxisOrderOfRankThree) {
  using T = TypeParam;
  auto rng = make_rng(3);
  tile<T, 3, 4, 19> x;
  tg_test::fill_uniform(x, rng, -4, 4);
  check_permute3<T, 0, 1, 2>(x);
  check_permute3<T, 0, 2, 1>(x);
  check_permute3<T, 1, 0, 2>(x);
  check_permute3<T, 1, 2, 0>(x);
  check_permute3<T, 2, 0, 1>(x);
  check_permute3<T, 2, 1, 0>(x);
}

TYPED_TEST(ShapeOps, Trans) {
  using T = TypeParam;
  auto rng = make_rng(4);
  tile<T, 5, 37> m;
  tile<T, 5> u;
  tile<T, 37> v;
  tg_test::fill_uniform(m, rng, -4, 4);
  tg_test::fill_uniform(u, rng, -4, 4);
  tg_test::fill_uniform(v, rng, -4, 4);
  tile<T, 37, 5> t = trans(m);
  tile<T, 37, 5> p = permute<1, 0>(m);
  tile<T, 5, 37> tt = trans(trans(m));
  tile<T, 37, 5> te = trans(col(u) * row(v) + m); // a transposed broadcast expression
  tile<T, 37, 5> mix = trans(m) * 2 + col(v);     // a transposed operand in a fused loop
  for (int i = 0; i < 37; ++i)
    for (int j = 0; j < 5; ++j) {
      EXPECT_EQ(t(i, j), m(j, i)) << "trans at (" << i << ", " << j << ")";
      EXPECT_EQ(p(i, j), m(j, i)) << "permute<1, 0> at (" << i << ", " << j << ")";
      EXPECT_EQ(tt(j, i), m(j, i)) << "trans(trans(m)) at (" << j << ", " << i << ")";
      // Exact unless FMA contraction rounds u * v + m once (terms below 16 in magnitude).
      EXPECT_NEAR(te(i, j), u(j) * v(i) + m(j, i), 16 * tg_test::contraction_rtol<T>)
          << "trans(col(u) * row(v) + m) at (" << i << ", " << j << ")";
      EXPECT_EQ(mix(i, j), m(j, i) * T(2) + v(i))
          << "trans(m) * 2 + col(v) at (" << i << ", " << j << ")";
    }
}

TYPED_TEST(ShapeOps, AssigningATransposeToItsSource) {
  using T = TypeParam;
  auto rng = make_rng(5);
  tile<T, 7, 7> m;
  tg_test::fill_uniform(m, rng, -4, 4);
  tile<T, 7, 7> const orig = m;
  m = trans(m); // reads what it overwrites unless evaluated into a temporary first
  for (int i = 0; i < 7; ++i)
    for (int j = 0; j < 7; ++j)
      EXPECT_EQ(m(i, j), orig(j, i)) << "m = trans(m) at (" << i << ", " << j << ")";
  m = orig;
  m = m + trans(m);
  for (int i = 0; i < 7; ++i)
    for (int j = 0; j < 7; ++j)
      EXPECT_EQ(m(i, j), orig(i, j) + orig(j, i))
          << "m = m + trans(m) at (" << i << ", " << j << ")";
  tile<T, 3, 3, 3> c;
  tg_test::fill_uniform(c, rng, -4, 4);
  tile<T, 3, 3, 3> const c0 = c;
  c = permute<2, 0, 1>(c);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 3; ++k)
        EXPECT_EQ(c(i, j, k), c0(j, k, i))
            << "c = permute<2, 0, 1>(c) at (" << i << ", " << j << ", " << k << ")";
}

// A tile made from trans(x) of a tile in memory is transposed by 16 x 16 blocks on registers
// where the target has them (float, bf16) and element by element otherwise: every kind of stored
// source (a small tile read by reference, a heap tile, a temporary held by the expression, a
// block read in place inside a launch), extents on and off the blocks, and the transpose of a
// square tile assigned to itself.
template <class T>
double as_double(T x) {
  return static_cast<double>(static_cast<float>(x));
}

template <class T, int R, int C>
void check_stored_transposes() {
  tile<T, R, C> m;
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j) // distinct values, exact in bf16 (at most 8 bits of mantissa)
      m(i, j) = T(static_cast<float>((i * C + j) % 251) - 125.0f);
  auto expect_transpose_of = [&](tile<T, C, R> const& t, char const* what) {
    int bad = 0;
    for (int i = 0; i < C; ++i)
      for (int j = 0; j < R; ++j)
        if (!(as_double(t(i, j)) == as_double(m(j, i))) && bad++ < 3)
          ADD_FAILURE() << what << " " << R << " x " << C << " at (" << i << ", " << j
                        << "): " << as_double(t(i, j)) << " vs " << as_double(m(j, i));
  };
  tile<T, C, R> const from_lvalue = trans(m);
  expect_transpose_of(from_lvalue, "trans(m)");
  tile<T, C, R> const from_temporary = trans(tile<T, R, C>(m));
  expect_transpose_of(from_temporary, "trans(tile(m))");
  tile<T, C, R> assigned(uninitialized);
  assigned = trans(m);
  expect_transpose_of(assigned, "t = trans(m)");
  std::vector<T> buf(static_cast<std::size_t>(R * C));
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j) buf[static_cast<std::size_t>(i * C + j)] = m(i, j);
  tile<T, C, R> in_launch(uninitialized);
  launch(launch_options{.exec = executor::sequential}, grid{1, 1, 1},
         [&](program const&, tensor<T const> x) {
           in_launch = tile<T, C, R>(trans(load(make_block_ptr<R, C>(x, {0, 0}))));
         },
         tensor<T const>(buf.data(), {R, C}, "x"));
  expect_transpose_of(in_launch, "trans(load(block)) in a launch");
  if constexpr (R == C) {
    tile<T, R, C> sq = m;
    sq = trans(sq);
    expect_transpose_of(sq, "x = trans(x)");
  }
}

TEST(ShapeOpsTranspose, StoredTilesByBlocksAndElementByElement) {
  check_stored_transposes<float, 64, 48>();
  check_stored_transposes<float, 64, 64>();
  check_stored_transposes<float, 16, 16>();
  check_stored_transposes<float, 37, 20>();
  check_stored_transposes<float, 4, 8>(); // 128 bytes: a tile held inline
  check_stored_transposes<double, 32, 48>();
  check_stored_transposes<double, 33, 5>();
  check_stored_transposes<bf16, 64, 64>();
  check_stored_transposes<bf16, 32, 80>();
  check_stored_transposes<bf16, 48, 17>();
}

TEST(ShapeOpsShapes, ColRowExpandDimsAndPermuteShapes) {
  tile<int, 5> u;
  tile<int, 3, 4, 19> x;
  static_assert(std::is_same_v<shape_of_t<decltype(col(u))>, shape<5, 1>>);
  static_assert(std::is_same_v<shape_of_t<decltype(row(u))>, shape<1, 5>>);
  static_assert(std::is_same_v<shape_of_t<decltype(trans(col(u)))>, shape<1, 5>>);
  static_assert(std::is_same_v<shape_of_t<decltype(permute<2, 0, 1>(x))>, shape<19, 3, 4>>);
  static_assert(std::is_same_v<shape_of_t<decltype(reshape<76, 3>(x))>, shape<76, 3>>);
  // Integer tiles go through the same views.
  for (int i = 0; i < 5; ++i)
    u(i) = 10 * i - 7;
  tile<int, 1, 5> r = trans(col(u));
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(r(0, i), 10 * i - 7) << "at (0, " << i << ")";
}

} // namespace

} // namespace test_shape_ops
