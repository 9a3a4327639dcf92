// Running a scripts/*.py file from a test case: /usr/bin/python3 on the script in the source tree, its
// exit status and output lines (cli_run.h), and a visible skip (skip.h) where python3 is missing.
#pragma once

#include <unistd.h>

#include <string>

#include "tests/cli_run.h"
#include "tests/skip.h"

namespace gradscale::test {

// `python3 scripts/<name> <arguments>` (each argument already a shell word: shell_quote).
inline CliResult run_script(const std::string& name, const std::string& arguments) {
  const std::string python = "/usr/bin/python3";
  if (access(python.c_str(), X_OK) != 0) skip_test(python + " not found (install python3)");
  return run_shell(python + " " + shell_quote(std::string(GRADSCALE_SOURCE_DIR) + "/scripts/" + name) + " " +
                   arguments);
}

// A file of tests/data, as one shell word.
inline std::string test_data(const std::string& name) {
  return shell_quote(std::string(GRADSCALE_SOURCE_DIR) + "/tests/data/" + name);
}

}  // namespace gradscale::test
