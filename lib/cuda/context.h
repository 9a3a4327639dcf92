// The CUDA context of the backend (lib/cuda): one device, one stream, one cuBLAS handle bound to that
// stream, and a scratch buffer. It is passed explicitly to the entries that need cuBLAS or scratch
// memory; the others take just its stream. No global CUDA state anywhere in the library.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lib/cuda/check.h"
#include "lib/cuda/device_buffer.h"

namespace gradscale::cuda {

// Number of CUDA devices; 0 when there is none or no usable driver. Never throws.
int device_count() noexcept;
// Why there is no device ("" when there is one), e.g. "cudaGetDeviceCount: cudaErrorNoDevice (no
// CUDA-capable device is detected)": for skip lines and the benchmark's message.
std::string no_device_reason();
// "NVIDIA H100 80GB HBM3, sm_90, 132 SMs, 79.1 GiB" (throws CudaError for a bad index).
std::string device_description(int device);

class CudaContext {
 public:
  // Selects `device` (cudaSetDevice), creates a stream and a cuBLAS handle on it. Throws CudaError
  // "no CUDA device: ..." when there is none, or naming the failing call.
  explicit CudaContext(int device = 0);
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  int device() const { return device_; }
  // A blocking stream (it orders with the legacy default stream): kernels of the backend run here —
  // or on the caller's stream after set_stream (another library's: PyTorch's current stream).
  cudaStream_t stream() const { return has_external_ ? external_ : stream_.get(); }
  // Queues the context's work (kernels, copies, cuBLAS) on `s`, which the caller keeps alive; null is
  // the legacy default stream (PyTorch's default current stream), not the context's own. Waits for the
  // stream left first, so no queued work is left unordered; naming the stream in use again waits for
  // nothing (the plug-in names PyTorch's current stream before every forward).
  void set_stream(cudaStream_t s);
  // cuBLAS on stream(), default math (no TF32) with reductions kept in the compute type (gemm.h).
  cublasHandle_t cublas() const { return cublas_.get(); }
  // Device scratch of at least `bytes`, for work queued on stream(); valid until the next call. Entries
  // that need temporary memory (statistics partials, per-sample losses) take it from here.
  void* scratch(std::size_t bytes);
  // Device memory of at least `bytes` that holds zeros whenever no work queued on stream() runs: an
  // entry that uses it (the statistics' accumulators, stats.cu) leaves it zeroed again, so none needs a
  // fill before its launch. Zeroed when it grows; valid until the next call.
  void* zeroed_scratch(std::size_t bytes);
  // Waits for everything queued on stream(); throws CudaError for a fault of that work. Every wait of
  // the backend for its device goes through here (a copy to the host is queued, then waited for).
  void synchronize() const;
  // While a watch is set, synchronize() polls the stream instead of blocking, and calls
  // watch(seconds waited so far) between polls; the watch ends a wait that must not go on by throwing
  // (work on the stream that waits for other processes: NCCL's collectives, lib/cuda/collectives.h).
  // An empty function removes it.
  void set_wait_watch(std::function<void(double)> watch) { watch_ = std::move(watch); }
  // How many times synchronize() has been called: the host's waits for the device (`bench step`).
  std::int64_t waits() const { return waits_; }

  // GEMM timing (`bench step`): while on, cuda::gemm brackets each product with a pair of events on
  // stream(); take_gemm_seconds() waits for the stream and returns the device time between the pairs
  // recorded since the last take (0 when off), then forgets them. Off by default: no events at all.
  void set_gemm_timing(bool on);
  bool gemm_timing() const { return gemm_timing_; }
  void gemm_started();
  void gemm_finished();
  double take_gemm_seconds();

 private:
  struct StreamDeleter {
    void operator()(cudaStream_t s) const noexcept { (void)cudaStreamDestroy(s); }
  };
  struct CublasDeleter {
    void operator()(cublasHandle_t h) const noexcept { (void)cublasDestroy(h); }
  };

  int device_;
  std::unique_ptr<CUstream_st, StreamDeleter> stream_;  // destroyed after the handle that uses it
  std::unique_ptr<cublasContext, CublasDeleter> cublas_;
  cudaStream_t external_ = nullptr;  // set_stream's (not owned; null: the legacy default stream)
  bool has_external_ = false;
  DeviceBuffer<unsigned char> scratch_;
  DeviceBuffer<unsigned char> zeroed_;
  struct EventDeleter {
    void operator()(cudaEvent_t e) const noexcept { (void)cudaEventDestroy(e); }
  };
  using Event = std::unique_ptr<CUevent_st, EventDeleter>;
  bool gemm_timing_ = false;
  std::vector<Event> gemm_events_;  // start, stop, start, stop, ...: reused from one take to the next
  std::size_t gemm_events_used_ = 0;
  mutable std::int64_t waits_ = 0;
  std::function<void(double)> watch_;
};

}  // namespace gradscale::cuda
