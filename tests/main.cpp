// Entry point of the Catch2 test binaries (gradscale_tests and the CPU execution target's).
// Catch2 returns the number of failed assertions (at most 255) as the exit status, and ctest reads 4 as
// a skip (SKIP_RETURN_CODE, tests/skip.h): a case that failed four assertions would pass as skipped. So
// any failure exits 1 (tests/test_harness.cpp checks it).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

int main(int argc, char* argv[]) {
  const int failures = Catch::Session().run(argc, argv);
  return failures == 0 ? 0 : 1;
}
