// Real 16-bit storage on the GPU: float32 ↔ __half / __nv_bfloat16 (what cuBLAS GEMMs read and write).
// fp32 → F gives exactly lib/numeric's encode(x, F) bits (RNE, subnormals, overflow to ±inf, a NaN keeps
// its sign and top payload bits, quiet); F → fp32 gives decode(bits, F). So a tensor stored in F holds
// the same values as the CPU's emulation of F (SPEC §2), and tests check it on every pattern.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstddef>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

namespace gradscale::cuda {

// Each converts n elements of device memory, queued on `stream`. Throws Error for null pointers with
// n > 0 and CudaError when the launch fails.
void to_fp16(const float* in, __half* out, std::size_t n, cudaStream_t stream);
void to_bf16(const float* in, __nv_bfloat16* out, std::size_t n, cudaStream_t stream);
void from_fp16(const __half* in, float* out, std::size_t n, cudaStream_t stream);
void from_bf16(const __nv_bfloat16* in, float* out, std::size_t n, cudaStream_t stream);

}  // namespace gradscale::cuda
