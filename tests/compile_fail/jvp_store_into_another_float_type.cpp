// expect-error: the tangents would be dropped
// A jvp of a float launch keeps an unmarked bf16 scratch tensor as it is: a value with tangents
// stored there and loaded back counted as a constant (y = x^3 gave y' = x^2, not 3 x^2).
#include <tilegrad/tilegrad.hpp>

namespace tg = tilegrad;

int main() {
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<tg::bf16> scratch,
                       tg::tensor<T> y) {
    auto const i = tg::arange<0, 4>();
    tg::tile<tg::fp32<T>, 4> const v = tg::load(x + i);
    tg::store(scratch + i, v * v);
    tg::store(y + i, tg::to<tg::fp32<T>>(tg::load(scratch + i)) * v);
  };
  tg::owned_tensor<float> x({4}, "x"), u({4}, "u"), y({4}, "y");
  tg::owned_tensor<tg::bf16> scratch({4}, "scratch");
  auto t = tg::jvp(1, k, tg::tangent_in("x", x, u), scratch.view(), tg::tangent_out("y", y));
  (void)t;
}
