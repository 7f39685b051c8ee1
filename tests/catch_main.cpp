// The shared Catch2 main of the single-process test binaries. Tests run on
// the BLAS kernels the moerl binary would choose (include/moerl/core/blas_kernels.h).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "moerl/core/blas_kernels.h"

int main(int argc, char** argv) {
  moerl::blas::select_kernels(argv);
  return Catch::Session().run(argc, argv);
}
