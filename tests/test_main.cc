// main() of every test that links libtorch: the BLAS kernel check first (model/blas_kernel.h: a
// test process runs on the kernels a user's process would), then GoogleTest. Run again under other
// kernels (scripts/numeric_kernels.sh sets SCD_NUMERIC_RERUN=1), a test whose ctest entry names
// its float-comparing cases (SCD_NUMERIC_CASES, tests/CMakeLists.txt) runs only those.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "model/blas_kernel.h"

int main(int argc, char** argv) {
  scd::SelectBlasKernel(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  const char* rerun = std::getenv("SCD_NUMERIC_RERUN");
  const char* cases = std::getenv("SCD_NUMERIC_CASES");
  if (rerun != nullptr && std::string(rerun) == "1" && cases != nullptr && *cases != '\0') {
    GTEST_FLAG_SET(filter, cases);
    std::printf("under other kernels: only the cases comparing floats (%s)\n", cases);
  }
  return RUN_ALL_TESTS();
}
