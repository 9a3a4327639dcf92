// The CUDA backend's softmax cross-entropy (see backend.h): the labels' check and upload, the loss and
// its gradient at S0, and the loss's copy to the host.
#include "lib/cuda/backend.h"

#include <cmath>
#include <limits>

namespace gradscale::cuda {

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
  cuda::softmax_cross_entropy(ctx_, logits.data(), labels_.data(), n, logits.dim(1), 1.0, nullptr,
                              loss_.data());
  queue_loss_copy();
  ctx_.synchronize();
  return queued_loss(n);
}

void CudaBackend::loss_backward(const Tensor& logits, const std::vector<std::int32_t>& labels,
                                double loss_scale, const Precision& p, ScaledGrad& grad, StepMonitor& monitor,
                                int layer_id, std::int64_t mean_over) {
  upload_labels(logits, labels);
  start_pass();  // a backward pass starts here: nothing of an abandoned one is reported
  grad.g.resize(logits.shape());
  cuda::softmax_cross_entropy(ctx_, logits.data(), labels_.data(), logits.dim(0), logits.dim(1), loss_scale,
                              grad.g.data(), &header()->loss, mean_over);
  grad.scale = loss_scale;
  grad.device_scale = -1;
  round_gradient(grad.g.data(), static_cast<std::size_t>(grad.g.size()), 1.0f, GradSite::loss, layer_id, p,
                 monitor);
  loss_pending_ = true;  // copied at finish_backward, with the measurements
  loss_batch_ = mean_over > 0 ? mean_over : logits.dim(0);  // the loss: this rank's share of the mean
}

bool CudaBackend::loss_backward_device_s0(const Tensor& logits, const std::vector<std::int32_t>& labels,
                                          const LossScaleRule& rule, const Precision& p, ScaledGrad& grad,
                                          StepMonitor& monitor, int layer_id, std::int64_t mean_over) {
  if (!device_decisions_) return false;
  upload_labels(logits, labels);
  start_pass();  // a backward pass starts here: nothing of an abandoned one is reported
  const std::int64_t n = logits.dim(0), classes = logits.dim(1);
  // The fp32 gradient at scale 1 (loss_gradient_fp32's, left on the device), its statistics in the
  // gradient format, S0 from them in the scale table; then the gradient at S0 as loss_backward's —
  // computed again, not multiplied: its factor is float(S0 / N), as the CPU's, and S0·float(1 / N) is
  // not that float for every S0 (one not a power of two, a product in float32's subnormal range).
  loss_grad_.resize(logits.shape());
  cuda::softmax_cross_entropy(ctx_, logits.data(), labels_.data(), n, classes, 1.0, loss_grad_.data(),
                              &header()->loss, mean_over);
  loss_scale_entry_ = new_scale_entry();
  // S0, taken by the launch of the statistics it reads.
  const StatsJob job = job_of(loss_grad_.data(), loss_grad_.size(), p.gradient_format(), p.round);
  tensor_stats(ctx_, &job, 1, query_stats_.data(), StatsDecision::loss_scale(rule, scale_at(loss_scale_entry_)));
  grad.g.resize(logits.shape());
  cuda::softmax_cross_entropy(ctx_, logits.data(), labels_.data(), n, classes, scale_at(loss_scale_entry_),
                              grad.g.data(), &header()->loss, mean_over);
  grad.scale = std::numeric_limits<double>::quiet_NaN();  // known on the host after the step's copy
  grad.device_scale = loss_scale_entry_;
  round_gradient(grad.g.data(), static_cast<std::size_t>(grad.g.size()), 1.0f, GradSite::loss, layer_id, p,
                 monitor);
  loss_pending_ = true;  // copied at finish_backward, with the measurements
  loss_batch_ = mean_over > 0 ? mean_over : n;
  return true;
}

LossResult CudaBackend::loss_gradient_fp32(const Tensor& logits, const std::vector<std::int32_t>& labels,
                                           Tensor& host_grad, std::int64_t mean_over) {
  upload_labels(logits, labels);
  const std::int64_t n = logits.dim(0);
  loss_grad_.resize(logits.shape());
  cuda::softmax_cross_entropy(ctx_, logits.data(), labels_.data(), n, logits.dim(1), 1.0, loss_grad_.data(),
                              loss_.data(), mean_over);
  queue_loss_copy();
  host_grad.copy_from(loss_grad_);  // queued after the loss's copy, then waits: one wait for both
  return queued_loss(mean_over > 0 ? mean_over : n);
}

}  // namespace gradscale::cuda
