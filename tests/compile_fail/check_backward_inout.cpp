// expect-error: check_backward takes no inout tensor
// tg::inout is vjp's: a forward for check_backward gives its output a buffer of its own. (It
// failed with a message blaming the kernel's signature.)
#include <tilegrad/tilegrad.hpp>

namespace tg = tilegrad;

int main() {
  auto k = []<class T>(tg::program const&, tg::tensor<T> x) {
    auto const i = tg::arange<0, 4>();
    tg::store(x + i, tg::load(x + i) * 2.0f);
  };
  tg::owned_tensor<float> x({4}, "x"), dx({4}, "dx");
  auto const f = tg::forward(1, k, tg::inout("x", x, dx));
  (void)f;
}
