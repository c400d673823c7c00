// expect-error: for bf16 data, run jvp on float copies
// A bf16 tensor marked tangent_in: jvp marks float and double tensors only (vjp runs a bf16
// launch on float copies itself); the message says what to do instead of calling bf16 "not a
// float tensor".
#include <tilegrad/tilegrad.hpp>

void f(tilegrad::owned_tensor<tilegrad::bf16>& x, tilegrad::owned_tensor<float>& u) {
  (void)tilegrad::tangent_in("x", x, u);
}
