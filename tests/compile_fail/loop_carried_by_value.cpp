// expect-error: tilegrad::loop: take every carried value by reference
// A tg::loop body taking a carried value by copy: its update would not reach the next iteration.
#include <tilegrad/tilegrad.hpp>

void f() {
  auto acc = tilegrad::zeros<float, 8>();
  tilegrad::loop(0, 4, 1, acc, [](int, auto acc) { acc = acc + 1.0f; });
}
