// The CUDA backend (lib/backend's seam on one GPU): tensors in device memory, layers that compute with
// cuBLAS and the lib/cuda kernels, and the precision model's shared steps (SPEC §4–§5) on the device.
//
// Measurement without a synchronisation per rounding: every gradient rounding queues its SPEC §3
// statistics (of the fp32 values before rounding, which also yield max|g| and the non-finite count;
// measured by the pass that rounds them, cuda::measure_and_round) into a slot of the step's record array, and finish_backward copies that array to
// the host in one piece (page-locked memory) and fills the StepMonitor in the order the roundings
// happened — found_inf, the first non-finite layer, max|g| per layer and, on recording steps, the
// statistics: the records the CPU's round_gradient writes as it goes. The same copy brings the step's
// loss value and popart_als's edge counts (added up on the device).
//
// Scales decided without a wait: a controller that describes its decision as a rule
// (LayerController::device_rule) has it evaluated on the device (local_scale.h) from statistics that
// stay there, and a join chooses its target T on the device (join_scale.h). The scales those produce
// live in the pass's scale table (ScaledGrad::device_scale) and are read there by every kernel that
// needs them (the rounding's multiplier, the unscale, the next decision, the next join); the same one
// copy brings them to the host, which then fills the layer records and hands each decision to its
// controller (accept). So a step waits for the device once for its measurements and once more for the
// trainer's divergence check (first_nonfinite: one index per parameter), under a global policy and
// under an adaptive one alike; a policy that chooses S0 from the loss gradient by a rule
// (Scaler::device_loss_rule) has it chosen here too (loss_backward_device_s0). It waits elsewhere only
// where the host decides from device values: a controller without a device rule (its query's
// statistics), a policy that chooses S0 from the loss gradient without one, and a layer that runs on
// the host (HostLayer in host_layer.cpp). host_waits() counts the waits.
//
// Data-parallel training (a StatisticsReducer in the BackwardContext, docs/distributed.md): every
// decision is then the host's, from the statistics copied there and reduced over the ranks — the
// CPU engine's reductions, exactly — and each weight gradient is summed over the ranks on the device
// (DeviceCollectives) before its one rounding. The device rules are not used then: their statistics
// would have to be reduced on the device first.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lib/backend/backend.h"
#include "lib/cuda/context.h"
#include "lib/cuda/device_buffer.h"
#include "lib/cuda/edge_counts.h"
#include "lib/cuda/gemm.h"
#include "lib/cuda/join_scale.h"
#include "lib/cuda/local_scale.h"
#include "lib/cuda/optim_step.h"
#include "lib/cuda/softmax_cross_entropy.h"
#include "lib/cuda/stats.h"
#include "lib/cuda/unscale.h"
#include "lib/cuda/working_copies.h"
#include "lib/layers/precision_ops.h"

namespace gradscale::cuda {

// Device memory of one CudaContext, for Tensor (allocations are cudaMalloc'd; copies and fills are
// queued on the context's stream; to_host waits for it).
class CudaMemory final : public DeviceMemory {
 public:
  explicit CudaMemory(CudaContext& ctx) : ctx_(ctx) {}
  Device device() const override { return Device::cuda; }
  float* allocate(std::size_t n) override;
  void release(float* p) noexcept override;
  void fill(float* p, std::size_t n, float value) override;
  void copy(float* dst, const float* src, std::size_t n) override;
  void from_host(float* dst, const float* host, std::size_t n) override;
  void to_host(float* host, const float* src, std::size_t n) override;

 private:
  CudaContext& ctx_;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;

