// expect-error: value_shape_does_not_fit_pointers<tilegrad::shape<4, 8>, tilegrad::shape<8> >.*the value's shape does not broadcast to the pointers' shape
// A (4, 8) tile stored through (8,) pointers: a readable message naming both shapes, in the
// reverse-mode instantiation as on the fast path.
#include <tilegrad/tilegrad.hpp>

namespace tg = tilegrad;

int main() {
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const offs = tg::col(tg::arange<0, 4>()) * 8 + tg::row(tg::arange<0, 8>());
    tg::tile<tg::fp32<T>, 4, 8> const v = tg::load(x + offs);
    tg::store(y + tg::arange<0, 8>(), v);
  };
  tg::owned_tensor<float> x({32}, "x"), y({8}, "y"), dy({8}, "dy");
  auto g = tg::vjp(1, k, tg::in("x", x), tg::out("y", y, dy));
  (void)g;
}
