// Fused multi-tensor unscale and non-finite check (see unscale.h): grid (blocks, tensors), the tensor
// table passed by value, one flag write per block that saw a non-finite value.
#include "lib/cuda/unscale.h"

#include <algorithm>
#include <cmath>

#include "lib/core/error.h"
#include "lib/cuda/check.h"
#include "lib/cuda/launch.h"

namespace gradscale::cuda {
namespace {

constexpr int kJobsPerLaunch = 32;

struct UnscaleTable {
  const float* grad[kJobsPerLaunch];
  float* master[kJobsPerLaunch];
  unsigned long long n[kJobsPerLaunch];
  float scale[kJobsPerLaunch];
  const double* scale_on_device[kJobsPerLaunch];  // read instead of `scale` when not null
  int count;
};

__global__ void unscale_kernel(UnscaleTable table, int* found_inf) {
  const int job = static_cast<int>(blockIdx.y);
  const float* g = table.grad[job];
  float* master = table.master[job];
  const std::size_t n = table.n[job];
  const double* on_device = table.scale_on_device[job];
  const float s = on_device != nullptr ? static_cast<float>(*on_device) : table.scale[job];
  // A scale outside float32's normal range cannot be divided out (x / inf wipes the gradient to 0): the
  // step counts as non-finite, as on the CPU (lib/scaler/scale_range.h: [2^-126, FLT_MAX]).
  bool bad = !(s >= 1.17549435e-38f && s <= 3.40282347e+38f);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float x = g[i];
    bad |= !isfinite(x);
    if (master != nullptr) {
      const float r = master[i] + x / s;
      master[i] = r;
      bad |= !isfinite(r);
    }
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found_inf = 1;  // every writer stores the same 1
}

void launch_unscale(const UnscaleTable& table, std::size_t largest, int* found_inf, cudaStream_t stream) {
  unscale_kernel<<<dim3(grid_for(largest, 4, 1024), static_cast<unsigned>(table.count)), kBlock, 0, stream>>>(
      table, found_inf);
  GS_CUDA_CHECK_LAUNCH();
}

}  // namespace

void unscale_accumulate(const UnscaleJob* jobs, std::size_t count, int* found_inf, cudaStream_t stream) {
  if (count == 0) return;
  GS_CHECK(jobs != nullptr && found_inf != nullptr, "cuda::unscale_accumulate got a null jobs array or flag");
  for (std::size_t i = 0; i < count; ++i) {
    GS_CHECK(jobs[i].grad != nullptr || jobs[i].n == 0,
             "cuda::unscale_accumulate: gradient " << i << " of " << jobs[i].n << " elements is null");
    if (jobs[i].scale_on_device != nullptr) continue;  // decided on the device, checked with the step's records
    const auto s = static_cast<float>(jobs[i].scale);  // the CPU divides by float(S) too
    GS_CHECK_NUMERIC(std::isfinite(s) && s > 0, "cuda::unscale_accumulate: scale of gradient "
                                                    << i << " must be finite and > 0 as a float, got "
                                                    << jobs[i].scale);
  }
  for (std::size_t first = 0; first < count; first += kJobsPerLaunch) {
    UnscaleTable table{};
    table.count = static_cast<int>(std::min<std::size_t>(kJobsPerLaunch, count - first));
    std::size_t largest = 0;
    for (int j = 0; j < table.count; ++j) {
      const UnscaleJob& job = jobs[first + static_cast<std::size_t>(j)];
      table.grad[j] = job.grad;
      table.master[j] = job.master;
      table.n[j] = job.n;
      table.scale[j] = static_cast<float>(job.scale);
      table.scale_on_device[j] = job.scale_on_device;
      largest = std::max(largest, job.n);
    }
    launch_unscale(table, largest, found_inf, stream);
  }
}

}  // namespace gradscale::cuda
