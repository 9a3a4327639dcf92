// BatchNorm forward and backward on the GPU (see batchnorm.h). Per-channel reductions run over many
// blocks per channel and then add the blocks' partials in a fixed order (deterministic, chunks_for);
// elementwise passes are grid-stride loops. Every expression is batchnorm.cpp's, operation by operation, in double where it is in double.
#include "lib/cuda/batchnorm.h"

#include <algorithm>
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

// A channel's sums are spread over `chunks` blocks: block (c, k) adds chunk k of channel c's n·plane
// values (each thread a fixed stride of it, then the block's fixed-order tree) into one partial, and
// one thread per channel then adds the partials in chunk order. The chunk count is a function of
// n·plane alone, never of the device, so the sums have the same bits on every GPU and every run; with
// one chunk (small channels) they are the one-block sums of before, bit for bit.
constexpr std::int64_t kChunkValues = 8 * static_cast<std::int64_t>(kBlock);  // values per chunk, at least
constexpr std::int64_t kMaxChunks = 64;

unsigned chunks_for(const BatchNormShape& s) {
  const std::int64_t count = s.n * s.plane;
  return static_cast<unsigned>(std::clamp<std::int64_t>((count + kChunkValues - 1) / kChunkValues, 1, kMaxChunks));
}

enum class ChannelSum { values, squared_deviations, gradients };

// partials[row · chunks + k] for row c (and, for gradients, row channels + c: Σ g·x̂).
template <ChannelSum kind>
__global__ void __launch_bounds__(kBlock)
    channel_partials_kernel(const float* x, const float* gy, BatchNormShape s, const double* mean,
                            const double* invstd, double* partials) {
  const std::int64_t c = blockIdx.x, k = blockIdx.y, chunks = gridDim.y, count = s.n * s.plane;
  const std::int64_t span = (count + chunks - 1) / chunks, begin = k * span;
  const std::int64_t end = begin + span < count ? begin + span : count;
  double a = 0, b = 0;
  for (std::int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    const std::int64_t i = channel_index(j, c, s.channels, s.plane);
    if constexpr (kind == ChannelSum::values) {
      a += x[i];
    } else if constexpr (kind == ChannelSum::squared_deviations) {
      const float p = x[i];
      a += (p - mean[c]) * (p - mean[c]);  // two passes: no cancellation when |mean| >> std
    } else {
      a += gy[i];
      b += gy[i] * (x[i] - mean[c]) * invstd[c];
    }
  }
  a = device::block_reduce(a, device::Sum());
  if constexpr (kind == ChannelSum::gradients) b = device::block_reduce(b, device::Sum());
  if (threadIdx.x != 0) return;
  partials[c * chunks + k] = a;
  if constexpr (kind == ChannelSum::gradients) partials[(s.channels + c) * chunks + k] = b;
}

__device__ __forceinline__ double chunk_total(const double* partials, std::int64_t row, unsigned chunks) {
  double total = 0;
  for (unsigned k = 0; k < chunks; ++k) total += partials[row * chunks + k];
  return total;
}

__global__ void batch_mean_kernel(const double* partials, unsigned chunks, BatchNormShape s, double* mean_out) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= s.channels) return;
  mean_out[c] = chunk_total(partials, c, chunks) / static_cast<double>(s.n * s.plane);
}

__global__ void batch_variance_kernel(const double* partials, unsigned chunks, BatchNormShape s, double eps,
                                      double momentum, const double* mean, float* running_mean,
                                      float* running_var, double* invstd_out) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= s.channels) return;
  const std::int64_t count = s.n * s.plane;
  const double ss = chunk_total(partials, c, chunks);
  const double var = ss / static_cast<double>(count);
  invstd_out[c] = 1.0 / sqrt(var + eps);
  const double unbiased = ss / static_cast<double>(count - 1);
  running_mean[c] = static_cast<float>((1 - momentum) * running_mean[c] + momentum * mean[c]);
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

__global__ void grad_totals_kernel(const double* partials, unsigned chunks, BatchNormShape s, double* sums,
                                   float* grad_gamma, float* grad_beta) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= s.channels) return;
  const double sg = chunk_total(partials, c, chunks), sgx = chunk_total(partials, s.channels + c, chunks);
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

