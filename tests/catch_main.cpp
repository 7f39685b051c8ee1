// The shared Catch2 main of the single-process test binaries.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
