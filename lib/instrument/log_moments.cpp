// Moments of ln|v| (see log_moments.h), accumulated in double.
#include "lib/instrument/log_moments.h"

#include <algorithm>
#include <cmath>

namespace gradscale {

LogMoments log_abs_moments(const float* v, std::size_t n) {
  LogMoments m;
  double sum = 0, sq = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double a = std::fabs(static_cast<double>(v[i]));
    if (a == 0 || !std::isfinite(a)) continue;
    const double l = std::log(a);
    sum += l;
    sq += l * l;
    ++m.count;
  }
  if (m.count) {
    const auto c = static_cast<double>(m.count);
    m.mean = sum / c;
    m.stddev = std::sqrt(std::max(0.0, sq / c - m.mean * m.mean));
  }
  return m;
}

}  // namespace gradscale
