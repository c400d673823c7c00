// expect-error: dot.a, b. multiplies rank-2 tiles
// Triton's batched dot of rank-3 tiles: the message spoke of K, which matched.
#include <tilegrad/tilegrad.hpp>

void f() {
  auto const a = tilegrad::zeros<float, 2, 4, 8>();
  auto const b = tilegrad::zeros<float, 2, 8, 4>();
  (void)tilegrad::dot(a, b);
}
