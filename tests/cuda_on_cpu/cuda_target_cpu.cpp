// gradscale_cuda_on_cpu_tests runs the lib/cuda cases on lib/cuda's CPU execution target (tests/cuda_test.h).
#include "tests/cuda_test.h"

#include "tests/cuda_on_cpu/executor.h"

bool gradscale::test::on_cpu_execution_target() noexcept {
  return true;
}

long long gradscale::test::kernel_launches() noexcept {
  return static_cast<long long>(gs_emu::launches());
}
