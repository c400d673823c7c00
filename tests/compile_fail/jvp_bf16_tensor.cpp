// expect-error: float for a bf16 tensor
// A bf16 tensor marked tangent_in with a bf16 tangent: a bf16 tensor's tangent is float (jvp runs
// a bf16 launch on dual<float> copies); the message says so.
#include <tilegrad/tilegrad.hpp>

void f(tilegrad::owned_tensor<tilegrad::bf16>& x, tilegrad::owned_tensor<tilegrad::bf16>& u) {
  (void)tilegrad::tangent_in("x", x, u);
}
