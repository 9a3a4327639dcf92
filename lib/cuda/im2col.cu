// im2col / col2im on the GPU (see im2col.h). Both run a block row per (sample, channel) plane: im2col
// one thread per output position (oh, ow), which writes that position's k·k column rows (one division
// for k·k entries; the threads of a warp write k·k coalesced runs); col2im one thread per input element,
// which gathers its entries in (ki, kj) order, no atomics (a stride of 1 needs no division at all, any
// other stride one per axis). A plane's own index is divided in 64 bits once per plane; a position in
// it is 32-bit arithmetic (check_conv_geometry: a plane fits in an int). An earlier version ran one thread
// per column entry, with divisions for every entry (for col2im up to four per kernel tap), and was
// bound by that arithmetic, not by memory. The per-element sum is im2col.cuh's col2im_sum, which
// stats.cu's col2im_measured shares.
#include "lib/cuda/im2col.h"

#include <algorithm>

#include "lib/core/error.h"
#include "lib/cuda/check.h"
#include "lib/cuda/convert.cuh"
#include "lib/cuda/im2col.cuh"
#include "lib/cuda/launch.h"

namespace gradscale::cuda {
namespace {

// How im2col stores a value: as it is, or as the fp16 / bf16 bits of convert.cuh.
struct StoreF32 {
  float* out;
  __device__ void operator()(std::int64_t i, float v) const { out[i] = v; }
};
struct StoreF16 {
  std::uint16_t* out;
  __device__ void operator()(std::int64_t i, float v) const { out[i] = bits16::fp16_bits(v); }
};
struct StoreBF16 {
  std::uint16_t* out;
  __device__ void operator()(std::int64_t i, float v) const { out[i] = bits16::bf16_bits(v); }
};

template <class Store>
__global__ void im2col_kernel(const float* x, ConvGeometry g, int ho, int wo, ColumnStrides cs, Store cols) {
  const int k = static_cast<int>(g.kernel), stride = static_cast<int>(g.stride),
            pad = static_cast<int>(g.pad);
  const int h = static_cast<int>(g.h), w = static_cast<int>(g.w), plane = ho * wo;
  const std::int64_t planes = g.n * g.channels;
  // The position loop counts in 64 bits: a plane may hold up to 2^31 - 1 values, and one step more
  // than the last position must not overflow.
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x,
                     step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t p = blockIdx.y; p < planes; p += gridDim.y) {
    const std::int64_t b = p / g.channels, c = p - b * g.channels;
    const float* xc = x + p * g.h * g.w;
    // Row (c·k + ki)·k + kj of sample b's columns; kj and then ki advance it by one row.
    const std::int64_t rows = b * cs.sample + c * k * k * cs.row;
    for (std::int64_t i = first; i < plane; i += step) {
      const int col = static_cast<int>(i);
      const int oh = col / wo, ow = col - oh * wo;
      const int ih0 = oh * stride - pad, iw0 = ow * stride - pad;
      std::int64_t at = rows + col;
      for (int ki = 0; ki < k; ++ki) {
        const int ih = ih0 + ki;
        const bool row_inside = ih >= 0 && ih < h;
        for (int kj = 0; kj < k; ++kj, at += cs.row) {
          const int iw = iw0 + kj;
          cols(at, row_inside && iw >= 0 && iw < w ? xc[ih * w + iw] : 0.0f);
        }
      }
    }
  }
}

// One thread per input element of a plane: col2im_sum (im2col.cuh).
template <bool UnitStride>
__global__ void col2im_kernel(const float* cols, ConvGeometry g, int ho, int wo, ColumnStrides cs,
                              float* gx) {
  const int k = static_cast<int>(g.kernel), stride = static_cast<int>(g.stride), pad = static_cast<int>(g.pad);
  const int w = static_cast<int>(g.w), plane = static_cast<int>(g.h) * w;
  const std::int64_t planes = g.n * g.channels;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x,
                     step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t p = blockIdx.y; p < planes; p += gridDim.y) {
    const std::int64_t b = p / g.channels, c = p - b * g.channels;
    const float* rows = cols + b * cs.sample + c * k * k * cs.row;
    float* out = gx + p * plane;
    for (std::int64_t i = first; i < plane; i += step)
      out[i] = device::col2im_sum<UnitStride>(rows, k, stride, pad, w, ho, wo, cs.row, static_cast<int>(i));
  }
}

