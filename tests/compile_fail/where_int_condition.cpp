// expect-error: the condition is a bool tile
// where with an int32 tile for its condition (a mask kept as numbers): Triton takes it as c != 0;
// here the message says to write that.
#include <tilegrad/tilegrad.hpp>

void f() {
  auto const c = tilegrad::arange<0, 16>() % 2;
  auto const a = tilegrad::zeros<float, 16>();
  (void)tilegrad::where(c, a, 1.0f);
}
