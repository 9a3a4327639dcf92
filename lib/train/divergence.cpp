// The divergence check (see divergence.h): one pass over the master weights after an applied step,
// a counter of non-finite losses.
#include "lib/train/divergence.h"

#include <cmath>
#include <cstring>
#include <sstream>

namespace gradscale {
namespace {

// Index of the first non-finite value of `t`, or -1. The scan is an integer test of the exponent
// bits (all ones: inf or NaN), which vectorises; the index is searched only when there is one.
std::int64_t first_nonfinite(const Tensor& tensor) {
  const Tensor copy = tensor.on_host() ? Tensor() : tensor.to_host();  // a device's tensor: read a copy
  const Tensor& t = tensor.on_host() ? tensor : copy;
  const float* x = t.data();
  const std::int64_t n = t.size();
  std::uint32_t any = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    any |= static_cast<std::uint32_t>((bits & 0x7F800000u) == 0x7F800000u);
  }
  if (!any) return -1;
  for (std::int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return i;
  return -1;
}

}  // namespace

bool DivergenceCheck::observe(std::int64_t step, double loss, bool applied,
                              const std::vector<Parameter*>& params) {
  if (diverged()) return true;
  nonfinite_loss_steps_ = std::isfinite(loss) ? 0 : nonfinite_loss_steps_ + 1;
  std::ostringstream why;
  if (applied) {
    for (const Parameter* p : params) {
      const std::int64_t i = first_nonfinite(p->value);
      if (i < 0) continue;
      why << "parameter '" << p->name << "' is not finite after the update (element " << i << " is "
          << p->value[i] << ")";
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
