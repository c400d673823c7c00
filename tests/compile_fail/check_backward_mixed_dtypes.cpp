// expect-error: every marked tensor of the forward must have the same element type
// A float input beside a bf16 output: the checker runs one working dtype (an unmarked float
// tensor may sit beside bf16 ones, as a bf16 attention's logsumexp; a marked one may not).
#include <tilegrad/tilegrad.hpp>

namespace tg = tilegrad;

int main() {
  auto k = []<class X, class Y>(tg::program const&, tg::tensor<X const> x, tg::tensor<Y> y) {
    tg::store(y + tg::arange<0, 4>(), tg::load(x + tg::arange<0, 4>()));
  };
  tg::owned_tensor<float> x({4}, "x");
  tg::owned_tensor<tg::bf16> y({4}, "y");
  auto r = tg::check_backward(tg::forward(1, k, tg::in("x", x), tg::out("y", y)),
                              [](tg::backward_context<float>&) {});
  (void)r;
}
