// Local scales decided on the device (SPEC §5–§6 without a wait): a controller that describes its
// decision as a rule (LayerController::device_rule, lib/scaler/scale_rule.h) has it evaluated by one
// thread (decide.cuh), from statistics in device memory — by the functions here after the statistics'
// launch, or by that launch itself (stats.h: tensor_stats with a StatsDecision) — and the result is
// applied to the upstream product on the device; the host reads it with the step's measurements (CudaBackend). Every
// gradient's accumulated scale S lives in an entry of the backend's scale table for the pass.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstddef>

#include <cuda_runtime_api.h>

#include "lib/cuda/stats.h"
#include "lib/scaler/scale_rule.h"

namespace gradscale::cuda {

// One entry of a scale table (device memory).
struct DeviceScale {
  double scale = 1;    // S of a gradient: s·S_in after a decision, S0 at the loss, T at a join
  double local = 1;    // s of a decision (1 for the others)
  double unbound = 1;  // the unbound s of a decision (1 for the others)
  double limit = 0;    // what held s (ScaleLimit of lib/scaler/scale_rule.h), as a double: 0 for the others
};

// *entry ← {value, 1, 1}, queued on `stream`.
void set_scale(DeviceScale* entry, double value, cudaStream_t stream);

// *out ← {s·S_in, s, unbound} where {s, unbound} = evaluate_rule(rule, inputs): the moments of `grad`
// and `weight` for the formulas that read moments, the binades of `upstream` for measured (null where
// the formula reads nothing), and S_in = in->scale. One thread, queued on `stream`. Throws Error when a
// statistic the formula reads is null, CudaError when the launch fails.
void decide_local_scale(const ScaleRule& rule, const DeviceStats* grad, const DeviceStats* weight,
                        const DeviceStats* upstream, const DeviceScale* in, DeviceScale* out, cudaStream_t stream);

// d[i] ← d[i] / float(entry->scale) for i < n in fp32 (SPEC §4's unscale by a scale decided on the
// device), unless entry->scale is outside float32's normal range (scale_in_float_range) — then d is left as it is, and
// the host, reading the entry with the step's measurements, counts the step as non-finite (as
// unscale_accumulate). Queued on `stream`.
void divide_by_scale(float* d, std::size_t n, const DeviceScale* entry, cudaStream_t stream);

// d[i] ← src[i]·float(entry->local) for i < n (src may be d; s = 1 copies): the decided s on the fp32
// upstream product, before its one rounding (the CPU's round_gradient multiplier), in one pass. Queued
// on `stream`.
void apply_local_scale(const float* src, float* d, std::size_t n, const DeviceScale* entry,
                       cudaStream_t stream);
inline void apply_local_scale(float* d, std::size_t n, const DeviceScale* entry, cudaStream_t stream) {
  apply_local_scale(d, d, n, entry, stream);
}

}  // namespace gradscale::cuda
