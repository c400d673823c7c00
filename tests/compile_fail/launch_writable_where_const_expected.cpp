// expect-error: does not deduce T: pass x.cview()
// An owned tensor passed where a generic kernel takes tensor<T const> (the tutorial's launch as
// first written): T is not deduced from a tensor<float>, and the message says what to pass.
#include <tilegrad/tilegrad.hpp>

void f() {
  tilegrad::owned_tensor<float> x({16}), y({16});
  tilegrad::launch(1, []<class T>(tilegrad::program const&, tilegrad::tensor<T const> a,
                                  tilegrad::tensor<T> b) {
    auto const i = tilegrad::arange<0, 16>();
    tilegrad::store(b + i, tilegrad::load(a + i));
  }, x, y.view());
}
