// Helpers of the CLI cases (test_overwrites_refused, test_wrong_results_refused,
// test_bad_inputs_refused, ...): files written and read whole, the CLI run inside a temp directory with a
// time limit, and the check of a one-line error exit.
#pragma once

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "tests/cli_run.h"
#include "tests/temp_dir.h"

namespace gradscale::test {

// Writes `text` to `path`, creating its directory.
inline void write_text(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// All output lines of a run, one string.
inline std::string joined(const CliResult& r) {
  std::string all;
  for (const auto& l : r.lines) all += l + "\n";
  return all;
}

// An error exit: `status`, exactly one line, and that line contains `text`.
inline void check_error(const CliResult& r, int status, const std::string& text) {
  INFO(joined(r));
  CHECK(r.status == status);
  REQUIRE(r.lines.size() == 1);
  CHECK_THAT(r.lines[0], Catch::Matchers::Contains(text));
}

// `gradscale <args>` run inside `dir`, killed after 60 s so that a hang fails the case instead of
// stopping the suite.
inline CliResult in_dir(const gradscale::testing::TempDir& dir, const std::string& args) {
  return run_shell("cd '" + dir.str() + "' && timeout 60 \"$GS\" " + args);
}

}  // namespace gradscale::test
