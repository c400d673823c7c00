// expect-error: kernel_argument_count<2, 3>.*the kernel takes fewer arguments after `program const&` than the launch passes
// A launch with one argument more than the kernel takes: the message named vjp and jvp, and
// not the count.
#include <tilegrad/tilegrad.hpp>

void f(tilegrad::owned_tensor<float>& x, tilegrad::owned_tensor<float>& y) {
  auto k = []<class T>(tilegrad::program const&, tilegrad::tensor<T const>, tilegrad::tensor<T>) {};
  tilegrad::launch(1, k, x.cview(), y.view(), 3);
}
