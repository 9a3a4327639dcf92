// One per-layer method of SPEC §6.2–§6.3 (approx_range, abs_range, element_wise, fixed, measured): which
// statistics it reads and the local scale it computes from them. The shared machinery — bounds, power
// of two, update_every, φ, S0 — lives in adaptive_scaler.cpp, so a method is only its formula.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/scaler/controller.h"
#include "lib/scaler/scale_rule.h"

namespace gradscale::adaptive {

// What every method may read besides the query: lib/scaler/scale_rule.h's parameters, whose formulas the
// methods evaluate (the same ones a device evaluates for LayerController::device_rule).
using MethodParams = ScaleRuleParams;

class Method {
 public:
  virtual ~Method() = default;
  virtual std::string name() const = 0;
  // The statistics its query must carry (lib/scaler/controller.h).
  virtual StatNeeds needs() const = 0;
  // s before the shared bounds of SPEC §6.1 and before rounding to a power of two.
  virtual double unbound_scale(const LocalScaleQuery& q, const MethodParams& p) const = 0;
};

std::unique_ptr<Method> make_approx_range();
std::unique_ptr<Method> make_abs_range();
std::unique_ptr<Method> make_element_wise();
std::unique_ptr<Method> make_fixed();
std::unique_ptr<Method> make_measured();
// The method names, in the order the error messages list them (adaptive/method_table.cpp).
const std::vector<std::string>& method_names();
// The method of that name (ConfigError naming the allowed ones otherwise).
std::unique_ptr<Method> make_method(const std::string& name);
// The formula a device evaluates for it (LayerController::device_rule); none where the host decides.
std::optional<ScaleRule::Formula> method_formula(const std::string& name);

// approx_range at a cast point (no weight, SPEC §6.2): σ_o = std(g), o_max = max|g|, no K.
double approx_range_no_weight(const TensorStats& g, const MethodParams& p);
// Its lognormal variant: ln|g| over the non-zero entries has mean μ_L and std σ_L.
double approx_range_lognormal(const LogMoments& g, double max_abs, const MethodParams& p);

}  // namespace gradscale::adaptive
