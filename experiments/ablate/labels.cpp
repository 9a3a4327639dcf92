// Labels and file-safe names of an ablation's values (see labels.h).
#include "experiments/ablate/labels.h"

namespace gradscale::ablate {
namespace {

using json = nlohmann::json;

}  // namespace

std::string value_label(const json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (!value.is_object()) return value.dump();
  std::string label;
  for (const char* head : {"policy", "name", "method"})
    if (value.contains(head) && value[head].is_string())
      label += (label.empty() ? "" : " ") + value[head].get<std::string>();
  for (const auto& [k, v] : value.items()) {
    if ((k == "policy" || k == "name" || k == "method") && v.is_string()) continue;
    label += (label.empty() ? "" : " ") + k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
  }
  return label.empty() ? "{}" : label;
}

std::string file_safe(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '_' || c == '=' || c == '+' || c == '-';
    if (keep)
      out += c;
    else if (out.empty() || out.back() != '-')
      out += '-';
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  while (!out.empty() && (out.front() == '-' || out.front() == '.')) out.erase(out.begin());
  return out.empty() ? "run" : out;
}

}  // namespace gradscale::ablate
