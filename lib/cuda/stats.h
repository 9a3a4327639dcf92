// SPEC §3 statistics on the GPU, the twin of lib/instrument's tensor_stats(): in one pass over a float32
// tensor, the round-to-F class counts (cut at the same round_thresholds(F), computed on the host from
// quantize()), the binade histogram (bins kBinadeMin..kBinadeMax) and the moments (double sums, min,
// max, max|v|, smallest non-zero |v|). Counts and bins equal tensor_stats exactly; the sums are added
// in another order (relative 1e-6 promised, far better in practice). Results are deterministic: the
// grid depends only on the size, and partial sums are combined in a fixed order.
//
// The batched entry fills one device array for several tensors, so a step needs one device→host copy.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstddef>
#include <vector>

#include "lib/cuda/context.h"
#include "lib/cuda/im2col.h"
#include "lib/instrument/histogram.h"
#include "lib/scaler/scale_rule.h"

namespace gradscale::cuda {

// What the device writes per tensor: TensorStats' fields as plain values (to_tensor_stats converts).
struct DeviceStats {
  unsigned long long zero, underflow, subnormal, normal, overflow, nonfinite, elements, count;
  double sum, sum_squares, min, max, max_abs, min_nonzero_abs;
  unsigned long long binades[kBinadeCount];
};
TensorStats to_tensor_stats(const DeviceStats& d);

// One tensor of a batch: n floats at `data` (device memory), classified for format F.
struct StatsJob {
  const float* data = nullptr;
  std::size_t n = 0;
  Format format = Format::fp32;
  RoundOptions round{};
};
// The job for n values at `data` (a tensor's size, as Tensor counts it).
inline StatsJob job_of(const float* data, std::int64_t n, Format f, RoundOptions round) {
  return StatsJob{data, static_cast<std::size_t>(n), f, round};
}

// out[i] ← the statistics of jobs[i] for i < count (`jobs` on the host, `out` in device memory),
// queued on ctx.stream(); uses ctx.scratch(). One kernel launch per 32 tensors. Throws Error for a
// null pointer with n > 0 or more than 2^40 elements in one tensor, CudaError when a launch fails.
void tensor_stats(CudaContext& ctx, const StatsJob* jobs, std::size_t count, DeviceStats* out);
inline void tensor_stats(CudaContext& ctx, const std::vector<StatsJob>& jobs, DeviceStats* out) {
  tensor_stats(ctx, jobs.data(), jobs.size(), out);
}
// One tensor.
void tensor_stats(CudaContext& ctx, const float* data, std::size_t n, Format f, RoundOptions opt,
                  DeviceStats* out);

struct DeviceScale;  // an entry of a scale table (local_scale.h)

// What a statistics launch decides once its statistics are complete: one of local_scale.h's decisions
// (the same device function), taken by one thread of the launch's last block to finish, so the decision
// has no kernel of its own. The statistics are also written to `out` as without it.
struct StatsDecision {
  enum Kind : int {
    kLocalScale,       // decide_local_scale(rule, ...) from jobs grad / weight / upstream (-1: not read)
    kWeightGradScale,      // SPEC §6.5's r from the largest maximum of all the jobs, u_max and S_in
    kLossScale,            // S0 = loss_scale_decision(loss, job 0's statistics)
    kWeightGradScaleEach,  // each job's own r (its maximum, u_max and S_in) into outs[job]
  };
  static constexpr int kMaxTensors = 3;  // the statistics a launch with a decision takes
  Kind kind = kLocalScale;
  ScaleRule rule;
  int grad = -1, weight = -1, upstream = -1;
  double u_max = 0;
  LossScaleRule loss;
  const DeviceScale* in = nullptr;  // S_in (kLocalScale, kWeightGradScale, kWeightGradScaleEach)
  DeviceScale* out = nullptr;       // every kind but kWeightGradScaleEach
  DeviceScale* outs[kMaxTensors] = {};  // kWeightGradScaleEach: job k's r into outs[k]

