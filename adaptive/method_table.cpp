// The one mapping from a method's name to its code and to the formula a device evaluates for it
// (lib/scaler/scale_rule.h): make_method, method_names and method_formula read this table alone.
#include <string>
#include <vector>

#include "adaptive/method.h"
#include "lib/core/error.h"

namespace gradscale::adaptive {
namespace {

struct MethodEntry {
  const char* name;
  std::unique_ptr<Method> (*make)();
  std::optional<ScaleRule::Formula> formula;  // none: the host decides (element_wise streams every product)
};

const std::vector<MethodEntry>& method_table() {
  static const std::vector<MethodEntry> table = {
      {"approx_range", make_approx_range, ScaleRule::kApproxRange},
      {"abs_range", make_abs_range, ScaleRule::kAbsRange},
      {"element_wise", make_element_wise, std::nullopt},
      {"fixed", make_fixed, ScaleRule::kFixed},
      {"measured", make_measured, ScaleRule::kMeasured},
  };
  return table;
}

const MethodEntry& entry_of(const std::string& name) {
  for (const MethodEntry& e : method_table())
    if (name == e.name) return e;
  std::string known;
  for (const auto& n : method_names()) known += (known.empty() ? "" : ", ") + n;
  throw ConfigError("scaler 'adaptive': unknown method '" + name + "' (allowed: " + known + ")");
}

}  // namespace

const std::vector<std::string>& method_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const MethodEntry& e : method_table()) n.push_back(e.name);
    return n;
  }();
  return names;
}

std::unique_ptr<Method> make_method(const std::string& name) { return entry_of(name).make(); }

std::optional<ScaleRule::Formula> method_formula(const std::string& name) { return entry_of(name).formula; }

}  // namespace gradscale::adaptive
