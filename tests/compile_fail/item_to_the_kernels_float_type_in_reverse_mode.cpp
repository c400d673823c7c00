// expect-error: in reverse mode would drop the item's derivative, which forward mode keeps
// fp32<T>(x.item()) in a kernel: in forward mode the number keeps the item's tangent, in reverse
// mode it would be a plain number, so the gradient would lose that path in one mode only.
#include <tilegrad/tilegrad.hpp>

namespace tg = tilegrad;

auto const k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
  using F = tg::fp32<T>;
  auto const i = tg::arange<0, 4>();
  tg::tile<F, 4> const v = tg::load(x + i);
  F const s = F(tg::sum(v * v).item());
  tg::store(y + i, v * tg::full<F, 4>(s));
};

void f(tg::owned_tensor<float>& x, tg::owned_tensor<float>& y, tg::owned_tensor<float>& dy) {
  auto g = tg::vjp(1, k, tg::in("x", x), tg::out("y", y, dy));
}
