// Runs the built `gradscale` binary (GRADSCALE_CLI) for the CLI tests: exit status and output lines.
#pragma once

#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

namespace gradscale::test {

struct CliResult {
  int status = -1;
  std::vector<std::string> lines;  // stdout and stderr together
};

// `command 2>&1` through the shell; "$GS" in it is the gradscale binary.
inline CliResult run_shell(const std::string& command) {
  CliResult r;
  const std::string script = "GS='" + std::string(GRADSCALE_CLI) + "'; " + command + " 2>&1";
  FILE* pipe = popen(script.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string out;
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  const int wait_status = pclose(pipe);
  REQUIRE(WIFEXITED(wait_status));
  r.status = WEXITSTATUS(wait_status);
  std::istringstream is(out);
  for (std::string line; std::getline(is, line);) r.lines.push_back(line);
  return r;
}

// `gradscale <arguments> 2>&1` through the shell (arguments are quoted by the caller).
inline CliResult run_cli(const std::string& arguments) {
  return run_shell("\"$GS\" " + arguments);
}

// `text` as one single-quoted shell word.
inline std::string shell_quote(const std::string& text) {
  std::string q = "'";
  for (const char c : text) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace gradscale::test
