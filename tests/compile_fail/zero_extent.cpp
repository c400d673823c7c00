// expect-error: shape<0>.*tilegrad: tile extents must be positive
// A tile with an extent of 0.
#include <tilegrad/tilegrad.hpp>

void f() {
  tilegrad::tile<float, 0> a;
  (void)a;
}
