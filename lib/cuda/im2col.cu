// im2col / col2im on the GPU (see im2col.h): for im2col a block row per (sample, column row) pair and
// one thread per entry of the pair's Ho·Wo plane, storing fp32 or the 16-bit bits of a GEMM operand; for
// col2im a block row per (sample, channel) plane and one thread per input element, which gathers its
// k·k possible entries (no atomics, a fixed order). Only a pair's or plane's own index is divided in
// 64 bits; an element's position in its plane is 32-bit arithmetic (check_geometry: a plane fits in
// an int). Dividing every element's flat 64-bit index, as an earlier version did, made these passes
// bound by the index arithmetic, not by memory.
#include "lib/cuda/im2col.h"

#include <algorithm>

#include "lib/core/error.h"
#include "lib/cuda/check.h"
#include "lib/cuda/convert.cuh"
#include "lib/cuda/launch.h"

namespace gradscale::cuda {
namespace {

// Offset of sample b's column matrix, and the distance between its rows, in `layout`.
struct ColumnStrides {
  std::int64_t sample, row;
};
ColumnStrides column_strides(const ConvGeometry& g, ColumnLayout layout) {
  const std::int64_t plane = g.col_cols();
  if (layout == ColumnLayout::batch_wide) return {plane, g.n * plane};
  return {g.col_rows() * plane, plane};
}

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
  const std::int64_t rows = g.channels * k * k, pairs = g.n * rows;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t pair = blockIdx.y; pair < pairs; pair += gridDim.y) {
    const std::int64_t b = pair / rows, row = pair - b * rows, c = row / (k * k);
    const int r = static_cast<int>(row - c * k * k), ki = r / k, kj = r - ki * k;
    const float* xc = x + (b * g.channels + c) * g.h * g.w;
    const std::int64_t out = b * cs.sample + row * cs.row;
    for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < plane;
         i += step) {
      const int col = static_cast<int>(i), oh = col / wo, ow = col - oh * wo;
      const int ih = oh * stride - pad + ki, iw = ow * stride - pad + kj;
      const bool inside = ih >= 0 && ih < h && iw >= 0 && iw < w;
      cols(out + col, inside ? xc[ih * w + iw] : 0.0f);
    }
  }
}

__global__ void col2im_kernel(const float* cols, ConvGeometry g, int ho, int wo, ColumnStrides cs,
                              float* gx) {
  const int k = static_cast<int>(g.kernel), stride = static_cast<int>(g.stride),
            pad = static_cast<int>(g.pad);
  const int w = static_cast<int>(g.w), plane = static_cast<int>(g.h) * w;
  const std::int64_t planes = g.n * g.channels;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t p = blockIdx.y; p < planes; p += gridDim.y) {
    const std::int64_t b = p / g.channels, c = p - b * g.channels;
    const float* sample = cols + b * cs.sample;
    float* out = gx + p * plane;
    for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < plane;
         i += step) {
      const int t = static_cast<int>(i), ih = t / w, iw = t - ih * w;
      float sum = 0.0f;
      for (int ki = 0; ki < k; ++ki) {
        const int th = ih + pad - ki;  // = oh·stride
        if (th < 0 || th % stride != 0 || th / stride >= ho) continue;
        for (int kj = 0; kj < k; ++kj) {
          const int tw = iw + pad - kj;  // = ow·stride
          if (tw < 0 || tw % stride != 0 || tw / stride >= wo) continue;
          sum += sample[((c * k + ki) * k + kj) * cs.row + (th / stride) * wo + tw / stride];
        }
      }
      out[t] = sum;
    }
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

void check_geometry(const ConvGeometry& g, const char* what) {
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

template <class Store>
void launch_im2col(const float* x, const ConvGeometry& g, Store cols, cudaStream_t stream, ColumnLayout layout) {
  im2col_kernel<Store><<<grid_2d(g.col_cols(), g.n * g.col_rows()), kBlock, 0, stream>>>(
      x, g, static_cast<int>(g.ho()), static_cast<int>(g.wo()), column_strides(g, layout), cols);
  GS_CUDA_CHECK_LAUNCH();
}

void launch_col2im(const float* cols, const ConvGeometry& g, float* gx, cudaStream_t stream, ColumnLayout layout) {
  col2im_kernel<<<grid_2d(g.h * g.w, g.n * g.channels), kBlock, 0, stream>>>(
      cols, g, static_cast<int>(g.ho()), static_cast<int>(g.wo()), column_strides(g, layout), gx);
  GS_CUDA_CHECK_LAUNCH();
}

}  // namespace

void im2col(const float* x, const ConvGeometry& g, float* cols, cudaStream_t stream, ColumnLayout layout) {
  check_geometry(g, "im2col");
  if (g.n == 0) return;
  GS_CHECK(x != nullptr && cols != nullptr, "cuda::im2col got a null pointer");
  launch_im2col(x, g, StoreF32{cols}, stream, layout);
}

void im2col_16bit(const float* x, const ConvGeometry& g, std::uint16_t* cols, DeviceType type, cudaStream_t stream,
                  ColumnLayout layout) {
  check_geometry(g, "im2col_16bit");
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
  check_geometry(g, "col2im");
  if (g.n == 0) return;
  GS_CHECK(cols != nullptr && gx != nullptr, "cuda::col2im got a null pointer");
  launch_col2im(cols, g, gx, stream, layout);
}

}  // namespace gradscale::cuda
