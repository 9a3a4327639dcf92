// The divergence check (see divergence.h): one pass over the master weights after an applied step (by
// the model's backend), a counter of non-finite losses.
#include "lib/train/divergence.h"

#include <cmath>
#include <sstream>

namespace gradscale {

bool DivergenceCheck::observe(std::int64_t step, double loss, bool applied,
                              const std::vector<Parameter*>& params, Backend& backend) {
  if (diverged()) return true;
  nonfinite_loss_steps_ = std::isfinite(loss) ? 0 : nonfinite_loss_steps_ + 1;
  std::ostringstream why;
  if (applied && !params.empty()) {
    std::vector<const Tensor*> values;
    values.reserve(params.size());
    for (const Parameter* p : params) values.push_back(&p->value);
    const std::vector<std::int64_t> first = backend.first_nonfinite(values);
    for (std::size_t k = 0; k < params.size(); ++k) {
      const std::int64_t i = first[k];
      if (i < 0) continue;
      const Parameter& p = *params[k];
      const float v = p.value.on_host() ? p.value[i] : p.value.to_host()[i];  // once, when it diverged
      why << "parameter '" << p.name << "' is not finite after the update (element " << i << " is " << v << ")";
      break;
    }
  }
  if (why.tellp() == 0 && nonfinite_loss_steps_ >= kNonFiniteLossLimit)
    why << "the loss was not finite for " << nonfinite_loss_steps_ << " iterations in a row (since step "
        << step - nonfinite_loss_steps_ + 1 << ")";
  if (why.tellp() == 0) return false;
  step_ = step;
  reason_ = why.str();
  return true;
}

}  // namespace gradscale
