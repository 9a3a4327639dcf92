// `gradscale bench cuda`: bandwidth of the GPU statistics and rounding kernels next to a device-to-device
// copy. Defined in bench_cuda.cpp, which the build compiles only with CUDA (GRADSCALE_HAS_CUDA).
#pragma once

#include <cstddef>

namespace gradscale::cli {

// Times each kernel on n gradient-like floats (best of `repeats`, CUDA events) and prints one row per
// kernel: milliseconds, GB/s of the bytes it must move, and that bandwidth as a share of the copy's.
// Without a device it prints one "no CUDA device" line and returns 0.
int bench_cuda(std::size_t n, int repeats);

}  // namespace gradscale::cli
