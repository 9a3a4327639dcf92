// Moments of ln|v| over the non-zero finite values of a tensor: the statistics of the lognormal form
// of approx_range at cast points (SPEC §6.2), which models |g| as lognormal rather than g as normal.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gradscale {

struct LogMoments {
  std::uint64_t count = 0;  // non-zero finite values
  double mean = 0;          // mean of ln|v|
  double stddev = 0;        // population standard deviation of ln|v|
};

LogMoments log_abs_moments(const float* v, std::size_t n);

}  // namespace gradscale
