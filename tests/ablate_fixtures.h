// Helpers shared by the tests of `gradscale ablate` (tests/test_ablate_*.cpp): files written and read
// back whole, the error an ablation file's expansion throws, and a tiny base config for real runs.
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiments/ablate/ablation.h"
#include "lib/core/error.h"

namespace gradscale::test::ablate_fixtures {

inline void write_text(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The message of the ConfigError that expanding `doc` throws ("" when it does not throw).
inline std::string expand_error(const std::string& doc) {
  try {
    ablate::expand_ablation(nlohmann::ordered_json::parse(doc), "t.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

inline std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

// A tiny base: each run takes well under a second.
inline constexpr const char* kTinyBase =
    R"("base": {"model": "mlp", "data": "synthetic:64", "batch": 16, "max_steps": 3, "eval_batch": 64, "trace_every": 1})";

// CSV parsed into rows of cells (no quoted commas in these tests).
inline std::vector<std::vector<std::string>> read_csv(const std::string& path) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(read_text(path));
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> cells;
    std::stringstream ls(line);
    for (std::string c; std::getline(ls, c, ',');) cells.push_back(c);
    if (!line.empty() && line.back() == ',') cells.push_back("");
    rows.push_back(cells);
  }
  return rows;
}

}  // namespace gradscale::test::ablate_fixtures
