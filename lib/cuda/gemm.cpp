// cuBLAS GEMMs (see gemm.h). cuBLAS is column-major: the row-major C = op(A)·op(B) is computed as the
// column-major Cᵀ = op(B)ᵀ·op(A)ᵀ, i.e. cuBLAS gets B first and the dimensions (n, m, k). A row-major
// [r, c] array is the column-major [c, r] array with leading dimension c, so an operand that is not
// transposed here is passed with CUBLAS_OP_N and one that is with CUBLAS_OP_T.
#include "lib/cuda/gemm.h"

#include <cmath>
#include <limits>

#include "lib/core/error.h"
#include "lib/cuda/check.h"

namespace gradscale::cuda {
namespace {

cudaDataType_t cuda_type(DeviceType t) {
  switch (t) {
    case DeviceType::f32:
      return CUDA_R_32F;
    case DeviceType::f16:
      return CUDA_R_16F;
    case DeviceType::bf16:
      return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

bool allowed(DeviceType a, DeviceType b, DeviceType c) {
  if (a != b) return false;
  if (a == DeviceType::f32) return c == DeviceType::f32;
  return c == a || c == DeviceType::f32;
}

int as_int(std::int64_t v, const char* name) {
  GS_CHECK_SHAPE(v >= 0 && v <= std::numeric_limits<int>::max(),
                 "cuda::gemm: " << name << " = " << v << " must be in [0, 2^31 - 1]");
  return static_cast<int>(v);
}

}  // namespace

const char* device_type_name(DeviceType t) {
  switch (t) {
    case DeviceType::f32:
      return "fp32";
    case DeviceType::f16:
      return "fp16";
    case DeviceType::bf16:
      return "bf16";
  }
  return "?";
}

void gemm(CudaContext& ctx, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const GemmInput& a,
          const GemmInput& b, float beta, const GemmOutput& c, std::int64_t batch) {
  const int mi = as_int(m, "m"), ni = as_int(n, "n"), ki = as_int(k, "k"), bi = as_int(batch, "batch");
  GS_CHECK_CONFIG(allowed(a.type, b.type, c.type),
                  "cuda::gemm: inputs "
                      << device_type_name(a.type) << " x " << device_type_name(b.type) << " with output "
                      << device_type_name(c.type)
                      << " is not supported (allowed: fp16 x fp16 -> fp16|fp32, bf16 x bf16 -> "
                         "bf16|fp32, fp32 x fp32 -> fp32)");
  GS_CHECK_NUMERIC(std::isfinite(alpha) && std::isfinite(beta),
                   "cuda::gemm: alpha and beta must be finite, got " << alpha << " and " << beta);
  if (mi == 0 || ni == 0 || bi == 0) return;
  GS_CHECK(c.data != nullptr && (ki == 0 || (a.data != nullptr && b.data != nullptr)),
           "cuda::gemm got a null pointer");
  // Leading dimensions of the row-major storage: A is [m, k] (or [k, m] when transposed), B [k, n]
  // (or [n, k]), C [m, n]. cuBLAS requires them >= 1 even for empty operands.
  const int lda = std::max(1, a.transposed ? mi : ki);
  const int ldb = std::max(1, b.transposed ? ki : ni);
  const int ldc = std::max(1, ni);
  const cublasOperation_t op_a = a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const bool timed = ctx.gemm_timing();
  if (timed) ctx.gemm_started();
  if (bi == 1) {
    GS_CUBLAS_CHECK(cublasGemmEx(ctx.cublas(), op_b, op_a, ni, mi, ki, &alpha, b.data, cuda_type(b.type), ldb,
                                 a.data, cuda_type(a.type), lda, &beta, c.data, cuda_type(c.type), ldc,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  } else {
    GS_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        ctx.cublas(), op_b, op_a, ni, mi, ki, &alpha, b.data, cuda_type(b.type), ldb, b.batch_stride, a.data,
        cuda_type(a.type), lda, a.batch_stride, &beta, c.data, cuda_type(c.type), ldc, c.batch_stride, bi,
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  if (timed) ctx.gemm_finished();
}

}  // namespace gradscale::cuda
