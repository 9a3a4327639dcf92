// One iteration of mixed-precision training with loss scaling, and its save/resume (see scaled_training.h).
#include "lib/train/scaled_training.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>
#include <sstream>

#include "lib/backend/backend.h"
#include "lib/core/json_read.h"
#include "lib/layers/precision_ops.h"
#include "lib/train/checkpoint.h"
#include "lib/train/scaler_setup.h"
#include "lib/train/verdict.h"

namespace gradscale {
namespace {

// The keys save() writes itself (write_checkpoint adds schema, tensor_file, tensor_bytes and checksum);
// `extra` may not use them.
const char* const kReservedKeys[] = {"schema", "identity",    "steps",        "scaler",  "optimizer",
                                     "rng",    "tensor_file", "tensor_bytes", "checksum"};
constexpr std::int64_t kMaxSteps = std::int64_t{1} << 62;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// What differs between two identities, for the refusal message.
std::string identity_difference(const nlohmann::json& saved, const nlohmann::json& now) {
  for (const char* key : {"format", "grad_format", "weight_grads"})
    if (saved.value(key, nlohmann::json()) != now.at(key))
      return std::string(key) + " " + json_excerpt(saved.value(key, nlohmann::json())) + ", this run " +
             now.at(key).dump();
  nlohmann::json a = saved.value("layers", nlohmann::json::array());
  if (!a.is_array()) a = nlohmann::json::array();
  const nlohmann::json& b = now.at("layers");
  for (std::size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    if (i < a.size() && i < b.size() && a[i] == b[i]) continue;
    const auto describe = [](const nlohmann::json& layers, std::size_t k) {
      if (k >= layers.size()) return std::string("none");
      const nlohmann::json& l = layers[k];
      const auto text_of = [&l](const char* key) {
        const auto it = l.find(key);  // end() for anything but an object
        return it != l.end() && it->is_string() ? text_excerpt(it->get<std::string>(), 80) : std::string("?");
      };
      std::string text = "'" + text_of("name") + "' (" + text_of("kind");
      if (!l.is_object()) return text + ")";
      const nlohmann::json params = l.value("parameters", nlohmann::json::array());
      if (!params.empty() && params[0].is_object()) {
        std::string shape;
        for (const nlohmann::json& d : params[0].value("shape", nlohmann::json::array()))
          shape += (shape.empty() ? "" : ", ") + json_excerpt(d);
        text += " [" + shape + "]";
      }
      return text + ")";
    };
    return "layer " + std::to_string(i) + " " + describe(a, i) + ", this run " + describe(b, i);
  }
  return "?";
}

}  // namespace

ScaledTraining::ScaledTraining(Model& model, Optimizer& optimizer, const Precision& precision,
                               std::unique_ptr<Scaler> scaler, std::uint64_t seed)
    : model_(model), optimizer_(optimizer), precision_(precision), scaler_(std::move(scaler)), seed_(seed) {
  GS_CHECK_CONFIG(scaler_ != nullptr,
                  "ScaledTraining: no scaler given (use {\"policy\": \"none\"} for none)");
  GS_CHECK_CONFIG(model_.num_layers() > 0 && !model_.sample_shape().empty(),
                  "ScaledTraining: the model must be finalized (Model::finalize) before training");
  scaler_->bind(model_.layer_infos(), precision_.gradient_format());
  if (model_.device() != Device::cpu)
    refuse_controller_off_gemm(*scaler_, model_.layer_infos(), "ScaledTraining",
                               std::string("the ") + device_name(model_.device()) +
                                   " backend takes local scales at Linear and Conv2d only in this version; use "
                                   "the CPU backend or \"control_at\": \"gemm\"");
  rng_.seed(seed_ ^ 0x9E3779B97F4A7C15ull);
  DeviceMemory* memory = model_.backend().memory();
  loss_grad_.g = Tensor(memory);
  input_ = Tensor(memory);
  optimizer_.use_device(model_.backend().optimizer_kernels());
}

const Tensor& ScaledTraining::on_model_device(const Tensor& images) {
  if (images.device() == model_.device()) return images;
  input_.copy_from(images);
  return input_;
}

ScaledTraining::ScaledTraining(Model& model, Optimizer& optimizer, const Precision& precision,
                               const nlohmann::json& scaler, std::uint64_t seed)
    : ScaledTraining(model, optimizer, precision, make_scaler_for(scaler, precision), seed) {}

ScaledTraining::~ScaledTraining() = default;

void ScaledTraining::expect(Phase phase, const char* call) const {
  // The call that leads to each phase.
  static const char* const kLastCall[] = {"step() (or nothing yet)", "begin_step()", "forward()",
                                          "loss_backward()"};
  GS_CHECK_AS(Error, phase_ == phase,
              "ScaledTraining::"
                  << call << " is called after " << kLastCall[static_cast<int>(phase_)] << " but must follow "
                  << kLastCall[static_cast<int>(phase)]
                  << " (the order of one iteration: begin_step, forward, loss_scale, loss_backward, step)");
}

void ScaledTraining::begin_step(bool record_statistics) {
  // An unfinished iteration (an exception in the middle) is abandoned: nothing of it was applied.
  model_.prepare_weights(precision_);
  monitor_.reset(model_.num_layers(), record_statistics, scaler_->gradient_edge());
  current_ = StepResult{};
  const auto t0 = std::chrono::steady_clock::now();
  scaler_->begin_step(steps_);
  current_.scaler_seconds = seconds_since(t0);
  batch_total_ = -1;
  phase_ = Phase::begun;
}

const Tensor& ScaledTraining::forward(const Tensor& images) {
  expect(Phase::begun, "forward");
  ForwardContext ctx{precision_, true, &rng_};
  const Tensor& logits = model_.forward(on_model_device(images), ctx);
  output_ = &logits;
  phase_ = Phase::forwarded;
  return logits;
}

double ScaledTraining::loss_scale(const Tensor& logits, const std::vector<std::int32_t>& labels) {
  expect(Phase::forwarded, "loss_scale");
  GS_CHECK_SHAPE(
      logits.rank() == 2 && logits.dim(0) == static_cast<std::int64_t>(labels.size()),
      "loss_scale: logits " << shape_string(logits.shape()) << " and " << labels.size() << " labels");
  // A policy that chooses S0 from the loss gradient sees that gradient in fp32 at scale 1 first.
  if (scaler_->loss_needs()) {  // data-parallel: this rank's rows of the whole batch's gradient
    const std::int64_t over = parallel_ ? batch_total(static_cast<std::int64_t>(labels.size())) : 0;
    model_.backend().loss_gradient_fp32(logits, labels, loss_fp32_, over);
  }
  return choose_loss_scale(loss_fp32_);
}

double ScaledTraining::choose_loss_scale(const Tensor& loss_grad_fp32) {
  const auto t0 = std::chrono::steady_clock::now();
  const double s0 = gradscale::choose_loss_scale(*scaler_, loss_grad_fp32.data(), loss_grad_fp32.shape(), steps_,
                                                 precision_, parallel_.get());
  current_.scaler_seconds += seconds_since(t0);
  return s0;
}

void ScaledTraining::check_outside_loss_grad(const Tensor& loss_grad, const char* call) const {
  expect(Phase::forwarded, call);
  GS_CHECK_CONFIG(model_.device() == Device::cpu && loss_grad.on_host(),
                  "ScaledTraining::" << call << ": a loss gradient of your own is taken on the CPU backend only "
                                     << "in this version (the model is on " << device_name(model_.device()) << ")");
  GS_CHECK_SHAPE(output_ != nullptr && loss_grad.shape() == output_->shape(),
                 "ScaledTraining::" << call << ": the loss gradient has shape " << shape_string(loss_grad.shape())
                                    << ", the model's output "
                                    << (output_ ? shape_string(output_->shape()) : std::string("none")));
}

double ScaledTraining::loss_scale(const Tensor& loss_grad) {
  check_outside_loss_grad(loss_grad, "loss_scale");
  return choose_loss_scale(loss_grad);
}

void ScaledTraining::backward(const Tensor& loss_grad, double loss_scale, double loss) {
  check_outside_loss_grad(loss_grad, "backward");
  GS_CHECK_NUMERIC(std::isfinite(loss_scale) && loss_scale > 0,
                   "backward: the loss scale must be finite and > 0, got " << loss_scale);
  loss_grad_.g.copy_from(loss_grad);
  loss_grad_.scale = loss_scale;
  monitor_.loss_grad_max_abs =
      round_gradient(loss_grad_.g.data(), static_cast<std::size_t>(loss_grad_.g.size()),
                     static_cast<float>(loss_scale), GradSite::loss, model_.num_layers() - 1, precision_, monitor_);
  monitor_.loss = loss;
  monitor_.correct = 0;
  std::unique_ptr<ShadowRecorder> shadow;
  if (shadow_due()) {
    ScaledGrad fp32;
    fp32.g.copy_from(loss_grad);
    shadow = shadow_pass(fp32);
  }
  run_backward(shadow.get());  // the loss as given (data-parallel: the ranks' shares added)
  current_.loss_scale = loss_scale;
}

LossResult ScaledTraining::loss_backward(const Tensor& logits, const std::vector<std::int32_t>& labels) {
  expect(Phase::forwarded, "loss_backward");
  // S0 on the model's device where the scaler gives a rule for it, in one process without a shadow pass
  // (data-parallel ranks reduce the loss gradient's statistics on the host first).
  std::optional<LossScaleRule> rule;
  if (!parallel_ && !shadow_due()) rule = scaler_->device_loss_rule();
  if (!rule) return loss_backward(logits, labels, loss_scale(logits, labels));
  GS_CHECK_SHAPE(
      logits.rank() == 2 && logits.dim(0) == static_cast<std::int64_t>(labels.size()),
      "loss_backward: logits " << shape_string(logits.shape()) << " and " << labels.size() << " labels");
  Backend& backend = model_.backend();
  if (!backend.loss_backward_device_s0(logits, labels, *rule, precision_, loss_grad_, monitor_,
                                       model_.num_layers() - 1, 0))
    return loss_backward(logits, labels, loss_scale(logits, labels));
  run_backward(nullptr);
  const LossScaleDecision d = backend.device_loss_scale();
  GS_CHECK_NUMERIC(std::isfinite(d.s0) && d.s0 > 0,
                   "scaler '" << scaler_->policy() << "' chose loss scale " << d.s0 << " on the device");
  scaler_->accept_loss_scale(d.s0, d.floor);
  current_.loss_scale = d.s0;
  return LossResult{current_.loss, current_.correct};
}

LossResult ScaledTraining::loss_backward(const Tensor& logits, const std::vector<std::int32_t>& labels,
                                         double loss_scale) {
  expect(Phase::forwarded, "loss_backward");
  GS_CHECK_NUMERIC(std::isfinite(loss_scale) && loss_scale > 0,
                   "loss_backward: the loss scale must be finite and > 0, got " << loss_scale);
  GS_CHECK_SHAPE(
      logits.rank() == 2 && logits.dim(0) == static_cast<std::int64_t>(labels.size()),
      "loss_backward: logits " << shape_string(logits.shape()) << " and " << labels.size() << " labels");
  Backend& backend = model_.backend();
  // Data-parallel: the mean over the whole batch (this rank's rows of its gradient, its share of the loss).
  const std::int64_t over = parallel_ ? batch_total(static_cast<std::int64_t>(labels.size())) : 0;
  std::unique_ptr<ShadowRecorder> shadow;
  if (shadow_due()) {  // the loss gradient at scale 1 in fp32, into a monitor of its own
    Precision fp32 = precision_;
    fp32.grad_format = Format::fp32;
    StepMonitor scratch;
    scratch.reset(model_.num_layers(), false, 0.0);
    ScaledGrad g;
    backend.loss_backward(logits, labels, 1.0, fp32, g, scratch, model_.num_layers() - 1, over);
    shadow = shadow_pass(g);
  }
  backend.loss_backward(logits, labels, loss_scale, precision_, loss_grad_, monitor_, model_.num_layers() - 1,
                        over);
  run_backward(shadow.get());
  current_.loss_scale = loss_scale;
  return LossResult{current_.loss, current_.correct};
}

void ScaledTraining::run_backward(ShadowRecorder* shadow) {
  Backend& backend = model_.backend();
  model_.zero_grads();
  BackwardContext ctx{precision_, *scaler_, monitor_, steps_, parallel_.get()};
  std::optional<ShadowComparison> compare;
  if (shadow) ctx.observer = &compare.emplace(*shadow, monitor_);
  model_.backward(loss_grad_, ctx);
  backend.finish_backward(monitor_);  // also the loss: a device's comes with its measurements
  if (compare) compare->finish(model_);
  if (parallel_) parallel_->reduce_step(monitor_);  // found_inf, max|g|, loss, statistics: the whole batch's
  current_.loss = monitor_.loss;
  current_.correct = monitor_.correct;
  phase_ = Phase::backwarded;
}

void ScaledTraining::set_shadow(bool on) {
  GS_CHECK_CONFIG(!on || (model_.device() == Device::cpu && !parallel_),
                  "the fp32 shadow (shadow) runs on the CPU backend in one process: the model is on "
                      << (model_.device() == Device::cpu ? "the CPU, data-parallel" : "a device"));
  shadow_ = on;
}

std::unique_ptr<ShadowRecorder> ScaledTraining::shadow_pass(const ScaledGrad& loss_grad_fp32) {
  // Nothing rounded (gradients in fp32, weight gradients kept), nothing scaled (no controller: s = 1),
  // found_inf and statistics into a monitor of its own; the parameters' gradients it leaves are read,
  // then zeroed by the step's own pass.
  Precision fp32 = precision_;
  fp32.grad_format = Format::fp32;
  fp32.quantize_weight_grads = false;
  const std::unique_ptr<Scaler> none = make_scaler(nlohmann::json{{"policy", "none"}}, Format::fp32);
  StepMonitor scratch;
  scratch.reset(model_.num_layers(), false, 0.0);
  auto shadow = std::make_unique<ShadowRecorder>();
  model_.zero_grads();
  BackwardContext ctx{fp32, *none, scratch, steps_, nullptr};
  ctx.observer = shadow.get();
  model_.backward(loss_grad_fp32, ctx);
  model_.backend().finish_backward(scratch);
  shadow->take_weight_grads(model_);
  return shadow;
}

StepResult ScaledTraining::step(double lr) {
  expect(Phase::backwarded, "step");
  GS_CHECK_CONFIG(std::isfinite(lr) && lr >= 0,
                  "step: the learning rate must be finite and >= 0, got " << lr);
  StepResult r = current_;
  scaler_verdict(*scaler_, monitor_, steps_, r);
  // A skipped step touches neither weights nor optimizer moments nor the step count.
  if (!r.skipped) optimizer_.step(model_.parameters(), lr);
  r.step = ++steps_;
  phase_ = Phase::idle;
  return r;
}

const Tensor& ScaledTraining::predict(const Tensor& images) {
  GS_CHECK_AS(
      Error, phase_ == Phase::idle,
      "ScaledTraining::predict is called inside an iteration (call it between step() and begin_step())");
  model_.prepare_weights(precision_);
  ForwardContext ctx{precision_, false, nullptr};
  return model_.forward(on_model_device(images), ctx);
}

nlohmann::json ScaledTraining::identity() const {
  return {{"layers", model_.layer_table()},
          {"format", format_name(precision_.format)},
          {"grad_format", format_name(precision_.gradient_format())},
          {"weight_grads", precision_.quantize_weight_grads}};
}

void ScaledTraining::save(const std::string& dir, const nlohmann::json& extra) const {
  GS_CHECK_AS(Error, phase_ == Phase::idle,
              "ScaledTraining::save is called inside an iteration (save between step() "
              "and the next begin_step())");
  GS_CHECK_CONFIG(extra.is_object(),
                  "ScaledTraining::save: `extra` must be a JSON object, got " << json_excerpt(extra));
  for (const char* key : kReservedKeys)
    GS_CHECK_CONFIG(!extra.contains(key), "ScaledTraining::save: `extra` may not use the key '"
                                              << key << "' (the checkpoint's own)");
  std::ostringstream rng_state;
  rng_state << rng_;
  nlohmann::json meta = extra;
  meta["identity"] = identity();
  meta["steps"] = steps_;
  meta["scaler"] = {{"config", scaler_->config()}, {"state", scaler_->state()}};
  meta["optimizer"] = optimizer_.state();
  meta["rng"] = rng_state.str();
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  std::vector<Tensor> staged;  // host copies of tensors in device memory
  staged.reserve(state_tensor_count());
  const auto add = [&](const std::string& name, const Tensor* t) {
    if (!t->on_host()) {
      staged.push_back(t->to_host());
      t = &staged.back();
    }
    tensors.emplace_back(name, t);
  };
  for (Parameter* p : model_.parameters()) add("param/" + p->name, &p->value);
  for (auto& [name, t] : model_.buffers()) add("buffer/" + name, t);
  for (auto& [name, t] : optimizer_.state_tensors()) add("optim/" + name, t);
  write_checkpoint(dir, std::to_string(steps_), meta, tensors);
}

// Nothing is used before it is checked: the seal, schema and tensor file name (read_checkpoint_meta),
// that the checkpoint is of this model, formats and scaler (ConfigError), then each field (DataError
// naming it), the optimizer's and the scaler's states by their owners, the tensor file last.
nlohmann::json ScaledTraining::load(const std::string& dir) {
  GS_CHECK_AS(Error, phase_ == Phase::idle, "ScaledTraining::load is called inside an iteration");
  nlohmann::json meta = read_checkpoint_meta(dir);
  const JsonFields f(meta, (std::filesystem::path(dir) / kCheckpointJson).string());
  const nlohmann::json expect = identity();
  const nlohmann::json& saved = f.object("identity");
  GS_CHECK_CONFIG(saved == expect, "checkpoint in '" << dir
                                                     << "' was written for another model or format (it has "
                                                     << identity_difference(saved, expect) << ")");
  const JsonFields saved_scaler = f.fields("scaler");
  GS_CHECK_CONFIG(saved_scaler.object("config") == scaler_->config(),
                  "checkpoint in '" << dir << "' used scaler " << json_excerpt(saved_scaler.object("config"))
                                    << ", this run " << json_excerpt(scaler_->config()));
  const JsonFields saved_optimizer = f.fields("optimizer");
  GS_CHECK_CONFIG(saved_optimizer.any("optimizer") == optimizer_.config(),
                  "checkpoint in '" << dir << "' used optimizer " << json_excerpt(saved_optimizer.any("optimizer"))
                                    << ", this run " << json_excerpt(optimizer_.config()));

  const std::int64_t steps = f.integer("steps", 0, kMaxSteps);
  std::istringstream rng_text(f.text("rng"));
  Rng rng;
  rng_text >> rng;
  if (rng_text.fail() || !(rng_text >> std::ws).eof())
    f.fail("rng", "is not the state of the random generator (mt19937_64 as text)");
  // The owners check their states; built the same way (checked above), a refusal means a damaged state.
  try {
    optimizer_.restore_state(f.object("optimizer"), model_.parameters());
  } catch (const ConfigError& e) {
    f.fail("optimizer", std::string("is refused: ") + e.what());
  }
  if (optimizer_.step_count() > steps)
    f.fail("optimizer.step", "is " + std::to_string(optimizer_.step_count()) + ", more than the " +
                                 std::to_string(steps) + " iterations in 'steps'");
  try {
    scaler_->restore_state(saved_scaler.object("state"));
  } catch (const ConfigError& e) {
    saved_scaler.fail("state", std::string("is refused: ") + e.what());
  }
  std::vector<std::pair<std::string, Tensor*>> tensors;
  std::vector<std::pair<Tensor*, Tensor>> staged;  // device tensors and their host copies to read into
  staged.reserve(state_tensor_count());
  const auto add = [&](const std::string& name, Tensor* t) {
    if (!t->on_host()) {
      staged.emplace_back(t, t->to_host());
      t = &staged.back().second;
    }
    tensors.emplace_back(name, t);
  };
  for (Parameter* p : model_.parameters()) add("param/" + p->name, &p->value);
  for (auto& [name, t] : model_.buffers()) add("buffer/" + name, t);
  for (auto& [name, t] : optimizer_.state_tensors()) add("optim/" + name, t);
  read_checkpoint_tensors(dir, meta, tensors);
  for (auto& [device_tensor, host] : staged) device_tensor->copy_from(host);
  rng_ = rng;
  mix_rank_into_rng();  // every rank resumes the saved stream, each mixed with its rank
  steps_ = steps;
  return meta;
}

std::size_t ScaledTraining::state_tensor_count() const {
  return model_.parameters().size() + model_.buffers().size() + optimizer_.state_tensors().size();
}

std::vector<LayerScale> ScaledTraining::layer_scales() const {
  return layer_scale_rows(model_.layer_infos(), monitor_);
}

nlohmann::json make_trace_header(const nlohmann::json& config, const Precision& precision,
                                 const nlohmann::json& scaler, std::uint64_t seed,
                                 const nlohmann::json& layers, const std::string& model_name) {
  GS_CHECK_CONFIG(config.is_object(), "trace_header: `config` must be a JSON object, got " << config.dump());
  nlohmann::json header = {{"version", GRADSCALE_VERSION},
                           {"config", config},
                           {"format", format_name(precision.format)},
                           {"grad_format", format_name(precision.gradient_format())},
                           {"scaler", scaler},
                           {"seed", seed},
                           {"layers", layers}};
  // The model's name (Model::name, a spec's "name"); else the run config's "model", as the CLI's has.
  const auto named = config.find("model");
  if (!model_name.empty())
    header["model"] = model_name;
  else if (named != config.end() && named->is_string())
    header["model"] = *named;
  return header;
}

nlohmann::json ScaledTraining::trace_header(const nlohmann::json& config) const {
  return make_trace_header(config, precision_, scaler_->config(), seed_, model_.layer_table(), model_.name());
}

void ScaledTraining::distribute(Communicator& comm, const std::string& gpu_collectives) {
  GS_CHECK_AS(Error, phase_ == Phase::idle, "ScaledTraining::distribute is called inside an iteration");
  if (comm.size() == 1) return;  // one process: nothing to reduce
  auto parallel = std::make_unique<DataParallel>(comm);
  parallel->check_same_config(identity());
  // After the check, so that ranks with different configs stop there, before NCCL starts.
  device_collectives_ = model_.backend().device_collectives(comm, gpu_collectives);
  parallel->use_device(device_collectives_.get());
  parallel_ = std::move(parallel);
  mix_rank_into_rng();
}

std::int64_t ScaledTraining::batch_total(std::int64_t local) {
  if (batch_total_ < 0) batch_total_ = parallel_ ? parallel_->total(local) : local;
  return batch_total_;
}

void ScaledTraining::mix_rank_into_rng() {
  if (!parallel_ || parallel_->rank() == 0) return;
  const std::uint64_t mixed = rng_() ^ (0xD1B54A32D192ED03ull * static_cast<std::uint64_t>(parallel_->rank()));
  rng_.seed(mixed);
}

}  // namespace gradscale
