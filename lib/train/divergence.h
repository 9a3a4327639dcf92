// Divergence (docs/config.md, "Divergence"): a run whose fp32 master weights became non-finite, or
// whose loss stayed non-finite, cannot recover — a skipped step leaves the weights as they are — so
// training stops there and the run is reported as diverged (the CLI exits 3) instead of finishing
// with NaN weights and "complete": true.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lib/backend/backend.h"
#include "lib/optim/parameter.h"

namespace gradscale {

// Iterations in a row with a non-finite loss after which a run has diverged. The loss is computed in
// fp32 from the logits, so it is non-finite only when the forward pass overflowed; the step is then
// skipped and the weights stay as they are, so the next batches mostly overflow too. A healthy run
// does not see this twice in a row.
inline constexpr std::int64_t kNonFiniteLossLimit = 5;

class DivergenceCheck {
 public:
  // Call once per iteration after the optimizer step; `step` is the iteration's 1-based number and
  // `applied` says the optimizer step was applied (not skipped). When applied, every parameter's
  // master value is checked, by `backend` (the model's: on a device, one pass over all of them and one
  // small copy). Returns true when the run has diverged at this iteration (then, and from then on,
  // diverged() is true and step() and reason() say when and why).
  bool observe(std::int64_t step, double loss, bool applied, const std::vector<Parameter*>& params,
               Backend& backend = cpu_backend());

  bool diverged() const { return step_ > 0; }
  std::int64_t step() const { return step_; }            // the iteration that diverged (0: none)
  const std::string& reason() const { return reason_; }  // one line, e.g. "parameter 'fc1.weight' ..."

  // Iterations in a row, up to now, whose loss was not finite (saved in checkpoints).
  std::int64_t nonfinite_loss_steps() const { return nonfinite_loss_steps_; }
  void restore(std::int64_t nonfinite_loss_steps) { nonfinite_loss_steps_ = nonfinite_loss_steps; }

 private:
  std::int64_t nonfinite_loss_steps_ = 0;
  std::int64_t step_ = 0;
  std::string reason_;
};

}  // namespace gradscale
