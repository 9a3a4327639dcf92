// Max pooling forward and backward on the GPU (see maxpool.h). Forward: one thread per output, the
// window visited in row-major order with the CPU's takes_over rule; a 2×2 stride-2 instance of the same
// template lets the compiler unroll the common case. Backward gathers instead of scattering: one thread
// per input adds the gradients of the windows that chose it, in increasing output index — the order of
// the CPU's scatter loop — so no atomics and the same bits.
#include "lib/cuda/maxpool.h"

#include <limits>

#include "lib/core/error.h"
#include "lib/cuda/check.h"
#include "lib/cuda/launch.h"

namespace gradscale::cuda {
namespace {

// Whether v replaces the running maximum `best` (pool.cpp: takes_over): larger, or the first NaN.
__device__ __forceinline__ bool takes_over(float v, float best) {
  return v > best || (v != v && best == best);
}

// kFixed > 0: kernel = stride = kFixed known at compile time; 0: read from the geometry.
template <int kFixed>
__global__ void max_pool_forward_kernel(const float* x, std::int64_t planes, std::int64_t h, std::int64_t w,
                                        std::int64_t kernel_rt, std::int64_t stride_rt, std::int64_t ho,
                                        std::int64_t wo, float* y, std::int32_t* argmax) {
  const std::int64_t kernel = kFixed > 0 ? kFixed : kernel_rt;
  const std::int64_t stride = kFixed > 0 ? kFixed : stride_rt;
  const std::int64_t total = planes * ho * wo;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t o = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < total;
       o += step) {
    const std::int64_t p = o / (ho * wo), r = o % (ho * wo), oh = r / wo, ow = r % wo;
    const float* in = x + p * h * w;
    std::int64_t best_i = oh * stride * w + ow * stride;
    float best = in[best_i];
    for (std::int64_t ki = 0; ki < kernel; ++ki) {
      for (std::int64_t kj = 0; kj < kernel; ++kj) {
        const std::int64_t i = (oh * stride + ki) * w + ow * stride + kj;
        const float v = in[i];
        if (takes_over(v, best)) {
          best = v;
          best_i = i;
        }
      }
    }
    y[o] = best;
    argmax[o] = static_cast<std::int32_t>(best_i);
  }
}

__global__ void max_pool_backward_kernel(const float* gy, const std::int32_t* argmax, std::int64_t planes,
                                         std::int64_t h, std::int64_t w, std::int64_t kernel,
                                         std::int64_t stride, std::int64_t ho, std::int64_t wo, float* gx) {
  const std::int64_t total = planes * h * w;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += step) {
    const std::int64_t p = t / (h * w), r = t % (h * w), ih = r / w, iw = r % w;
    // Windows containing (ih, iw): oh·stride ≤ ih ≤ oh·stride + kernel − 1, likewise ow.
    const std::int64_t oh_lo = ih < kernel ? 0 : (ih - kernel) / stride + 1;
    const std::int64_t ow_lo = iw < kernel ? 0 : (iw - kernel) / stride + 1;
    const std::int64_t oh_hi = min(ih / stride, ho - 1), ow_hi = min(iw / stride, wo - 1);
    float sum = 0.0f;
    for (std::int64_t oh = oh_lo; oh <= oh_hi; ++oh) {
      for (std::int64_t ow = ow_lo; ow <= ow_hi; ++ow) {
        const std::int64_t o = (p * ho + oh) * wo + ow;
        if (argmax[o] == r) sum += gy[o];
      }
    }
    gx[t] = sum;
  }
}

void check_geometry(const PoolGeometry& g, const char* what) {
  GS_CHECK_SHAPE(g.kernel >= 1 && g.stride >= 1 && g.planes >= 0 && g.h >= g.kernel && g.w >= g.kernel,
                 "cuda::" << what << ": kernel " << g.kernel << ", stride " << g.stride
                          << " do not fit planes " << g.planes << " of " << g.h << "x" << g.w);
  GS_CHECK_SHAPE(g.h * g.w <= std::numeric_limits<std::int32_t>::max(),
                 "cuda::" << what << ": plane of " << g.h << "x" << g.w << " is too large");
}

void launch_max_pool_forward(const float* x, const PoolGeometry& g, float* y, std::int32_t* argmax,
                             cudaStream_t stream) {
  const std::int64_t ho = g.ho(), wo = g.wo();
  const auto grid = grid_for(static_cast<std::size_t>(g.planes * ho * wo));
  if (g.kernel == 2 && g.stride == 2)
    max_pool_forward_kernel<2><<<grid, kBlock, 0, stream>>>(x, g.planes, g.h, g.w, 2, 2, ho, wo, y, argmax);
  else
    max_pool_forward_kernel<0>
        <<<grid, kBlock, 0, stream>>>(x, g.planes, g.h, g.w, g.kernel, g.stride, ho, wo, y, argmax);
  GS_CUDA_CHECK_LAUNCH();
}

void launch_max_pool_backward(const float* gy, const std::int32_t* argmax, const PoolGeometry& g, float* gx,
                              cudaStream_t stream) {
  max_pool_backward_kernel<<<grid_for(static_cast<std::size_t>(g.planes * g.h * g.w)), kBlock, 0, stream>>>(
      gy, argmax, g.planes, g.h, g.w, g.kernel, g.stride, g.ho(), g.wo(), gx);
  GS_CUDA_CHECK_LAUNCH();
}

}  // namespace

void max_pool_forward(const float* x, const PoolGeometry& g, float* y, std::int32_t* argmax,
                      cudaStream_t stream) {
  check_geometry(g, "max_pool_forward");
  if (g.planes == 0) return;
  GS_CHECK(x != nullptr && y != nullptr && argmax != nullptr, "cuda::max_pool_forward got a null pointer");
  launch_max_pool_forward(x, g, y, argmax, stream);
}

void max_pool_backward(const float* gy, const std::int32_t* argmax, const PoolGeometry& g, float* gx,
                       cudaStream_t stream) {
  check_geometry(g, "max_pool_backward");
  if (g.planes == 0) return;
  GS_CHECK(gy != nullptr && argmax != nullptr && gx != nullptr, "cuda::max_pool_backward got a null pointer");
  launch_max_pool_backward(gy, argmax, g, gx, stream);
}

}  // namespace gradscale::cuda
