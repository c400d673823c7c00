// expect-error: static[ _]assert(ion)? failed.*tilegrad: example
// Example of a compile-fail test: this translation unit must not compile, and the compiler's
// output must match the regular expression on the first line.
static_assert(sizeof(int) == 3, "tilegrad: example");

int main() {
  return 0;
}
