// A convolution without its columns (an implicit GEMM). Forward: each block gathers the input patches it
// needs straight from x into shared memory, multiplies them with a tile of the weights, and rounds its
// outputs to F as it stores them — one kernel for im2col (which writes C·k² values per output position
// and reads them back), the GEMM over those columns, the bias's rank-1 GEMM and the output's rounding
// pass. Backward, the upstream gradient: each input element's taps summed from g and W directly — one
// kernel for the GEMM Wᵀ·g (C·k² fp32 values per output position, written and read back) and col2im.
//
// Every output is the fp32 sum, k = 0..C·k²−1 in order (k = (c·kernel + ki)·kernel + kj, the column row
// of im2col), of one fused multiply-add per term from +0, padding terms included; then + b (one fp32
// addition) and one rounding to F. That is the order of the CPU execution target's reference GEMM, so
// on that target the result has the bits of im2col + cuda::gemm + quantize; on exact values (products
// of F values, sums that fit in fp32) it has the CPU Conv2d's bits in any order.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstdint>

#include <cuda_runtime_api.h>

#include "lib/cuda/im2col.h"
#include "lib/cuda/quantize.h"

namespace gradscale::cuda {

// y [n, out_channels, ho, wo] ← round(W·cols(x) + b, F) with W [out_channels, C·k·k] row-major, b
// [out_channels] or null (no bias), `rounding` F's rule (device_rounding; fp32's leaves the sums as they
// are). Device pointers, queued on `stream`; y must not overlap x, W or b. Throws ShapeError when the
// geometry does not describe a convolution or its grid does not fit a launch, Error for null pointers.
void conv_forward_implicit(const float* x, const ConvGeometry& g, const float* w, std::int64_t out_channels,
                           const float* bias, float* y, const DeviceRounding& rounding, cudaStream_t stream);

// gx [n, C, h, w] ← col2im(Wᵀ·g) for the output gradient g [n, out_channels, ho, wo]: the upstream
// product in fp32, unrounded (the controller measures it; scale_upstream_grad rounds it), without the
// columns. Each element sums its kernel taps in col2im's (ki, kj) order, each tap's column entry
// Σ_o W[o][c][ki][kj]·g[o] over o in order from +0 (one fused multiply-add per term): on the CPU
// execution target the bits of cuda::gemm + col2im; on exact values, Conv2d's. Throws as
// conv_forward_implicit.
void conv_backward_input_implicit(const float* g, const ConvGeometry& geo, const float* w, std::int64_t out_channels,
                                  float* gx, cudaStream_t stream);

}  // namespace gradscale::cuda
