// im2col and its adjoint col2im on the GPU, the column layout of lib/layers/conv2d.cpp: a convolution is
// then one GEMM per sample (cuda::gemm, batched), or — with the columns of the whole batch side by side —
// one GEMM whose reduction runs over the batch (the weight gradient). im2col copies values, so it is
// exact; col2im sums each input's column entries in the CPU's order ((ki, kj) ascending), so it gives the
// CPU's bits in either layout.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstdint>

#include <cuda_runtime_api.h>

#include "lib/cuda/gemm.h"

namespace gradscale::cuda {

// Input [n, channels, h, w]; square kernel, stride, zero padding; output [n, O, ho, wo].
struct ConvGeometry {
  std::int64_t n = 0, channels = 0, h = 0, w = 0, kernel = 1, stride = 1, pad = 0;
  std::int64_t ho() const { return (h + 2 * pad - kernel) / stride + 1; }
  std::int64_t wo() const { return (w + 2 * pad - kernel) / stride + 1; }
  std::int64_t col_rows() const { return channels * kernel * kernel; }  // C·k·k
  std::int64_t col_cols() const { return ho() * wo(); }                 // Ho·Wo
};

// Where sample b's column matrix [C·k·k, Ho·Wo] lies: `per_sample`, the matrices one after another
// (cols [n, C·k·k, Ho·Wo]); `batch_wide`, side by side (cols [C·k·k, n·Ho·Wo], sample b's columns at
// b·Ho·Wo), so that one GEMM with K = n·Ho·Wo sums over the batch.
enum class ColumnLayout : std::uint8_t { per_sample, batch_wide };

// Offset of sample b's column matrix, and the distance between its rows, in `layout`.
struct ColumnStrides {
  std::int64_t sample, row;
};
inline ColumnStrides column_strides(const ConvGeometry& g, ColumnLayout layout) {
  const std::int64_t plane = g.col_cols();
  if (layout == ColumnLayout::batch_wide) return {plane, g.n * plane};
  return {g.col_rows() * plane, plane};
}

// Throws ShapeError (naming `what`) when the geometry does not describe a convolution whose planes fit
// in 32-bit indices (the kernels' position arithmetic).
void check_conv_geometry(const ConvGeometry& g, const char* what);

// cols ← per sample, row (c·k + ki)·k + kj, column oh·Wo + ow: the input at
// (c, oh·stride − pad + ki, ow·stride − pad + kj), 0 outside. Device pointers, queued on `stream`.
// Throws ShapeError when the geometry does not describe a convolution.
void im2col(const float* x, const ConvGeometry& g, float* cols, cudaStream_t stream,
            ColumnLayout layout = ColumnLayout::per_sample);
// The same columns as `type`'s bits (f16 or bf16, convert.h's conversions): a GEMM's 16-bit operand
// written in one pass, without the fp32 columns. Exact when x holds values of that format.
void im2col_16bit(const float* x, const ConvGeometry& g, std::uint16_t* cols, DeviceType type, cudaStream_t stream,
                  ColumnLayout layout = ColumnLayout::per_sample);
// gx [n, C, h, w] ← the adjoint: every input element the sum of the column entries that copied it
// (0 where none), overwriting gx.
void col2im(const float* cols, const ConvGeometry& g, float* gx, cudaStream_t stream,
            ColumnLayout layout = ColumnLayout::per_sample);
// col2im measured in the same pass (for a controller that reads the statistics of the upstream
// product): stats.h's col2im_measured.

}  // namespace gradscale::cuda
