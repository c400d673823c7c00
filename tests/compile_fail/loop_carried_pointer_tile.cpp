// expect-error: tilegrad::loop: a tile of pointers cannot be carried
// Triton's `a_ptrs += BK * stride` carried through a tg::loop: reverse mode keeps the carried
// values of every iteration, and a pointer tile's offsets may refer to the kernel's locals. It is
// refused in every mode, the fast path's float instantiation here included.
#include <tilegrad/tilegrad.hpp>

void f(tilegrad::tensor<float const> a, tilegrad::tensor<float> y) {
  auto ptrs = a + tilegrad::arange<0, 8>();
  auto acc = tilegrad::zeros<float, 8>();
  tilegrad::loop(0, 4, 1, ptrs, acc, [](int, auto& p, auto& acc) {
    acc = acc + tilegrad::load(p);
    p += 8;
  });
  tilegrad::store(y + tilegrad::arange<0, 8>(), acc);
}
