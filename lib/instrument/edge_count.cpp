// Two-bin gradient histogram (see edge_count.h).
#include "lib/instrument/edge_count.h"

#include <cmath>

#include "lib/core/error.h"

namespace gradscale {

EdgeCounts count_about_edge(const float* v, std::size_t n, float edge) {
  GS_CHECK_NUMERIC(edge > 0.0f && std::isfinite(edge),
                   "count_about_edge: the edge must be a positive finite float, got " << edge);
  GS_CHECK_NUMERIC(v != nullptr || n == 0, "count_about_edge: null data with n = " << n);
  EdgeCounts c;
  for (std::size_t i = 0; i < n; ++i) {
    const float a = std::fabs(v[i]);
    c.below += a < edge ? 1u : 0u;
    c.above += a >= edge ? 1u : 0u;
  }
  return c;
}

}  // namespace gradscale
