// expect-error: the elementwise max of two operands is maximum.a, b.
// max(a, b) for Triton's tl.maximum(a, b): max reduces one tile.
#include <tilegrad/tilegrad.hpp>

void f() {
  auto const a = tilegrad::zeros<float, 16>();
  auto const b = tilegrad::zeros<float, 16>();
  (void)tilegrad::max(a, b);
}
