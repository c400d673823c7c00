// expect-error: dot_shapes_do_not_match<tilegrad::shape<4, 8>, tilegrad::shape<7, 16> ?>.*tilegrad: dot.a, b. needs a .M x K. and b .K x N. with the same K
// dot of (4, 8) and (7, 16): the inner extents 8 and 7 differ.
#include <tilegrad/tilegrad.hpp>

void f() {
  tilegrad::tile<float, 4, 8> a;
  tilegrad::tile<float, 7, 16> b;
  auto c = tilegrad::dot(a, b);
  (void)c;
}
