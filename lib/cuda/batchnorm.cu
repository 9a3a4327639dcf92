// BatchNorm forward and backward on the GPU (see batchnorm.h). Per-channel reductions run one block
// per channel with a fixed-order block reduction (deterministic); elementwise passes are grid-stride
// loops. Every expression is batchnorm.cpp's, operation by operation, in double where it is in double.
#include "lib/cuda/batchnorm.h"

#include <cmath>

#include "lib/core/error.h"
#include "lib/cuda/check.h"
#include "lib/cuda/launch.h"
#include "lib/cuda/reduce.cuh"

namespace gradscale::cuda {
namespace {

// Element j of channel c, j < n·plane, in [n, channels, plane] order.
__device__ __forceinline__ std::int64_t channel_index(std::int64_t j, std::int64_t c, std::int64_t channels,
                                                      std::int64_t plane) {
  return (j / plane) * channels * plane + c * plane + j % plane;
}

__global__ void __launch_bounds__(kBlock)
    batch_statistics_kernel(const float* x, BatchNormShape s, double eps, double momentum,
                            float* running_mean, float* running_var, double* mean_out, double* invstd_out) {
  const std::int64_t c = blockIdx.x, count = s.n * s.plane;
  double sum = 0;
  for (std::int64_t j = threadIdx.x; j < count; j += blockDim.x)
    sum += x[channel_index(j, c, s.channels, s.plane)];
  sum = device::block_reduce(sum, device::Sum());
  const double mean = sum / static_cast<double>(count);
  double ss = 0;  // two passes: no cancellation when |mean| >> std
  for (std::int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const float p = x[channel_index(j, c, s.channels, s.plane)];
    ss += (p - mean) * (p - mean);
  }
  ss = device::block_reduce(ss, device::Sum());
  if (threadIdx.x != 0) return;
  const double var = ss / static_cast<double>(count);
  mean_out[c] = mean;
  invstd_out[c] = 1.0 / sqrt(var + eps);
  const double unbiased = ss / static_cast<double>(count - 1);
  running_mean[c] = static_cast<float>((1 - momentum) * running_mean[c] + momentum * mean);
  running_var[c] = static_cast<float>((1 - momentum) * running_var[c] + momentum * unbiased);
}

__global__ void running_statistics_kernel(const float* running_mean, const float* running_var,
                                          std::int64_t channels, double eps, double* mean_out,
                                          double* invstd_out) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  mean_out[c] = running_mean[c];
  invstd_out[c] = 1.0 / sqrt(static_cast<double>(running_var[c]) + eps);
}

__global__ void normalize_kernel(const float* x, BatchNormShape s, const float* gamma, const float* beta,
                                 const double* mean, const double* invstd, float* y) {
  const std::int64_t total = s.n * s.channels * s.plane;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    const std::int64_t c = (i / s.plane) % s.channels;
    const double a = gamma[c] * invstd[c], m = mean[c], b = beta[c];
    y[i] = static_cast<float>((x[i] - m) * a + b);
  }
}

__global__ void __launch_bounds__(kBlock)
    grad_sums_kernel(const float* x, const float* gy, BatchNormShape s, const double* mean,
                     const double* invstd, double* sums, float* grad_gamma, float* grad_beta) {
  const std::int64_t c = blockIdx.x, count = s.n * s.plane;
  double sg = 0, sgx = 0;
  for (std::int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const std::int64_t i = channel_index(j, c, s.channels, s.plane);
    sg += gy[i];
    sgx += gy[i] * (x[i] - mean[c]) * invstd[c];
  }
  sg = device::block_reduce(sg, device::Sum());
  sgx = device::block_reduce(sgx, device::Sum());
  if (threadIdx.x != 0) return;
  sums[c] = sg;
  sums[s.channels + c] = sgx;
  grad_beta[c] = static_cast<float>(sg);
  grad_gamma[c] = static_cast<float>(sgx);
}

__global__ void input_grad_kernel(const float* x, const float* gy, BatchNormShape s, const float* gamma,
                                  const double* mean, const double* invstd, const double* sums,
                                  double inv_count, float* gx) {
  const std::int64_t total = s.n * s.channels * s.plane;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    const std::int64_t c = (i / s.plane) % s.channels;
    const double a = gamma[c] * invstd[c], m = mean[c], is = invstd[c];
    const double mg = sums[c] * inv_count, mgx = sums[s.channels + c] * inv_count;
    gx[i] = static_cast<float>(a * (gy[i] - mg - (x[i] - m) * is * mgx));
  }
}

void check_shape(const BatchNormShape& s, const char* what) {
  GS_CHECK_SHAPE(s.n >= 0 && s.channels > 0 && s.plane > 0 && s.channels <= 2147483647,
                 "cuda::" << what << ": shape n " << s.n << ", channels " << s.channels << ", plane "
                          << s.plane << " is not a batch-norm input");
}

