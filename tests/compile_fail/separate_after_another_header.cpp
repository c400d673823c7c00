// expect-error: include <tilegrad/separate.hpp> first, in a file of its own
// tilegrad/separate.hpp compiles the machinery out of line: included after another tilegrad
// header, its definitions would be missing, so it refuses with a message saying what to do.
#include <tilegrad/tilegrad.hpp>
#include <tilegrad/separate.hpp>

int main() { return 0; }
