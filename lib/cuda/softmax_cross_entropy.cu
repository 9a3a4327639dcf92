// Softmax cross-entropy on the GPU (see softmax_cross_entropy.h): one thread per sample computes its
// row exactly as the CPU loop does (max and sum in double, the fp32 gradient times S0/N), writing its
// loss and correctness to scratch; one block then adds them up in a fixed order.
#include "lib/cuda/softmax_cross_entropy.h"

#include <cmath>

#include "lib/core/error.h"
#include "lib/cuda/check.h"
#include "lib/cuda/launch.h"
#include "lib/cuda/reduce.cuh"

namespace gradscale::cuda {
namespace {

struct RowResult {
  double loss;
  int correct;
  int bad_label;
};

__global__ void softmax_rows_kernel(const float* logits, const std::int32_t* labels, std::int64_t n,
                                    std::int64_t classes, float scale_over_n, const DeviceScale* s0,
                                    std::int64_t over, float* grad, RowResult* rows) {
  if (s0 != nullptr) scale_over_n = static_cast<float>(s0->scale / static_cast<double>(over));  // as the CPU
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const float* z = logits + i * classes;
    float* g = grad != nullptr ? grad + i * classes : nullptr;
    const std::int32_t y = labels[i];
    if (y < 0 || y >= classes) {
      rows[i] = RowResult{__longlong_as_double(0x7FF8000000000000LL), 0, 1};
      if (g != nullptr)
        for (std::int64_t k = 0; k < classes; ++k) g[k] = 0.0f;
      continue;
    }
    std::int64_t arg = 0;
    double zmax = z[0];
    for (std::int64_t k = 1; k < classes; ++k)
      if (z[k] > zmax) zmax = z[k], arg = k;
    double sum = 0;
    for (std::int64_t k = 0; k < classes; ++k) sum += exp(static_cast<double>(z[k]) - zmax);
    rows[i] = RowResult{log(sum) + zmax - static_cast<double>(z[y]), arg == y ? 1 : 0, 0};
    if (g != nullptr) {
      // fp32 gradient (softmax − onehot)/N, times S0 in fp32 before the caller's one rounding to F.
      for (std::int64_t k = 0; k < classes; ++k) {
        const auto prob = static_cast<float>(exp(static_cast<double>(z[k]) - zmax) / sum);
        g[k] = (prob - (k == y ? 1.0f : 0.0f)) * scale_over_n;
      }
    }
  }
}

__global__ void __launch_bounds__(kBlock)
    loss_sum_kernel(const RowResult* rows, std::int64_t n, DeviceLoss* result) {
  double loss = 0;
  long long correct = 0, bad = 0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    loss += rows[i].loss;
    correct += rows[i].correct;
    bad += rows[i].bad_label;
  }
  loss = device::block_reduce(loss, device::Sum());
  correct = device::block_reduce(correct, device::Sum());
  bad = device::block_reduce(bad, device::Sum());
  if (threadIdx.x == 0) *result = DeviceLoss{loss, correct, bad};
}

void launch_softmax_cross_entropy(const float* logits, const std::int32_t* labels, std::int64_t n,
                                  std::int64_t classes, float scale_over_n, const DeviceScale* s0,
                                  std::int64_t over, float* grad, RowResult* rows, DeviceLoss* result,
                                  cudaStream_t stream) {
  softmax_rows_kernel<<<grid_for(static_cast<std::size_t>(n)), kBlock, 0, stream>>>(
      logits, labels, n, classes, scale_over_n, s0, over, grad, rows);
  GS_CUDA_CHECK_LAUNCH();
  loss_sum_kernel<<<1, kBlock, 0, stream>>>(rows, n, result);
  GS_CUDA_CHECK_LAUNCH();
}

}  // namespace

void softmax_cross_entropy(CudaContext& ctx, const float* logits, const std::int32_t* labels, std::int64_t n,
                           std::int64_t classes, double loss_scale, float* grad, DeviceLoss* result,
                           std::int64_t mean_over) {
  GS_CHECK_SHAPE(n >= 1 && classes >= 1,
                 "cuda::softmax_cross_entropy: logits must be [n >= 1, classes >= 1], got ["
                     << n << ", " << classes << "]");
  GS_CHECK_NUMERIC(std::isfinite(loss_scale) && loss_scale > 0,
                   "cuda::softmax_cross_entropy: loss scale must be finite and > 0, got " << loss_scale);
  GS_CHECK(logits != nullptr && labels != nullptr && result != nullptr,
           "cuda::softmax_cross_entropy got a null pointer");
  const std::int64_t over = mean_over > 0 ? mean_over : n;
  const auto scale_over_n = static_cast<float>(loss_scale / static_cast<double>(over));  // as the CPU
  auto* rows = static_cast<RowResult*>(ctx.scratch(static_cast<std::size_t>(n) * sizeof(RowResult)));
  launch_softmax_cross_entropy(logits, labels, n, classes, scale_over_n, nullptr, over, grad, rows, result,
                               ctx.stream());
}

void softmax_cross_entropy(CudaContext& ctx, const float* logits, const std::int32_t* labels, std::int64_t n,
                           std::int64_t classes, const DeviceScale* loss_scale, float* grad, DeviceLoss* result,
                           std::int64_t mean_over) {
  GS_CHECK_SHAPE(n >= 1 && classes >= 1,
                 "cuda::softmax_cross_entropy: logits must be [n >= 1, classes >= 1], got ["
                     << n << ", " << classes << "]");
  GS_CHECK(logits != nullptr && labels != nullptr && result != nullptr && loss_scale != nullptr && grad != nullptr,
           "cuda::softmax_cross_entropy got a null pointer");
  const std::int64_t over = mean_over > 0 ? mean_over : n;
  auto* rows = static_cast<RowResult*>(ctx.scratch(static_cast<std::size_t>(n) * sizeof(RowResult)));
  launch_softmax_cross_entropy(logits, labels, n, classes, 1.0f, loss_scale, over, grad, rows, result, ctx.stream());
}

}  // namespace gradscale::cuda
