// Dropout's mask on the GPU, the twin of lib/layers/dropout.cpp's arithmetic: y = keep ? x·factor : 0
// with one fp32 product, for the forward (x the input) and the backward (x the output gradient) alike.
// The mask itself is drawn on the host from the run's seeded generator, so a run draws the CPU's masks
// on either device; the caller rounds y to F (SPEC §5: the scale S passes unchanged).
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace gradscale::cuda {

// y[i] = keep[i] ? x[i]·factor : 0 for i < n (device arrays; keep is 1 or 0), queued on `stream`.
void apply_dropout_mask(const float* x, const std::uint8_t* keep, float factor, float* y, std::size_t n,
                        cudaStream_t stream);

}  // namespace gradscale::cuda
