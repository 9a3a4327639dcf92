// The precision model's steps on raw float32 arrays in a backend's memory (SPEC §3–§5), for a backward
// pass that another engine computes: ExternalBackward (lib/train/external_backward.h), and through it
// the PyTorch plug-in, hands over the addresses of PyTorch's tensors — host memory on the CPU, device
// memory on a GPU — and every rounding, statistic and maximum it needs is taken here, where the data
// lives. The host's are lib/instrument's and round_gradient as gradscale's own layers use them; lib/cuda's
// are its kernels (CudaBackend::array_ops), with the same counts and bits (docs/gpu.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "lib/layers/precision_ops.h"
#include "lib/scaler/scale_rule.h"

namespace gradscale {

// An entry of a device's scale table as the host reads it back (lib/cuda/local_scale.h's DeviceScale):
// the scale S a gradient carries, and for a decision its s, unbound s and what held s (ScaleLimit).
struct ScaleEntry {
  double scale = 1, local = 1, unbound = 1;
  int limit = 0;
};

// A rounding's factors (ArrayOps::queue_scaled_rounding): before the rounding, the fp32 multiplier or
// the s of a scale entry (multiply_by_local's factor); after it, a division of the stored values by a
// host divisor (divide's) or by the S of a scale entry (divide_by_scale's), or none.
struct RoundingScales {
  float multiplier = 1.0f;  // used when multiply_by is -1
  int multiply_by = -1;     // a scale entry whose s multiplies instead
  bool divide = false;      // d[i] / divisor after the rounding
  float divisor = 1.0f;
  int divide_by = -1;  // a scale entry whose S divides after the rounding (not together with `divide`)
};

class ArrayOps {
 public:
  virtual ~ArrayOps() = default;
  // round_gradient's contract (lib/layers/precision_ops.h) from n values at `src` into `d` (src may be d;
  // src is left as it is): the multiplier in fp32 and the one rounding now; the records — the site's
  // statistics into `monitor` when it records, popart_als's counts of a weight gradient, the found_inf
  // check — then `then(max|d| before rounding)` (inf when something is not finite; `then` may be
  // empty), in the order the calls were made: at once on the host, at the next flush() on a device,
  // where every queued measurement comes back in one copy. `monitor` must live until then.
  virtual void queue_rounding(const float* src, float* d, std::size_t n, float multiplier, GradSite site,
                              int node, const Precision& p, StepMonitor& monitor,
                              std::function<void(float)> then) = 0;
  // queue_rounding with `scales`' factors: multiply_by_local (or the multiplier), queue_rounding, then
  // divide or divide_by_scale — the same values and records, in one pass over the data where the
  // memory allows (a device, unless popart_als counts the weight gradient between the passes).
  virtual void queue_scaled_rounding(const float* src, float* d, std::size_t n, const RoundingScales& scales,
                                     GradSite site, int node, const Precision& p, StepMonitor& monitor,
                                     std::function<void(float)> then);
  // `f` in order with the queued roundings' records (a monitor change whose order with theirs matters:
  // which layer was the first non-finite one). At once on the host.
  virtual void queue(std::function<void()> f) = 0;
  // Makes every queued record and runs what was queued, in order (one wait on a device).
  virtual void flush() = 0;
  // max|d[i]| (inf when one is not finite), as lib/instrument's max_abs.
  virtual float max_abs(const float* d, std::size_t n) = 0;
  // max_abs of each of `count` arrays (arrays[k]: sizes[k] values), into out[k]: a join's parts at
  // once (one wait on a device).
  virtual void max_abs_each(const float* const* arrays, const std::size_t* sizes, std::size_t count,
                            float* out) {
    for (std::size_t k = 0; k < count; ++k) out[k] = max_abs(arrays[k], sizes[k]);
  }
  // d[i] = d[i] / divisor in fp32 (the unscale of SPEC §4).
  virtual void divide(float* d, std::size_t n, float divisor) = 0;
  // dst[i] = quantize(src[i], f): a forward value or working weight rounded to F, in one pass (src may
  // be dst; fp32 copies).
  virtual void quantize(const float* src, float* dst, std::size_t n, Format f, RoundOptions round) = 0;
  // SPEC §3's counts, histogram and moments of n values against f.
  virtual TensorStats statistics(const float* d, std::size_t n, Format f, RoundOptions round) = 0;
  // QueryStatistics::attach's work for a query whose raw views (grad, weight, upstream) point into this
  // memory: the statistics `needs` names into `stats`, the query pointed at them. A device leaves the
  // query without raw views (a controller decides from the statistics). Not the product range (it
  // needs gradscale's own layers).
  virtual void attach(QueryStatistics& stats, StatNeeds needs, LocalScaleQuery& q, RoundOptions round) = 0;
  // n values at `d` into host memory.
  virtual void to_host(const float* d, std::size_t n, float* host) = 0;
  // SPEC §5's join sum, lib/model/join.h's sum_scaled_parts where the arrays live: out[i] = Σ_k
  // parts[k][i]·float(target/scales[k]), from 0, one fp32 product and one fp32 sum per term, in order.
  virtual void sum_scaled_parts(const float* const* parts, const double* scales, std::size_t count,
                                double target, float* out, std::size_t n) = 0;
  // ---- scales decided where the data lives, without a wait: a device's scale table -----------------
  // A device keeps a step's scales in a table whose entries (numbered from 0) live until the next
  // flush(), which brings them to the host with the records. Host memory keeps none (keeps_scales()
  // false): its caller decides every scale on the host, and the entries below throw Error.
  virtual bool keeps_scales() const { return false; }
  // A new entry {value, 1, 1, 0}.
  virtual int new_scale(double value);
  // SPEC §5 step 1 by a controller's rule (`rule.reduction` set: K of the layer's GEMM), from the
  // statistics its formula reads against format f — the moments of `grad` and `weight`, or those of the
  // fp32 upstream product `upstream` — and S_in = the scale of entry `in`: a new entry {s·S_in, s,
  // unbound s, limit} (lib/cuda/local_scale.h's decide_local_scale). A pointer the formula does not
  // read may be null.
  virtual int decide_scale(const ScaleRule& rule, const float* grad, std::size_t grad_n, const float* weight,
                           std::size_t weight_n, const float* upstream, std::size_t upstream_n, Format f,
                           RoundOptions round, int in);
  // S0 by a scaler's rule (Scaler::device_loss_rule) from the statistics of the n fp32 values at `src`
  // (the loss gradient at scale 1) against format f: a new entry {S0, S0, floor, 0}, whose s is S0 too
  // (the loss gradient's S_in is 1: multiply_by_local applies it) (lib/cuda/local_scale.h's
  // decide_loss_scale).
  virtual int decide_loss_scale(const LossScaleRule& rule, const float* src, std::size_t n, Format f,
                                RoundOptions round);
  // d[i] = src[i]·float(s of `entry`) in fp32 (src may be d): a decided s on the fp32 product before
  // its one rounding, as round_gradient's multiplier.
  virtual void multiply_by_local(const float* src, float* d, std::size_t n, int entry);
  // d[i] = d[i] / float(S of `entry`) in fp32 (SPEC §4's unscale), unless S is outside float32's
  // normal range (scale_in_float_range): d is then left as it is, for the caller to check S at flush.
  virtual void divide_by_scale(float* d, std::size_t n, int entry);
  // How many parts join_scale takes at most (0: none, where keeps_scales() is false).
  virtual std::size_t max_join_parts() const { return 0; }
  // SPEC §5's join target (lib/model/join_target.h) for gradient format f from each part's max|g|
  // (parts[k]: sizes[k] fp32 values) and its scale (entry scales[k]): a new entry {T, 1, 1, 0}.
  virtual int join_scale(const float* const* parts, const std::size_t* sizes, const int* scales,
                         std::size_t count, Format f);
  // sum_scaled_parts with every factor T/S_k read from the table: T from entry `target`, S_k from
  // entry scales[k].
  virtual void sum_scaled_parts_at(const float* const* parts, const int* scales, std::size_t count,
                                   int target, float* out, std::size_t n);
  // `then(the entry)` at flush(), in order with the queued records.
  virtual void queue_scale(int entry, std::function<void(const ScaleEntry&)> then);
  // SPEC §6.5 decided where the data lives, without a wait, for the n fp32 values of a weight-gradient
  // part at `src` (src may be d; src is left as it is) at S_in = the scale of entry `in`: r =
  // weight_grad_range_scale(max|src|, u_max, S_in) (lib/scaler/scale_rule.h, the rule
  // LayerController::device_weight_grad_bound describes) from src's own statistics; d = r·src rounded as
  // queue_rounding(site weight, `node`) rounds and records it; then d divided by r·S_in in fp32, unless
  // r·S_in is outside float32's range (then, after that rounding's records, `monitor` notes a
  // non-finite value at `node`, as the host path does). `then(r)` runs with the rounding's records, at
  // flush().
  virtual void queue_weight_gradient(const float* src, float* d, std::size_t n, double u_max, int in,
                                     int node, const Precision& p, StepMonitor& monitor,
                                     std::function<void(double)> then);
  // Orders this work on the caller's stream (a cudaStream_t as an integer, 0: the legacy default
  // stream); the host has none. Naming the stream in use again waits for nothing. An entry that returns
  // something measured waits for it; the others are queued.
  virtual void set_stream(std::uintptr_t /*stream*/) {}
  // Whether the arrays live in host memory (their addresses may be read by the caller directly).
  virtual bool host_memory() const = 0;
};

// The host's (stateless): every entry is the lib/instrument / lib/layers function of the same name.
ArrayOps& host_array_ops();

}  // namespace gradscale
