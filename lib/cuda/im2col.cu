// im2col / col2im on the GPU (see im2col.h): one thread per column entry for im2col, storing fp32 or
// the 16-bit bits of a GEMM operand; for col2im one thread per input element gathers its k·k possible
// entries (no atomics, a fixed order).
#include "lib/cuda/im2col.h"

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
__global__ void im2col_kernel(const float* x, ConvGeometry g, std::int64_t ho, std::int64_t wo,
                              ColumnStrides cs, Store cols) {
  const std::int64_t k = g.kernel, plane = ho * wo, rows = g.channels * k * k;
  const std::int64_t total = g.n * rows * plane;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += step) {
    const std::int64_t col = t % plane, row = (t / plane) % rows, b = t / (plane * rows);
    const std::int64_t kj = row % k, ki = (row / k) % k, c = row / (k * k);
    const std::int64_t ih = (col / wo) * g.stride - g.pad + ki, iw = (col % wo) * g.stride - g.pad + kj;
    const bool inside = ih >= 0 && ih < g.h && iw >= 0 && iw < g.w;
    cols(b * cs.sample + row * cs.row + col, inside ? x[((b * g.channels + c) * g.h + ih) * g.w + iw] : 0.0f);
  }
}

__global__ void col2im_kernel(const float* cols, ConvGeometry g, std::int64_t ho, std::int64_t wo,
                              ColumnStrides cs, float* gx) {
  const std::int64_t k = g.kernel;
  const std::int64_t total = g.n * g.channels * g.h * g.w;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += step) {
    const std::int64_t iw = t % g.w, ih = (t / g.w) % g.h, c = (t / (g.w * g.h)) % g.channels;
    const std::int64_t b = t / (g.w * g.h * g.channels);
    const float* sample = cols + b * cs.sample;
    float sum = 0.0f;
    for (std::int64_t ki = 0; ki < k; ++ki) {
      const std::int64_t th = ih + g.pad - ki;  // = oh·stride
      if (th < 0 || th % g.stride != 0 || th / g.stride >= ho) continue;
      for (std::int64_t kj = 0; kj < k; ++kj) {
        const std::int64_t tw = iw + g.pad - kj;  // = ow·stride
        if (tw < 0 || tw % g.stride != 0 || tw / g.stride >= wo) continue;
        sum += sample[((c * k + ki) * k + kj) * cs.row + (th / g.stride) * wo + tw / g.stride];
      }
    }
    gx[t] = sum;
  }
}

void check_geometry(const ConvGeometry& g, const char* what) {
  GS_CHECK_SHAPE(g.n >= 0 && g.channels > 0 && g.h > 0 && g.w > 0 && g.kernel > 0 && g.stride > 0 &&
                     g.pad >= 0 && g.h + 2 * g.pad >= g.kernel && g.w + 2 * g.pad >= g.kernel,
                 "cuda::" << what << ": kernel " << g.kernel << ", stride " << g.stride << ", padding "
                          << g.pad << " do not fit input [" << g.n << ", " << g.channels << ", " << g.h
                          << ", " << g.w << "]");
}

template <class Store>
void launch_im2col(const float* x, const ConvGeometry& g, Store cols, cudaStream_t stream, ColumnLayout layout) {
  const auto total = static_cast<std::size_t>(g.n * g.col_rows() * g.col_cols());
  im2col_kernel<Store><<<grid_for(total, 4), kBlock, 0, stream>>>(x, g, g.ho(), g.wo(), column_strides(g, layout),
                                                                   cols);
  GS_CUDA_CHECK_LAUNCH();
}

void launch_col2im(const float* cols, const ConvGeometry& g, float* gx, cudaStream_t stream, ColumnLayout layout) {
  const auto total = static_cast<std::size_t>(g.n * g.channels * g.h * g.w);
  col2im_kernel<<<grid_for(total, 4), kBlock, 0, stream>>>(cols, g, g.ho(), g.wo(), column_strides(g, layout), gx);
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
