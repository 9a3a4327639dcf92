// Two helpers of the ablation file's readers (ablation.cpp, dimensions.cpp, settings.cpp): a value of
// the file (read in file order) as the plain json the configs are made of, and a value shortened for
// a message.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace gradscale::ablate {

// At most this much of a value goes into a message: a long model spec stays readable.
inline std::string shown(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 120) s = s.substr(0, 117) + "...";
  return s;
}

// The value as a json (its objects' keys then sorted, as every config is).
inline nlohmann::json to_json(const nlohmann::ordered_json& v) {
  return nlohmann::json::parse(v.dump());
}

}  // namespace gradscale::ablate
