// expect-error: reshape_changes_size<tilegrad::shape<4, 8>, tilegrad::shape<5, 7> ?>.*tilegrad: reshape must keep the number of elements
// reshape of 32 elements to 35.
#include <tilegrad/tilegrad.hpp>

void f() {
  tilegrad::tile<float, 4, 8> a;
  auto b = tilegrad::reshape<5, 7>(a);
  (void)b;
}
