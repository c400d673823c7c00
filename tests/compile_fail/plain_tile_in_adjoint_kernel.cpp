// expect-error: holds plain numbers but the expression carries derivatives
// A kernel that declares tile<float, N> drops the derivatives of what it holds; in reverse mode
// that is a compile error asking for tile<fp32<T>, N>.
#include <tilegrad/tilegrad.hpp>

namespace tg = tilegrad;

int main() {
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    tg::tile<float, 4> const v = tg::load(x + tg::arange<0, 4>());
    tg::store(y + tg::arange<0, 4>(), tg::to<T>(v * 2.0f));
  };
  tg::owned_tensor<float> x({4}, "x"), y({4}, "y"), dy({4}, "dy");
  auto g = tg::vjp(1, k, tg::in("x", x), tg::out("y", y, dy));
  (void)g;
}
