// expect-error: boundary_check names an axis the block does not have
#include <tilegrad/tilegrad.hpp>

namespace tg = tilegrad;

int main() {
  tg::owned_tensor<float> x({4, 4}, "x");
  auto bp = tg::make_block_ptr<2, 2>(x.cview(), {0, 0});
  auto v = tg::load(bp, tg::bounds<2>); // a rank-2 block has axes 0 and 1
  return static_cast<int>(v(0, 0));
}
