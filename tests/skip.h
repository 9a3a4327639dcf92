// A visible skip for a test case that cannot run here (no data, no GPU, no python): prints why and
// exits with 4, which ctest reports as "Skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt). Each test
// case runs in its own process under ctest, so exiting ends only this case.
#pragma once

#include <cstdlib>
#include <iostream>
#include <string>

namespace gradscale::test {

[[noreturn]] inline void skip_test(const std::string& why) {
  std::cout << "SKIPPED: " << why << std::endl;
  std::exit(4);
}

}  // namespace gradscale::test
