// Mixed-precision training with loss scaling, one iteration at a time, as a user's own loop drives it
// (SPEC §4–§5): working weights in F, forward in F, S0 from the scaler, the loss gradient times S0
// rounded to F, backward with the local scales of the scaler's per-layer controller, then the scaler's
// verdict — the optimizer step is applied or skipped, and the caller is told which. Trainer is one
// user of this class; a research loop is another. Public through <gradscale/training.h>.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/core/random.h"
#include "lib/dist/data_parallel.h"
#include "lib/instrument/step_monitor.h"
#include "lib/layers/layer.h"
#include "lib/layers/softmax_cross_entropy.h"
#include "lib/model/model.h"
#include "lib/optim/optimizer.h"
#include "lib/scaler/scaler.h"
#include "lib/train/shadow.h"

namespace gradscale {

// What one iteration did (step()).
struct StepResult {
  std::int64_t step = 0;     // 1-based number of this iteration (steps() after it)
  double loss = 0;           // mean loss of the batch, computed in fp32/fp64 (from loss_backward)
  std::int64_t correct = 0;  // samples whose largest logit is their label
  double loss_scale = 1;     // S0 the loss gradient was multiplied by
  bool found_inf = false;    // a gradient was not finite (or, in a saturating format, beyond its maximum)
  int first_nonfinite_layer = -1;  // in backward order; -1 when none
  bool skipped = false;       // the optimizer step was not applied: weights, moments, step count untouched
  double phi = 1;             // the safety factor of SPEC §6.4 after the update (1 for policies without one)
  double scaler_seconds = 0;  // wall time in the scaler, its controller and the statistics they asked for
  StepReport report;          // the scaler's verdict: report.scale is the next S0, report.state its counters
};

// One layer's scales in the last iteration, for reading and printing (layer_scales()).
struct LayerScale {
  int id = -1;
  std::string name, kind;
  bool parametric = false;    // Linear / Conv2d: the controller chose its local scale (elsewhere too
                              // when it acts there: LayerController::acts_at, "control_at": "all")
  bool ran = false;           // its backward ran (a layer with no parameter on or before it does not)
  bool sent = false;          // it sent a gradient upstream (a first layer does not: s is then 1)
  double s = 1, unbound = 1;  // local scale applied, and the controller's value before bounds
  double scale_in = 1, scale_out = 1;  // accumulated S of the gradient received and sent (s·S_in)
  bool recorded = false;               // the statistics below were taken (begin_step(true))
  double underflow_rate = 0;  // of the activation gradient it sent upstream (SPEC §1), when recorded
};

// The header of a trace (lib/train/trace.h, SPEC §8), written once for the C++ engine
// (ScaledTraining::trace_header) and a backward computed elsewhere (ExternalBackward::trace_header):
// the version, `config` (what describes the run; ConfigError unless an object) under "config", the
// formats of `precision`, the scaler's configuration, the seed and the layer table; "model" is
// `model_name` when it is not empty, else config's "model" when that is a string, else absent.
nlohmann::json make_trace_header(const nlohmann::json& config, const Precision& precision,
                                 const nlohmann::json& scaler, std::uint64_t seed,
                                 const nlohmann::json& layers, const std::string& model_name);

class ScaledTraining {
 public:
  // Attaches `scaler` to `model` for the gradient format of `precision` (binds its controller to the
  // model's layer table). The model (finalized) and the optimizer are borrowed and must outlive this
  // object; the scaler is owned. `seed` seeds the dropout masks (seed ^ 0x9E3779B97F4A7C15, as Trainer).
  ScaledTraining(Model& model, Optimizer& optimizer, const Precision& precision,
                 std::unique_ptr<Scaler> scaler, std::uint64_t seed = 0);
  // The same with the scaler built from a configuration: an object {"policy": NAME, ...} or command-line
  // text as a JSON string ("torch", "static:1024", docs/scalers.md). ConfigError for an unknown policy or
  // key.
  ScaledTraining(Model& model, Optimizer& optimizer, const Precision& precision, const nlohmann::json& scaler,
                 std::uint64_t seed = 0);
  ~ScaledTraining();
  ScaledTraining(const ScaledTraining&) = delete;
  ScaledTraining& operator=(const ScaledTraining&) = delete;

