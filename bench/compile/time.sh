#!/usr/bin/env bash
# Compile times of a user's check file, the FlashAttention example and an empty file including
# the umbrella header, header-only and with TILEGRAD_SEPARATE_COMPILATION, beside the Eigen
# yardstick: CPU time (user) and peak memory of one g++ -O2 -march=native compile each, one at a
# time. Run from anywhere: bench/compile/time.sh [rounds]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
rounds=${1:-1}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flags=(-std=gnu++20 -O2 -Wall -Wextra -march=native -fopenmp -DTILEGRAD_USE_OPENMP=1
       -DTILEGRAD_USE_TBB=1 -DTILEGRAD_USE_XSIMD=1 -DGTEST_HAS_PTHREAD=1
       -I"$root/include" -I"$root/tests")
echo '#include <tilegrad/tilegrad.hpp>' > "$out/empty.cpp"
one() { # label, then the g++ arguments
  local label=$1
  shift
  /usr/bin/time -f "%U %M" -o "$out/t" g++ "$@" -c -o "$out/x.o"
  read -r user kb < "$out/t"
  printf '%-50s %7.2f s %6d MB\n' "$label" "$user" $((kb / 1024))
}
for ((r = 0; r < rounds; ++r)); do
  one "Eigen yardstick" -std=gnu++20 -O2 -march=native -I/usr/include/eigen3 \
    "$root/bench/compile/eigen_yardstick.cpp"
  one "empty file, umbrella header" "${flags[@]}" "$out/empty.cpp"
  for f in bench/compile/user_check.cpp tests/check/test_softmax_backward.cpp \
           examples/06_flash_attention.cpp; do
    one "$f" "${flags[@]}" "$root/$f"
    one "$f, separate" "${flags[@]}" -DTILEGRAD_SEPARATE_COMPILATION=1 "$root/$f"
  done
done
