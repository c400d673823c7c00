// expect-error: shapes_do_not_broadcast<tilegrad::shape<4, 8>, tilegrad::shape<3> ?>|shapes_do_not_broadcast<tilegrad::shape<3>, tilegrad::shape<4, 8> ?>
// (4, 8) + (3,) does not broadcast (8 != 3): the error names both shapes.
#include <tilegrad/tilegrad.hpp>

void f() {
  tilegrad::tile<float, 4, 8> a;
  tilegrad::tile<float, 3> b;
  auto c = a + b;
  (void)c;
}