  Device device() const override { return Device::cuda; }
  std::string description() const override;
  DeviceMemory* memory() override { return &memory_; }
  std::unique_ptr<Layer> adopt(std::unique_ptr<Layer> layer, const LayerPlacement& placement) override;
  void join(const std::vector<const ScaledGrad*>& parts, ScaledGrad& out, const Precision& p,
            StepMonitor& monitor, int node_id, StatisticsReducer* reducer) override;
  LossResult softmax_cross_entropy(const Tensor& logits, const std::vector<std::int32_t>& labels) override;
  void loss_backward(const Tensor& logits, const std::vector<std::int32_t>& labels, double loss_scale,
                     const Precision& p, ScaledGrad& grad, StepMonitor& monitor, int layer_id,
                     std::int64_t mean_over) override;
  bool loss_backward_device_s0(const Tensor& logits, const std::vector<std::int32_t>& labels,
                               const LossScaleRule& rule, const Precision& p, ScaledGrad& grad, StepMonitor& monitor,
                               int layer_id, std::int64_t mean_over) override;
  LossScaleDecision device_loss_scale() const override { return device_loss_; }
  LossResult loss_gradient_fp32(const Tensor& logits, const std::vector<std::int32_t>& labels,
                                Tensor& host_grad, std::int64_t mean_over) override;
  void note_backward(int layer_id, const ScaledGrad& g, StepMonitor& monitor) override;
  void finish_backward(StepMonitor& monitor) override;
  void synchronize() override { ctx_.synchronize(); }
  std::vector<std::int64_t> first_nonfinite(const std::vector<const Tensor*>& tensors) override;
  std::int64_t host_waits() const override { return ctx_.waits(); }
  void set_gemm_timing(bool on) override { ctx_.set_gemm_timing(on); }
  double gemm_seconds() override { return ctx_.take_gemm_seconds(); }
  void set_conv_algorithm(const std::string& algorithm) override;
  bool implicit_convolution() const { return implicit_conv_; }  // conv_algorithm "implicit"
  DeviceOptimizerKernels* optimizer_kernels() override { return optimizer_.get(); }
  ArrayOps& array_ops() override { return *array_ops_; }
  // "host" (through page-locked host memory over comm) or "nccl" (lib/cuda/collectives.h); "auto": nccl
  // when this build has it.
  std::unique_ptr<DeviceCollectives> device_collectives(Communicator& comm, const std::string& kind) override;

  CudaContext& context() { return ctx_; }

  // ---- the precision model's shared steps on device tensors (the twins of lib/layers/precision_ops.h) ----
  // d (device) ← quantize(multiplier·d, gradient format), measured as round_gradient does (queued); with
  // `factor`, the multiplier is factor->local, read on the device; with `unscale` (its grad is d), d then
  // unscaled into its master (unscale_accumulate, into the step's found_inf); with `decides_r`, a weight
  // gradient's r decided from d first (n ≤ one_block_values()). One pass (cuda::measure_and_round), except
  // for popart_als's weight gradients, whose edge counts read the values between the passes.
  void round_gradient(float* d, std::size_t n, float multiplier, GradSite site, int node, const Precision& p,
                      StepMonitor& monitor, const DeviceScale* factor = nullptr, const UnscaleJob* unscale = nullptr,
                      const WeightGradDecision* decides_r = nullptr);
  void round_activation_grad(Tensor& t, int layer_id, const Precision& p, StepMonitor& monitor);
  void round_output(Tensor& t, const Precision& p);
  // working ← the master rounded to F and, with `half`, its bits as `half_type` (f16 / bf16) too, in one
  // pass; queued until end_prepare_weights() inside Model::prepare_weights (every parameter of the model
  // in one launch: working_copies.h), else launched at once.
  void round_working_copy(const Parameter& master, Tensor& working, const Precision& p,
                          std::uint16_t* half = nullptr, DeviceType half_type = DeviceType::f32);
  void begin_prepare_weights() override;
  void end_prepare_weights() override;
  // The last pass that writes a layer's fp32 upstream product into gx.g (a convolution's col2im), when
  // the layer leaves it to scale_upstream_grad: write(nullptr, nullptr, nullptr) writes gx.g;
  // write(job, out, then) also measures it as tensor_stats would for job's format into *out and takes
  // `then` in the same launch (cuda::col2im_measured). Run once, before anything reads gx.g.
  using UpstreamWrite = std::function<void(const StatsJob* job, DeviceStats* out, const StatsDecision* then)>;
  // SPEC §5 steps 1–2 with gx.g holding the fp32 upstream product at S_in (see scale_upstream_grad), or
  // written by `write` first: a controller that decides on the device from that product's statistics
  // gets them from the pass that writes it.
  void scale_upstream_grad(const Layer& layer, const ScaledGrad& grad_output, const UpstreamProduct& product,
                           ScaledGrad& gx, BackwardContext& ctx, const UpstreamWrite& write = {});
  // g (the layer's fp32 weight gradient) rounded, then unscaled by the scale of `at` (its output
  // gradient: on the host or in the scale table) into param.grad.
  void accumulate_weight_grad(Tensor& g, const ScaledGrad& at, Parameter& param, int layer_id, const Precision& p,
                              StepMonitor& monitor);
  // SPEC §4 step 3 with §6.5 for one layer (the twin of lib/layers/precision_ops.h's accumulate_weight_grads):
  // `grads` hold its parameters' fp32 gradients at the scale of `at`. Under a per-layer policy a factor
  // r for each — decided on the device when the controller gives the bound of its rule
  // (LayerController::device_weight_grad_bound) and device decisions are on, else by the host from its
  // maximum (one wait) — multiplies it before its rounding, and it is unscaled by r·S.
  void accumulate_weight_grads(const Layer& layer, std::initializer_list<WeightGrad> grads, const ScaledGrad& at,
                               BackwardContext& ctx);
  // g's scale on the host: g.scale, or its entry in the scale table, which waits for the device
  // (enter_measurements) when the table has not been copied since the entry was made.
  double host_scale(const ScaledGrad& g, StepMonitor& monitor);
  // g's scale in device memory: its entry in the scale table, or a new entry holding g.scale.
  const DeviceScale* scale_entry(const ScaledGrad& g);
  // On by default: controllers with a device rule decide on the device, joins choose T there. Off: the
  // host decides every scale, waiting for the statistics (the comparison the tests make).
  void set_device_decisions(bool on) { device_decisions_ = on; }
  bool device_decisions() const { return device_decisions_; }
  // The queued measurements of the pass so far into `monitor`, in rounding order (one copy; waits for
  // the device): what finish_backward does first, and what a host layer needs before its own records.
  void enter_measurements(StepMonitor& monitor);
  // The statistics of several device tensors now (one kernel pair, one copy, waits for the device).
  std::vector<TensorStats> statistics_now(const std::vector<StatsJob>& jobs);

