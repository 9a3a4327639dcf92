// Tolerant file reads for the ablation runner and table (see files.h).
#include "experiments/ablate/files.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "lib/core/file_read.h"
#include "lib/core/json_read.h"

namespace gradscale::ablate {

nlohmann::json read_json_or_null(const std::string& path) {
  const BoundedRead text = read_bounded(path, kMaxJsonFileBytes);  // a FIFO or /dev/zero: null
  if (text.problem != ReadProblem::none) return nullptr;
  nlohmann::json j = parse_json_or_discarded(text.text);  // bounded nesting, like every JSON read
  return j.is_discarded() ? nlohmann::json() : j;
}

std::string file_tail(const std::string& path, std::size_t bytes) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return "";  // never open a FIFO: it would block
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  const std::streamoff size = in.tellg();
  if (size <= 0) return "";
  const std::streamoff from = std::max<std::streamoff>(0, size - static_cast<std::streamoff>(bytes));
  in.seekg(from);
  std::string s(static_cast<std::size_t>(size - from), '\0');
  in.read(s.data(), static_cast<std::streamsize>(s.size()));
  return s;
}

std::string file_first_line(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return "";
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream is(text);
  for (std::string line; std::getline(is, line);) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    const auto cr = line.rfind('\r');
    if (cr != std::string::npos) line = line.substr(cr + 1);
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

}  // namespace gradscale::ablate
