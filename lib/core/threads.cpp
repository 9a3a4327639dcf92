// The engine's thread count (see threads.h): OpenMP's, and Eigen's for GEMMs outside parallel regions.
#include "lib/core/threads.h"

#include <omp.h>

#include <Eigen/Core>

#include "lib/core/error.h"

namespace gradscale {

void set_threads(int n) {
  constexpr int kMaxThreads = 1024;
  GS_CHECK_CONFIG(n >= 0 && n <= kMaxThreads,
                  "threads must be in [0, " << kMaxThreads << "] (0: every core), got " << n);
  const int count = n > 0 ? n : omp_get_num_procs();
  omp_set_num_threads(count);
  Eigen::setNbThreads(count);
}

int threads() {
  return omp_get_max_threads();
}

}  // namespace gradscale
