// The formats the tests of lib/cuda run every kernel over (tests/test_cuda_*.cpp): every Format, and
// fp8_e4m3 with both overflow options.
#pragma once

#include <string>
#include <vector>

#include "lib/numeric/format.h"
#include "lib/numeric/quantize.h"

namespace gradscale::test::cuda_fixtures {

struct FormatCase {
  Format format;
  RoundOptions round;
  std::string name() const {
    return std::string(format_name(format)) + (round.e4m3_overflow_to_nan ? " (overflow to NaN)" : "");
  }
};

// Every format, and fp8_e4m3 with both overflow options.
inline std::vector<FormatCase> format_cases() {
  std::vector<FormatCase> c;
  for (Format f : all_formats()) c.push_back({f, {}});
  c.push_back({Format::fp8_e4m3, RoundOptions{true}});
  return c;
}

}  // namespace gradscale::test::cuda_fixtures
