// Rounding float32 to a storage format F on the GPU (SPEC §2), the twin of lib/numeric's quantize():
// the same rule (round to nearest, ties to even, gradual underflow, F's overflow rule, NaN keeps its
// sign and top payload bits), the magnitude rounded by round_magnitude_fast (lib/numeric/round_rule.h:
// round_magnitude's bits in a few fp32 operations), so the results are bit-identical — tests compare
// them on every fp16 and bf16 pattern, their neighbours and midpoints, and random floats.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "lib/numeric/format.h"
#include "lib/numeric/quantize.h"
#include "lib/numeric/round_rule.h"

namespace gradscale::cuda {

// F's rounding rule as plain values a kernel takes by value (built on the host from format_info).
struct DeviceRounding {
  bool identity = true;             // fp32: no rounding at all (NaN payloads included)
  float32::FastRounding magnitude{};  // F's round_magnitude_fast (not read for fp32)
  float max_finite = 0;             // F's largest finite value
  std::uint32_t nan_drop_mask = 0;  // float32 fraction bits a NaN loses in F
  bool single_nan = false;          // F has one NaN per sign (fp8_e4m3): sign | inf | quiet bit
  OverflowRule overflow = OverflowRule::infinity;  // with the e4m3 NaN option already applied
};
DeviceRounding device_rounding(Format f, RoundOptions opt = {});

// out[i] = quantize(multiplier · in[i], F) for i < n (device pointers; in == out is allowed), queued on
// `stream`. The product is one fp32 multiplication (skipped when multiplier == 1), as the CPU's
// round_gradient applies a local scale or S0. A NaN input keeps its sign only with multiplier 1 (a GPU
// multiplication returns its canonical NaN). Throws Error for null pointers with n > 0 and CudaError
// when the launch fails (e.g. no device).
void quantize(const float* in, float* out, std::size_t n, Format f, RoundOptions opt, float multiplier,
              cudaStream_t stream);

}  // namespace gradscale::cuda
