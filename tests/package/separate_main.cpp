// A consumer built with TILEGRAD_SEPARATE_COMPILATION=1: vjp's machinery comes from
// separate.cpp, compiled once. Checks one gradient: y = x * x, dy = 1 -> dx = 2 x.
#include <tilegrad/tilegrad.hpp>

#include <cstdio>

namespace tg = tilegrad;

int main() {
  constexpr auto square = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                      tg::tensor<T> y) {
    auto const i = p.program_id(0) * 16 + tg::arange<0, 16>();
    auto const m = i < static_cast<int>(x.size(0));
    tg::store(y + i, tg::load(x + i, m) * tg::load(x + i, m), m);
  };
  tg::owned_tensor<float> x({20}, "x"), y({20}, "y"), dy({20}, "dy");
  for (int i = 0; i < 20; ++i) {
    x(i) = 0.5f * float(i) - 3.0f;
    dy(i) = 1.0f;
  }
  auto const g = tg::vjp(tg::grid(2), square, tg::in("x", x), tg::out("y", y, dy));
  for (int i = 0; i < 20; ++i)
    if (g["x"](i) != 2.0f * x(i)) {
      std::printf("dx[%d] = %g, expected %g\n", i, double(g["x"](i)), 2.0 * x(i));
      return 1;
    }
  std::printf("separate compilation: vjp OK\n");
  return 0;
}
