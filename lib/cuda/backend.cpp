// The CUDA backend (see backend.h).
#include "lib/cuda/backend.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "lib/cuda/adam.h"
#include "lib/cuda/convert.h"
#include "lib/cuda/elementwise.h"
#include "lib/cuda/layers.h"
#include "lib/cuda/nonfinite.h"
#include "lib/cuda/quantize.h"
#include "lib/cuda/sgd.h"
#include "lib/cuda/unscale.h"
#include "lib/model/join.h"
#include "lib/scaler/scaler.h"

namespace gradscale::cuda {

// ---- memory ------------------------------------------------------------------------------------------

float* CudaMemory::allocate(std::size_t n) {
  void* p = nullptr;
  GS_CUDA_CHECK(cudaMalloc(&p, n * sizeof(float)));
  return static_cast<float*>(p);
}

void CudaMemory::release(float* p) noexcept { (void)cudaFree(p); }

void CudaMemory::fill(float* p, std::size_t n, float value) {
  if (value == 0.0f && !std::signbit(value)) {
    GS_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), ctx_.stream()));
    return;
  }
  cuda::fill(p, n, value, ctx_.stream());
}

void CudaMemory::copy(float* dst, const float* src, std::size_t n) {
  GS_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, ctx_.stream()));
}

void CudaMemory::from_host(float* dst, const float* host, std::size_t n) {
  // From pageable memory the call returns once `host` has been read: the caller may reuse it.
  GS_CUDA_CHECK(cudaMemcpyAsync(dst, host, n * sizeof(float), cudaMemcpyHostToDevice, ctx_.stream()));
}

void CudaMemory::to_host(float* host, const float* src, std::size_t n) {
  GS_CUDA_CHECK(cudaMemcpyAsync(host, src, n * sizeof(float), cudaMemcpyDeviceToHost, ctx_.stream()));
  ctx_.synchronize();
}

// ---- optimizer ---------------------------------------------------------------------------------------
namespace {

class CudaOptimizerKernels final : public DeviceOptimizerKernels {
 public:
  explicit CudaOptimizerKernels(CudaContext& ctx) : ctx_(ctx) {}
  void sgd(float* w, const float* g, float* momentum_buffer, std::size_t n, const SgdStep& s) override {
    sgd_update(w, g, momentum_buffer, n, s, ctx_.stream());
  }
  void adam(float* w, const float* g, float* m, float* v, std::size_t n, const AdamStep& s) override {
    adam_update(w, g, m, v, n, s, ctx_.stream());
  }

 private:
  CudaContext& ctx_;
};

StatsJob job_of(const float* data, std::int64_t n, Format f, RoundOptions round) {
  return StatsJob{data, static_cast<std::size_t>(n), f, round};
}

}  // namespace

// ---- the backend -------------------------------------------------------------------------------------

CudaBackend::CudaBackend(int device)
    : ctx_(device),
      memory_(ctx_),
      optimizer_(std::make_unique<CudaOptimizerKernels>(ctx_)),
      now_(8),
      loss_(1),
      loss_host_(1),
      found_inf_(1),
      loss_grad_(&memory_),
      query_stats_(3),
      join_stats_(kMaxJoinParts) {
  reserve_records(256);  // every built-in model's step fits
}

CudaBackend::~CudaBackend() = default;

std::string CudaBackend::description() const { return "cuda: " + device_description(ctx_.device()); }

std::unique_ptr<Layer> CudaBackend::adopt(std::unique_ptr<Layer> layer, const LayerPlacement& placement) {
  return adopt_layer(*this, std::move(layer), placement);
}

void CudaBackend::reserve_records(std::size_t slots) {
  records_.resize(kStatsOffset + slots * sizeof(DeviceStats));
  records_host_.resize(records_.size());
  record_slots_ = slots;
  overflow_.clear();
}

DeviceStats* CudaBackend::next_slot() {
  const std::size_t i = pending_.size();
  if (i < record_slots_) return reinterpret_cast<DeviceStats*>(records_.data() + kStatsOffset) + i;
  const std::size_t j = i - record_slots_;
  if (j / kChunk >= overflow_.size()) overflow_.emplace_back(kChunk);
  return overflow_[j / kChunk].data() + j % kChunk;
}

