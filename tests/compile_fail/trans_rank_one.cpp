// expect-error: a rank-1 tile has nothing to transpose
// trans of a rank-1 tile (x.T of a vector): the message pointed to permute.
#include <tilegrad/tilegrad.hpp>

void f() {
  auto const x = tilegrad::zeros<float, 16>();
  (void)tilegrad::trans(x);
}
