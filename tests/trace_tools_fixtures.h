// Helpers shared by the tests of the trace readers (tests/test_inspect_*.cpp, tests/test_plot_trace.cpp):
// the fixtures' directory, a temporary directory, `inspect --json` parsed, the hand-worked rows of the
// fixture checked, a broken trace rejected by `inspect --check`, and a visible skip.
#pragma once

#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/cli_run.h"

namespace gradscale::test::trace_tools_fixtures {

inline const std::string kData = std::string(GRADSCALE_SOURCE_DIR) + "/tests/data/";
inline const std::string kPython = "/usr/bin/python3";

// A fresh directory under the system temp directory, removed with everything in it at scope exit.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() /
           ("gradscale_trace_" + std::to_string(getpid()) + "_" + std::to_string(rd()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in);
  return nlohmann::json::parse(in);
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  REQUIRE(out.good());
}

// The one line of `inspect --json` that holds the JSON object (warnings go to stderr).
inline nlohmann::json inspect_json(const std::string& arguments) {
  const CliResult r = run_cli("inspect " + arguments + " --json");
  REQUIRE(r.status == 0);
  for (const std::string& line : r.lines)
    if (!line.empty() && line.front() == '{') return nlohmann::json::parse(line);
  FAIL("no JSON object in the output of inspect " << arguments);
  return {};
}

// Skips the running test visibly. Under ctest (one test per process, selected by name) it exits with
// status 4, which tests/CMakeLists.txt declares as SKIP_RETURN_CODE; in a run of the whole binary it
// warns and returns, so the other tests still run.
inline void skip_test(const std::string& reason) {
  if (Catch::getCurrentContext().getConfig()->hasTestFilters()) {
    std::cout << "SKIPPED: " << reason << std::endl;
    std::cerr.flush();
    std::_Exit(4);
  }
  WARN("SKIPPED: " << reason);
}

inline bool is_png(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char sig[8] = {};
  in.read(sig, 8);
  return in.gcount() == 8 && std::string(sig, 8) == std::string("\x89PNG\r\n\x1a\n", 8);
}

struct Expected {
  std::size_t records;
  double log2_mean, log2_min, log2_max;
  double rate_mean, rate_max;  // ignored when rated is false
  bool rated;
  std::size_t overflow_events;
};

inline void check_row(const nlohmann::json& row, const Expected& e) {
  INFO(row.dump());
  CHECK(row["records"] == e.records);
  REQUIRE(row["log2_S"].is_object());
  CHECK(row["log2_S"]["mean"].get<double>() == e.log2_mean);
  CHECK(row["log2_S"]["min"].get<double>() == e.log2_min);
  CHECK(row["log2_S"]["max"].get<double>() == e.log2_max);
  if (e.rated) {
    REQUIRE(row["underflow_rate"].is_object());
    CHECK(row["underflow_rate"]["mean"].get<double>() == e.rate_mean);
    CHECK(row["underflow_rate"]["max"].get<double>() == e.rate_max);
  } else {
    CHECK(row["underflow_rate"].is_null());
  }
  CHECK(row["overflow_events"] == e.overflow_events);
}

inline void check_no_records(const nlohmann::json& row) {
  INFO(row.dump());
  CHECK(row["records"] == 0);
  CHECK(row["log2_S"].is_null());
  CHECK(row["underflow_rate"].is_null());
  CHECK(row["overflow_events"].is_null());
}

// Writes `doc` to a file in `dir`, runs `inspect --check` on it and requires exit 1 with one line that
// contains every one of `parts`.
inline void require_rejected(const TempDir& dir, const nlohmann::json& doc,
                             const std::vector<std::string>& parts) {
  const std::string path = dir.file("broken.json");
  write_text(path, doc.dump(1));
  const CliResult r = run_cli("inspect --check '" + path + "'");
  INFO("output: " << (r.lines.empty() ? std::string("(none)") : r.lines.front()));
  CHECK(r.status == 1);
  REQUIRE(r.lines.size() == 1);
  CHECK_THAT(r.lines[0], Catch::Matchers::Contains("gradscale inspect: " + path + ": "));
  for (const std::string& p : parts) CHECK_THAT(r.lines[0], Catch::Matchers::Contains(p));
}

}  // namespace gradscale::test::trace_tools_fixtures