void CudaBackend::start_pass() {
  pending_.clear();
  edge_counting_ = false;
  scales_used_ = scales_on_host_ = 0;
  decisions_.clear();
  notes_.clear();
}

// ---- the scale table ---------------------------------------------------------------------------------

int CudaBackend::new_scale_entry() {
  const int e = scales_used_++;
  if (static_cast<std::size_t>(e) / kChunk >= scale_chunks_.size()) {
    scale_chunks_.emplace_back(kChunk);
    scale_mirrors_.emplace_back(kChunk);
  }
  return e;
}

DeviceScale* CudaBackend::scale_at(int e) {
  const auto i = static_cast<std::size_t>(e);
  return scale_chunks_[i / kChunk].data() + i % kChunk;
}

const DeviceScale* CudaBackend::scale_entry(const ScaledGrad& g) {
  if (g.device_scale >= 0) return scale_at(g.device_scale);
  const int e = new_scale_entry();
  set_scale(scale_at(e), g.scale, ctx_.stream());
  return scale_at(e);
}

void CudaBackend::copy_scales_to_host() {
  for (auto e = static_cast<std::size_t>(scales_on_host_); e < static_cast<std::size_t>(scales_used_);) {
    const std::size_t c = e / kChunk, offset = e % kChunk;
    const std::size_t n = std::min(kChunk - offset, static_cast<std::size_t>(scales_used_) - e);
    GS_CUDA_CHECK(cudaMemcpyAsync(scale_mirrors_[c].data() + offset, scale_chunks_[c].data() + offset,
                                  n * sizeof(DeviceScale), cudaMemcpyDeviceToHost, ctx_.stream()));
    e += n;
  }
}

void CudaBackend::resolve_scales(StepMonitor& monitor) {
  const auto on_host = [this](int e) -> const DeviceScale& {
    const auto i = static_cast<std::size_t>(e);
    return scale_mirrors_[i / kChunk].data()[i % kChunk];
  };
  scales_on_host_ = scales_used_;
  for (const PendingNote& n : notes_) {  // first: a decision at the same layer then sets its S_out
    LayerRecord& r = monitor.record_of(n.layer);
    r.scale_in = r.scale_out = on_host(n.entry).scale;
  }
  notes_.clear();
  std::vector<PendingDecision> decisions;
  decisions.swap(decisions_);
  for (const PendingDecision& d : decisions) {
    const DeviceScale& e = on_host(d.entry);
    GS_CHECK_NUMERIC(std::isfinite(e.local) && e.local > 0,
                     "the controller of policy '" << d.policy << "' chose local scale " << e.local << " at layer '"
                                                  << d.layer_name << "' (must be finite and > 0)");
    LayerRecord& r = monitor.record_of(d.layer);
    r.local_scale = e.local;
    r.unbound_scale = e.unbound;
    r.scale_out = e.scale;
    d.controller->accept(d.layer, LocalScale{e.local, e.unbound});
  }
}

double CudaBackend::host_scale(const ScaledGrad& g, StepMonitor& monitor) {
  if (g.device_scale < 0) return g.scale;
  if (g.device_scale >= scales_on_host_) enter_measurements(monitor);  // one copy, one wait
  const auto i = static_cast<std::size_t>(g.device_scale);
  return scale_mirrors_[i / kChunk].data()[i % kChunk].scale;
}

void CudaBackend::note_backward(int layer_id, const ScaledGrad& g, StepMonitor& monitor) {
  gradscale::note_backward(layer_id, g.scale, monitor);
  if (g.device_scale < 0) return;
  if (g.device_scale < scales_on_host_) {
    gradscale::note_backward(layer_id, host_scale(g, monitor), monitor);
  } else {
    notes_.push_back(PendingNote{g.device_scale, layer_id});
  }
}

