// expect-error: the kernel takes tensor<T> .writable. where a read-only tensor arrives.*declare that parameter tensor<T const>
// A tensor marked in(...) reaches the kernel read-only: a kernel declaring tensor<T> for it gets
// told so, not a bare "no match for call".
#include <tilegrad/tilegrad.hpp>

namespace tg = tilegrad;

int main() {
  auto k = []<class T>(tg::program const&, tg::tensor<T> x, tg::tensor<T> y) {
    tg::store(y + tg::arange<0, 8>(), tg::load(x + tg::arange<0, 8>()));
  };
  tg::owned_tensor<float> x({8}, "x"), y({8}, "y"), dy({8}, "dy");
  auto g = tg::vjp(1, k, tg::in("x", x), tg::out("y", y, dy));
  (void)g;
}
