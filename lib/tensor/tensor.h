// A small owned N-d float32 tensor: contiguous row-major storage plus a shape. Layers view it as
// Eigen matrices for the math. Nothing fancier than the layers need.
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

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(Shape shape, float fill = 0.0f) { reset(std::move(shape), fill); }

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

  float* data() { return data_.data(); }
  const float* data() const { return data_.data(); }
  float& operator[](std::int64_t i) { return data_[static_cast<std::size_t>(i)]; }
  float operator[](std::int64_t i) const { return data_[static_cast<std::size_t>(i)]; }

  // Row-major matrix views of the storage (rows * cols must equal size()).
  MatrixMap matrix(std::int64_t rows, std::int64_t cols);
  ConstMatrixMap matrix(std::int64_t rows, std::int64_t cols) const;
  // The tensor as (dim(0), size/dim(0)).
  MatrixMap rows_view() { return matrix(dim(0), size_ / dim(0)); }
  ConstMatrixMap rows_view() const { return matrix(dim(0), size_ / dim(0)); }

 private:
  Shape shape_;
  std::int64_t size_ = 0;
  std::vector<float, Eigen::aligned_allocator<float>> data_;
};

}  // namespace gradscale
