// The CUDA backend's scale table (see backend.h): the scales decided on the device in a pass, their
// copy to the host, and the records and controller calls that wait for them.
#include "lib/cuda/backend.h"

#include <algorithm>
#include <cmath>

#include "lib/layers/scale_step.h"
#include "lib/scaler/scale_range.h"

namespace gradscale::cuda {

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
  if (loss_scale_entry_ >= 0) {  // S0 chosen on the device (loss_backward_device_s0): its value and floor
    const DeviceScale& e = on_host(loss_scale_entry_);
    device_loss_ = LossScaleDecision{e.scale, e.unbound};
    loss_scale_entry_ = -1;
  }
  for (const PendingNote& n : notes_) {  // first: a decision at the same layer then sets its S_out
    LayerRecord& r = monitor.record_of(n.layer);
    r.scale_in = r.scale_out = on_host(n.entry).scale;
  }
  notes_.clear();
  // r decided on the device, one entry per weight gradient: the layer's record keeps the smallest.
  std::vector<int> seen;
  for (const PendingNote& n : weight_grad_scales_) {
    const bool first = std::find(seen.begin(), seen.end(), n.layer) == seen.end();
    keep_smallest_weight_grad_scale(monitor.record_of(n.layer), on_host(n.entry).local, first);
    if (first) seen.push_back(n.layer);
  }
  weight_grad_scales_.clear();
  // As the CPU's accumulate_weight_grad: a weight gradient divided by a scale outside float32's range
  // (lib/scaler/scale_range.h) makes the step non-finite, so the scaler skips it.
  for (const PendingNote& n : unscaled_at_)
    if (!scale_in_float_range(on_host(n.entry).scale)) monitor.note_nonfinite(n.layer);
  unscaled_at_.clear();
  std::vector<PendingDecision> decisions;
  decisions.swap(decisions_);
  for (const PendingDecision& d : decisions) {
    const DeviceScale& e = on_host(d.entry);
    check_local_scale(e.local, d.policy, d.layer_name);
    LayerRecord& r = monitor.record_of(d.layer);
    r.local_scale = e.local;
    r.unbound_scale = e.unbound;
    r.scale_limit = static_cast<int>(e.limit);
    r.scale_out = e.scale;
    d.controller->accept(d.layer, LocalScale{e.local, e.unbound, r.scale_limit});
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

}  // namespace gradscale::cuda
