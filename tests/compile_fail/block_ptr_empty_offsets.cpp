// expect-error: give one entry per block axis
// Empty braces for a 2-D block's offsets: a std::array parameter took them as (0, 0), so a
// kernel that meant to give its program's offsets and left them out read the first block.
#include <tilegrad/tilegrad.hpp>

void f(tilegrad::tensor<float> t) {
  (void)tilegrad::make_block_ptr<2, 4>(t, {});
}
