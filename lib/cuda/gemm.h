// Matrix products on the GPU through cuBLAS (SPEC §4–§5): F×F inputs (fp16 or bf16 storage, or fp32
// arrays holding values in F for the emulation) with fp32 compute and accumulation. The local scale s of
// SPEC §5 is the GEMM's alpha: it multiplies the fp32 accumulator before the one rounding of the output,
// so s·g never overflows on its own. An fp32 output is the unrounded product that the `measured`
// controller reads before rounding; an fp16/bf16 output is that product rounded once (RNE, ±inf beyond
// the largest finite value). Row-major, as every tensor of the library.
//
// Accuracy: the products of F values are exact in fp32 and the sums are fp32 (tensor cores may truncate
// inside their blocks), so |C − exact| ≤ 2·(K + 1)·u32·|alpha|·Σ|a||b| per element (u32 = 2^-24); the
// tests check this bound. The handle's math mode forbids TF32 and reductions in the output type.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstdint>

#include "lib/cuda/context.h"

namespace gradscale::cuda {

enum class DeviceType : std::uint8_t { f32, f16, bf16 };  // float, __half, __nv_bfloat16
const char* device_type_name(DeviceType t);

// A row-major matrix operand: op(A) = A ([rows, cols] as stored) or Aᵀ when `transposed`. For a batched
// product, matrix b starts batch_stride elements after matrix b − 1.
struct GemmInput {
  const void* data = nullptr;
  DeviceType type = DeviceType::f32;
  bool transposed = false;
  std::int64_t batch_stride = 0;
};
struct GemmOutput {
  void* data = nullptr;
  DeviceType type = DeviceType::f32;
  std::int64_t batch_stride = 0;
};

// For b < batch: C_b [m, n] = alpha · op(A_b) [m, k] · op(B_b) [k, n] + beta · C_b, on ctx's stream and
// handle. Allowed types: A and B both fp16 (C fp16 or fp32), both bf16 (C bf16 or fp32), or all fp32.
// Throws ShapeError for negative or too large (> 2^31 − 1) dimensions, ConfigError for another type
// combination, NumericError for a non-finite alpha or beta, Error for null pointers, CudaError when
// cuBLAS fails. m, n or k = 0 follow BLAS (k = 0: C = beta·C).
void gemm(CudaContext& ctx, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const GemmInput& a,
          const GemmInput& b, float beta, const GemmOutput& c, std::int64_t batch = 1);

}  // namespace gradscale::cuda
