// The target scale of SPEC §5's backward join, as one host-and-device function: lib/model/join.cpp
// calls it on the host, lib/cuda's join kernel on the device (where the parts' max|g_i| are), so the
// same T comes out of both.
#pragma once

#include "lib/core/host_device.h"

namespace gradscale {

// T = the largest S_i with 2·m·T < limit (max_finite of the gradient format), where
// m = max_i(max_abs[i] / scales[i]); if none qualifies, min S_i halved until it does. `max_abs[i]` is
// infinite for a part holding a non-finite value (then nothing fits: min S_i). Scales finite and > 0,
// n ≥ 1 (the host wrapper checks).
GS_HOST_DEVICE inline double join_target(const double* max_abs, const double* scales, int n, double limit) {
  double m = 0;  // largest true |gradient| among the parts
  for (int i = 0; i < n; ++i) {
    const double r = max_abs[i] / scales[i];
    m = m < r ? r : m;  // std::max
  }
  double best = 0, smallest = scales[0];
  for (int i = 0; i < n; ++i) {
    if (2.0 * m * scales[i] < limit) best = best < scales[i] ? scales[i] : best;
    smallest = scales[i] < smallest ? scales[i] : smallest;  // std::min_element: the first smallest
  }
  if (best > 0) return best;
  if (!(m <= 1.7976931348623157e308)) return smallest;  // m is not finite: nothing fits a non-finite part
  const double tiny = 4.9406564584124654e-324;  // the smallest positive double
  double t = smallest;
  while (!(2.0 * m * t < limit) && t > tiny) t *= 0.5;
  return t;
}

}  // namespace gradscale
