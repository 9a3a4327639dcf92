// The optimizer base: binding parameters to their state, the all-or-nothing step, checkpoint state and
// restore (see optimizer.h), and the factory by name.
#include "lib/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "lib/core/error.h"
#include "lib/core/json_read.h"
#include "lib/optim/adam.h"
#include "lib/core/config_reader.h"
#include "lib/optim/sgd.h"

namespace gradscale {

Optimizer::Optimizer(std::string name, std::vector<std::string> slot_names)
    : name_(std::move(name)), slot_names_(std::move(slot_names)) {}

void Optimizer::step(const std::vector<Parameter*>& params, double lr) {
  GS_CHECK_CONFIG(std::isfinite(lr) && lr >= 0.0,
                  "optimizer '" << name_ << "': learning rate must be finite and >= 0, got " << lr);
  if (steps_ == 0) {
    bind(params, /*check_grads=*/true);
  } else {
    check_bound(params);
  }
  const std::int64_t step = steps_ + 1;
  if (device_ != nullptr) device_->begin_step();
  try {
    for (std::size_t i = 0; i < params.size(); ++i) update(*params[i], bound_[i].slots, step, lr);
  } catch (...) {
    if (device_ != nullptr) device_->end_step(false);
    throw;
  }
  if (device_ != nullptr) device_->end_step(true);
  steps_ = step;
}

DeviceOptimizerKernels& Optimizer::device_kernels(const Parameter& param) const {
  GS_CHECK_CONFIG(device_ != nullptr, "optimizer '" << name_ << "': parameter '" << param.name << "' lives in "
                                                    << device_name(param.value.device())
                                                    << " memory, but the optimizer has no kernels for it "
                                                       "(ScaledTraining sets them from the model's backend)");
  return *device_;
}

void Optimizer::bind(const std::vector<Parameter*>& params, bool check_grads) {
  std::unordered_set<std::string> names;
  std::vector<Bound> bound;
  bound.reserve(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Parameter* p = params[i];
    GS_CHECK(p != nullptr, "parameter " << i << " is null");
    if (check_grads)
      GS_CHECK_SHAPE(p->grad.shape() == p->value.shape(),
                     "parameter '" << p->name << "': grad shape " << shape_string(p->grad.shape())
                                   << " differs from value shape " << shape_string(p->value.shape()));
    GS_CHECK_CONFIG(names.insert(p->name).second,
                    "optimizer '" << name_ << "': two parameters are named '" << p->name << "'");
    Bound b{p->name, p->value.shape(), {}};
    for (std::size_t s = 0; s < slot_names_.size(); ++s) b.slots.emplace_back(p->value.shape(), 0.0f, p->value.memory());
    bound.push_back(std::move(b));
  }
  bound_ = std::move(bound);
}

void Optimizer::check_bound(const std::vector<Parameter*>& params) const {
  GS_CHECK_CONFIG(params.size() == bound_.size(),
                  "optimizer '" << name_ << "': stepped with " << params.size()
                                << " parameters, but its state holds " << bound_.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Parameter* p = params[i];
    GS_CHECK(p != nullptr, "parameter " << i << " is null");
    GS_CHECK_CONFIG(p->name == bound_[i].name, "optimizer '" << name_ << "': parameter " << i << " is '"
                                                             << p->name << "', but its state belongs to '"
                                                             << bound_[i].name << "'");
    GS_CHECK_CONFIG(p->value.shape() == bound_[i].shape,
                    "optimizer '" << name_ << "': parameter '" << p->name << "' has shape "
                                  << shape_string(p->value.shape()) << ", but its state has shape "
                                  << shape_string(bound_[i].shape));
    GS_CHECK_SHAPE(p->grad.shape() == p->value.shape(),
                   "parameter '" << p->name << "': grad shape " << shape_string(p->grad.shape())
                                 << " differs from value shape " << shape_string(p->value.shape()));
  }
}

nlohmann::json Optimizer::state() const {
  nlohmann::json parameters = nlohmann::json::array();
  for (const Bound& b : bound_) parameters.push_back({{"name", b.name}, {"shape", b.shape}});
  return {{"optimizer", config()}, {"step", steps_}, {"parameters", std::move(parameters)}};
}

std::vector<StateTensor> Optimizer::state_tensors() {
  std::vector<StateTensor> out;
  for (Bound& b : bound_)
    for (std::size_t s = 0; s < slot_names_.size(); ++s)
      out.emplace_back(b.name + "/" + slot_names_[s], &b.slots[s]);
  return out;
}

std::vector<ConstStateTensor> Optimizer::state_tensors() const {
  std::vector<ConstStateTensor> out;
  for (const Bound& b : bound_)
    for (std::size_t s = 0; s < slot_names_.size(); ++s)
      out.emplace_back(b.name + "/" + slot_names_[s], &b.slots[s]);
  return out;
}

namespace {

// Hyperparameters are compared exactly: a resumed run is bit-identical only with the same values.
bool same_value(const nlohmann::json& a, const nlohmann::json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}

const nlohmann::json& member(const nlohmann::json& state, const char* key) {
  GS_CHECK_CONFIG(state.is_object() && state.contains(key), "optimizer state: missing key '" << key << "'");
  return state.at(key);
}

// One entry of state()["parameters"]: {"name": string, "shape": [integers >= 0]}.
std::string entry_name(const nlohmann::json& entry, std::size_t index) {
  GS_CHECK_CONFIG(
      entry.is_object() && entry.contains("name") && entry.at("name").is_string(),
      "optimizer state: parameter entry " << index << " needs a string 'name', got " << json_excerpt(entry));
  return entry.at("name").get<std::string>();
}

Shape entry_shape(const nlohmann::json& entry, const std::string& name) {
  const nlohmann::json* shape = entry.contains("shape") ? &entry.at("shape") : nullptr;
  bool valid = shape != nullptr && shape->is_array();
  if (valid)
    for (const nlohmann::json& d : *shape)
      valid = valid && d.is_number_integer() && d.get<std::int64_t>() >= 0;
  GS_CHECK_CONFIG(valid, "optimizer state: parameter '" << name << "' needs a 'shape' of integers >= 0, got "
                                                        << json_excerpt(entry));
  return shape->get<Shape>();
}

}  // namespace

void Optimizer::restore_state(const nlohmann::json& state, const std::vector<Parameter*>& params) {
  const nlohmann::json& saved = member(state, "optimizer");
  const nlohmann::json mine = config();
  GS_CHECK_CONFIG(saved.is_object(),
                  "optimizer state: 'optimizer' must be an object, got " << json_excerpt(saved));
  GS_CHECK_CONFIG(saved.contains("name") && saved.at("name") == name_,
                  "optimizer state: the checkpoint's optimizer is "
                      << json_excerpt(saved.value("name", nlohmann::json())) << ", this run's is '" << name_
                      << "'");
  for (const auto& item : saved.items())
    GS_CHECK_CONFIG(mine.contains(item.key()), "optimizer state: the checkpoint's optimizer has '"
                                                   << item.key() << "', which optimizer '" << name_
                                                   << "' does not know");
  for (const auto& item : mine.items()) {
    GS_CHECK_CONFIG(saved.contains(item.key()),
                    "optimizer state: the checkpoint's optimizer lacks '" << item.key() << "'");
    GS_CHECK_CONFIG(same_value(saved.at(item.key()), item.value()),
                    "optimizer state: '" << item.key() << "' is " << json_excerpt(saved.at(item.key()))
                                         << " in the checkpoint but " << json_excerpt(item.value())
                                         << " in this run");
  }

  const nlohmann::json& step = member(state, "step");
  GS_CHECK_CONFIG(step.is_number_integer() && step.get<std::int64_t>() >= 0,
                  "optimizer state: 'step' must be an integer >= 0, got " << json_excerpt(step));
  const std::int64_t steps = step.get<std::int64_t>();
  const nlohmann::json& saved_params = member(state, "parameters");
  GS_CHECK_CONFIG(saved_params.is_array(), "optimizer state: 'parameters' must be an array");

  if (steps == 0) {
    GS_CHECK_CONFIG(saved_params.empty(), "optimizer state: 'parameters' must be empty at step 0");
    bound_.clear();
    steps_ = 0;
    return;
  }
  const std::size_t n = std::min(saved_params.size(), params.size());
  for (std::size_t i = 0; i < n; ++i) {
    GS_CHECK(params[i] != nullptr, "parameter " << i << " is null");
    const std::string saved_name = entry_name(saved_params[i], i);
    GS_CHECK_CONFIG(saved_name == params[i]->name,
                    "optimizer state: parameter " << i << " is '" << saved_name << "' in the checkpoint but '"
                                                  << params[i]->name << "' in the model");
    const Shape saved_shape = entry_shape(saved_params[i], saved_name);
    GS_CHECK_CONFIG(saved_shape == params[i]->value.shape(),
                    "optimizer state: parameter '" << saved_name << "' has shape "
                                                   << shape_string(saved_shape) << " in the checkpoint but "
                                                   << shape_string(params[i]->value.shape())
                                                   << " in the model");
  }
  GS_CHECK_CONFIG(saved_params.size() == n, "optimizer state: the checkpoint's parameter '"
                                                << entry_name(saved_params[n], n) << "' is not in the model");
  GS_CHECK_CONFIG(params.size() == n, "optimizer state: the model's parameter '"
                                          << params[n]->name << "' is not in the checkpoint");

  bind(params, /*check_grads=*/false);  // a resumed model may not have gradients yet
  steps_ = steps;
}

std::unique_ptr<Optimizer> make_optimizer(const nlohmann::json& cfg) {
  const std::string name = config_name(cfg, "optimizer", {"sgd", "adam", "adamw"});
  const nlohmann::json object = cfg.is_object() ? cfg : nlohmann::json{{"name", name}};
  if (name == "sgd") return std::make_unique<Sgd>(Sgd::Options::from_json(object));
  return std::make_unique<Adam>(Adam::Options::from_json(object));
}

}  // namespace gradscale
