// Checks of CUDA runtime and cuBLAS calls (lib/cuda). One generic macro over GS_CHECK_AS
// (lib/core/error.h) throws CudaError with the failing call's text, the status's name and meaning, and
// file:line; every runtime call, cuBLAS call and kernel launch of the backend goes through it.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "lib/core/error.h"

namespace gradscale::cuda {

inline const char* status_name(cudaError_t e) {
  return cudaGetErrorName(e);
}
inline const char* status_text(cudaError_t e) {
  return cudaGetErrorString(e);
}
inline const char* status_name(cublasStatus_t s) {
  return cublasGetStatusName(s);
}
inline const char* status_text(cublasStatus_t s) {
  return cublasGetStatusString(s);
}

}  // namespace gradscale::cuda

// Evaluates `call` once; when its status is not `ok`, throws CudaError:
//   "`cudaMalloc(&p, bytes)` failed: cudaErrorMemoryAllocation (out of memory) [x.cu:12]"
// A failed CUDA call is an internal fault, reported as it is: its message keeps the file name and line
// (never the build path), which a user quotes in a bug report.
#define GS_GPU_CHECK(call, ok)                                                                       \
  do {                                                                                               \
    const auto gs_gpu_status_ = (call);                                                              \
    GS_CHECK_AS(::gradscale::CudaError, gs_gpu_status_ == (ok),                                      \
                "`" #call "` failed: " << ::gradscale::cuda::status_name(gs_gpu_status_) << " ("     \
                                       << ::gradscale::cuda::status_text(gs_gpu_status_) << ") ["    \
                                       << ::gradscale::source_file_name(__FILE__) << ":" << __LINE__ \
                                       << "]");                                                      \
  } while (0)

#define GS_CUDA_CHECK(call) GS_GPU_CHECK(call, cudaSuccess)
#define GS_CUBLAS_CHECK(call) GS_GPU_CHECK(call, CUBLAS_STATUS_SUCCESS)
// After every kernel launch: a bad configuration or an earlier asynchronous fault surfaces here.
#define GS_CUDA_CHECK_LAUNCH() GS_CUDA_CHECK(cudaGetLastError())
