// The CUDA context (see context.h): device selection, stream, cuBLAS handle and scratch, and the
// device queries the tests and the benchmark use to skip or explain themselves.
#include "lib/cuda/context.h"

#include <chrono>
#include <iomanip>
#include <thread>
#include <sstream>

namespace gradscale::cuda {

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear it: the query's failure is the answer, not a fault
    return 0;
  }
  return n;
}

std::string no_device_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) return "";
  (void)cudaGetLastError();
  if (e == cudaSuccess) return "cudaGetDeviceCount: 0 devices";
  return std::string("cudaGetDeviceCount: ") + status_name(e) + " (" + status_text(e) + ")";
}

std::string device_description(int device) {
  cudaDeviceProp p{};
  GS_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  std::ostringstream os;
  os << p.name << ", sm_" << p.major << p.minor << ", " << p.multiProcessorCount << " SMs, " << std::fixed
     << std::setprecision(1) << static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0) << " GiB";
  return os.str();
}

CudaContext::CudaContext(int device) : device_(device) {
  const int n = device_count();
  GS_CHECK_AS(CudaError, n > 0, "no CUDA device: " << no_device_reason());
  GS_CHECK_AS(CudaError, device >= 0 && device < n,
              "CUDA device " << device << " does not exist (this machine has " << n << ")");
  GS_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t s = nullptr;
  GS_CUDA_CHECK(cudaStreamCreate(&s));
  stream_.reset(s);
  cublasHandle_t h = nullptr;
  GS_CUBLAS_CHECK(cublasCreate(&h));
  cublas_.reset(h);
  GS_CUBLAS_CHECK(cublasSetStream(h, s));
  // Default math: no TF32 for fp32 GEMMs. Disallowing reduced-precision reductions keeps split-K
  // partial sums in fp32 when the output is fp16/bf16 (SPEC §4: accumulation in fp32).
  GS_CUBLAS_CHECK(cublasSetMathMode(
      h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
}

void* CudaContext::scratch(std::size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

void* CudaContext::zeroed_scratch(std::size_t bytes) {
  if (zeroed_.size() < bytes) {
    zeroed_.resize(bytes);
    GS_CUDA_CHECK(cudaMemsetAsync(zeroed_.data(), 0, bytes, stream()));
  }
  return zeroed_.data();
}

void CudaContext::set_stream(cudaStream_t s) {
  if (has_external_ ? s == external_ : s == stream_.get()) return;
  synchronize();
  external_ = s;
  has_external_ = true;
  GS_CUBLAS_CHECK(cublasSetStream(cublas_.get(), stream()));
}

void CudaContext::synchronize() const {
  ++waits_;
  if (!watch_) {
    GS_CUDA_CHECK(cudaStreamSynchronize(stream()));
    return;
  }
  // Polled: back to back for the first millisecond (a step's waits are short), then every 100 µs.
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t e = cudaStreamQuery(stream());
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) GS_CUDA_CHECK(e);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    watch_(waited);
    if (waited > 1e-3) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void CudaContext::set_gemm_timing(bool on) {
  gemm_timing_ = on;
  gemm_events_used_ = 0;
}

void CudaContext::gemm_started() {
  if (gemm_events_used_ + 2 > gemm_events_.size()) {
    for (int i = 0; i < 2; ++i) {
      cudaEvent_t e = nullptr;
      GS_CUDA_CHECK(cudaEventCreate(&e));
      gemm_events_.emplace_back(e);
    }
  }
  GS_CUDA_CHECK(cudaEventRecord(gemm_events_[gemm_events_used_].get(), stream()));
}

void CudaContext::gemm_finished() {
  GS_CUDA_CHECK(cudaEventRecord(gemm_events_[gemm_events_used_ + 1].get(), stream()));
  gemm_events_used_ += 2;
}

double CudaContext::take_gemm_seconds() {
  synchronize();
  double ms = 0;
  for (std::size_t i = 0; i + 1 < gemm_events_used_; i += 2) {
    float pair_ms = 0;
    GS_CUDA_CHECK(cudaEventElapsedTime(&pair_ms, gemm_events_[i].get(), gemm_events_[i + 1].get()));
    ms += pair_ms;
  }
  gemm_events_used_ = 0;
  return ms / 1e3;
}

}  // namespace gradscale::cuda
