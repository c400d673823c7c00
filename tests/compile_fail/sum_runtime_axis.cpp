// expect-error: the axis is a template argument
// Triton's tl.sum(x, 1): the axis is a template argument here, and the candidate list of a failed
// overload resolution did not say so.
#include <tilegrad/tilegrad.hpp>

void f() {
  auto const x = tilegrad::zeros<float, 4, 8>();
  (void)tilegrad::sum(x, 1);
}
