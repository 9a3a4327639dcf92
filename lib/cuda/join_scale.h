// SPEC §5's backward join without a wait: the target scale T is chosen on the device from the parts'
// max|g_i| (their statistics, left in device memory by the stats kernel) and their scales (entries of
// the backend's scale table), with the host's function (lib/model/join_target.h); each part is then
// added at T/S_i read on the device.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstddef>

#include <cuda_runtime_api.h>

#include "lib/cuda/local_scale.h"
#include "lib/cuda/stats.h"

namespace gradscale::cuda {

// The parts of one join, passed by value to the kernel.
constexpr int kMaxJoinParts = 32;
struct JoinParts {
  const DeviceStats* stats[kMaxJoinParts];  // the part's statistics (max_abs, nonfinite)
  const DeviceScale* scales[kMaxJoinParts];  // its S_i
  int count = 0;
  double limit = 0;  // max_finite of the gradient format
};

// *out ← {T, 1, 1}. One thread, queued on `stream`. Throws Error for 0 or more than kMaxJoinParts parts
// or a null pointer, CudaError when the launch fails.
void choose_join_scale(const JoinParts& parts, DeviceScale* out, cudaStream_t stream);

// dst[i] ← dst[i] + src[i]·float(target->scale / part->scale) for i < n (lib/model/join.cpp's loop, the
// factor read on the device). Queued on `stream`.
void scale_add_rescaled(const float* src, const DeviceScale* target, const DeviceScale* part, float* dst,
                        std::size_t n, cudaStream_t stream);

}  // namespace gradscale::cuda
