// The step's working copies of the parameters (SPEC §4) on the GPU: each master rounded to F and, where
// a GEMM reads the weight in 16 bits, its 16-bit copy written by the same pass — for many parameters in
// one launch (Model::prepare_weights queues them all: CudaBackend::round_working_copy), where one
// quantize and one conversion per tensor took up to three launches a layer.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "lib/cuda/gemm.h"
#include "lib/numeric/format.h"
#include "lib/numeric/quantize.h"

namespace gradscale::cuda {

// dst[i] ← quantize(src[i], F) for i < n (device pointers; src == dst is allowed) and, with `half`,
// half[i] ← the bits of dst[i] as `half_type` (f16 or bf16: convert.h's to_fp16 / to_bf16 of it).
struct CopyJob {
  const float* src = nullptr;
  float* dst = nullptr;
  std::uint16_t* half = nullptr;
  std::size_t n = 0;
  DeviceType half_type = DeviceType::f32;
};

constexpr std::size_t kCopyJobsPerLaunch = 32;

// The jobs, all rounded to F, in one launch per kCopyJobsPerLaunch non-empty ones (`jobs` on the host,
// read before it returns), queued on `stream`: the bits of quantize() then to_fp16 / to_bf16 for each.
// Throws Error, before anything is launched, for a null pointer in a job with n > 0 or a `half` whose
// type is not f16 or bf16, naming the job.
void round_copies(const CopyJob* jobs, std::size_t count, Format f, RoundOptions opt, cudaStream_t stream);

}  // namespace gradscale::cuda
