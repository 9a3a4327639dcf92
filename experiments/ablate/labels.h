// The text an ablation's values get: their label in the table, and the file-safe form of a label
// that run names (directories DIR/runs/<name>) are made of.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace gradscale::ablate {

// The text a value gets in the table: strings as they are, numbers as JSON writes them, a scaler
// object as its policy (and method) followed by its other parameters as key=value.
std::string value_label(const nlohmann::json& value);

// `text` made safe for a file name: letters, digits and . _ = + - kept, runs of anything else → '-'.
std::string file_safe(const std::string& text);

}  // namespace gradscale::ablate