void CudaBackend::round_gradient(float* d, std::size_t n, float multiplier, GradSite site, int node,
                                 const Precision& p, StepMonitor& monitor) {
  const Format f = p.gradient_format();
  const bool quantized = site != GradSite::weight || p.quantize_weight_grads;
  cudaStream_t stream = ctx_.stream();
  if (multiplier != 1.0f) quantize(d, d, n, Format::fp32, p.round, multiplier, stream);  // fp32: d·multiplier
  tensor_stats(ctx_, d, n, f, p.round, next_slot());
  pending_.push_back(Pending{site, node, quantized, p});
  if (site == GradSite::weight && monitor.gradient_edge > 0) {  // popart_als: added up in the header
    if (!edge_counting_) {
      GS_CUDA_CHECK(cudaMemsetAsync(&header()->edge, 0, sizeof(DeviceEdgeCounts), stream));
      edge_counting_ = true;
    }
    const std::uint32_t t =
        edge_threshold_bits(static_cast<float>(monitor.gradient_edge), quantized ? f : Format::fp32, p.round);
    count_about_edge(d, n, t, &header()->edge, stream);
  }
  if (quantized) quantize(d, d, n, f, p.round, 1.0f, stream);
}

void CudaBackend::round_activation_grad(Tensor& t, int layer_id, const Precision& p, StepMonitor& monitor) {
  monitor.record_of(layer_id).sent_grad = true;
  round_gradient(t.data(), static_cast<std::size_t>(t.size()), 1.0f, GradSite::upstream, layer_id, p, monitor);
}

void CudaBackend::round_output(Tensor& t, const Precision& p) {
  if (p.format == Format::fp32) return;
  quantize(t.data(), t.data(), static_cast<std::size_t>(t.size()), p.format, p.round, 1.0f, ctx_.stream());
}

void CudaBackend::round_working_copy(const Parameter& master, Tensor& working, const Precision& p) {
  working.resize(master.value.shape());
  quantize(master.value.data(), working.data(), static_cast<std::size_t>(master.value.size()), p.format, p.round,
           1.0f, ctx_.stream());
}

std::vector<TensorStats> CudaBackend::statistics_now(const std::vector<StatsJob>& jobs) {
  if (now_.size() < jobs.size()) now_.resize(jobs.size());
  tensor_stats(ctx_, jobs, now_.data());
  return download_stats(ctx_, now_.data(), jobs.size());
}

DeviceType CudaBackend::gemm_type(Format a, Format b, bool exact) const {
  if (!gemm16_ || !exact || a != b) return DeviceType::f32;
  if (a == Format::fp16) return DeviceType::f16;
  if (a == Format::bf16) return DeviceType::bf16;
  return DeviceType::f32;  // fp8 and fp32: fp32 GEMMs
}

const void* CudaBackend::gemm_operand(const float* data, std::size_t n, DeviceType type, int slot) {
  if (type == DeviceType::f32) return data;
  GS_CHECK(slot == 0 || slot == 1, "CudaBackend::gemm_operand: slot " << slot << " (0 or 1)");
  DeviceBuffer<std::uint16_t>& buffer = gemm_slots_[slot];
  if (buffer.size() < n) buffer.resize(n);
  to_16bit(data, n, type, buffer.data());
  return buffer.data();
}

void CudaBackend::to_16bit(const float* data, std::size_t n, DeviceType type, std::uint16_t* out) {
  GS_CHECK(type == DeviceType::f16 || type == DeviceType::bf16, "CudaBackend::to_16bit: not a 16-bit type");
  if (type == DeviceType::f16)
    to_fp16(data, reinterpret_cast<__half*>(out), n, ctx_.stream());
  else
    to_bf16(data, reinterpret_cast<__nv_bfloat16*>(out), n, ctx_.stream());
}

void CudaBackend::finish_backward(StepMonitor& monitor) {
  enter_measurements(monitor);
  if (loss_pending_) {  // loss_backward's sums, in the header that enter_measurements brought over
    StepHeader h;
    std::memcpy(&h, records_host_.data(), sizeof h);
    monitor.loss = h.loss.loss_sum / static_cast<double>(loss_batch_);
    monitor.correct = static_cast<std::int64_t>(h.loss.correct);
    loss_pending_ = false;
  }
  // A step that needed overflow slots makes the record array large enough for the next (nothing is
  // queued on the records any more).
  if (!overflow_.empty()) reserve_records(record_slots_ + overflow_.size() * kChunk);
}

