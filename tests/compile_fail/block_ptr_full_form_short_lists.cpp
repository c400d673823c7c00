// expect-error: one order entry per block axis
// Triton's full form with a 1-D shape and strides for a 2-D block: the missing extent and stride
// were taken as 0, and every load read zeros with no error.
#include <tilegrad/tilegrad.hpp>

void f(tilegrad::tensor<float> t, std::int64_t row) {
  (void)tilegrad::make_block_ptr<2, 4>(t, {8}, {4}, {row, 0}, {1, 0});
}
