// The scaler interface (SPEC §5–§7): what training asks of a loss-scaling policy. A scaler gives the
// initial scale S0 that enters at the loss, the local scale s at each parametric layer (1 for every
// global policy; the adaptive controllers choose it per layer), and after each iteration decides from
// found_inf and the step's statistics whether the optimizer step is applied or skipped.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/core/error.h"
#include "lib/numeric/format.h"

namespace gradscale {

// Raised by a policy whose peer raises (deepspeed at its minimum scale with raise_at_min).
class ScalerError : public Error {
 public:
  using Error::Error;
};

// What a parametric layer (Linear, Conv2d) tells the controller during backward (SPEC §5 step 1).
// All pointers are borrowed for the duration of the call.
struct LocalScaleQuery {
  int layer_id = -1;
  std::string_view layer_name;
  Format format = Format::fp32;
  double scale_in = 1.0;        // S_in: the accumulated scale of `grad`
  const float* grad = nullptr;  // incoming gradient g (values in F), grad_size elements
  std::int64_t grad_size = 0;
  const float* weight = nullptr;  // working weight W (values in F); null at cast points
  std::int64_t weight_size = 0;
  std::int64_t reduction = 1;       // K: reduction length of the upstream GEMM
  const float* upstream = nullptr;  // g ⊗ Wᵀ in fp32 at scale S_in, before rounding (may be null)
  std::int64_t upstream_size = 0;
};

// What training measured during one iteration, handed to update().
struct StepStatistics {
  bool found_inf = false;
  int first_nonfinite_layer = -1;  // layer id, -1 when none
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
  // S0: the scale at the loss for the next iteration.
  virtual double loss_scale() const = 0;
  // s for one parametric layer; global policies return 1.
  virtual double local_scale(const LocalScaleQuery& query);
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

void register_scaler(const std::string& policy, ScalerFactory factory);
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
// Parses command-line text into the configuration object make_scaler takes (same forms as above).
nlohmann::json parse_scaler_spec(std::string_view spec);

}  // namespace gradscale
