// The host's ArrayOps (array_ops.h): the functions gradscale's own CPU layers use, on the caller's arrays.
#include <algorithm>
#include <cstring>

#include "lib/backend/array_ops.h"
#include "lib/instrument/finite_scan.h"
#include "lib/instrument/histogram.h"
#include "lib/model/join.h"

namespace gradscale {
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
