// A small owned N-d float32 tensor: contiguous row-major storage plus a shape, in host memory (the CPU
// backend; layers view it as Eigen matrices) or in a device's memory (a device backend's tensors, for
// its kernels). Nothing fancier than the layers need. See docs/architecture.md, "The device seam".
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "lib/core/error.h"

namespace gradscale {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMatrix, Eigen::Aligned16>;
using ConstMatrixMap = Eigen::Map<const RowMatrix, Eigen::Aligned16>;
using Shape = std::vector<std::int64_t>;

std::string shape_string(const Shape& shape);  // "[128, 1, 28, 28]"
std::int64_t shape_size(const Shape& shape);

// Where a tensor's elements live.
enum class Device : std::uint8_t { cpu, cuda };
const char* device_name(Device d);  // "cpu", "cuda"

// The memory of a device other than the host, as a backend provides it (lib/backend): allocation and
// the whole-buffer operations Tensor itself needs. Tensors borrow it: it must outlive them. Calls are
// ordered with the backend's kernels (one stream); to_host waits for them.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual Device device() const = 0;
  virtual float* allocate(std::size_t n) = 0;       // n > 0 floats; throws when it cannot
  virtual void release(float* p) noexcept = 0;      // from allocate()
  virtual void fill(float* p, std::size_t n, float value) = 0;
  virtual void copy(float* dst, const float* src, std::size_t n) = 0;  // device to device
  virtual void from_host(float* dst, const float* host, std::size_t n) = 0;
  virtual void to_host(float* host, const float* src, std::size_t n) = 0;  // waits for the device
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(Shape shape, float fill = 0.0f) { reset(std::move(shape), fill); }
  // An empty tensor on `memory`'s device (null: the host).
  explicit Tensor(DeviceMemory* memory) : memory_(memory) {}
  Tensor(Shape shape, float fill, DeviceMemory* memory) : memory_(memory) { reset(std::move(shape), fill); }
  ~Tensor() { release_device(); }
  Tensor(const Tensor& other);
  Tensor& operator=(const Tensor& other);
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;

  // Sets the shape; keeps the storage when it is large enough (no allocation in steady state).
  // Contents are unspecified after a size change unless `fill` is used.
  void resize(const Shape& shape);
  void reset(Shape shape, float fill);
  void fill(float value);

  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  std::int64_t dim(int i) const;  // negative i counts from the end
  std::int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  Device device() const { return memory_ ? memory_->device() : Device::cpu; }
  bool on_host() const { return memory_ == nullptr; }
  DeviceMemory* memory() const { return memory_; }  // null on the host

  // The elements: host memory, or device memory for a tensor on a device (for its backend's kernels).
  float* data() { return memory_ ? device_data_ : data_.data(); }
  const float* data() const { return memory_ ? device_data_ : data_.data(); }
  // Host tensors only.
  float& operator[](std::int64_t i) { return data_[static_cast<std::size_t>(i)]; }
  float operator[](std::int64_t i) const { return data_[static_cast<std::size_t>(i)]; }

  // This tensor's shape and elements, copied from `src` on any device (this tensor keeps its device).
  void copy_from(const Tensor& src);
  // A copy on `memory`'s device (null: the host).
  Tensor to(DeviceMemory* memory) const;
  Tensor to_host() const { return to(nullptr); }

  // Row-major matrix views of the storage (rows * cols must equal size()). Host tensors only.
  MatrixMap matrix(std::int64_t rows, std::int64_t cols);
  ConstMatrixMap matrix(std::int64_t rows, std::int64_t cols) const;
  // The tensor as (dim(0), size/dim(0)).
  MatrixMap rows_view() { return matrix(dim(0), size_ / dim(0)); }
  ConstMatrixMap rows_view() const { return matrix(dim(0), size_ / dim(0)); }

 private:
  void release_device() noexcept;
  void reserve_device(std::size_t n);

  Shape shape_;
  std::int64_t size_ = 0;
  std::vector<float, Eigen::aligned_allocator<float>> data_;  // host storage
  DeviceMemory* memory_ = nullptr;                              // device storage, when set
  float* device_data_ = nullptr;
  std::size_t device_capacity_ = 0;
};

}  // namespace gradscale
