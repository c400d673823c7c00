#include <tilegrad/tilegrad.hpp>

int main() {
  return 0;
}
