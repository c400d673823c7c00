// expect-error: the value's shape differs from the block's .*trans\(value\)
// A (16, 8) tile stored through an (8, 16) block pointer (a value laid out transposed): the error
// says it is a block store and names trans(), where the tile-assignment message suggested a
// reshape, which would scramble the values.
#include <tilegrad/tilegrad.hpp>

namespace tg = tilegrad;

void f(tg::tensor<float> y) {
  auto bp = tg::make_block_ptr<8, 16>(y, {0, 0});
  tg::tile<float, 16, 8> v(1.0f);
  tg::store(bp, v);
}
