// expect-error: the offsets are an integer tile
// A tensor plus a float tile (adding values to what a pointer points at, or offsets computed in
// float): the candidate list of a failed overload resolution did not say what an offset is.
#include <tilegrad/tilegrad.hpp>

void f(tilegrad::tensor<float const> x) {
  auto const y = tilegrad::zeros<float, 16>();
  (void)(x + y);
}
