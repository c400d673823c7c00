// expect-error: Op = tilegrad::ops::exp_op.*tilegrad: this math function needs a floating tile
// exp of an int32 tile (Triton needs x.to(tl.float32) first as well).
#include <tilegrad/tilegrad.hpp>

#include <cstdint>

void f() {
  tilegrad::tile<std::int32_t, 16> a;
  auto e = exp(a);
  (void)e;
}