  // ---- 16-bit GEMM operands (SPEC §4: products of F values, fp32 accumulation) ----
  // The storage type a GEMM reads for two operands holding values of formats a and b (`exact`: the
  // graph guarantees they do, LayerPlacement): fp16 or bf16 — real 16-bit storage, tensor cores — when
  // both are that format and 16-bit GEMMs are on, else fp32. The products are the same either way (exact
  // in fp32); only the order of the fp32 sums may differ.
  DeviceType gemm_type(Format a, Format b, bool exact) const;
  // n floats at `data` as `type`: the array itself for fp32, else its conversion (exact: the values are
  // in that format) into scratch slot `slot` (0 or 1, the two operands of one GEMM; the next GEMM on the
  // stream may reuse it).
  const void* gemm_operand(const float* data, std::size_t n, DeviceType type, int slot);
  // Scratch slot `slot` with room for n 16-bit values, for a layer that writes a GEMM operand there
  // itself (a convolution's columns, im2col_16bit); the same reuse as gemm_operand's.
  std::uint16_t* gemm_slot(int slot, std::size_t n);
  // n floats at `data` (values of that format) into `out` as fp16 or bf16 storage, queued.
  void to_16bit(const float* data, std::size_t n, DeviceType type, std::uint16_t* out);
  // On by default; off makes every GEMM read the fp32 arrays (for comparisons and benchmarks).
  void set_16bit_gemms(bool on) { gemm16_ = on; }
  bool uses_16bit_gemms() const { return gemm16_; }

