// SGD update on the GPU (see sgd.h): one grid-stride kernel; sgd.cpp's element loop verbatim.
#include "lib/cuda/sgd.h"

#include <algorithm>
#include <cmath>

#include "lib/core/error.h"
#include "lib/cuda/check.h"
#include "lib/cuda/launch.h"

namespace gradscale::cuda {
namespace {

constexpr std::size_t kSgdJobsPerLaunch = 32;

struct SgdScalars {
  float lr, momentum, weight_decay;
  bool nesterov, with_buffer;
};

// One element of torch.optim.SGD's update (lib/optim/sgd.cpp's loop body).
__device__ void sgd_element(float* w, const float* g, float* buf, std::size_t i, const SgdScalars& p, bool first) {
  const float d = p.weight_decay != 0.0f ? g[i] + p.weight_decay * w[i] : g[i];
  if (!p.with_buffer) {
    w[i] = w[i] - p.lr * d;
    return;
  }
  const float b = first ? d : buf[i] * p.momentum + d;
  buf[i] = b;
  const float u = p.nesterov ? d + p.momentum * b : b;
  w[i] = w[i] - p.lr * u;
}

__global__ void sgd_kernel(float* w, const float* g, float* buf, std::size_t n, SgdScalars p,
                           const DeviceOptimizerStep* step) {
  const long long t = step->current;
  if (t == 0) return;         // skipped step: nothing changes
  const bool first = t == 1;  // torch initialises the buffer to a copy of d on its first step
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    sgd_element(w, g, buf, i, p, first);
}

// Many parameters' updates: a block row per parameter (sgd_update_many).
struct SgdJobs {
  struct Job {
    float* w;
    const float* g;
    float* buf;
    std::size_t n;
    SgdScalars p;
    bool first;
  } job[kSgdJobsPerLaunch];
};
__global__ void sgd_many_kernel(SgdJobs jobs) {
  const SgdJobs::Job& j = jobs.job[blockIdx.y];
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < j.n; i += stride)
    sgd_element(j.w, j.g, j.buf, i, j.p, j.first);
}

void launch_sgd(float* w, const float* g, float* buf, std::size_t n, const SgdScalars& p,
                const DeviceOptimizerStep* step, cudaStream_t stream) {
  sgd_kernel<<<grid_for(n, 4), kBlock, 0, stream>>>(w, g, buf, n, p, step);
  GS_CUDA_CHECK_LAUNCH();
}

}  // namespace

void sgd_update(float* w, const float* g, float* momentum_buffer, std::size_t n, const SgdParams& p,
                const DeviceOptimizerStep* step, cudaStream_t stream) {
  GS_CHECK_CONFIG(std::isfinite(p.lr) && p.lr >= 0 && p.momentum >= 0 && p.momentum < 1 &&
                      std::isfinite(p.weight_decay) && p.weight_decay >= 0 && (!p.nesterov || p.momentum > 0),
                  "cuda::sgd_update: lr " << p.lr << ", momentum " << p.momentum << ", weight_decay "
                                          << p.weight_decay << ", nesterov " << p.nesterov
                                          << " (need lr >= 0, momentum in [0, 1), weight_decay >= 0, "
                                             "nesterov only with momentum > 0)");
  GS_CHECK(step != nullptr, "cuda::sgd_update got a null step counter");
  GS_CHECK((p.momentum > 0) == (momentum_buffer != nullptr),
           "cuda::sgd_update: a momentum buffer is needed exactly when momentum > 0 (momentum " << p.momentum
                                                                                                << ")");
  if (n == 0) return;
  GS_CHECK(w != nullptr && g != nullptr, "cuda::sgd_update of " << n << " elements got a null pointer");
  const SgdScalars s{static_cast<float>(p.lr), static_cast<float>(p.momentum),
                     static_cast<float>(p.weight_decay), p.nesterov, momentum_buffer != nullptr};
  launch_sgd(w, g, momentum_buffer, n, s, step, stream);
}

void sgd_update_many(const SgdJob* jobs, std::size_t count, cudaStream_t stream) {
  for (std::size_t i = 0; i < count; ++i) {  // every job checked before any is launched
    const SgdJob& j = jobs[i];
    GS_CHECK((j.s.momentum > 0) == (j.momentum_buffer != nullptr),
             "cuda::sgd_update_many: job " << i << " needs a momentum buffer exactly when momentum > 0 (momentum "
                                           << j.s.momentum << ")");
    GS_CHECK(j.n == 0 || (j.w != nullptr && j.g != nullptr),
             "cuda::sgd_update_many: job " << i << " of " << j.n << " elements has a null pointer");
  }
  SgdJobs batch;
  launch_in_batches(
      count, kSgdJobsPerLaunch, [&](std::size_t i) { return jobs[i].n; },
      [&](std::size_t i, std::size_t slot) {
        const SgdJob& j = jobs[i];
        batch.job[slot] = {j.w, j.g, j.momentum_buffer, j.n,
                           {j.s.lr, j.s.momentum, j.s.weight_decay, j.s.nesterov, j.momentum_buffer != nullptr},
                           j.s.first};
      },
      [&](std::size_t in_batch, std::size_t largest) {
        sgd_many_kernel<<<dim3(grid_for(largest, 4), static_cast<unsigned>(in_batch)), kBlock, 0, stream>>>(batch);
        GS_CUDA_CHECK_LAUNCH();
      });
}

}  // namespace gradscale::cuda
