// The policy catalogue: every built-in scaler, by name, for the registry (lib/scaler/registry.cpp).
// It sits above lib/, baselines/ and adaptive/ so that lib/ depends on neither method folder; a static
// library would drop self-registering objects, so the registry asks for this list on first use instead.
#include "adaptive/builtin.h"
#include "baselines/builtin.h"
#include "lib/scaler/scaler.h"

namespace gradscale {

std::vector<BuiltinScaler> builtin_scalers() {
  std::vector<BuiltinScaler> all = baselines::builtin_scalers();
  for (BuiltinScaler& b : adaptive::builtin_scalers()) all.push_back(std::move(b));
  return all;
}

}  // namespace gradscale
