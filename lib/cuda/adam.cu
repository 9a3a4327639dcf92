// Adam / AdamW update on the GPU (see adam.h): one grid-stride kernel; adam.cpp's element loop, with the
// bias-correction scalars read from the device step counter.
#include "lib/cuda/adam.h"

#include <algorithm>
#include <cmath>

#include "lib/core/error.h"
#include "lib/cuda/check.h"
#include "lib/cuda/launch.h"

namespace gradscale::cuda {
namespace {

// adam.cpp's floats, computed on the host where they do not depend on the step number.
struct AdamScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_factor, wd;
  bool decay_weight, decay_grad;
};

// One element of torch.optim.Adam's update (lib/optim/adam.cpp's loops).
__device__ void adam_element(float* w, const float* g, float* m, float* v, std::size_t i, const AdamScalars& p,
                             float neg_step_size, float bias_correction2_sqrt) {
  const float wi = p.decay_weight ? w[i] * p.weight_factor : w[i];
  const float gi = p.decay_grad ? g[i] + p.wd * wi : g[i];
  const float mi = m[i] * p.beta1 + p.one_minus_beta1 * gi;
  const float vi = v[i] * p.beta2 + p.one_minus_beta2 * gi * gi;
  m[i] = mi;
  v[i] = vi;
  const float denom = sqrtf(vi) / bias_correction2_sqrt + p.eps;
  w[i] = wi + neg_step_size * mi / denom;
}

__global__ void adam_kernel(float* w, const float* g, float* m, float* v, std::size_t n, AdamScalars p,
                            const DeviceOptimizerStep* step) {
  if (step->current == 0) return;  // skipped step: nothing changes
  const float neg_step_size = step->adam_neg_step_size;
  const float bias_correction2_sqrt = step->adam_bias_correction2_sqrt;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    adam_element(w, g, m, v, i, p, neg_step_size, bias_correction2_sqrt);
}

// Many parameters' updates: a block row per parameter (adam_update_many).
struct AdamJobs {
  struct Job {
    float* w;
    const float* g;
    float* m;
    float* v;
    std::size_t n;
    AdamScalars p;
    float neg_step_size, bias_correction2_sqrt;
  } job[kOptimizerJobsPerLaunch];
};
__global__ void adam_many_kernel(AdamJobs jobs) {
  const AdamJobs::Job& j = jobs.job[blockIdx.y];
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < j.n; i += stride)
    adam_element(j.w, j.g, j.m, j.v, i, j.p, j.neg_step_size, j.bias_correction2_sqrt);
}

AdamScalars scalars_of(const AdamStep& s) {
  return {s.beta1, s.one_minus_beta1, s.beta2, s.one_minus_beta2, s.eps, s.weight_factor,
          s.weight_decay, s.decay_weight, s.decay_grad};
}

void launch_adam(float* w, const float* g, float* m, float* v, std::size_t n, const AdamScalars& p,
                 const DeviceOptimizerStep* step, cudaStream_t stream) {
  adam_kernel<<<grid_for(n, 4), kBlock, 0, stream>>>(w, g, m, v, n, p, step);
  GS_CUDA_CHECK_LAUNCH();
}

}  // namespace

void adam_update(float* w, const float* g, float* m, float* v, std::size_t n, const AdamParams& p,
                 const DeviceOptimizerStep* step, cudaStream_t stream) {
  GS_CHECK_CONFIG(std::isfinite(p.lr) && p.lr >= 0 && p.beta1 >= 0 && p.beta1 < 1 && p.beta2 >= 0 &&
                      p.beta2 < 1 && std::isfinite(p.eps) && p.eps > 0 && std::isfinite(p.weight_decay) &&
                      p.weight_decay >= 0,
                  "cuda::adam_update: lr " << p.lr << ", betas " << p.beta1 << ", " << p.beta2 << ", eps "
                                           << p.eps << ", weight_decay " << p.weight_decay
                                           << " (need lr >= 0, betas in [0, 1), eps > 0, weight_decay >= 0)");
  GS_CHECK(step != nullptr, "cuda::adam_update got a null step counter");
  if (n == 0) return;
  GS_CHECK(w != nullptr && g != nullptr && m != nullptr && v != nullptr,
           "cuda::adam_update of " << n << " elements got a null pointer");
  AdamScalars s{};
  s.beta1 = static_cast<float>(p.beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - p.beta1);
  s.beta2 = static_cast<float>(p.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - p.beta2);
  s.eps = static_cast<float>(p.eps);
  s.decay_weight = p.weight_decay != 0.0 && p.decoupled;
  s.decay_grad = p.weight_decay != 0.0 && !p.decoupled;
  s.weight_factor = static_cast<float>(1.0 - p.lr * p.weight_decay);  // AdamW
  s.wd = static_cast<float>(p.weight_decay);                          // Adam
  launch_adam(w, g, m, v, n, s, step, stream);
}

void adam_update_many(const AdamJob* jobs, std::size_t count, cudaStream_t stream) {
  for (std::size_t i = 0; i < count; ++i)  // every job checked before any is launched
    GS_CHECK(jobs[i].n == 0 || (jobs[i].w != nullptr && jobs[i].g != nullptr && jobs[i].m != nullptr &&
                                jobs[i].v != nullptr),
             "cuda::adam_update_many: job " << i << " of " << jobs[i].n << " elements has a null pointer");
  AdamJobs batch;
  launch_in_batches(
      count, kOptimizerJobsPerLaunch, [&](std::size_t i) { return jobs[i].n; },
      [&](std::size_t i, std::size_t slot) {
        const AdamJob& j = jobs[i];
        batch.job[slot] = {j.w, j.g, j.m, j.v, j.n, scalars_of(j.s), j.s.neg_step_size, j.s.bias_correction2_sqrt};
      },
      [&](std::size_t in_batch, std::size_t largest) {
        adam_many_kernel<<<dim3(grid_for(largest, 4), static_cast<unsigned>(in_batch)), kBlock, 0, stream>>>(batch);
        GS_CUDA_CHECK_LAUNCH();
      });
}

}  // namespace gradscale::cuda
