// Tensor storage and shape helpers (see tensor.h).
#include "lib/tensor/tensor.h"

#include <algorithm>
#include <sstream>

namespace gradscale {

std::string shape_string(const Shape& shape) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

std::int64_t shape_size(const Shape& shape) {
  std::int64_t n = 1;
  for (auto d : shape) {
    GS_CHECK_SHAPE(d >= 0, "negative dimension in shape " << shape_string(shape));
    n *= d;
  }
  return n;
}

const char* device_name(Device d) {
  switch (d) {
    case Device::cpu:
      return "cpu";
    case Device::cuda:
      return "cuda";
  }
  return "?";
}

Tensor::Tensor(const Tensor& other) : shape_(other.shape_), size_(other.size_), memory_(other.memory_) {
  if (!memory_) {
    data_ = other.data_;
    return;
  }
  reserve_device(static_cast<std::size_t>(size_));
  if (size_ > 0) memory_->copy(device_data_, other.device_data_, static_cast<std::size_t>(size_));
}

Tensor& Tensor::operator=(const Tensor& other) {
  if (this == &other) return *this;
  if (memory_ != other.memory_) {
    release_device();
    data_.clear();
    memory_ = other.memory_;
  }
  shape_ = other.shape_;
  size_ = other.size_;
  if (!memory_) {
    data_ = other.data_;
    return *this;
  }
  reserve_device(static_cast<std::size_t>(size_));
  if (size_ > 0) memory_->copy(device_data_, other.device_data_, static_cast<std::size_t>(size_));
  return *this;
}

Tensor::Tensor(Tensor&& other) noexcept
    : shape_(std::move(other.shape_)),
      size_(other.size_),
      data_(std::move(other.data_)),
      memory_(other.memory_),
      device_data_(other.device_data_),
      device_capacity_(other.device_capacity_) {
  other.size_ = 0;
  other.device_data_ = nullptr;
  other.device_capacity_ = 0;
}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this == &other) return *this;
  release_device();
  shape_ = std::move(other.shape_);
  size_ = other.size_;
  data_ = std::move(other.data_);
  memory_ = other.memory_;
  device_data_ = other.device_data_;
  device_capacity_ = other.device_capacity_;
  other.size_ = 0;
  other.device_data_ = nullptr;
  other.device_capacity_ = 0;
  return *this;
}

void Tensor::release_device() noexcept {
  if (memory_ && device_data_) memory_->release(device_data_);
  device_data_ = nullptr;
  device_capacity_ = 0;
}

void Tensor::reserve_device(std::size_t n) {
  if (n <= device_capacity_) return;
  release_device();
  device_data_ = memory_->allocate(n);
  device_capacity_ = n;
}

void Tensor::resize(const Shape& shape) {
  shape_ = shape;
  size_ = shape_size(shape_);
  if (memory_) {
    reserve_device(static_cast<std::size_t>(size_));
    return;
  }
  if (static_cast<std::size_t>(size_) > data_.size()) data_.resize(static_cast<std::size_t>(size_));
}

void Tensor::reset(Shape shape, float value) {
  shape_ = std::move(shape);
  size_ = shape_size(shape_);
  if (memory_) {
    reserve_device(static_cast<std::size_t>(size_));
    fill(value);
    return;
  }
  data_.assign(static_cast<std::size_t>(size_), value);
}

void Tensor::fill(float value) {
  if (memory_) {
    if (size_ > 0) memory_->fill(device_data_, static_cast<std::size_t>(size_), value);
    return;
  }
  std::fill(data_.begin(), data_.begin() + size_, value);
}

void Tensor::copy_from(const Tensor& src) {
  if (&src == this) return;
  resize(src.shape());
  const auto n = static_cast<std::size_t>(size_);
  if (n == 0) return;
  if (!memory_ && !src.memory_) {
    std::copy(src.data_.begin(), src.data_.begin() + size_, data_.begin());
  } else if (memory_ && src.memory_) {
    GS_CHECK(memory_ == src.memory_, "Tensor::copy_from between two devices' memories");
    memory_->copy(device_data_, src.device_data_, n);
  } else if (memory_) {
    memory_->from_host(device_data_, src.data_.data(), n);
  } else {
    src.memory_->to_host(data_.data(), src.device_data_, n);
  }
}

Tensor Tensor::to(DeviceMemory* memory) const {
  Tensor t(memory);
  t.copy_from(*this);
  return t;
}

std::int64_t Tensor::dim(int i) const {
  const int r = rank();
  const int k = i < 0 ? r + i : i;
  GS_CHECK_SHAPE(k >= 0 && k < r, "dimension " << i << " out of range for shape " << shape_string(shape_));
  return shape_[static_cast<std::size_t>(k)];
}

MatrixMap Tensor::matrix(std::int64_t rows, std::int64_t cols) {
  GS_CHECK(!memory_, "matrix view of a tensor in " << device_name(device()) << " memory");
  GS_CHECK_SHAPE(rows * cols == size_,
                 "cannot view " << shape_string(shape_) << " as " << rows << "x" << cols);
  return MatrixMap(data_.data(), rows, cols);
}

ConstMatrixMap Tensor::matrix(std::int64_t rows, std::int64_t cols) const {
  GS_CHECK(!memory_, "matrix view of a tensor in " << device_name(device()) << " memory");
  GS_CHECK_SHAPE(rows * cols == size_,
                 "cannot view " << shape_string(shape_) << " as " << rows << "x" << cols);
  return ConstMatrixMap(data_.data(), rows, cols);
}

}  // namespace gradscale
