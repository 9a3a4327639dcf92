// The CPU execution target of lib/cuda: the cuBLAS calls lib/cuda makes, with a reference GEMM. Same
// column-major contract and operand types as cublasGemmEx / cublasGemmStridedBatchedEx; each product
// is accumulated in fp32 (one fused multiply-add per term, k in order), alpha and beta applied to the
// fp32 result, then rounded once to C's type. cuBLAS's own order of summation (tiles, split-K) is not
// reproduced: for fp32 operands its last bits may differ (docs/gpu.md); products of fp16 or bf16
// operands are exact in fp32, and an exact sum is the same in any order.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/cuda_on_cpu/memory.h"

struct cublasContext {
  cudaStream_t stream;
  cublasMath_t math;
};

namespace gs_emu {
namespace {

std::size_t type_bytes(cudaDataType t) {
  switch (t) {
    case CUDA_R_32F:
      return 4;
    case CUDA_R_16F:
    case CUDA_R_16BF:
      return 2;
    default:
      return 0;
  }
}

float load(const void* base, cudaDataType t, std::size_t i) {
  switch (t) {
    case CUDA_R_16F:
      return __half2float(static_cast<const __half*>(base)[i]);
    case CUDA_R_16BF:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

void store(void* base, cudaDataType t, std::size_t i, float v) {
  switch (t) {
    case CUDA_R_16F:
      static_cast<__half*>(base)[i] = __float2half_rn(v);
      break;
    case CUDA_R_16BF:
      static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v);
      break;
    default:
      static_cast<float*>(base)[i] = v;
      break;
  }
}

// The extent in bytes of a column-major operand of `cols` columns with leading dimension ld, whose
// `batch` matrices are `stride` elements apart.
std::size_t extent(int rows, int cols, int ld, long long stride, int batch, std::size_t bytes) {
  if (rows == 0 || cols == 0 || batch == 0) return 0;
  const std::size_t last = static_cast<std::size_t>(stride) * static_cast<std::size_t>(batch - 1) +
                           static_cast<std::size_t>(ld) * static_cast<std::size_t>(cols - 1) +
                           static_cast<std::size_t>(rows);
  return last * bytes;
}

bool on_device(const char* name, const void* p, std::size_t bytes) {
  if (bytes == 0) return true;
  const Allocation* a = find_allocation(p, bytes);
  if (a != nullptr && a->kind == MemoryKind::device) return true;
  report_fault(cudaErrorIllegalAddress, std::string("cublasGemmEx: operand ") + name +
                                            " is not within one device allocation for the extent its " +
                                            "dimensions give (" + std::to_string(bytes) + " bytes)");
  return false;
}

cublasStatus_t gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                    const void* alpha_p, const void* A, cudaDataType at, int lda, long long sa, const void* B,
                    cudaDataType bt, int ldb, long long sb, const void* beta_p, void* C, cudaDataType ct,
                    int ldc, long long sc, int batch, cublasComputeType_t compute) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  const std::lock_guard<std::recursive_mutex> device(gs_emu::device_lock());
  if (m < 0 || n < 0 || k < 0 || batch < 0 || alpha_p == nullptr || beta_p == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (compute != CUBLAS_COMPUTE_32F || type_bytes(at) == 0 || at != bt || type_bytes(ct) == 0 ||
      (at == CUDA_R_32F && ct != CUDA_R_32F))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  // op(A) is m x k, op(B) k x n; the stored A is m x k (N) or k x m (T).
  const int a_rows = ta == CUBLAS_OP_N ? m : k, a_cols = ta == CUBLAS_OP_N ? k : m;
  const int b_rows = tb == CUBLAS_OP_N ? k : n, b_cols = tb == CUBLAS_OP_N ? n : k;
  if (lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
  const float alpha = *static_cast<const float*>(alpha_p), beta = *static_cast<const float*>(beta_p);
  if (!on_device("A", A, extent(a_rows, a_cols, lda, sa, batch, type_bytes(at))) ||
      !on_device("B", B, extent(b_rows, b_cols, ldb, sb, batch, type_bytes(bt))) ||
      !on_device("C", C, extent(m, n, ldc, sc, batch, type_bytes(ct))))
    return CUBLAS_STATUS_EXECUTION_FAILED;
  // op(A) row by row and op(B) as a k x n row-major array, in fp32: for each output row, one pass over
  // p = 0..k-1 adds a(i, p)·b(p, j) into every j's accumulator, so each sum is in p order.
  std::vector<float> a_rows_f(static_cast<std::size_t>(m) * static_cast<std::size_t>(k));
  std::vector<float> b_f(static_cast<std::size_t>(k) * static_cast<std::size_t>(n));
  std::vector<float> acc(static_cast<std::size_t>(n));
  const auto us = [](int v) { return static_cast<std::size_t>(v); };
  for (int b = 0; b < batch; ++b) {
    const std::size_t ao = static_cast<std::size_t>(sa) * us(b);
    const std::size_t bo = static_cast<std::size_t>(sb) * us(b);
    const std::size_t co = static_cast<std::size_t>(sc) * us(b);
    for (int i = 0; i < m; ++i)
      for (int p = 0; p < k; ++p)
        a_rows_f[us(i) * us(k) + us(p)] =
            load(A, at, ao + (ta == CUBLAS_OP_N ? us(i) + us(p) * us(lda) : us(p) + us(i) * us(lda)));
    for (int p = 0; p < k; ++p)
      for (int j = 0; j < n; ++j)
        b_f[us(p) * us(n) + us(j)] =
            load(B, bt, bo + (tb == CUBLAS_OP_N ? us(p) + us(j) * us(ldb) : us(j) + us(p) * us(ldb)));
    for (int i = 0; i < m; ++i) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      const float* a_row = a_rows_f.data() + us(i) * us(k);
      for (int p = 0; p < k; ++p) {
        const float a_ip = a_row[p];
        const float* b_row = b_f.data() + us(p) * us(n);
        for (int j = 0; j < n; ++j) acc[us(j)] = std::fma(a_ip, b_row[j], acc[us(j)]);
      }
      for (int j = 0; j < n; ++j) {
        const std::size_t ci = co + us(i) + us(j) * us(ldc);
        // beta == 0: C is not read (it may hold anything, NaN included), as cuBLAS documents.
        const float result = beta == 0.0f ? alpha * acc[us(j)] : alpha * acc[us(j)] + beta * load(C, ct, ci);
        store(C, ct, ci, result);
      }
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace
}  // namespace gs_emu

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* h) {
  if (h == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *h = new cublasContext{nullptr, CUBLAS_DEFAULT_MATH};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    default:
      return "CUBLAS_STATUS_UNKNOWN";
  }
}

const char* cublasGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GPU program failed to execute";
    default:
      return "unknown error";
  }
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void* alpha, const void* A, cudaDataType at, int lda, const void* B,
                            cudaDataType bt, int ldb, const void* beta, void* C, cudaDataType ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t) {
  return gs_emu::gemm(h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0, 1,
                      compute);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                          int n, int k, const void* alpha, const void* A, cudaDataType at,
                                          int lda, long long sa, const void* B, cudaDataType bt, int ldb,
                                          long long sb, const void* beta, void* C, cudaDataType ct, int ldc,
                                          long long sc, int batch, cublasComputeType_t compute,
                                          cublasGemmAlgo_t) {
  return gs_emu::gemm(h, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C, ct, ldc, sc, batch,
                      compute);
}

}  // extern "C"
