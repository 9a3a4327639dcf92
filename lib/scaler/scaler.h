// The scaler interface (SPEC §5–§7): what training asks of a loss-scaling policy. A scaler is the
// loss-level policy: it gives the initial scale S0 that enters at the loss and, after each iteration,
// decides from found_inf and the step's statistics whether the optimizer step is applied or skipped.
// A per-layer policy also owns a LayerController (controller.h) that chooses the local scale s at each
// parametric layer; global policies have none, and every layer then passes its gradient on with s = 1.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/core/error.h"
#include "lib/numeric/format.h"
#include "lib/scaler/controller.h"
#include "lib/scaler/scale_rule.h"

namespace gradscale {

// Raised by a policy whose peer raises (deepspeed at its minimum scale with raise_at_min).
class ScalerError : public Error {
 public:
  using Error::Error;
};

// What training measured during one iteration, handed to update().
struct StepStatistics {
  bool found_inf = false;
  int first_nonfinite_layer = -1;  // layer id, -1 when none
  std::int64_t step = 0;           // iteration index, from 0
  const StepMonitor* monitor = nullptr;  // per-layer records of the iteration (null in replay)
  // Counts of |g| over all weight-layer gradients (in F, at the loss scale, before unscaling) below and
  // at-or-above gradient_edge(): filled only when the scaler asks for an edge (popart_als).
  std::uint64_t grad_below_edge = 0;
  std::uint64_t grad_above_edge = 0;
};

// What update() decided, for progress lines, results and traces.
struct StepReport {
  bool skipped = false;
  double scale = 1.0;    // S0 the next iteration will use
  nlohmann::json state;  // the policy's counters under the peer's names
};

class Scaler {
 public:
  virtual ~Scaler() = default;

  virtual std::string policy() const = 0;
  // S0: the scale at the loss for the next iteration, as far as it is known before that iteration's
  // loss gradient (progress lines, replay); choose_loss_scale() gives the one actually used.
  virtual double loss_scale() const = 0;
  // The per-layer controller, or null for a global policy (then s = 1 at every layer).
  virtual LayerController* layer_controller() { return nullptr; }
  // Once before training: the model's layer table and the gradient format (binds the controller).
  virtual void bind(const std::vector<LayerInfo>& layers, Format grad_format);
  // At the start of each iteration: tells the controller the step and phi().
  virtual void begin_step(std::int64_t step);
  // The overflow safety factor φ of SPEC §6.4 that the next iteration uses (1 for policies without one).
  virtual double phi() const { return 1.0; }
  // S0 for this iteration from the fp32 loss gradient at scale 1 (layer_id -1, no weight), carrying the
  // statistics asked for by loss_needs(). Default: loss_scale().
  virtual StatNeeds loss_needs() const { return 0; }
  virtual double choose_loss_scale(const LocalScaleQuery& loss_grad);
  // Optional: choose_loss_scale as a rule a device evaluates where the loss gradient's statistics are
  // (lib/scaler/scale_rule.h's loss_scale_decision over its binades), so that the host does not wait for
  // S0: for the same statistics it must give choose_loss_scale's S0. A device that took S0 from it hands
  // the decision back with accept_loss_scale before update(). Default: none (the host chooses).
  virtual std::optional<LossScaleRule> device_loss_rule() const { return std::nullopt; }
  virtual void accept_loss_scale(double /*s0*/, double /*floor*/) {}
  // For statistics-driven policies (popart_als): the |g| edge to count weight gradients against, in
  // the units of the stored (scaled) gradients. 0 = the policy needs no such counts.
  virtual double gradient_edge() const { return 0.0; }
  // Consumes one iteration's outcome. Returns whether the step is skipped and the new state.
  // May throw ScalerError where the peer raises.
  virtual StepReport update(const StepStatistics& stats) = 0;

  // The resolved configuration {"policy": ..., parameters...} (defaults filled in).
  virtual nlohmann::json config() const = 0;
  // The counters, under the peer's names; restore_state(state()) continues bit-identically.
  virtual nlohmann::json state() const = 0;
  virtual void restore_state(const nlohmann::json& state) = 0;
};

// ---- registry ------------------------------------------------------------------------------------
// A factory gets the configuration object (with "policy") and the storage format (for defaults that
// depend on it, e.g. cerebras' and popart_als' maxima). It validates every key: unknown keys and out
// of range values throw ConfigError naming the parameter and the allowed range.
using ScalerFactory = std::function<std::unique_ptr<Scaler>(const nlohmann::json& config, Format format)>;

// Whether a policy scales only at the loss or also per layer (it has a LayerController): error messages
// and listings group the policies by it.
enum class ScalerKind : std::uint8_t { global, per_layer };
void register_scaler(const std::string& policy, ScalerFactory factory, ScalerKind kind = ScalerKind::global);
struct BuiltinScaler {
  std::string name;
  ScalerFactory factory;
  ScalerKind kind = ScalerKind::global;
};
// The built-in policies: defined by the policy catalogue (policies/catalogue.cpp), the one place that
// lists baselines/ and adaptive/. The registry reads it on first use.
std::vector<BuiltinScaler> builtin_scalers();
std::vector<std::string> scaler_policies();  // sorted
// From a configuration object {"policy": NAME, ...}.
std::unique_ptr<Scaler> make_scaler(const nlohmann::json& config, Format format);
// From command-line text: a JSON object, a bare policy name ("torch"), or "static:S".
std::unique_ptr<Scaler> make_scaler(std::string_view spec, Format format);
// The same for a std::string or a string literal (which would otherwise be ambiguous between the JSON
// form, where "torch" is a JSON string, and the text form).
inline std::unique_ptr<Scaler> make_scaler(const std::string& spec, Format format) {
  return make_scaler(std::string_view(spec), format);
}
inline std::unique_ptr<Scaler> make_scaler(const char* spec, Format format) {
  return make_scaler(std::string_view(spec), format);
}
// ---- controllers by name ------------------------------------------------------------------------
// A LayerController of one's own, run under the built-in loss-level policy {"policy": "adaptive",
// "controller": NAME, "controller_config": {...}} (S0, φ, skipping and state are the policy's; φ
// reaches the controller in begin_step). The factory gets "controller_config" (an object, {} when
// absent) and the gradient format, and validates its keys. Registering a name twice is an error.
using ControllerFactory =
    std::function<std::unique_ptr<LayerController>(const nlohmann::json& config, Format grad_format)>;
void register_controller(const std::string& name, ControllerFactory factory);
std::vector<std::string> controller_names();  // sorted
// ConfigError naming the known controllers for an unknown name.
std::unique_ptr<LayerController> make_controller(const std::string& name, const nlohmann::json& config,
                                                 Format grad_format);

// Parses command-line text into the configuration object make_scaler takes (same forms as above).
nlohmann::json parse_scaler_spec(std::string_view spec);

}  // namespace gradscale
