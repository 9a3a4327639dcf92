// The dimensions of an ablation (docs/ablations.md): an axis, or the variants, read from the file into
// choices, each with its label in the table, its part of the run names and the keys it sets; and the
// file's "seeds" and "target". Every reader checks what it reads and throws ConfigError naming it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiments/ablate/ablation.h"

namespace gradscale::ablate {

// One choice along a dimension of the ablation (a value of an axis, or a variant): its label in the
// table, its part of the run names, and the keys it sets, in file order.
struct Choice {
  std::string label;
  std::string name_part;
  std::string source;  // for messages: "axis 'scaler' value \"torch\"", "variant 2 ('fp16')"
  std::vector<std::pair<std::string, nlohmann::json>> settings;
};

// An axis, or the variants: one table column and its choices.
struct Dimension {
  std::string column;
  std::vector<Choice> choices;
};

// An axis: {"key": [V, {"label": L, "value": V}, {"label": L, "set": {"key": V, ...}}, ...]}. A value
// with "set" sets several keys at once; the axis key is then only the column's name. Labels are
// distinct and printable; each value's settings pass check_setting (settings.h). `where` names the file.
Dimension read_axis(const std::string& key, const nlohmann::ordered_json& values, const std::string& where);

// "variants": [{"label": L, config keys...}, ...], the column "variant"; a variant without a label is
// labelled by its settings ("base" when it sets none).
Dimension read_variants(const nlohmann::ordered_json& doc, const std::string& where);

// A non-empty array of distinct integers >= 0; `what` names it in messages.
std::vector<std::uint64_t> read_seeds(const nlohmann::ordered_json& doc, const std::string& what);

// "target": {"fraction": F} (of the fp32 reference row's final accuracy) or {"accuracy": A}, in (0, 1].
Target read_target(const nlohmann::ordered_json& v, const std::string& where);

}  // namespace gradscale::ablate
