// expect-error: the kernel's first parameter is the program it runs as
// A kernel written without its program parameter.
#include <tilegrad/tilegrad.hpp>

void f(tilegrad::owned_tensor<float>& x, tilegrad::owned_tensor<float>& y) {
  auto k = []<class T>(tilegrad::tensor<T const>, tilegrad::tensor<T>) {};
  tilegrad::launch(1, k, x.cview(), y.view());
}
