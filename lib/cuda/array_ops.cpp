// lib/cuda's ArrayOps (see array_ops.h): each rounding queues its statistics kernel into a slot, as
// CudaBackend::round_gradient does, and flush() brings every slot to the host in one copy and makes the
// records in the order the roundings were queued.
#include "lib/cuda/array_ops.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>

#include "lib/cuda/device_buffer.h"
#include "lib/cuda/edge_counts.h"
#include "lib/cuda/elementwise.h"
#include "lib/cuda/join_scale.h"
#include "lib/cuda/local_scale.h"
#include "lib/cuda/quantize.h"
#include "lib/cuda/stats.h"
#include "lib/instrument/log_moments.h"
#include "lib/instrument/round_thresholds.h"
#include "lib/scaler/scale_range.h"

namespace gradscale::cuda {
namespace {

float max_of(const TensorStats& s) {  // lib/instrument's max_abs: infinite when something is not finite
  return s.nonfinite > 0 ? std::numeric_limits<float>::infinity() : static_cast<float>(s.max_abs);
}

class CudaArrayOps final : public ArrayOps {
 public:
  explicit CudaArrayOps(CudaContext& ctx) : ctx_(ctx), stats_(3) {}

  void queue_rounding(const float* src, float* d, std::size_t n, float multiplier, GradSite site, int node,
                      const Precision& p, StepMonitor& monitor, std::function<void(float)> then) override {
    select_device();
    queue_rounding_by(src, d, n, multiplier, nullptr, site, node, p, monitor, std::move(then), Division{});
  }

  void queue_scaled_rounding(const float* src, float* d, std::size_t n, const RoundingScales& scales,
                             GradSite site, int node, const Precision& p, StepMonitor& monitor,
                             std::function<void(float)> then) override {
    select_device();
    GS_CHECK(!(scales.divide && scales.divide_by >= 0),
             "CudaArrayOps::queue_scaled_rounding: a division by a host value or by an entry's S, not both");
    Division division;
    division.by_value = scales.divide;
    division.value = scales.divisor;
    if (scales.divide_by >= 0) division.entry = scale_entry(table_index(scales.divide_by));
    const DeviceScale* factor = scales.multiply_by >= 0 ? scale_entry(table_index(scales.multiply_by)) : nullptr;
    queue_rounding_by(src, d, n, factor ? 1.0f : scales.multiplier, factor, site, node, p, monitor, std::move(then),
                      division);
  }

  void queue(std::function<void()> f) override {
    if (queued_.empty()) {
      f();  // nothing to keep the order with
      return;
    }
    Queued e;
    e.run = std::move(f);
    queued_.push_back(std::move(e));
  }

  void flush() override {
    if (queued_.empty()) {  // nothing to report: the slots and entries start again (one stream orders them)
      rounding_count_ = 0;
      scale_count_ = 0;
      any_edge_ = false;
      return;
    }
    select_device();
    // Every slot used, one copy per chunk, one wait.
    std::vector<DeviceStats> stats(rounding_count_);
    std::vector<DeviceEdgeCounts> edges(rounding_count_);
    for (std::size_t c = 0; c * kChunk < rounding_count_; ++c) {
      const std::size_t count = std::min(kChunk, rounding_count_ - c * kChunk);
      GS_CUDA_CHECK(cudaMemcpyAsync(stats.data() + c * kChunk, stat_chunks_[c].data(), count * sizeof(DeviceStats),
                                    cudaMemcpyDeviceToHost, ctx_.stream()));
      if (any_edge_)
        GS_CUDA_CHECK(cudaMemcpyAsync(edges.data() + c * kChunk, edge_chunks_[c].data(),
                                      count * sizeof(DeviceEdgeCounts), cudaMemcpyDeviceToHost, ctx_.stream()));
    }
    std::vector<DeviceScale> scales(scale_count_);
    for (std::size_t c = 0; c * kChunk < scale_count_; ++c)
      GS_CUDA_CHECK(cudaMemcpyAsync(scales.data() + c * kChunk, scale_chunks_[c].data(),
                                    std::min(kChunk, scale_count_ - c * kChunk) * sizeof(DeviceScale),
                                    cudaMemcpyDeviceToHost, ctx_.stream()));
    ctx_.synchronize();
    std::vector<Queued> queued;
    queued.swap(queued_);  // a `then` may queue more (it runs at once then: nothing is left to order with)
    rounding_count_ = 0;
    scale_count_ = 0;
    any_edge_ = false;
    // Every item runs, whatever one of them throws (a decision's check): the first error is rethrown
    // after the last, so no record of the step is lost.
    std::exception_ptr first_error;
    for (Queued& e : queued) {
      try {
        if (e.with_entry) {  // queue_scale
          const DeviceScale& d = scales[e.scale_entry];
          e.with_entry(ScaleEntry{d.scale, d.local, d.unbound, static_cast<int>(d.limit)});
          continue;
        }
        if (e.scale_entry != kNoEntry) {  // a weight gradient's r, decided on the device
          const DeviceScale& r = scales[e.scale_entry];
          if (e.with_r) e.with_r(r.local);
          if (!scale_in_float_range(r.scale)) e.monitor->note_nonfinite(e.node);
          continue;
        }
        if (!e.rounding) {
          e.run();
          continue;
        }
        const TensorStats s = to_tensor_stats(stats[e.slot]);
        StepMonitor& monitor = *e.monitor;
        if (monitor.record) store_gradient_statistics(monitor, e.site, e.node, s);
        if (e.edge) {
          monitor.grad_below_edge += edges[e.slot].below;
          monitor.grad_above_edge += edges[e.slot].above;
        }
        const float m = max_of(s);
        check_rounded_max(monitor, e.site, e.node, m, e.quantized, e.precision);
        if (e.then) e.then(m);
      } catch (...) {
        if (!first_error) first_error = std::current_exception();
      }
    }
    if (first_error) std::rethrow_exception(first_error);
  }

