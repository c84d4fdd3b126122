// main() of every test that links libtorch: the BLAS kernel check first (model/blas_kernel.h: a
// test process runs on the kernels a user's process would), then GoogleTest.
#include <gtest/gtest.h>

#include "model/blas_kernel.h"

int main(int argc, char** argv) {
  scd::SelectBlasKernel(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
