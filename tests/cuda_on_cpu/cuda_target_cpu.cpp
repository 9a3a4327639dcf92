// gradscale_cuda_on_cpu_tests runs the lib/cuda cases on lib/cuda's CPU execution target (tests/cuda_test.h).
#include "tests/cuda_test.h"

bool gradscale::test::on_cpu_execution_target() noexcept {
  return true;
}
