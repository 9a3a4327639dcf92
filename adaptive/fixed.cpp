// fixed (SPEC §6.2): the same local scale at every layer, every step. With init_scale it is the static
// baseline expressed per layer (and the test that scales compose exactly through a deep network).
#include "adaptive/method.h"

namespace gradscale::adaptive {
namespace {

class Fixed final : public Method {
 public:
  std::string name() const override { return "fixed"; }
  StatNeeds needs() const override { return 0; }
  double unbound_scale(const LocalScaleQuery& /*q*/, const MethodParams& p) const override {
    return p.fixed_scale;
  }
};

}  // namespace

std::unique_ptr<Method> make_fixed() {
  return std::make_unique<Fixed>();
}

}  // namespace gradscale::adaptive