  float max_abs(const float* d, std::size_t n) override {  // the maximum alone: no statistics pass
    select_device();
    max_abs_bits(d, n, max_bits_.data(), ctx_.stream());
    GS_CUDA_CHECK(cudaMemcpyAsync(max_bits_host_.data(), max_bits_.data(), sizeof(unsigned), cudaMemcpyDeviceToHost,
                                  ctx_.stream()));
    ctx_.synchronize();
    return max_abs_of_bits(max_bits_host_.data()[0]);
  }

  void max_abs_each(const float* const* arrays, const std::size_t* sizes, std::size_t count,
                    float* out) override {
    if (count == 0) return;
    select_device();
    if (max_bits_.size() < count) {
      max_bits_ = DeviceBuffer<unsigned>(count);
      max_bits_host_ = PinnedBuffer<unsigned>(count);
    }
    for (std::size_t k = 0; k < count; ++k)
      max_abs_bits(arrays[k], sizes[k], max_bits_.data() + k, ctx_.stream());
    GS_CUDA_CHECK(cudaMemcpyAsync(max_bits_host_.data(), max_bits_.data(), count * sizeof(unsigned),
                                  cudaMemcpyDeviceToHost, ctx_.stream()));
    ctx_.synchronize();
    for (std::size_t k = 0; k < count; ++k) out[k] = max_abs_of_bits(max_bits_host_.data()[k]);
  }

  void divide(float* d, std::size_t n, float divisor) override {
    select_device();
    cuda::divide(d, n, divisor, ctx_.stream());
  }

  void quantize(const float* src, float* dst, std::size_t n, Format f, RoundOptions round) override {
    select_device();
    if (f != Format::fp32)
      cuda::quantize(src, dst, n, f, round, 1.0f, ctx_.stream());
    else if (src != dst && n > 0)
      GS_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, ctx_.stream()));
  }

  TensorStats statistics(const float* d, std::size_t n, Format f, RoundOptions round) override {
    select_device();
    tensor_stats(ctx_, d, n, f, round, stats_.data());
    return download_stats(ctx_, stats_.data(), 1).at(0);
  }