void launch_forward_training(const float* x, const BatchNormShape& s, const float* gamma, const float* beta,
                             double eps, double momentum, float* running_mean, float* running_var,
                             double* mean, double* invstd, float* y, cudaStream_t stream) {
  batch_statistics_kernel<<<static_cast<unsigned>(s.channels), kBlock, 0, stream>>>(
      x, s, eps, momentum, running_mean, running_var, mean, invstd);
  GS_CUDA_CHECK_LAUNCH();
  normalize_kernel<<<grid_for(static_cast<std::size_t>(s.size()), 4), kBlock, 0, stream>>>(x, s, gamma, beta,
                                                                                           mean, invstd, y);
  GS_CUDA_CHECK_LAUNCH();
}

void launch_forward_eval(const float* x, const BatchNormShape& s, const float* gamma, const float* beta,
                         const float* running_mean, const float* running_var, double eps, double* mean,
                         double* invstd, float* y, cudaStream_t stream) {
  running_statistics_kernel<<<grid_for(static_cast<std::size_t>(s.channels)), kBlock, 0, stream>>>(
      running_mean, running_var, s.channels, eps, mean, invstd);
  GS_CUDA_CHECK_LAUNCH();
  if (s.size() == 0) return;
  normalize_kernel<<<grid_for(static_cast<std::size_t>(s.size()), 4), kBlock, 0, stream>>>(x, s, gamma, beta,
                                                                                           mean, invstd, y);
  GS_CUDA_CHECK_LAUNCH();
}

void launch_backward(const float* x, const float* gy, const BatchNormShape& s, const float* gamma,
                     const double* mean, const double* invstd, double inv_count, double* sums, float* gx,
                     float* grad_gamma, float* grad_beta, cudaStream_t stream) {
  grad_sums_kernel<<<static_cast<unsigned>(s.channels), kBlock, 0, stream>>>(x, gy, s, mean, invstd, sums,
                                                                             grad_gamma, grad_beta);
  GS_CUDA_CHECK_LAUNCH();
  if (gx == nullptr || s.size() == 0) return;
  input_grad_kernel<<<grid_for(static_cast<std::size_t>(s.size()), 4), kBlock, 0, stream>>>(
      x, gy, s, gamma, mean, invstd, sums, inv_count, gx);
  GS_CUDA_CHECK_LAUNCH();
}

}  // namespace

void batchnorm_forward_training(const float* x, const BatchNormShape& s, const float* gamma,
                                const float* beta, double eps, double momentum, float* running_mean,
                                float* running_var, double* mean, double* invstd, float* y,
                                cudaStream_t stream) {
  check_shape(s, "batchnorm_forward_training");
  GS_CHECK_SHAPE(s.n * s.plane > 1,
                 "cuda::batchnorm_forward_training needs more than one value per channel, got n "
                     << s.n << " and plane " << s.plane);
  GS_CHECK(x && gamma && beta && running_mean && running_var && mean && invstd && y,
           "cuda::batchnorm_forward_training got a null pointer");
  GS_CHECK_CONFIG(std::isfinite(eps) && eps > 0 && momentum >= 0 && momentum <= 1,
                  "cuda::batchnorm_forward_training: eps must be > 0 and momentum in [0, 1], got "
                      << eps << ", " << momentum);
  launch_forward_training(x, s, gamma, beta, eps, momentum, running_mean, running_var, mean, invstd, y,
                          stream);
}

void batchnorm_forward_eval(const float* x, const BatchNormShape& s, const float* gamma, const float* beta,
                            const float* running_mean, const float* running_var, double eps, double* mean,
                            double* invstd, float* y, cudaStream_t stream) {
  check_shape(s, "batchnorm_forward_eval");
  GS_CHECK(gamma && beta && running_mean && running_var && mean && invstd && (s.size() == 0 || (x && y)),
           "cuda::batchnorm_forward_eval got a null pointer");
  GS_CHECK_CONFIG(std::isfinite(eps) && eps > 0,
                  "cuda::batchnorm_forward_eval: eps must be > 0, got " << eps);
  launch_forward_eval(x, s, gamma, beta, running_mean, running_var, eps, mean, invstd, y, stream);
}

void batchnorm_backward(CudaContext& ctx, const float* x, const float* gy, const BatchNormShape& s,
                        const float* gamma, const double* mean, const double* invstd, bool training,
                        float* gx, float* grad_gamma, float* grad_beta) {
  check_shape(s, "batchnorm_backward");
  GS_CHECK(gamma && mean && invstd && grad_gamma && grad_beta && (s.size() == 0 || (x && gy)),
           "cuda::batchnorm_backward got a null pointer");
  auto* sums = static_cast<double*>(ctx.scratch(2 * static_cast<std::size_t>(s.channels) * sizeof(double)));
  const double inv_count = training ? 1.0 / static_cast<double>(s.n * s.plane) : 0.0;
  launch_backward(x, gy, s, gamma, mean, invstd, inv_count, sums, gx, grad_gamma, grad_beta, ctx.stream());
}

}  // namespace gradscale::cuda
