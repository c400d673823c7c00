// expect-error: tilegrad: bf16 is a storage type: convert with to<float>.x. before computing
// Arithmetic on bf16 tiles: bf16 is for storage; compute in float.
#include <tilegrad/tilegrad.hpp>

void f() {
  tilegrad::tile<tilegrad::bf16, 16> a, b;
  auto c = a + b;
  (void)c;
}
