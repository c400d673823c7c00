// expect-error: cannot_assign_tile_shape<tilegrad::shape<8, 4>, tilegrad::shape<4, 8> ?>.*tilegrad: tile shape mismatch
// A (4, 8) expression assigned to a tile<float, 8, 4>: same size, different shape.
#include <tilegrad/tilegrad.hpp>

void f() {
  tilegrad::tile<float, 4, 8> a;
  tilegrad::tile<float, 8, 4> b = a * 2;
  (void)b;
}
