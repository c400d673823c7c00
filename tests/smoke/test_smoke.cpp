// Smoke test: the test machinery works and the configuration macros reach the compiler.
#if __has_include(<tilegrad/tilegrad.hpp>)
#include <tilegrad/tilegrad.hpp>
#endif

#include <gtest/gtest.h>

#if !defined(TILEGRAD_USE_XSIMD) || !defined(TILEGRAD_USE_TBB) || !defined(TILEGRAD_USE_OPENMP)
#error "tilegrad::tilegrad must define TILEGRAD_USE_XSIMD, TILEGRAD_USE_TBB and TILEGRAD_USE_OPENMP"
#endif

TEST(Smoke, ConfigMacrosAreBooleans) {
  EXPECT_TRUE(TILEGRAD_USE_XSIMD == 0 || TILEGRAD_USE_XSIMD == 1);
  EXPECT_TRUE(TILEGRAD_USE_TBB == 0 || TILEGRAD_USE_TBB == 1);
  EXPECT_TRUE(TILEGRAD_USE_OPENMP == 0 || TILEGRAD_USE_OPENMP == 1);
}

TEST(Smoke, OpenMPModeMatchesConfig) {
#if defined(_OPENMP)
  constexpr bool openmp_mode = true;
#else
  constexpr bool openmp_mode = false;
#endif
  EXPECT_EQ(openmp_mode, TILEGRAD_USE_OPENMP == 1);
}
