// The round-to-F class counts of SPEC §3 from threshold crossings, one definition for the host pass
// (histogram.cpp: stats_pass) and the GPU's (lib/cuda/stats.cu: finalize).
#pragma once

#include "lib/core/host_device.h"

namespace gradscale {

// Sets the class counts of `s` (a TensorStats, or the GPU's DeviceStats) for n values of which
// reached[k] reach threshold k: |v| != 0, >= first_nonzero, >= first_normal, >= first_overflow, >= inf
// (round_thresholds.h). Class k holds the values that reached exactly k thresholds; `count` is the
// number of finite values.
template <class Stats, class Count>
GS_HOST_DEVICE inline void set_class_counts(Stats& s, Count n, const Count (&reached)[5]) {
  s.elements = n;
  s.zero = n - reached[0];
  s.underflow = reached[0] - reached[1];
  s.subnormal = reached[1] - reached[2];
  s.normal = reached[2] - reached[3];
  s.overflow = reached[3] - reached[4];
  s.nonfinite = reached[4];
  s.count = n - s.nonfinite;
}

}  // namespace gradscale
