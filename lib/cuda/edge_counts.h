// popart_als's two-bin counts on the GPU, the twin of lib/instrument's count_about_edge(): how many
// values of a device tensor lie below an edge and how many at or above it, as they will be after
// rounding to F, added into a device record so that a step's counts reach the host with its other
// measurements (CudaBackend's one copy) instead of a copy of every weight gradient.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace gradscale::cuda {

// What the device adds to (device memory; the caller zeroes it when a count starts).
struct DeviceEdgeCounts {
  unsigned long long below;  // |v| < edge after rounding
  unsigned long long above;  // |v| >= edge after rounding, ±inf included
};

// out->below += #{i : (bits(v[i]) & 0x7FFFFFFF) < t}, out->above += #{i : t <= that <= bits(inf)}, with
// t = edge_threshold_bits(edge, F, opt) (lib/instrument/histogram.h): the CPU's counts exactly; NaN in
// neither. Queued on `stream`. Throws Error for null pointers with n > 0, CudaError when a launch fails.
void count_about_edge(const float* v, std::size_t n, std::uint32_t threshold_bits, DeviceEdgeCounts* out,
                      cudaStream_t stream);

}  // namespace gradscale::cuda
