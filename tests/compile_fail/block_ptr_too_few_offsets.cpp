// expect-error: one offset per block axis
// A 2-D block given one offset: the second was taken as 0, silently (a std::array parameter fills
// what the braces leave out).
#include <tilegrad/tilegrad.hpp>

void f(tilegrad::tensor<float> t, std::int64_t row) {
  (void)tilegrad::make_block_ptr<2, 4>(t, {row});
}
