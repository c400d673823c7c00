// expect-error: only float tensors have gradients
// Marking an integer tensor `in` asks for a gradient that cannot exist.
#include <tilegrad/tilegrad.hpp>

#include <cstdint>

namespace tg = tilegrad;

int main() {
  auto k = []<class T>(tg::program const&, tg::tensor<std::int32_t const> idx, tg::tensor<T> y) {
    tg::store(y + tg::arange<0, 4>(), tg::load(idx + tg::arange<0, 4>()).template to<float>());
  };
  tg::owned_tensor<std::int32_t> idx({4}, "idx");
  tg::owned_tensor<float> y({4}, "y"), dy({4}, "dy");
  auto g = tg::vjp(1, k, tg::in("idx", idx), tg::out("y", y, dy));
  (void)g;
}