void CudaBackend::enter_measurements(StepMonitor& monitor) {
  // The header and the slots in the record array: one copy into page-locked memory, one wait.
  const std::size_t n = pending_.size(), in_records = std::min(n, record_slots_);
  GS_CUDA_CHECK(cudaMemcpyAsync(records_host_.data(), records_.data(), kStatsOffset + in_records * sizeof(DeviceStats),
                                cudaMemcpyDeviceToHost, ctx_.stream()));
  copy_scales_to_host();  // the scales decided on the device: the same wait
  ctx_.synchronize();
  std::vector<TensorStats> all;
  all.reserve(n);
  for (std::size_t i = 0; i < in_records; ++i) {
    DeviceStats d;
    std::memcpy(&d, records_host_.data() + kStatsOffset + i * sizeof(DeviceStats), sizeof d);
    all.push_back(to_tensor_stats(d));
  }
  for (std::size_t c = 0; in_records + c * kChunk < n; ++c) {  // a step larger than any before: more waits
    const std::vector<TensorStats> part =
        download_stats(ctx_, overflow_[c].data(), std::min(kChunk, n - in_records - c * kChunk));
    all.insert(all.end(), part.begin(), part.end());
  }
  for (std::size_t i = 0; i < n; ++i) {
    const Pending& e = pending_[i];
    const TensorStats& s = all[i];
    if (monitor.record) store_gradient_statistics(monitor, e.site, e.node, s);
    // max|d| as lib/instrument's max_abs: infinite when something is not finite.
    const float m = s.nonfinite > 0 ? std::numeric_limits<float>::infinity() : static_cast<float>(s.max_abs);
    check_rounded_max(monitor, e.node, m, e.quantized, e.precision);
    if (e.site == GradSite::upstream) monitor.record_of(e.node).sent_max_abs = m;
    if (e.site == GradSite::loss) monitor.loss_grad_max_abs = m;
  }
  pending_.clear();
  if (edge_counting_) {  // the counts so far go to the monitor once; the device starts again from zero
    StepHeader h;
    std::memcpy(&h, records_host_.data(), sizeof h);
    monitor.grad_below_edge += h.edge.below;
    monitor.grad_above_edge += h.edge.above;
    edge_counting_ = false;
  }
  resolve_scales(monitor);
}

std::vector<std::int64_t> CudaBackend::first_nonfinite(const std::vector<const Tensor*>& tensors) {
  std::vector<NonFiniteJob> jobs;
  std::vector<std::size_t> on_device;  // which tensors the jobs are
  std::vector<std::int64_t> first(tensors.size(), -1);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = *tensors[i];
    if (t.on_host()) {
      first[i] = gradscale::first_nonfinite(t.data(), static_cast<std::size_t>(t.size()));
    } else {
      GS_CHECK(t.device() == Device::cuda, "first_nonfinite: a tensor of another device");
      jobs.push_back(NonFiniteJob{t.data(), static_cast<std::size_t>(t.size())});
      on_device.push_back(i);
    }
  }
  if (jobs.empty()) return first;
  if (nonfinite_.size() < jobs.size()) nonfinite_.resize(jobs.size());
  cuda::first_nonfinite(jobs.data(), jobs.size(), nonfinite_.data(), ctx_.stream());
  std::vector<unsigned long long> got(jobs.size());
  GS_CUDA_CHECK(cudaMemcpyAsync(got.data(), nonfinite_.data(), got.size() * sizeof(unsigned long long),
                                cudaMemcpyDeviceToHost, ctx_.stream()));
  ctx_.synchronize();
  for (std::size_t j = 0; j < jobs.size(); ++j)
    first[on_device[j]] = got[j] == kAllFinite ? -1 : static_cast<std::int64_t>(got[j]);
  return first;
}

