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

void Tensor::resize(const Shape& shape) {
  shape_ = shape;
  size_ = shape_size(shape_);
  if (static_cast<std::size_t>(size_) > data_.size()) data_.resize(static_cast<std::size_t>(size_));
}

void Tensor::reset(Shape shape, float value) {
  shape_ = std::move(shape);
  size_ = shape_size(shape_);
  data_.assign(static_cast<std::size_t>(size_), value);
}

void Tensor::fill(float value) {
  std::fill(data_.begin(), data_.begin() + size_, value);
}

std::int64_t Tensor::dim(int i) const {
  const int r = rank();
  const int k = i < 0 ? r + i : i;
  GS_CHECK_SHAPE(k >= 0 && k < r, "dimension " << i << " out of range for shape " << shape_string(shape_));
  return shape_[static_cast<std::size_t>(k)];
}

MatrixMap Tensor::matrix(std::int64_t rows, std::int64_t cols) {
  GS_CHECK_SHAPE(rows * cols == size_,
                 "cannot view " << shape_string(shape_) << " as " << rows << "x" << cols);
  return MatrixMap(data_.data(), rows, cols);
}

ConstMatrixMap Tensor::matrix(std::int64_t rows, std::int64_t cols) const {
  GS_CHECK_SHAPE(rows * cols == size_,
                 "cannot view " << shape_string(shape_) << " as " << rows << "x" << cols);
  return ConstMatrixMap(data_.data(), rows, cols);
}

}  // namespace gradscale
