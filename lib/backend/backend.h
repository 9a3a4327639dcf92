// The device seam (docs/architecture.md, "The device seam"). A backend is where a model computes: the
// host (CpuBackend: Eigen and OpenMP, today's layer code) or a GPU (lib/cuda's CudaBackend: cuBLAS and
// the lib/cuda kernels). Tensors carry their device (lib/tensor); a Model is built on the host from its
// spec and then moved to a backend (Model::use_backend), which gives every layer its twin there. What the
// device-agnostic code — Model, ScaledTraining, Optimizer, Trainer — needs beyond the layers is this
// interface: the join, the loss, the end of a backward pass and the optimizer's element loops. Scalers
// and controllers never see a backend: they get the same statistics, computed where the data lives.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lib/backend/array_ops.h"
#include "lib/dist/communicator.h"
#include "lib/instrument/statistics_reducer.h"
#include "lib/layers/layer.h"
#include "lib/layers/precision_ops.h"
#include "lib/layers/softmax_cross_entropy.h"
#include "lib/optim/optimizer.h"
#include "lib/scaler/scale_rule.h"
#include "lib/tensor/tensor.h"

namespace gradscale {

class Backend {
 public:
  virtual ~Backend() = default;
  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual Device device() const = 0;
  // One line for logs and results: "cpu (8 threads)", "cuda: NVIDIA H100 ..., sm_90, ...".
  virtual std::string description() const = 0;
  // The memory this backend's tensors live in (null: the host). It must outlive the tensors.
  virtual DeviceMemory* memory() = 0;

  // This backend's twin of a layer built on the host: the same name, kind, shapes and parameter values
  // (the host layer's parameters are copied over). `placement` says what the graph guarantees about
  // the values the layer will see (a device may store them in 16 bits for its GEMMs). The CPU backend
  // returns the layer itself.
  virtual std::unique_ptr<Layer> adopt(std::unique_ptr<Layer> layer, const LayerPlacement& placement) = 0;