  // ---- one iteration: begin_step, forward, loss_scale, loss_backward, step — in this order ---------
  // Working weights = quantize(master, F); the per-layer records are reset (with full statistics when
  // `record_statistics`: trace steps, or whenever you want to read underflow rates); the scaler is told
  // the iteration begins.
  void begin_step(bool record_statistics = false);
  // Forward in F (training mode: dropout active, BatchNorm on batch statistics). images: [N, sample
  // shape of the model] in fp32, used as given (as Trainer feeds its normalised data), on the host or
  // on the model's device (host images are copied there). Returns the logits [N, classes] on the
  // model's device (Tensor::to_host() reads them), owned by the model and valid until the next forward;
  // `images` must stay alive and unchanged until loss_backward has returned (backward reads it).
  const Tensor& forward(const Tensor& images);
  // S0 for this iteration as the scaler chooses it — from the fp32 loss gradient at scale 1 for policies
  // that look at it (adaptive with init_scale "auto"), else its current scale. Optional: loss_backward
  // takes any S0 > 0 (an experiment may override the scaler's).
  double loss_scale(const Tensor& logits, const std::vector<std::int32_t>& labels);
  // Softmax cross-entropy of the logits (fp32/fp64); its gradient times `loss_scale` (finite, > 0) in
  // fp32, rounded once to the gradient format; then the master gradients are zeroed and backward runs
  // with the scaler's local scales. labels: N values in [0, classes). Afterwards every Parameter::grad
  // holds the true, unscaled fp32 gradient (no unscale step: each layer divides by its own S) unless
  // the iteration overflowed — clip or inspect them here, before step().
  LossResult loss_backward(const Tensor& logits, const std::vector<std::int32_t>& labels, double loss_scale);
  // loss_scale and loss_backward in one call, with S0 as the scaler chooses it: on the model's device
  // when the scaler describes its choice as a rule (Scaler::device_loss_rule: the adaptive policy, unless
  // init_scale "auto" takes a moment-based cast_form) and the backend decides there — then the host does
  // not wait for S0, and the StepResult of step() says which S0 it was. In one process, and not on a
  // step with the fp32 shadow; elsewhere exactly loss_backward(logits, labels, loss_scale(logits, labels)).
  LossResult loss_backward(const Tensor& logits, const std::vector<std::int32_t>& labels);
  // ---- any loss: the same iteration with a loss gradient you computed --------------------------------
  // In place of loss_scale/loss_backward above (softmax cross-entropy): `loss_grad` is dL/d(output) of
  // your loss, fp32 at scale 1, shaped like the output forward() returned, on the host. loss_scale
  // gives S0 as the scaler chooses it from these values; backward multiplies them by S0 in fp32,
  // rounds once to the gradient format (SPEC §5, "Loss") and runs backward as loss_backward does.
  // `loss` is only reported (StepResult::loss). CPU backend only in this version (ConfigError on a
  // device).
  double loss_scale(const Tensor& loss_grad);
  void backward(const Tensor& loss_grad, double loss_scale, double loss = 0);
  // The scaler's verdict from what backward saw (found_inf, per-layer records), then the optimizer step
  // with learning rate `lr` unless the verdict is to skip. Returns what happened, skipped included.
  StepResult step(double lr);

  // ---- data-parallel: one of N ranks (docs/distributed.md) ------------------------------------------
  // From now on this object is one rank of `comm` (borrowed; it must outlive this object): each rank
  // runs every iteration with its own rows of the batch, the same calls in the same order. The loss is
  // the mean over the whole batch (the ranks' row counts are summed), the statistics every decision
  // depends on — S0, each layer's s, the join targets, found_inf, φ and the skip — are reduced over the
  // ranks so every rank takes the decisions one process with the whole batch takes, and the master
  // gradients are summed before the optimizer step. Checks first that every rank built the same model,
  // formats and scaler (ConfigError naming the ranks and the key). On a GPU (a model on the CUDA
  // backend, each rank its own context) every decision is taken on the host from the reduced statistics,
  // and the weight gradients are summed on the device by `gpu_collectives`: "nccl", "host" (through host
  // memory over comm) or "auto" (nccl when the build has it; lib/cuda/collectives.h); ignored on the CPU.
  // With a loss of your own (backward(), CPU backend), give each rank's rows of the whole batch's loss
  // gradient and its share of the loss. Dropout masks are drawn per rank. Save from one rank; load on
  // every rank (any N). A communicator of one rank changes nothing.
  void distribute(Communicator& comm, const std::string& gpu_collectives = "auto");

  // ---- what precision costs each layer (lib/train/shadow.h) ----------------------------------------
  // On: on every step with statistics (begin_step(true)), loss_backward and backward first run the
  // backward pass in fp32 over the same forward values, nothing rounded and nothing scaled, and the
  // step's records get, per layer, ShadowMetrics of the gradient it sent upstream and of its weight
  // gradients against it (in the trace: "shadow"). One more backward pass on those steps. The CPU
  // backend in one process: ConfigError on a device or after distribute().
  void set_shadow(bool on);
  bool shadow() const { return shadow_; }
  // The reductions (null unless distribute() was called): rank, size and what they moved.
  const DataParallel* data_parallel() const { return parallel_.get(); }

