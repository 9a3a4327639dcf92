// How many CPU threads the engine computes with: one setting for its OpenMP loops (layers, rounding,
// statistics) and Eigen's GEMMs, so a program of one's own needs no <omp.h>. Public through
// <gradscale/network.h>.
#pragma once

namespace gradscale {

// Uses `n` threads from now on (1..1024), or every core the machine has when n = 0; ConfigError naming
// the value otherwise. Results do not depend on it except where a header says so (Conv2d's weight
// gradient sums per thread; a given count is deterministic). Process-wide, like omp_set_num_threads:
// set it before training, not from inside a step.
void set_threads(int n);
// The number of threads the next parallel loop will use.
int threads();

}  // namespace gradscale