// Blocks over x for `per_row` elements of a row, and rows over y: as many threads in all as a flat
// launch of rows·per_row elements, 4 a thread, would have (a row is looped over when there are more).
dim3 grid_2d(std::int64_t per_row, std::int64_t rows) {
  const unsigned x = grid_for(static_cast<std::size_t>(per_row));
  const std::size_t flat = grid_for(static_cast<std::size_t>(per_row * rows), 4);
  const std::size_t y = std::clamp<std::size_t>(flat / x, 1, std::min<std::int64_t>(rows, 65535));
  return dim3(x, static_cast<unsigned>(y));
}


template <class Store>
void launch_im2col(const float* x, const ConvGeometry& g, Store cols, cudaStream_t stream, ColumnLayout layout) {
  im2col_kernel<Store><<<grid_2d(g.col_cols(), g.n * g.channels), kBlock, 0, stream>>>(
      x, g, static_cast<int>(g.ho()), static_cast<int>(g.wo()), column_strides(g, layout), cols);
  GS_CUDA_CHECK_LAUNCH();
}

void launch_col2im(const float* cols, const ConvGeometry& g, float* gx, cudaStream_t stream, ColumnLayout layout) {
  const dim3 grid = grid_2d(g.h * g.w, g.n * g.channels);
  const int ho = static_cast<int>(g.ho()), wo = static_cast<int>(g.wo());
  if (g.stride == 1)
    col2im_kernel<true><<<grid, kBlock, 0, stream>>>(cols, g, ho, wo, column_strides(g, layout), gx);
  else
    col2im_kernel<false><<<grid, kBlock, 0, stream>>>(cols, g, ho, wo, column_strides(g, layout), gx);
  GS_CUDA_CHECK_LAUNCH();
}

}  // namespace

void im2col(const float* x, const ConvGeometry& g, float* cols, cudaStream_t stream, ColumnLayout layout) {
  check_conv_geometry(g, "im2col");
  if (g.n == 0) return;
  GS_CHECK(x != nullptr && cols != nullptr, "cuda::im2col got a null pointer");
  launch_im2col(x, g, StoreF32{cols}, stream, layout);
}

void im2col_16bit(const float* x, const ConvGeometry& g, std::uint16_t* cols, DeviceType type, cudaStream_t stream,
                  ColumnLayout layout) {
  check_conv_geometry(g, "im2col_16bit");
  GS_CHECK(type == DeviceType::f16 || type == DeviceType::bf16,
           "cuda::im2col_16bit: " << device_type_name(type) << " is not a 16-bit type");
  if (g.n == 0) return;
  GS_CHECK(x != nullptr && cols != nullptr, "cuda::im2col_16bit got a null pointer");
  if (type == DeviceType::f16)
    launch_im2col(x, g, StoreF16{cols}, stream, layout);
  else
    launch_im2col(x, g, StoreBF16{cols}, stream, layout);
}

void col2im(const float* cols, const ConvGeometry& g, float* gx, cudaStream_t stream, ColumnLayout layout) {
  check_conv_geometry(g, "col2im");
  if (g.n == 0) return;
  GS_CHECK(cols != nullptr && gx != nullptr, "cuda::col2im got a null pointer");
  launch_col2im(cols, g, gx, stream, layout);
}

void check_conv_geometry(const ConvGeometry& g, const char* what) {
  GS_CHECK_SHAPE(g.n >= 0 && g.channels > 0 && g.h > 0 && g.w > 0 && g.kernel > 0 && g.stride > 0 &&
                     g.pad >= 0 && g.h + 2 * g.pad >= g.kernel && g.w + 2 * g.pad >= g.kernel,
                 "cuda::" << what << ": kernel " << g.kernel << ", stride " << g.stride << ", padding "
                          << g.pad << " do not fit input [" << g.n << ", " << g.channels << ", " << g.h
                          << ", " << g.w << "]");
  constexpr std::int64_t kInt = 2147483647;
  GS_CHECK_SHAPE(g.h <= kInt && g.w <= kInt && g.stride <= kInt && g.pad <= kInt && g.h + 2 * g.pad <= kInt &&
                     g.w + 2 * g.pad <= kInt && g.h * g.w <= kInt && g.ho() * g.wo() <= kInt &&
                     g.kernel * g.kernel <= kInt,
                 "cuda::" << what << ": a plane of " << g.h << "x" << g.w << " values (or its kernel "
                          << g.kernel << ", padding " << g.pad << ") does not fit in 32-bit indices");
}

}  // namespace gradscale::cuda
