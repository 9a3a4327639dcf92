// round_copies (see working_copies.h): a block row per job, a grid-stride loop over its elements; the
// jobs travel by value in the launch's parameters (no copy to the device first).
#include "lib/cuda/working_copies.h"

#include <algorithm>

#include "lib/core/error.h"
#include "lib/cuda/check.h"
#include "lib/cuda/convert.cuh"
#include "lib/cuda/launch.h"
#include "lib/cuda/quantize.h"
#include "lib/cuda/round.cuh"

namespace gradscale::cuda {
namespace {

struct CopyJobs {
  CopyJob job[kCopyJobsPerLaunch];
};

__global__ void round_copies_kernel(CopyJobs jobs, DeviceRounding rounding) {
  const CopyJob& j = jobs.job[blockIdx.y];
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < j.n; i += stride) {
    const float v = device::round_to_format(j.src[i], rounding);
    j.dst[i] = v;
    if (j.half != nullptr)
      j.half[i] = j.half_type == DeviceType::f16 ? bits16::fp16_bits(v) : bits16::bf16_bits(v);
  }
}

}  // namespace

void round_copies(const CopyJob* jobs, std::size_t count, Format f, RoundOptions opt, cudaStream_t stream) {
  for (std::size_t i = 0; i < count; ++i) {  // every job checked before any is launched
    const CopyJob& j = jobs[i];
    GS_CHECK(j.n == 0 || (j.src != nullptr && j.dst != nullptr),
             "cuda::round_copies: job " << i << " of " << j.n << " elements has a null pointer");
    GS_CHECK(j.half == nullptr || j.half_type == DeviceType::f16 || j.half_type == DeviceType::bf16,
             "cuda::round_copies: job " << i << "'s 16-bit copy must be f16 or bf16, not "
                                        << device_type_name(j.half_type));
  }
  const DeviceRounding rounding = device_rounding(f, opt);
  CopyJobs batch;
  launch_in_batches(
      count, kCopyJobsPerLaunch, [&](std::size_t i) { return jobs[i].n; },
      [&](std::size_t i, std::size_t slot) { batch.job[slot] = jobs[i]; },
      [&](std::size_t in_batch, std::size_t largest) {
        round_copies_kernel<<<dim3(grid_for(largest, 4), static_cast<unsigned>(in_batch)), kBlock, 0, stream>>>(
            batch, rounding);
        GS_CUDA_CHECK_LAUNCH();
      });
}

}  // namespace gradscale::cuda
