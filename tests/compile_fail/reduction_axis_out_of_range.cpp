// expect-error: Axis = 2.*tilegrad: reduction/scan axis is out of range
// sum along axis 2 of a rank-2 tile (valid axes: -2 to 1).
#include <tilegrad/tilegrad.hpp>

void f() {
  tilegrad::tile<float, 4, 8> a;
  auto s = tilegrad::sum<2>(a);
  (void)s;
}
