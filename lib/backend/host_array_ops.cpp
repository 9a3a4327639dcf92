// The host's ArrayOps (array_ops.h): the functions gradscale's own CPU layers use, on the caller's arrays.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "lib/backend/array_ops.h"
#include "lib/core/error.h"
#include "lib/instrument/finite_scan.h"
#include "lib/instrument/histogram.h"
#include "lib/model/join.h"

namespace gradscale {

// ---- the scale table's entries where there is none (keeps_scales() false) ----------------------------
namespace {
[[noreturn]] void no_scale_table(const char* call) {
  GS_CHECK_AS(Error, false,
              "ArrayOps::" << call
                           << ": these arrays keep no scale table (keeps_scales() is false: the caller "
                           << "decides its scales on the host)");
  std::abort();  // not reached
}
}  // namespace

void ArrayOps::queue_scaled_rounding(const float* src, float* d, std::size_t n, const RoundingScales& scales,
                                     GradSite site, int node, const Precision& p, StepMonitor& monitor,
                                     std::function<void(float)> then) {
  GS_CHECK(!(scales.divide && scales.divide_by >= 0),
           "ArrayOps::queue_scaled_rounding: a division by a host value or by an entry's S, not both");
  const float* from = src;
  float multiplier = scales.multiplier;
  if (scales.multiply_by >= 0) {
    multiply_by_local(src, d, n, scales.multiply_by);
    from = d;
    multiplier = 1.0f;
  }
  queue_rounding(from, d, n, multiplier, site, node, p, monitor, std::move(then));
  if (scales.divide_by >= 0)
    divide_by_scale(d, n, scales.divide_by);
  else if (scales.divide)
    divide(d, n, scales.divisor);
}

int ArrayOps::new_scale(double) {
  no_scale_table("new_scale");
}
int ArrayOps::decide_scale(const ScaleRule&, const float*, std::size_t, const float*, std::size_t,
                           const float*, std::size_t, Format, RoundOptions, int) {
  no_scale_table("decide_scale");
}
int ArrayOps::decide_loss_scale(const LossScaleRule&, const float*, std::size_t, Format, RoundOptions) {
  no_scale_table("decide_loss_scale");
}
void ArrayOps::multiply_by_local(const float*, float*, std::size_t, int) {
  no_scale_table("multiply_by_local");
}
void ArrayOps::divide_by_scale(float*, std::size_t, int) {
  no_scale_table("divide_by_scale");
}
int ArrayOps::join_scale(const float* const*, const std::size_t*, const int*, std::size_t, Format) {
  no_scale_table("join_scale");
}
void ArrayOps::sum_scaled_parts_at(const float* const*, const int*, std::size_t, int, float*, std::size_t) {
  no_scale_table("sum_scaled_parts_at");
}
void ArrayOps::queue_scale(int, std::function<void(const ScaleEntry&)>) {
  no_scale_table("queue_scale");
}
void ArrayOps::queue_weight_gradient(const float*, float*, std::size_t, double, int, int, const Precision&,
                                     StepMonitor&, std::function<void(double)>) {
  no_scale_table("queue_weight_gradient");
}

namespace {

class HostArrayOps final : public ArrayOps {
 public:
  void queue_rounding(const float* src, float* d, std::size_t n, float multiplier, GradSite site, int node,
                      const Precision& p, StepMonitor& monitor, std::function<void(float)> then) override {
    const float m = gradscale::round_gradient(src, d, n, multiplier, site, node, p, monitor);
    if (then) then(m);
  }
  void queue(std::function<void()> f) override { f(); }
  void flush() override {}
  float max_abs(const float* d, std::size_t n) override { return gradscale::max_abs(d, n); }
  void divide(float* d, std::size_t n, float divisor) override {
    for (std::size_t i = 0; i < n; ++i) d[i] /= divisor;
  }
  void quantize(const float* src, float* dst, std::size_t n, Format f, RoundOptions round) override {
    if (f != Format::fp32)
      gradscale::quantize(src, dst, n, f, round);
    else if (src != dst && n > 0)
      std::memcpy(dst, src, n * sizeof(float));
  }
  TensorStats statistics(const float* d, std::size_t n, Format f, RoundOptions round) override {
    return tensor_stats(d, n, f, round);
  }
  void attach(QueryStatistics& stats, StatNeeds needs, LocalScaleQuery& q, RoundOptions round) override {
    stats.attach(needs, q, round);
  }
  void to_host(const float* d, std::size_t n, float* host) override { std::copy(d, d + n, host); }
  void sum_scaled_parts(const float* const* parts, const double* scales, std::size_t count, double target,
                        float* out, std::size_t n) override {
    gradscale::sum_scaled_parts(parts, scales, count, target, out, n);
  }
  bool host_memory() const override { return true; }
};

}  // namespace

ArrayOps& host_array_ops() {
  static HostArrayOps ops;
  return ops;
}

}  // namespace gradscale