  void attach(QueryStatistics& stats, StatNeeds needs, LocalScaleQuery& q, RoundOptions round) override {
    select_device();
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

  void sum_scaled_parts(const float* const* parts, const double* scales, std::size_t count, double target,
                        float* out, std::size_t n) override {
    select_device();
    cuda::fill(out, n, 0.0f, ctx_.stream());  // from 0, then each term as lib/model/join.cpp's loop
    for (std::size_t k = 0; k < count; ++k)
      cuda::scale_add(parts[k], static_cast<float>(target / scales[k]), out, n, ctx_.stream());
  }

  void queue_weight_gradient(const float* src, float* d, std::size_t n, double u_max, int in, int node,
                             const Precision& p, StepMonitor& monitor,
                             std::function<void(double)> then) override {
    select_device();
    // r from the maximum of src, r·S_in in a new entry: CudaBackend::accumulate_weight_grads's device path,
    // in the same order. A gradient of one block's values takes r in its rounding's launch; a larger one
    // from its statistics first (a slot of their own, read by the rule only).
    const std::size_t out = scale_count_++;
    const WeightGradDecision r{u_max, scale_entry(table_index(in)), scale_entry(out)};
    if (n > one_block_values()) {
      const StatsJob job{src, n, p.gradient_format(), p.round};
      tensor_stats(ctx_, &job, 1, slot(rounding_count_++), StatsDecision::weight_grad_scale(r.u_max, r.in, r.out));
    }
    Division by_scale;  // d = r·src rounded, then divided by r·S_in (one pass)
    by_scale.entry = scale_entry(out);
    queue_rounding_by(src, d, n, 1.0f, scale_entry(out), GradSite::weight, node, p, monitor, {}, by_scale,
                      n <= one_block_values() ? &r : nullptr);
    Queued e;  // after the rounding's records: r, and the range of r·S_in
    e.scale_entry = out;
    e.node = node;
    e.monitor = &monitor;
    e.with_r = std::move(then);
    queued_.push_back(std::move(e));
  }

  // ---- the scale table ------------------------------------------------------------------------------
  bool keeps_scales() const override { return true; }

  int new_scale(double value) override {
    select_device();
    const std::size_t e = scale_count_++;
    set_scale(scale_entry(e), value, ctx_.stream());
    return static_cast<int>(e);
  }

  int decide_scale(const ScaleRule& rule, const float* grad, std::size_t grad_n, const float* weight,
                   std::size_t weight_n, const float* upstream, std::size_t upstream_n, Format f,
                   RoundOptions round, int in) override {
    select_device();
    // CudaBackend::decide_on_device's statistics, in its order: the moments of g and W, or the upstream
    // product's; they stay in their slots until the decision kernel (queued after them) has read them.
    const bool moments = rule_reads_moments(rule.formula), reads_upstream = rule_reads_upstream(rule.formula);
    GS_CHECK(!moments || (grad && weight),
             "CudaArrayOps::decide_scale: the formula reads the moments of g and W");
    GS_CHECK(!reads_upstream || upstream,
             "CudaArrayOps::decide_scale: the formula reads the upstream product");
    std::vector<StatsJob> jobs;
    if (moments) {
      jobs.push_back(StatsJob{grad, grad_n, f, round});
      jobs.push_back(StatsJob{weight, weight_n, f, round});
    }
    if (reads_upstream) jobs.push_back(StatsJob{upstream, upstream_n, f, round});
    DeviceStats* stats = jobs.empty() ? nullptr : slots(jobs.size());
    const std::size_t out = scale_count_++;
    tensor_stats(ctx_, jobs.data(), jobs.size(), stats,  // taken by the launch of the statistics it reads
                 StatsDecision::local_scale(rule, scale_entry(table_index(in)), scale_entry(out)));
    return static_cast<int>(out);
  }

  int decide_loss_scale(const LossScaleRule& rule, const float* src, std::size_t n, Format f,
                        RoundOptions round) override {
    select_device();
    GS_CHECK(src != nullptr || n == 0, "CudaArrayOps::decide_loss_scale: the loss gradient is null");
    DeviceStats* stats = slots(1);
    const std::size_t out = scale_count_++;
    const StatsJob job{src, n, f, round};  // S0, taken by the launch of the statistics it reads
    tensor_stats(ctx_, &job, 1, stats, StatsDecision::loss_scale(rule, scale_entry(out)));
    return static_cast<int>(out);
  }

  void multiply_by_local(const float* src, float* d, std::size_t n, int entry) override {
    select_device();
    apply_local_scale(src, d, n, scale_entry(table_index(entry)), ctx_.stream());  // one pass
  }

  void divide_by_scale(float* d, std::size_t n, int entry) override {
    select_device();
    cuda::divide_by_scale(d, n, scale_entry(table_index(entry)), ctx_.stream());
  }

  std::size_t max_join_parts() const override { return static_cast<std::size_t>(kMaxJoinParts); }

  int join_scale(const float* const* parts, const std::size_t* sizes, const int* scales, std::size_t count,
                 Format f) override {
    select_device();
    GS_CHECK(count >= 1 && count <= max_join_parts(),
             "CudaArrayOps::join_scale: " << count << " parts (1 to " << max_join_parts() << ")");
    // The parts' maxima in statistics slots of one chunk (CudaBackend::join's, against fp32).
    std::vector<StatsJob> jobs;
    for (std::size_t k = 0; k < count; ++k) jobs.push_back(StatsJob{parts[k], sizes[k], Format::fp32, {}});
    DeviceStats* stats = slots(count);
    tensor_stats(ctx_, jobs, stats);
    JoinParts table;
    table.count = static_cast<int>(count);
    table.limit = format_info(f).max_finite;
    for (std::size_t k = 0; k < count; ++k) {
      table.stats[k] = stats + k;
      table.scales[k] = scale_entry(table_index(scales[k]));
    }
    const std::size_t out = scale_count_++;
    choose_join_scale(table, scale_entry(out), ctx_.stream());
    return static_cast<int>(out);
  }

  void sum_scaled_parts_at(const float* const* parts, const int* scales, std::size_t count, int target,
                           float* out, std::size_t n) override {
    select_device();
    cuda::fill(out, n, 0.0f, ctx_.stream());  // from 0, then each term as lib/model/join.cpp's loop
    for (std::size_t k = 0; k < count; ++k)
      scale_add_rescaled(parts[k], scale_entry(table_index(target)), scale_entry(table_index(scales[k])), out,
                         n, ctx_.stream());
  }

  void queue_scale(int entry, std::function<void(const ScaleEntry&)> then) override {
    GS_CHECK(then, "CudaArrayOps::queue_scale: no function to call with the entry");
    Queued e;
    e.scale_entry = table_index(entry);
    e.with_entry = std::move(then);
    queued_.push_back(std::move(e));
  }

  void to_host(const float* d, std::size_t n, float* host) override {
    if (n == 0) return;
    select_device();
    GS_CUDA_CHECK(cudaMemcpyAsync(host, d, n * sizeof(float), cudaMemcpyDeviceToHost, ctx_.stream()));
    ctx_.synchronize();
  }

  void set_stream(std::uintptr_t stream) override {
    select_device();
    ctx_.set_stream(reinterpret_cast<cudaStream_t>(stream));  // NOLINT: the caller's stream handle
  }

  bool host_memory() const override { return false; }

 private:
  // A queued rounding's records (or a queued function), made at flush.
  struct Queued {
    bool rounding = false;
    GradSite site = GradSite::upstream;
    int node = 0;
    bool quantized = false, edge = false;
    Precision precision;
    StepMonitor* monitor = nullptr;
    std::function<void(float)> then;
    std::function<void()> run;
    std::size_t slot = 0;
    std::size_t scale_entry = kNoEntry;  // queue_weight_gradient's r·S_in entry, or queue_scale's
    std::function<void(double)> with_r;
    std::function<void(const ScaleEntry&)> with_entry;
  };
  static constexpr std::size_t kNoEntry = static_cast<std::size_t>(-1);
  // The caller may be another thread than the one that made the context — PyTorch runs backward on
  // its own worker thread per device — and a thread's current device is its own: every entry that
  // queues work selects the context's device first.
  void select_device() const { GS_CUDA_CHECK(cudaSetDevice(ctx_.device())); }
  static constexpr std::size_t kChunk = 256;
  // The statistics and edge counts of queued rounding i, in chunks that never move while kernels
  // may write them.
  DeviceStats* slot(std::size_t i) {
    while (i / kChunk >= stat_chunks_.size()) {
      stat_chunks_.emplace_back(kChunk);
      edge_chunks_.emplace_back(kChunk);
    }
    return stat_chunks_[i / kChunk].data() + i % kChunk;
  }
  // `count` (at most kChunk) consecutive slots of one chunk, for one tensor_stats call: the next ones,
  // or the next chunk's first when they would straddle two (the slots skipped are copied, never read).
  DeviceStats* slots(std::size_t count) {
    GS_CHECK(count >= 1 && count <= kChunk, "CudaArrayOps: " << count << " statistics at once");
    if (rounding_count_ / kChunk != (rounding_count_ + count - 1) / kChunk)
      rounding_count_ = (rounding_count_ / kChunk + 1) * kChunk;
    DeviceStats* first = slot(rounding_count_);
    rounding_count_ += count;
    return first;
  }
  DeviceEdgeCounts* edge_slot(std::size_t i) { return edge_chunks_[i / kChunk].data() + i % kChunk; }
  // After a rounding: d divided by a host value, or by the S of a table entry (divide_by_scale's range
  // check), or not at all.
  struct Division {
    bool by_value = false;
    float value = 1.0f;
    const DeviceScale* entry = nullptr;
  };
  // queue_rounding with the multiplier factor->local (read on the device) when `factor` is not null, and
  // the stored values divided as `division` says.
  void queue_rounding_by(const float* src, float* d, std::size_t n, float multiplier, const DeviceScale* factor,
                         GradSite site, int node, const Precision& p, StepMonitor& monitor,
                         std::function<void(float)> then, const Division& division,
                         const WeightGradDecision* decides_r = nullptr) {
    const Format f = p.gradient_format();
    Queued e;
    e.rounding = true;
    e.site = site;
    e.node = node;
    e.quantized = site != GradSite::weight || p.quantize_weight_grads;
    e.precision = p;
    e.monitor = &monitor;
    e.then = std::move(then);
    e.slot = rounding_count_++;
    e.edge = site == GradSite::weight && monitor.gradient_edge > 0;
    any_edge_ = any_edge_ || e.edge;
    cudaStream_t stream = ctx_.stream();
    if (!e.edge) {  // the multiplication, the statistics, the rounding (or the copy) and the division in one pass
      StoredRounding stored{d, e.quantized, multiplier, factor ? &factor->local : nullptr};
      stored.divide = division.by_value;
      stored.divisor = division.value;
      stored.device_divisor = division.entry ? &division.entry->scale : nullptr;
      stored.decides_r = decides_r;
      measure_and_round(ctx_, StatsJob{src, n, f, p.round}, stored, slot(e.slot));
      queued_.push_back(std::move(e));
      return;
    }
    // popart_als counts the weight gradients about its edge as they will be stored: between the passes.
    // v: the fp32 values after the multiplier (src itself without one: the rounding then writes d).
    if (decides_r != nullptr) {  // r from src's own statistics first, as the one pass decides it
      const StatsJob job{src, n, f, p.round};
      tensor_stats(ctx_, &job, 1, slot(rounding_count_++),
                   StatsDecision::weight_grad_scale(decides_r->u_max, decides_r->in, decides_r->out));
    }
    const float* v = src;
    if (factor != nullptr) {
      apply_local_scale(src, d, n, factor, stream);  // d = src·factor
      v = d;
    } else if (multiplier != 1.0f) {
      cuda::quantize(src, d, n, Format::fp32, p.round, multiplier, stream);  // d = src·multiplier
      v = d;
    }
    tensor_stats(ctx_, v, n, f, p.round, slot(e.slot));
    DeviceEdgeCounts* counts = edge_slot(e.slot);
    GS_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(DeviceEdgeCounts), stream));
    const Format stored = e.quantized ? f : Format::fp32;
    count_about_edge(v, n, edge_threshold_bits(static_cast<float>(monitor.gradient_edge), stored, p.round), counts,
                     stream);
    if (e.quantized)
      cuda::quantize(v, d, n, f, p.round, 1.0f, stream);
    else if (v != d && n > 0)
      GS_CUDA_CHECK(cudaMemcpyAsync(d, v, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    if (division.entry != nullptr)
      cuda::divide_by_scale(d, n, division.entry, stream);
    else if (division.by_value)
      cuda::divide(d, n, division.value, stream);
    queued_.push_back(std::move(e));
  }
  // An entry number from the caller, checked against the step's table.
  std::size_t table_index(int entry) const {
    GS_CHECK(entry >= 0 && static_cast<std::size_t>(entry) < scale_count_,
             "CudaArrayOps: scale entry " << entry << " is not in the table (" << scale_count_
                                          << " entries since the last flush)");
    return static_cast<std::size_t>(entry);
  }
  // Scale entry i of the step, in chunks that never move.
  DeviceScale* scale_entry(std::size_t i) {
    while (i / kChunk >= scale_chunks_.size()) scale_chunks_.emplace_back(kChunk);
    return scale_chunks_[i / kChunk].data() + i % kChunk;
  }

  CudaContext& ctx_;
  DeviceBuffer<DeviceStats> stats_;  // a measurement returned at once: one tensor's, or a query's three
  DeviceBuffer<unsigned> max_bits_{1};  // max_abs's result (max_abs_each's, one per array), and its host copy
  PinnedBuffer<unsigned> max_bits_host_{1};
  std::vector<DeviceBuffer<DeviceStats>> stat_chunks_;
  std::vector<DeviceBuffer<DeviceEdgeCounts>> edge_chunks_;
  std::vector<DeviceBuffer<DeviceScale>> scale_chunks_;
  std::vector<Queued> queued_;
  std::size_t rounding_count_ = 0, scale_count_ = 0;
  bool any_edge_ = false;  // some queued rounding counts about popart_als's edge
};

}  // namespace

std::unique_ptr<ArrayOps> make_array_ops(CudaContext& ctx) { return std::make_unique<CudaArrayOps>(ctx); }

}  // namespace gradscale::cuda
