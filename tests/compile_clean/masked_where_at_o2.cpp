// Must compile without a warning at -O2 (-Wall -Wextra -Werror): the masked where of an
// attention block (queries against keys, tiles of 64) in the float, double and reverse-mode
// instantiations. GCC 12 used to warn here of undefined behaviour in `q0 + arange` on tail
// iterations that never run (-Waggressive-loop-optimizations), from the evaluation loop.
#include <tilegrad/tilegrad.hpp>

namespace tg = tilegrad;

namespace {

constexpr int B = 64;

constexpr auto masked = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
  int const q0 = p.program_id(0) * B, k0 = p.program_id(1) * B;
  int const n = static_cast<int>(x.size(0));
  auto const offs_q = q0 + tg::arange<0, B>();
  auto const offs_k = k0 + tg::arange<0, B>();
  auto const offs = tg::col(tg::arange<0, B>()) * B + tg::row(tg::arange<0, B>());
  tg::tile<tg::fp32<T>, B, B> pt = tg::load(x + offs);
  pt = tg::where((tg::row(offs_k) < n) & (tg::col(offs_q) >= 0), pt, 0.0f);
  tg::store(y + offs, pt);
};

} // namespace

void masked_where_in_every_mode(tg::owned_tensor<float>& x, tg::owned_tensor<float>& y,
                                tg::owned_tensor<float> const& dy, tg::owned_tensor<double>& xd,
                                tg::owned_tensor<double>& yd, tg::owned_tensor<double> const& dyd) {
  tg::launch(1, masked, x.cview(), y.view());
  tg::launch(1, masked, xd.cview(), yd.view());
  (void)tg::vjp(1, masked, tg::in("x", x), tg::out("y", y, dy));
  (void)tg::vjp(1, masked, tg::in("x", xd), tg::out("y", yd, dyd));
}
