// Owned arrays for lib/cuda: DeviceBuffer in device memory (cudaMalloc on construction or resize,
// cudaFree on destruction), PinnedBuffer in page-locked host memory; both move-only. DeviceBuffer's copy
// helpers are synchronous (they wait for `stream`), for set-up, tests and benchmarks; the training path
// keeps its data on the device.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstddef>
#include <vector>

#include "lib/cuda/check.h"

namespace gradscale::cuda {

namespace detail {

struct DeviceAllocation {
  static void* allocate(std::size_t bytes) {
    void* p = nullptr;
    GS_CUDA_CHECK(cudaMalloc(&p, bytes));
    return p;
  }
  static void release(void* p) noexcept { (void)cudaFree(p); }  // cannot throw; the pointer is ours
};

struct PinnedAllocation {
  static void* allocate(std::size_t bytes) {
    void* p = nullptr;
    GS_CUDA_CHECK(cudaMallocHost(&p, bytes));
    return p;
  }
  static void release(void* p) noexcept { (void)cudaFreeHost(p); }
};

// An owned, move-only array of `count` T from `Allocation`; contents uninitialised.
template <class T, class Allocation>
class OwnedArray {
 public:
  OwnedArray() = default;
  // Throws CudaError (naming the allocation call) when the allocation fails, e.g. without a device.
  explicit OwnedArray(std::size_t count) { resize(count); }
  ~OwnedArray() { release(); }
  OwnedArray(const OwnedArray&) = delete;
  OwnedArray& operator=(const OwnedArray&) = delete;
  OwnedArray(OwnedArray&& other) noexcept : data_(other.data_), size_(other.size_) {
    other.data_ = nullptr;
    other.size_ = 0;
  }
  OwnedArray& operator=(OwnedArray&& other) noexcept {
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
  // (cudaFree waits for the device, so work still reading old device memory finishes first.)
  void resize(std::size_t count) {
    if (count == size_) return;
    release();
    if (count == 0) return;
    data_ = static_cast<T*>(Allocation::allocate(count * sizeof(T)));
    size_ = count;
  }

 protected:
  void release() noexcept {
    if (data_ != nullptr) Allocation::release(data_);
    data_ = nullptr;
    size_ = 0;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace detail

template <class T>
class DeviceBuffer : public detail::OwnedArray<T, detail::DeviceAllocation> {
  using Base = detail::OwnedArray<T, detail::DeviceAllocation>;

 public:
  using Base::Base;

  // Device ← host: the first `count` elements (count ≤ size()), after the work queued on `stream`.
  void upload(const T* host, std::size_t count, cudaStream_t stream) {
    GS_CHECK(count <= this->size_, "upload of " << count << " elements into a buffer of " << this->size_);
    if (count == 0) return;
    GS_CUDA_CHECK(cudaMemcpyAsync(this->data_, host, count * sizeof(T), cudaMemcpyHostToDevice, stream));
    GS_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  // Host ← device: the first `count` elements, after the work queued on `stream` has finished.
  void download(T* host, std::size_t count, cudaStream_t stream) const {
    GS_CHECK(count <= this->size_, "download of " << count << " elements from a buffer of " << this->size_);
    if (count == 0) return;
    GS_CUDA_CHECK(cudaMemcpyAsync(host, this->data_, count * sizeof(T), cudaMemcpyDeviceToHost, stream));
    GS_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  std::vector<T> to_host(cudaStream_t stream) const {
    std::vector<T> v(this->size_);
    download(v.data(), this->size_, stream);
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
    if (this->size_ != 0) GS_CUDA_CHECK(cudaMemsetAsync(this->data_, byte, this->bytes(), stream));
  }
};

// An owned array in page-locked host memory (cudaMallocHost, cudaFreeHost): the host side of the copies
// the backend waits for — a copy from the device into pageable memory is staged and synchronous, into
// page-locked memory it is one direct transfer.
template <class T>
using PinnedBuffer = detail::OwnedArray<T, detail::PinnedAllocation>;

}  // namespace gradscale::cuda