  // SPEC §5's join at a forked tensor (lib/model/join.h): out = round(Σ g_i·T/S_i) at scale T. With a
  // `reducer` (data-parallel training) T is chosen from the parts' maxima over the ranks.
  virtual void join(const std::vector<const ScaledGrad*>& parts, ScaledGrad& out, const Precision& p,
                    StepMonitor& monitor, int node_id, StatisticsReducer* reducer) = 0;
  // Softmax cross-entropy of logits on this backend (lib/layers/softmax_cross_entropy.h), labels on the
  // host: the loss alone (evaluation); waits for it.
  virtual LossResult softmax_cross_entropy(const Tensor& logits, const std::vector<std::int32_t>& labels) = 0;
  // The start of a training step's backward pass (SPEC §5): grad ← the loss gradient times S0, rounded
  // to F at the loss site (its statistics recorded under layer_id). The loss and the correct count go to
  // monitor.loss and monitor.correct by the time finish_backward returns: a device backend copies them
  // at the end of the pass with its measurements instead of waiting for the device here. `mean_over`
  // (0: the logits' rows) is the count the loss is the mean over: data-parallel training gives the
  // whole batch's, so a rank's rows of the gradient are the one process's rows and its loss its share.
  virtual void loss_backward(const Tensor& logits, const std::vector<std::int32_t>& labels, double loss_scale,
                             const Precision& p, ScaledGrad& grad, StepMonitor& monitor, int layer_id,
                             std::int64_t mean_over) = 0;
  // loss_backward at an S0 chosen on this backend's device by `rule` (Scaler::device_loss_rule) from the
  // statistics of the fp32 loss gradient at scale 1, so that the host does not wait for S0; the decision
  // comes to the host with the step's measurements (device_loss_scale, after finish_backward). Returns
  // false, having done nothing, where the backend decides nothing on a device (the CPU's; a GPU's with
  // device decisions off): the caller then chooses S0 on the host and calls loss_backward.
  virtual bool loss_backward_device_s0(const Tensor& /*logits*/, const std::vector<std::int32_t>& /*labels*/,
                                       const LossScaleRule& /*rule*/, const Precision& /*p*/, ScaledGrad& /*grad*/,
                                       StepMonitor& /*monitor*/, int /*layer_id*/, std::int64_t /*mean_over*/) {
    return false;
  }
  // The S0 and floor the last loss_backward_device_s0 chose, once finish_backward has returned.
  virtual LossScaleDecision device_loss_scale() const { return {}; }
  // The fp32 loss gradient at scale 1, before any rounding, into `host_grad` (host memory, resized to
  // the logits' shape): what a policy that chooses S0 from the loss gradient looks at (small: the
  // logits' size). Returns the loss. `mean_over` as for loss_backward.
  virtual LossResult loss_gradient_fp32(const Tensor& logits, const std::vector<std::int32_t>& labels,
                                        Tensor& host_grad, std::int64_t mean_over) = 0;
  // Model::backward's note that layer_id runs backward on gradient g (lib/layers/precision_ops.h's
  // note_backward: the layer record's S_in). A device backend that holds g's scale on the device
  // (ScaledGrad::device_scale) fills the record in by finish_backward.
  virtual void note_backward(int layer_id, const ScaledGrad& g, StepMonitor& monitor) {
    gradscale::note_backward(layer_id, g.scale, monitor);
  }
  // After a backward pass: completes `monitor` (a device backend fills in what its kernels measured —
  // found_inf, max|g|, the statistics — from one copy to the host) and the loss of loss_backward.
  // Before the scaler reads it.
  virtual void finish_backward(StepMonitor& monitor) = 0;
  // Waits until the work queued on this backend has finished (timings; a no-op on the host).
  virtual void synchronize() = 0;
  // The divergence check's scan (lib/train/divergence.h): for each tensor, the index of its first value
  // that is inf or NaN, or -1 when all are finite. A device backend scans its tensors in one pass and
  // copies one index per tensor to the host.
  virtual std::vector<std::int64_t> first_nonfinite(const std::vector<const Tensor*>& tensors) = 0;
  // How many times the host has waited for this backend's device so far (every copy to the host and
  // every synchronize is one): `bench step` reports it per step. Always 0 on the host.
  virtual std::int64_t host_waits() const { return 0; }
  // Timing of the matrix products for `bench step`: while on, the backend measures the time its GEMMs
  // take; gemm_seconds() waits for the backend and returns that time since the last call (then starts
  // again), or a negative value when the backend does not time its GEMMs (the CPU's are inside Eigen).
  virtual void set_gemm_timing(bool /*on*/) {}
  virtual double gemm_seconds() { return -1.0; }
  // Model::prepare_weights brackets its layers' working-copy roundings with these: a backend may queue
  // the roundings made between them and run them together at the end (the CUDA backend: one launch for
  // all). Outside the bracket every rounding is made at once.
  virtual void begin_prepare_weights() {}
  virtual void end_prepare_weights() {}
  // How convolutions compute their output and upstream gradient (config key conv_algorithm): "im2col"
  // (the columns, then a GEMM over them: every backend's) or "implicit" (no columns: lib/cuda/
  // conv_implicit.h, the CUDA backend's). The layers read it at each pass. ConfigError for a name this
  // backend does not have.
  virtual void set_conv_algorithm(const std::string& algorithm);
  // The optimizer's element loops for this backend's parameters (null: the host loops).
  virtual DeviceOptimizerKernels* optimizer_kernels() = 0;
  // The precision steps on raw arrays in this backend's memory (lib/backend/array_ops.h), for a
  // backward pass another engine computes (ExternalBackward).
  virtual ArrayOps& array_ops() = 0;
  // Data-parallel training over `comm`: the collectives that sum this backend's weight gradients where
  // they are (lib/dist/communicator.h), or null for host memory (the communicator sums those). `kind`:
  // "auto", "nccl" or "host" (a device's gradients through host memory over `comm`). ConfigError for a
  // kind this backend or build does not have. The result must not outlive this backend or `comm`.
  virtual std::unique_ptr<DeviceCollectives> device_collectives(Communicator& comm, const std::string& kind) = 0;
};

// The host backend (stateless; one per process): every model's backend until Model::use_backend.
Backend& cpu_backend();

// A backend by name: "cpu" (a CpuBackend of its own), "cuda" (device 0) or "cuda:N". ConfigError for another
// name or for "cuda" in a program without the CUDA backend (gradscale::cuda); CudaError ("no CUDA device:
// ...") when there is no GPU.
std::unique_ptr<Backend> make_backend(const std::string& device);
// Whether this program has the CUDA backend: it links gradscale::cuda (lib/cuda).
bool cuda_backend_built();
// How many CUDA devices this process sees (0 without the CUDA backend or without a GPU). Never throws.
int cuda_device_count();

}  // namespace gradscale