void CudaBackend::scale_upstream_grad(const Layer& layer, const ScaledGrad& grad_output,
                                      const UpstreamProduct& product, ScaledGrad& gx, BackwardContext& ctx) {
  LayerController* controller = ctx.scaler.layer_controller();
  if (controller != nullptr && device_decisions_) {
    if (std::optional<ScaleRule> rule = controller->device_rule(layer.id())) {
      decide_on_device(*rule, *controller, layer, grad_output, product, gx, ctx);
      return;
    }
  }
  LayerRecord& r = ctx.monitor.record_of(layer.id());
  r.sent_grad = true;
  if (controller == nullptr) {  // a global policy: s = 1, the scale passes on (host value or device entry)
    r.local_scale = r.unbound_scale = 1.0;
    round_gradient(gx.g.data(), static_cast<std::size_t>(gx.g.size()), 1.0f, GradSite::upstream, layer.id(),
                   ctx.precision, ctx.monitor);
    gx.scale = grad_output.scale;
    gx.device_scale = grad_output.device_scale;
    if (gx.device_scale < 0) r.scale_out = gx.scale;  // else note_backward's entry fills S_in and S_out
    return;
  }
  // The host decides: the statistics it asked for, copied now (one wait).
  const auto t0 = std::chrono::steady_clock::now();
  LocalScaleQuery q = upstream_query(layer, grad_output, product, gx.g, ctx);  // no raw views: device data
  q.scale_in = host_scale(grad_output, ctx.monitor);
  const StatNeeds needs = controller->needs(layer.id());
  QueryStatistics stats;
  std::vector<StatsJob> jobs;
  std::vector<TensorStats*> targets;
  std::vector<const TensorStats**> slots;
  const auto ask = [&](const Tensor& t, Format f, TensorStats* target, const TensorStats** slot) {
    jobs.push_back(job_of(t.data(), t.size(), f, ctx.precision.round));
    targets.push_back(target);
    slots.push_back(slot);
  };
  if (needs & kNeedGradMoments) ask(grad_output.g, q.format, &stats.grad_moments, &q.grad_moments);
  if (needs & kNeedWeightMoments) ask(product.weight, q.format, &stats.weight_moments, &q.weight_moments);
  if (needs & kNeedUpstreamStats) ask(gx.g, q.format, &stats.upstream_stats, &q.upstream_stats);
  if (!jobs.empty()) {
    const std::vector<TensorStats> got = statistics_now(jobs);
    for (std::size_t i = 0; i < got.size(); ++i) {
      *targets[i] = got[i];
      *slots[i] = targets[i];
    }
  }
  if (needs & kNeedGradLogMoments) {  // on the host, from a copy
    const Tensor host = grad_output.g.to_host();
    stats.grad_log_moments = log_abs_moments(host.data(), static_cast<std::size_t>(host.size()));
    q.grad_log_moments = &stats.grad_log_moments;
  }
  if ((needs & kNeedProductRange) && product.product_range) {  // the layer's closure copies to the host
    stats.products = product.product_range();
    q.products = &stats.products;
  }
  const LocalScale decision = checked_decision(*controller, q, layer, ctx, t0);
  r.local_scale = decision.s;
  r.unbound_scale = decision.unbound;
  round_gradient(gx.g.data(), static_cast<std::size_t>(gx.g.size()), static_cast<float>(decision.s),
                 GradSite::upstream, layer.id(), ctx.precision, ctx.monitor);
  gx.scale = decision.s * q.scale_in;
  gx.device_scale = -1;
  r.scale_out = gx.scale;
}

