// expect-error: cannot_convert_tile_implicitly<float, double>.*tilegrad: narrowing element-type conversion
// A double expression assigned to a float tile needs to<float>(e).
#include <tilegrad/tilegrad.hpp>

void f() {
  tilegrad::tile<double, 16> a;
  tilegrad::tile<float, 16> b = a * 2;
  (void)b;
}
