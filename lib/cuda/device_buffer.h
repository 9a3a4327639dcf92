// An owned array in device memory (lib/cuda): cudaMalloc on construction or resize, cudaFree on
// destruction; move-only. The copy helpers are synchronous (they wait for `stream`), for set-up, tests
// and benchmarks; the training path keeps its data on the device.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstddef>
#include <vector>

#include "lib/cuda/check.h"

namespace gradscale::cuda {

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // `count` elements of uninitialised device memory. Throws CudaError (naming cudaMalloc) when the
  // allocation fails, e.g. when there is no device.
  explicit DeviceBuffer(std::size_t count) { resize(count); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept : data_(other.data_), size_(other.size_) {
    other.data_ = nullptr;
    other.size_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = other.data_;
      size_ = other.size_;
      other.data_ = nullptr;
      other.size_ = 0;
    }
    return *this;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::size_t bytes() const { return size_ * sizeof(T); }
  bool empty() const { return size_ == 0; }

  // Reallocates to exactly `count` elements when the size differs; the contents are then undefined.
  // cudaFree waits for the device, so work still reading the old memory finishes first.
  void resize(std::size_t count) {
    if (count == size_) return;
    release();
    if (count == 0) return;
    void* p = nullptr;
    GS_CUDA_CHECK(cudaMalloc(&p, count * sizeof(T)));
    data_ = static_cast<T*>(p);
    size_ = count;
  }

  // Device ← host: the first `count` elements (count ≤ size()), after the work queued on `stream`.
  void upload(const T* host, std::size_t count, cudaStream_t stream) {
    GS_CHECK(count <= size_, "upload of " << count << " elements into a buffer of " << size_);
    if (count == 0) return;
    GS_CUDA_CHECK(cudaMemcpyAsync(data_, host, count * sizeof(T), cudaMemcpyHostToDevice, stream));
    GS_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  // Host ← device: the first `count` elements, after the work queued on `stream` has finished.
  void download(T* host, std::size_t count, cudaStream_t stream) const {
    GS_CHECK(count <= size_, "download of " << count << " elements from a buffer of " << size_);
    if (count == 0) return;
    GS_CUDA_CHECK(cudaMemcpyAsync(host, data_, count * sizeof(T), cudaMemcpyDeviceToHost, stream));
    GS_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  std::vector<T> to_host(cudaStream_t stream) const {
    std::vector<T> v(size_);
    download(v.data(), size_, stream);
    return v;
  }
  // A buffer holding a copy of `host`.
  static DeviceBuffer from_host(const std::vector<T>& host, cudaStream_t stream) {
    DeviceBuffer b(host.size());
    b.upload(host.data(), host.size(), stream);
    return b;
  }
  // Every byte set to `byte` (queued on `stream`): 0 for zeros, 0xFF for a NaN sentinel in floats.
  void fill_bytes(int byte, cudaStream_t stream) {
    if (size_ != 0) GS_CUDA_CHECK(cudaMemsetAsync(data_, byte, bytes(), stream));
  }

 private:
  void release() noexcept {
    if (data_ != nullptr) (void)cudaFree(data_);  // a destructor cannot throw; the pointer is ours
    data_ = nullptr;
    size_ = 0;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace gradscale::cuda