void CudaBackend::decide_on_device(ScaleRule rule, LayerController& controller, const Layer& layer,
                                   const ScaledGrad& grad_output, const UpstreamProduct& product, ScaledGrad& gx,
                                   BackwardContext& ctx) {
  const auto t0 = std::chrono::steady_clock::now();
  rule.reduction = static_cast<double>(product.reduction);
  // The statistics the formula reads stay in query_stats_ (the stream keeps them until the decision
  // kernel has read them): the moments of g and W, or those of the fp32 upstream product.
  const Format f = ctx.precision.gradient_format();
  const bool moments = rule_reads_moments(rule.formula), upstream = rule_reads_upstream(rule.formula);
  std::vector<StatsJob> jobs;
  if (moments) {
    jobs.push_back(job_of(grad_output.g.data(), grad_output.g.size(), f, ctx.precision.round));
    jobs.push_back(job_of(product.weight.data(), product.weight.size(), f, ctx.precision.round));
  }
  if (upstream) jobs.push_back(job_of(gx.g.data(), gx.g.size(), f, ctx.precision.round));
  if (!jobs.empty()) tensor_stats(ctx_, jobs, query_stats_.data());
  const DeviceStats* stats = query_stats_.data();
  const DeviceScale* in = scale_entry(grad_output);
  const int e = new_scale_entry();
  decide_local_scale(rule, moments ? stats : nullptr, moments ? stats + 1 : nullptr,
                     upstream ? stats + (moments ? 2 : 0) : nullptr, in, scale_at(e), ctx_.stream());
  decisions_.push_back(PendingDecision{e, layer.id(), &controller, ctx.scaler.policy(), layer.name()});
  ctx.monitor.record_of(layer.id()).sent_grad = true;
  // s multiplies the fp32 accumulator before the one rounding, so s·g itself never overflows.
  const auto n = static_cast<std::size_t>(gx.g.size());
  apply_local_scale(gx.g.data(), n, scale_at(e), ctx_.stream());
  round_gradient(gx.g.data(), n, 1.0f, GradSite::upstream, layer.id(), ctx.precision, ctx.monitor);
  gx.scale = std::numeric_limits<double>::quiet_NaN();  // known on the host after the step's copy
  gx.device_scale = e;
  ctx.monitor.scaler_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void CudaBackend::accumulate_weight_grad(Tensor& g, const ScaledGrad& at, Parameter& param, int layer_id,
                                         const Precision& p, StepMonitor& monitor) {
  GS_CHECK_SHAPE(g.size() == param.grad.size(),
                 "gradient of " << param.name << " has shape " << shape_string(g.shape())
                                << ", parameter has " << shape_string(param.grad.shape()));
  const auto n = static_cast<std::size_t>(g.size());
  round_gradient(g.data(), n, 1.0f, GradSite::weight, layer_id, p, monitor);
  UnscaleJob job{g.data(), param.grad.data(), n, at.scale};
  if (at.device_scale >= 0) job.scale_on_device = &scale_at(at.device_scale)->scale;
  unscale_accumulate(&job, 1, found_inf_.data(), ctx_.stream());
}

void CudaBackend::join(const std::vector<const ScaledGrad*>& parts, ScaledGrad& out, const Precision& p,
                       StepMonitor& monitor, int node_id) {
  GS_CHECK(!parts.empty(), "join of no gradients");
  for (const ScaledGrad* part : parts)
    GS_CHECK_SHAPE(part->g.shape() == parts[0]->g.shape(), "join: gradient shapes "
                                                               << shape_string(part->g.shape()) << " and "
                                                               << shape_string(parts[0]->g.shape()));
  if (!device_decisions_ || parts.size() > static_cast<std::size_t>(kMaxJoinParts)) {
    host_join(parts, out, p, monitor, node_id);
    return;
  }
  // T on the device (join_scale.h) from the parts' max|g_i| and scales: no wait.
  std::vector<StatsJob> jobs;
  for (const ScaledGrad* part : parts) {
    if (part->device_scale < 0)
      GS_CHECK_NUMERIC(std::isfinite(part->scale) && part->scale > 0,
                       "join: scale " << part->scale << " is not finite and > 0");
    jobs.push_back(job_of(part->g.data(), part->g.size(), Format::fp32, p.round));
  }
  tensor_stats(ctx_, jobs, join_stats_.data());
  JoinParts table;
  table.count = static_cast<int>(parts.size());
  table.limit = format_info(p.gradient_format()).max_finite;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    table.stats[i] = join_stats_.data() + i;
    table.scales[i] = scale_entry(*parts[i]);
  }
  const int e = new_scale_entry();
  choose_join_scale(table, scale_at(e), ctx_.stream());
  out.g.resize(parts[0]->g.shape());
  out.g.fill(0.0f);
  const auto n = static_cast<std::size_t>(out.g.size());
  for (std::size_t i = 0; i < parts.size(); ++i)
    scale_add_rescaled(parts[i]->g.data(), scale_at(e), table.scales[i], out.g.data(), n, ctx_.stream());
  out.scale = std::numeric_limits<double>::quiet_NaN();  // known on the host after the step's copy
  out.device_scale = e;
  round_gradient(out.g.data(), n, 1.0f, GradSite::join, node_id, p, monitor);
}

void CudaBackend::host_join(const std::vector<const ScaledGrad*>& parts, ScaledGrad& out, const Precision& p,
                            StepMonitor& monitor, int node_id) {
  std::vector<StatsJob> jobs;
  std::vector<double> scales;
  for (const ScaledGrad* part : parts) {
    jobs.push_back(job_of(part->g.data(), part->g.size(), Format::fp32, p.round));
    scales.push_back(host_scale(*part, monitor));
  }
  std::vector<double> max_abs_parts;
  for (const TensorStats& s : statistics_now(jobs))
    max_abs_parts.push_back(s.nonfinite > 0 ? std::numeric_limits<double>::infinity() : s.max_abs);
  const double target = join_target_scale(max_abs_parts, scales, p.gradient_format());
  out.g.resize(parts[0]->g.shape());
  out.g.fill(0.0f);
  const auto n = static_cast<std::size_t>(out.g.size());
  for (std::size_t i = 0; i < parts.size(); ++i)
    scale_add(parts[i]->g.data(), static_cast<float>(target / scales[i]), out.g.data(), n, ctx_.stream());
  out.scale = target;
  out.device_scale = -1;
  round_gradient(out.g.data(), n, 1.0f, GradSite::join, node_id, p, monitor);
}

