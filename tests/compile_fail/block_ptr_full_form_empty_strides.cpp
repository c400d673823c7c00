// expect-error: one stride, one offset and one order entry per block axis
// Triton's full form with the strides left as `{}`: they were taken as 0, and every element of
// the block read the first one, with no error.
#include <tilegrad/tilegrad.hpp>

void f(tilegrad::tensor<float> t, std::int64_t row) {
  (void)tilegrad::make_block_ptr<2, 4>(t, {8, 8}, {}, {row, 0}, {1, 0});
}