 private:
  struct Pending {
    GradSite site;
    int node;
    bool quantized;
    Precision precision;  // the gradient format and rounding options of the check
  };
  // The step's records: a header, then one DeviceStats per rounding (slot i, in rounding order), in one
  // device array with a page-locked mirror on the host; slots beyond its capacity go to overflow
  // arrays, and the array grows at the end of such a step so that the next one fits.
  struct StepHeader {
    DeviceLoss loss;        // loss_backward's sums
    DeviceEdgeCounts edge;  // popart_als: the weight gradients' counts about the edge
  };
  static constexpr std::size_t kStatsOffset =
      (sizeof(StepHeader) + alignof(DeviceStats) - 1) / alignof(DeviceStats) * alignof(DeviceStats);
  // A decision made on the device, reported to the host at the next enter_measurements.
  struct PendingDecision {
    int entry;  // in the scale table
    int layer;
    LayerController* controller;
    std::string policy, layer_name;  // for the error when the decision is not a finite s > 0
  };
  // A layer whose incoming gradient's scale is on the device (its record's S_in, filled in later).
  struct PendingNote {
    int entry, layer;
  };
  void reserve_records(std::size_t slots);
  int new_scale_entry();               // the next entry of the pass's scale table
  DeviceScale* scale_at(int entry);    // its address (stable for the pass)
  void copy_scales_to_host();          // queues the copy of the entries not yet on the host
  void resolve_scales(StepMonitor& monitor);  // after that copy: records, accept(), checks
  void host_join(const std::vector<const ScaledGrad*>& parts, ScaledGrad& out, const Precision& p,
                 StepMonitor& monitor, int node_id, StatisticsReducer* reducer);
  void decide_on_device(ScaleRule rule, LayerController& controller, const Layer& layer,
                        const ScaledGrad& grad_output, const UpstreamProduct& product, ScaledGrad& gx,
                        BackwardContext& ctx, const UpstreamWrite& write);
  StepHeader* header() { return reinterpret_cast<StepHeader*>(records_.data()); }
  DeviceStats* next_slot();
  void start_pass();  // loss_backward: nothing of an abandoned pass is reported
  void upload_labels(const Tensor& logits, const std::vector<std::int32_t>& labels);  // checked first
  void queue_loss_copy();                        // loss_ → loss_host_, queued
  LossResult queued_loss(std::int64_t batch) const;  // that copy's sums as the mean over `batch` (after a wait)

  CudaContext ctx_;
  CudaMemory memory_;
  std::unique_ptr<DeviceOptimizerKernels> optimizer_;
  std::unique_ptr<ArrayOps> array_ops_;  // lib/cuda/array_ops.h, on ctx_
  DeviceBuffer<unsigned char> records_;
  PinnedBuffer<unsigned char> records_host_;
  std::size_t record_slots_ = 0;
  static constexpr std::size_t kChunk = 256;
  std::vector<DeviceBuffer<DeviceStats>> overflow_;  // slot record_slots_ + i in overflow_[i / kChunk]
  std::vector<Pending> pending_;
  // The pass's scale table: chunks of kChunk entries (never moved while kernels may read them), each
  // with a page-locked mirror; entries below scales_on_host_ have been copied.
  std::vector<DeviceBuffer<DeviceScale>> scale_chunks_;
  std::vector<PinnedBuffer<DeviceScale>> scale_mirrors_;
  int scales_used_ = 0, scales_on_host_ = 0;
  std::vector<PendingDecision> decisions_;
  std::vector<PendingNote> notes_;
  std::vector<PendingNote> weight_grad_scales_;  // r decided on the device: the layer record's weight_grad_scale
  std::vector<PendingNote> unscaled_at_;  // device scales weight gradients were divided by: checked on the host
  bool device_decisions_ = true;
  bool queue_copies_ = false;         // inside Model::prepare_weights: round_working_copy queues
  std::vector<CopyJob> copy_jobs_;     // the queued working copies, all rounded with copy_precision_
  Precision copy_precision_;
  bool implicit_conv_ = false;  // conv_algorithm "implicit": CudaConv2d by lib/cuda/conv_implicit.h
  DeviceBuffer<DeviceStats> query_stats_;  // a device decision's statistics (g, W, upstream)
  DeviceBuffer<DeviceStats> join_stats_;   // a device join's parts
  bool edge_counting_ = false;                       // header()->edge is counting in this pass
  DeviceBuffer<DeviceStats> now_;        // statistics_now's results
  DeviceBuffer<std::int32_t> labels_;    // the batch's labels
  DeviceBuffer<DeviceLoss> loss_;        // the evaluation loss's sums
  PinnedBuffer<DeviceLoss> loss_host_;   // their copy on the host
  bool loss_pending_ = false;            // loss_backward's sums (in the header) await finish_backward
  std::int64_t loss_batch_ = 0;
  DeviceBuffer<int> found_inf_;          // unscale_accumulate's flag (the host decides from the records)
  Tensor loss_grad_;                     // loss_gradient_fp32's device result
  int loss_scale_entry_ = -1;            // loss_backward_device_s0's S0 in the scale table, until resolved
  LossScaleDecision device_loss_;        // ... and on the host after the step's copy
  DeviceBuffer<unsigned long long> nonfinite_;  // first_nonfinite's results
  bool gemm16_ = true;
  DeviceBuffer<std::uint16_t> gemm_slots_[2];  // 16-bit copies of a GEMM's two operands
};

std::unique_ptr<Backend> make_cuda_backend(int device);

}  // namespace gradscale::cuda