namespace {

void check_labels(const Tensor& logits, const std::vector<std::int32_t>& labels) {
  GS_CHECK_SHAPE(logits.rank() == 2 && logits.dim(0) == static_cast<std::int64_t>(labels.size()),
                 "softmax cross-entropy: logits " << shape_string(logits.shape()) << " and " << labels.size()
                                                  << " labels");
  const std::int64_t c = logits.dim(1);
  for (std::size_t i = 0; i < labels.size(); ++i)
    GS_CHECK_NUMERIC(labels[i] >= 0 && labels[i] < c,
                     "label " << labels[i] << " of sample " << i << " is outside [0, " << c << ")");
}

}  // namespace

void CudaBackend::upload_labels(const Tensor& logits, const std::vector<std::int32_t>& labels) {
  check_labels(logits, labels);
  if (labels_.size() < labels.size()) labels_.resize(labels.size());
  GS_CUDA_CHECK(cudaMemcpyAsync(labels_.data(), labels.data(), labels.size() * sizeof(std::int32_t),
                                cudaMemcpyHostToDevice, ctx_.stream()));
}

void CudaBackend::queue_loss_copy() {
  GS_CUDA_CHECK(cudaMemcpyAsync(loss_host_.data(), loss_.data(), sizeof(DeviceLoss), cudaMemcpyDeviceToHost,
                                ctx_.stream()));
}

LossResult CudaBackend::queued_loss(std::int64_t n) const {
  const DeviceLoss& r = *loss_host_.data();
  return LossResult{r.loss_sum / static_cast<double>(n), static_cast<std::int64_t>(r.correct)};
}

LossResult CudaBackend::softmax_cross_entropy(const Tensor& logits, const std::vector<std::int32_t>& labels) {
  upload_labels(logits, labels);
  const std::int64_t n = logits.dim(0);
  cuda::softmax_cross_entropy(ctx_, logits.data(), labels_.data(), n, logits.dim(1), 1.0, nullptr, loss_.data());
  queue_loss_copy();
  ctx_.synchronize();
  return queued_loss(n);
}

void CudaBackend::loss_backward(const Tensor& logits, const std::vector<std::int32_t>& labels, double loss_scale,
                                const Precision& p, ScaledGrad& grad, StepMonitor& monitor, int layer_id) {
  upload_labels(logits, labels);
  start_pass();  // a backward pass starts here: nothing of an abandoned one is reported
  grad.g.resize(logits.shape());
  cuda::softmax_cross_entropy(ctx_, logits.data(), labels_.data(), logits.dim(0), logits.dim(1), loss_scale,
                              grad.g.data(), &header()->loss);
  grad.scale = loss_scale;
  grad.device_scale = -1;
  round_gradient(grad.g.data(), static_cast<std::size_t>(grad.g.size()), 1.0f, GradSite::loss, layer_id, p,
                 monitor);
  loss_pending_ = true;  // copied at finish_backward, with the measurements
  loss_batch_ = logits.dim(0);
}

LossResult CudaBackend::loss_gradient_fp32(const Tensor& logits, const std::vector<std::int32_t>& labels,
                                           Tensor& host_grad) {
  upload_labels(logits, labels);
  const std::int64_t n = logits.dim(0);
  loss_grad_.resize(logits.shape());
  cuda::softmax_cross_entropy(ctx_, logits.data(), labels_.data(), n, logits.dim(1), 1.0, loss_grad_.data(),
                              loss_.data());
  queue_loss_copy();
  host_grad.copy_from(loss_grad_);  // queued after the loss's copy, then waits: one wait for both
  return queued_loss(n);
}

std::unique_ptr<Backend> make_cuda_backend(int device) { return std::make_unique<CudaBackend>(device); }

}  // namespace gradscale::cuda
