// Small file helpers of the ablation runner and table: tolerant reads of files that a run may not have
// finished writing.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gradscale::ablate {

// The file parsed as JSON, or null when it is absent or not valid JSON.
nlohmann::json read_json_or_null(const std::string& path);

// The last `bytes` bytes of a file ("" when it cannot be read).
std::string file_tail(const std::string& path, std::size_t bytes);

// The first line of a file ("" when it cannot be read).
std::string file_first_line(const std::string& path);

// The non-empty lines of `text`; a line rewritten with carriage returns keeps its last part.
std::vector<std::string> lines_of(const std::string& text);

}  // namespace gradscale::ablate