// The per-channel sums of `kind` into partials ([rows][chunks], rows = channels, or 2·channels for
// gradients), one block per (channel, chunk).
template <ChannelSum kind>
void launch_partials(const float* x, const float* gy, const BatchNormShape& s, const double* mean,
                     const double* invstd, unsigned chunks, double* partials, cudaStream_t stream) {
  channel_partials_kernel<kind><<<dim3(static_cast<unsigned>(s.channels), chunks), kBlock, 0, stream>>>(
      x, gy, s, mean, invstd, partials);
  GS_CUDA_CHECK_LAUNCH();
}

void launch_forward_training(const float* x, const BatchNormShape& s, const float* gamma, const float* beta,
                             double eps, double momentum, float* running_mean, float* running_var,
                             double* mean, double* invstd, float* y, double* partials, cudaStream_t stream) {
  const unsigned chunks = chunks_for(s);
  const unsigned per_channel = grid_for(static_cast<std::size_t>(s.channels));
  launch_partials<ChannelSum::values>(x, nullptr, s, nullptr, nullptr, chunks, partials, stream);
  batch_mean_kernel<<<per_channel, kBlock, 0, stream>>>(partials, chunks, s, mean);
  GS_CUDA_CHECK_LAUNCH();
  launch_partials<ChannelSum::squared_deviations>(x, nullptr, s, mean, nullptr, chunks, partials, stream);
  batch_variance_kernel<<<per_channel, kBlock, 0, stream>>>(partials, chunks, s, eps, momentum, mean,
                                                             running_mean, running_var, invstd);
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
                     const double* mean, const double* invstd, double inv_count, double* sums, double* partials,
                     float* gx, float* grad_gamma, float* grad_beta, cudaStream_t stream) {
  const unsigned chunks = chunks_for(s);
  launch_partials<ChannelSum::gradients>(x, gy, s, mean, invstd, chunks, partials, stream);
  grad_totals_kernel<<<grid_for(static_cast<std::size_t>(s.channels)), kBlock, 0, stream>>>(
      partials, chunks, s, sums, grad_gamma, grad_beta);
  GS_CUDA_CHECK_LAUNCH();
  if (gx == nullptr || s.size() == 0) return;
  input_grad_kernel<<<grid_for(static_cast<std::size_t>(s.size()), 4), kBlock, 0, stream>>>(
      x, gy, s, gamma, mean, invstd, sums, inv_count, gx);
  GS_CUDA_CHECK_LAUNCH();
}

}  // namespace

void batchnorm_forward_training(CudaContext& ctx, const float* x, const BatchNormShape& s, const float* gamma,
                                const float* beta, double eps, double momentum, float* running_mean,
                                float* running_var, double* mean, double* invstd, float* y) {
  check_shape(s, "batchnorm_forward_training");
  GS_CHECK_SHAPE(s.n * s.plane > 1,
                 "cuda::batchnorm_forward_training needs more than one value per channel, got n "
                     << s.n << " and plane " << s.plane);
  GS_CHECK(x && gamma && beta && running_mean && running_var && mean && invstd && y,
           "cuda::batchnorm_forward_training got a null pointer");
  GS_CHECK_CONFIG(std::isfinite(eps) && eps > 0 && momentum >= 0 && momentum <= 1,
                  "cuda::batchnorm_forward_training: eps must be > 0 and momentum in [0, 1], got "
                      << eps << ", " << momentum);
  const std::size_t partials = static_cast<std::size_t>(s.channels) * chunks_for(s);
  auto* scratch = static_cast<double*>(ctx.scratch(partials * sizeof(double)));
  launch_forward_training(x, s, gamma, beta, eps, momentum, running_mean, running_var, mean, invstd, y,
                          scratch, ctx.stream());
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
  // The totals Σg, Σg·x̂ (2·channels), then the chunks' partials of each (2·channels·chunks).
  const std::size_t rows = 2 * static_cast<std::size_t>(s.channels);
  auto* sums = static_cast<double*>(ctx.scratch(rows * (1 + chunks_for(s)) * sizeof(double)));
  const double inv_count = training ? 1.0 / static_cast<double>(s.n * s.plane) : 0.0;
  launch_backward(x, gy, s, gamma, mean, invstd, inv_count, sums, sums + rows, gx, grad_gamma, grad_beta,
                  ctx.stream());
}

}  // namespace gradscale::cuda