  // Inference between iterations: working weights in F, forward in evaluation mode (no dropout,
  // BatchNorm on its running statistics). Returns the logits [N, classes], owned by the model and valid
  // until the next forward. Changes no training state.
  const Tensor& predict(const Tensor& images);

  // ---- save / resume (PyTorch's state_dict and load_state_dict) -----------------------------------
  // Writes, atomically, into directory `dir`: the model's parameters and buffers, the optimizer's state,
  // the scaler's configuration and state (its controller's per-layer caches included), the iteration
  // count and the dropout generator — everything the next iterations depend on — plus the keys of the
  // object `extra` (the caller's own counters: data order, epoch...; keys the checkpoint uses itself are
  // refused). Only between iterations (before begin_step or after step).
  void save(const std::string& dir, const nlohmann::json& extra = nlohmann::json::object()) const;
  // Restores what save() wrote into this object's model, optimizer and scaler, which must be built the
  // same way: the same layers and shapes, formats and scaler configuration (else ConfigError naming what
  // differs; a damaged file is a DataError naming it). Returns the whole checkpoint document, `extra`'s
  // keys included. The next iterations are bit-identical to those of the run that saved.
  nlohmann::json load(const std::string& dir);

  // ---- reading ------------------------------------------------------------------------------------
  std::int64_t steps() const { return steps_; }  // iterations completed (skipped ones included)
  // The records of the current or last iteration: scales per layer, found_inf, and the §3 statistics
  // of every gradient rounded (when recorded). Reset by begin_step.
  const StepMonitor& monitor() const { return monitor_; }
  std::vector<LayerScale> layer_scales() const;  // from monitor(), one row per layer
  // The header of a trace of this run (lib/train/trace.h): make_trace_header with this run's formats,
  // scaler, seed, layer table (Model::layer_table) and model name, `config` (what describes the run;
  // must be an object) stored under "config".
  nlohmann::json trace_header(const nlohmann::json& config = nlohmann::json::object()) const;

  Model& model() { return model_; }
  Optimizer& optimizer() { return optimizer_; }
  Scaler& scaler() { return *scaler_; }
  const Scaler& scaler() const { return *scaler_; }
  const Precision& precision() const { return precision_; }

 private:
  enum class Phase { idle, begun, forwarded, backwarded };
  void expect(Phase phase, const char* call) const;
  // `images` on the model's device: itself, or its copy in input_.
  const Tensor& on_model_device(const Tensor& images);
  std::size_t state_tensor_count() const;
  // S0 from an fp32 loss gradient at scale 1 (host), as the scaler chooses it.
  double choose_loss_scale(const Tensor& loss_grad_fp32);
  // The whole batch's sample count (this rank's `local` in one process), once per iteration.
  std::int64_t batch_total(std::int64_t local);
  // A rank's own dropout stream: the generator's state mixed with the rank (rank 0 keeps it).
  void mix_rank_into_rng();
  void check_outside_loss_grad(const Tensor& loss_grad, const char* call) const;
  // The shadow pass from the fp32 loss gradient at scale 1, when this step has one (else null).
  std::unique_ptr<ShadowRecorder> shadow_pass(const ScaledGrad& loss_grad_fp32);
  // From loss_grad_ (the rounded loss gradient at S0): zero the gradients, run the model's backward
  // (compared with `shadow` when given), finish the pass and note its loss.
  void run_backward(ShadowRecorder* shadow);
  bool shadow_due() const { return shadow_ && monitor_.record; }
  nlohmann::json identity() const;

  Model& model_;
  Optimizer& optimizer_;
  Precision precision_;
  std::unique_ptr<Scaler> scaler_;
  std::uint64_t seed_;
  Rng rng_;  // dropout masks
  StepMonitor monitor_;
  ScaledGrad loss_grad_;
  Tensor loss_fp32_;  // the loss gradient at scale 1 (host), for policies that choose S0 from it
  Tensor input_;      // host images copied to the model's device
  const Tensor* output_ = nullptr;  // what the last forward returned (the shape an outside loss gradient has)
  Phase phase_ = Phase::idle;
  std::int64_t steps_ = 0;
  StepResult current_;  // filled while the iteration runs
  std::unique_ptr<DataParallel> parallel_;  // data-parallel: this rank's reductions (distribute())
  std::unique_ptr<DeviceCollectives> device_collectives_;  // a GPU model's: what parallel_ sums its gradients with
  std::int64_t batch_total_ = -1;           // the whole batch's count in this iteration (-1: not yet)
  bool shadow_ = false;                     // set_shadow
};

}  // namespace gradscale
