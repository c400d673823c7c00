// expect-error: cannot_convert_tile_implicitly<tilegrad::adjoint<float>, tilegrad::adjoint<double> >.*narrowing element-type conversion
// A float tile plus a double tile is double in every mode (adjoint<double> in reverse mode):
// assigning it to tile<fp32<T>> narrows, an error in reverse mode as on the fast path.
#include <tilegrad/tilegrad.hpp>

namespace tg = tilegrad;

int main() {
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    tg::tile<tg::fp32<T>, 4> const v = tg::load(x + tg::arange<0, 4>());
    tg::tile<double, 4> const c = tg::full<double, 4>(0.5);
    tg::tile<tg::fp32<T>, 4> const s = v + c;
    tg::store(y + tg::arange<0, 4>(), s);
  };
  tg::owned_tensor<float> x({4}, "x"), y({4}, "y"), dy({4}, "dy");
  auto g = tg::vjp(1, k, tg::in("x", x), tg::out("y", y, dy));
  (void)g;
}