  // `rule`'s local scale, its statistics in the backend's order: g and W (jobs 0 and 1) when the formula
  // reads moments, then the upstream product.
  static StatsDecision local_scale(const ScaleRule& rule, const DeviceScale* in, DeviceScale* out) {
    StatsDecision d;
    d.rule = rule;
    const bool moments = rule_reads_moments(rule.formula);
    d.grad = moments ? 0 : -1;
    d.weight = moments ? 1 : -1;
    d.upstream = rule_reads_upstream(rule.formula) ? (moments ? 2 : 0) : -1;
    d.in = in;
    d.out = out;
    return d;
  }
  static StatsDecision weight_grad_scale(double u_max, const DeviceScale* in, DeviceScale* out) {
    StatsDecision d;
    d.kind = kWeightGradScale;
    d.u_max = u_max;
    d.in = in;
    d.out = out;
    return d;
  }
  // The r of each of `count` weight gradients from its own statistics (a layer's gradients, one launch):
  // what `count` launches of weight_grad_scale, one tensor each, decide.
  static StatsDecision weight_grad_scale_each(double u_max, const DeviceScale* in, DeviceScale* const* outs,
                                              int count) {
    StatsDecision d;
    d.kind = kWeightGradScaleEach;
    d.u_max = u_max;
    d.in = in;
    for (int k = 0; k < count && k < kMaxTensors; ++k) d.outs[k] = outs[k];
    return d;
  }
  static StatsDecision loss_scale(const LossScaleRule& loss, DeviceScale* out) {
    StatsDecision d;
    d.kind = kLossScale;
    d.loss = loss;
    d.out = out;
    return d;
  }
};
// tensor_stats, then `then` (device memory for in and out), in one launch. At most 3 jobs (those a
// decision reads). Throws Error for a job the decision's formula needs and was not given (as
// decide_local_scale), a null entry, or more than 3 jobs.
void tensor_stats(CudaContext& ctx, const StatsJob* jobs, std::size_t count, DeviceStats* out,
                  const StatsDecision& then);

// col2im (im2col.h) measured in the same pass: gx ← col2im(cols, g, layout) (the same sums, im2col.cuh),
// *out ← the statistics of those n·C·h·w values for F as tensor_stats computes them over gx (the same
// kernel, grid and walk: the same bits), and then `then` when not null (on that one tensor) — a
// convolution's upstream product measured for its controller without a pass of its own. Throws as
// col2im and tensor_stats.
void col2im_measured(CudaContext& ctx, const float* cols, const ConvGeometry& g, ColumnLayout layout, float* gx,
                     Format f, RoundOptions round, DeviceStats* out, const StatsDecision* then);

// How measure_and_round stores the values it measures.
// A weight gradient's r decided by its rounding's own launch (StoredRounding::decides_r): SPEC §6.5's
// r = weight_grad_range_scale(m, u_max, S_in), m the values' largest finite |v| (infinite when one is not
// finite) and S_in = in->scale, written as {r·S_in, r, r} into `out` before the pass reads its device
// values, which may point into `out` — what tensor_stats with StatsDecision::weight_grad_scale decides
// over the same values. For a tensor of one block (n ≤ one_block_values()).
struct WeightGradDecision {
  double u_max = 0;
  const DeviceScale* in = nullptr;
  DeviceScale* out = nullptr;
};
// The largest tensor a statistics launch walks with one block.
std::size_t one_block_values();

struct StoredRounding {
  float* dst = nullptr;  // may be the job's data
  bool round = true;     // dst[i] ← quantize(v, F); false: v itself
  float multiplier = 1.0f;
  const double* device_multiplier = nullptr;  // when not null, m is this device value (a scale entry's
                                              // `local`, local_scale.h) instead of `multiplier`
  // With `master`, each stored value is also unscaled into it as unscale_accumulate does (unscale.h:
  // master[i] ← master[i] + dst[i] / float(S), *found_inf ← 1 when a stored value or a result is not
  // finite or S is outside float32's normal range), S being `scale`, or *device_scale when not null.
  float* master = nullptr;
  double scale = 1;
  const double* device_scale = nullptr;
  int* found_inf = nullptr;
  // Without a master, the stored values may be divided after their rounding (SPEC §4's unscale as
  // ArrayOps' divide and divide_by_scale do it): dst[i] ← quantize(v, F) / divisor in fp32 when `divide`,
  // or / float(*device_divisor) when that is not null (a scale entry's S) and S is inside float32's
  // normal range (scale_in_float_range; outside it the values stay undivided, as divide_by_scale leaves
  // them). The statistics are of v, as without a division.
  bool divide = false;
  float divisor = 1.0f;
  const double* device_divisor = nullptr;
  // With `decides_r`, r first (see WeightGradDecision), in the same launch.
  const WeightGradDecision* decides_r = nullptr;
};
// A gradient's rounding in one pass (SPEC §4–§5): for i < job.n, v = m·job.data[i] (one fp32
// multiplication, none when m is 1, as cuda::quantize's multiplier and apply_local_scale), *out ← the
// statistics of v for job.format, and dst[i] ← quantize(v, F) (or v). The statistics are tensor_stats's
// bits (the same kernel, grid and order); the stored values are those of the multiplication and
// quantize(). One read and one write instead of the multiplication's, the statistics' and the rounding's
// passes (and the unscale's, with `master`, or the division's). Queued on ctx.stream(); throws as
// tensor_stats, for a null dst with n > 0, as unscale_accumulate for the unscale, for a division
// together with a master, and for an r decided over more than one block's values.
void measure_and_round(CudaContext& ctx, const StatsJob& job, const StoredRounding& stored, DeviceStats* out);

// The largest |v| alone, without the rest of the pass: *out (device memory) ← the largest of the
// values' bits with the sign cleared (order-free, so exact), queued on `stream`; 0 for n = 0. Bits at or
// above 0x7F800000 mean a value was not finite (lib/instrument's max_abs reads that as +inf:
// max_abs_of_bits). What a join or a weight gradient's factor r is chosen from (ExternalBackward).
void max_abs_bits(const float* data, std::size_t n, unsigned* out, cudaStream_t stream);
// Those bits as lib/instrument's max_abs: +inf when a value was not finite.
float max_abs_of_bits(unsigned bits);

// The one device→host copy of a step: `count` results from device memory (waits for ctx.stream()).
std::vector<TensorStats> download_stats(CudaContext& ctx, const DeviceStats* out, std::size_t count);

}  // namespace gradscale::cuda
