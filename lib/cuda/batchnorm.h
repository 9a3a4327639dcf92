// Batch normalisation on the GPU, the twin of lib/layers/batchnorm.cpp: per-channel statistics in
// double (two passes), y = γ·(x − mean)·invstd + β in double with one rounding to fp32, PyTorch's
// running statistics; the backward is linear in g, so the input gradient keeps the scale S (SPEC §5)
// and dγ, dβ come out at scale S for the usual rounding and unscaling. The caller rounds y and gx to F
// (cuda::quantize) and unscales dγ, dβ (cuda::unscale_accumulate), as the CPU layer's shared steps do.
// The per-channel sums are added in another order than on the CPU: results agree to about one fp32 ulp.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstdint>

#include "lib/cuda/context.h"

namespace gradscale::cuda {

// x is [n, channels, plane] (plane = H·W, or 1 for [N, C] inputs).
struct BatchNormShape {
  std::int64_t n = 0, channels = 0, plane = 1;
  std::int64_t size() const { return n * channels * plane; }
};

// Training forward: batch mean and biased variance per channel (needs n·plane ≥ 2), written to
// mean/invstd (double [channels], kept for the backward); running_mean/running_var (fp32 [channels])
// ← (1 − momentum)·r + momentum·batch (unbiased variance); y ← the normalised output in fp32. gamma and
// beta are the working copies (fp32 [channels], values in F). All device pointers; queued on
// ctx.stream(), with ctx.scratch() for the per-channel partial sums (channels × up to 64 doubles).
void batchnorm_forward_training(CudaContext& ctx, const float* x, const BatchNormShape& s, const float* gamma,
                                const float* beta, double eps, double momentum, float* running_mean,
                                float* running_var, double* mean, double* invstd, float* y);
// Eval forward: normalises with the running statistics (mean/invstd written as in training).
void batchnorm_forward_eval(const float* x, const BatchNormShape& s, const float* gamma, const float* beta,
                            const float* running_mean, const float* running_var, double eps, double* mean,
                            double* invstd, float* y, cudaStream_t stream);
// Backward from gy (at scale S) of the forward that wrote mean/invstd: grad_beta = Σg, grad_gamma = Σg·x̂
// per channel (fp32 at scale S); when gx is not null, gx = γ·invstd·(g − Σg/M − x̂·Σ(g·x̂)/M) in
// training (M = n·plane) or γ·invstd·g in eval. Uses ctx.scratch() and ctx.stream().
void batchnorm_backward(CudaContext& ctx, const float* x, const float* gy, const BatchNormShape& s,
                        const float* gamma, const double* mean, const double* invstd, bool training,
                        float* gx, float* grad_gamma, float* grad_beta);

}  // namespace gradscale::cuda
