// lib/cuda's ArrayOps (see array_ops.h): round_gradient's records from one statistics kernel and one
// copy, as CudaBackend::round_gradient queues them, but measured at once — the caller (ExternalBackward)
// reads the maximum as soon as the rounding is made.
#include "lib/cuda/array_ops.h"

#include <cmath>
#include <limits>

#include "lib/cuda/device_buffer.h"
#include "lib/cuda/edge_counts.h"
#include "lib/cuda/elementwise.h"
#include "lib/cuda/quantize.h"
#include "lib/cuda/stats.h"
#include "lib/instrument/log_moments.h"
#include "lib/instrument/round_thresholds.h"

namespace gradscale::cuda {
namespace {

float max_of(const TensorStats& s) {  // lib/instrument's max_abs: infinite when something is not finite
  return s.nonfinite > 0 ? std::numeric_limits<float>::infinity() : static_cast<float>(s.max_abs);
}

class CudaArrayOps final : public ArrayOps {
 public:
  explicit CudaArrayOps(CudaContext& ctx) : ctx_(ctx), stats_(3), edge_(1) {}

  float round_gradient(float* d, std::size_t n, float multiplier, GradSite site, int node, const Precision& p,
                       StepMonitor& monitor) override {
    const Format f = p.gradient_format();
    const bool quantized = site != GradSite::weight || p.quantize_weight_grads;
    cudaStream_t stream = ctx_.stream();
    if (multiplier != 1.0f) cuda::quantize(d, d, n, Format::fp32, p.round, multiplier, stream);  // d·multiplier
    tensor_stats(ctx_, d, n, f, p.round, stats_.data());
    const bool edge = site == GradSite::weight && monitor.gradient_edge > 0;
    if (edge) {  // popart_als counts the weight gradients about its edge as they will be stored
      edge_.fill_bytes(0, stream);
      count_about_edge(d, n,
                       edge_threshold_bits(static_cast<float>(monitor.gradient_edge), quantized ? f : Format::fp32,
                                           p.round),
                       edge_.data(), stream);
    }
    if (quantized) cuda::quantize(d, d, n, f, p.round, 1.0f, stream);
    const TensorStats s = download_stats(ctx_, stats_.data(), 1).at(0);
    if (monitor.record) store_gradient_statistics(monitor, site, node, s);
    if (edge) {
      DeviceEdgeCounts c{};
      edge_.download(&c, 1, stream);
      ctx_.synchronize();
      monitor.grad_below_edge += c.below;
      monitor.grad_above_edge += c.above;
    }
    const float m = max_of(s);
    check_rounded_max(monitor, site, node, m, quantized, p);
    return m;
  }

  float max_abs(const float* d, std::size_t n) override {
    return max_of(statistics(d, n, Format::fp32, RoundOptions{}));
  }

  void divide(float* d, std::size_t n, float divisor) override { cuda::divide(d, n, divisor, ctx_.stream()); }

  void quantize(float* d, std::size_t n, Format f, RoundOptions round) override {
    if (f != Format::fp32) cuda::quantize(d, d, n, f, round, 1.0f, ctx_.stream());
  }

  TensorStats statistics(const float* d, std::size_t n, Format f, RoundOptions round) override {
    tensor_stats(ctx_, d, n, f, round, stats_.data());
    return download_stats(ctx_, stats_.data(), 1).at(0);
  }

  void attach(QueryStatistics& stats, StatNeeds needs, LocalScaleQuery& q, RoundOptions round) override {
    std::vector<StatsJob> jobs;
    std::vector<TensorStats*> targets;
    std::vector<const TensorStats**> slots;
    const auto ask = [&](const float* data, std::int64_t n, TensorStats* target, const TensorStats** slot) {
      jobs.push_back(job_of(data, n, q.format, round));
      targets.push_back(target);
      slots.push_back(slot);
    };
    if ((needs & kNeedGradMoments) && q.grad) ask(q.grad, q.grad_size, &stats.grad_moments, &q.grad_moments);
    if ((needs & kNeedWeightMoments) && q.weight)
      ask(q.weight, q.weight_size, &stats.weight_moments, &q.weight_moments);
    if ((needs & kNeedUpstreamStats) && q.upstream)
      ask(q.upstream, q.upstream_size, &stats.upstream_stats, &q.upstream_stats);
    if (!jobs.empty()) {
      tensor_stats(ctx_, jobs, stats_.data());
      const std::vector<TensorStats> got = download_stats(ctx_, stats_.data(), jobs.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        *targets[i] = got[i];
        *slots[i] = targets[i];
      }
    }
    if ((needs & kNeedGradLogMoments) && q.grad) {  // on the host, from a copy (as CudaBackend does)
      std::vector<float> host(static_cast<std::size_t>(q.grad_size));
      to_host(q.grad, host.size(), host.data());
      stats.grad_log_moments = log_abs_moments(host.data(), host.size());
      q.grad_log_moments = &stats.grad_log_moments;
    }
    q.grad = q.weight = q.upstream = nullptr;  // device memory: a controller decides from the statistics
  }

  void to_host(const float* d, std::size_t n, float* host) override {
    if (n == 0) return;
    GS_CUDA_CHECK(cudaMemcpyAsync(host, d, n * sizeof(float), cudaMemcpyDeviceToHost, ctx_.stream()));
    ctx_.synchronize();
  }

  void set_stream(std::uintptr_t stream) override {
    ctx_.set_stream(reinterpret_cast<cudaStream_t>(stream));  // NOLINT: the caller's stream handle
  }

  bool host_memory() const override { return false; }

 private:
  CudaContext& ctx_;
  DeviceBuffer<DeviceStats> stats_;  // one rounding's, or a query's three
  DeviceBuffer<DeviceEdgeCounts> edge_;
};

}  // namespace

std::unique_ptr<ArrayOps> make_array_ops(CudaContext& ctx) { return std::make_unique<CudaArrayOps>(ctx); }

}  // namespace gradscale::cuda
