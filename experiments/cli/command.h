// Subcommands of the `gradscale` CLI. Each verb lives in its own cmd_*.cpp and registers itself with
// GS_REGISTER_COMMAND; main() dispatches on the first argument.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace gradscale::cli {

// Gets the arguments after the verb; returns the process exit code. Throws ConfigError (exit 2) for
// bad input; main() prints one line for any exception.
using CommandFn = std::function<int(const std::vector<std::string>& args)>;

struct CommandRegistrar {
  CommandRegistrar(const char* name, const char* summary, CommandFn fn);
};

}  // namespace gradscale::cli

#define GS_CLI_CONCAT2(a, b) a##b
#define GS_CLI_CONCAT(a, b) GS_CLI_CONCAT2(a, b)
#define GS_REGISTER_COMMAND(name, summary, fn) \
  static const ::gradscale::cli::CommandRegistrar GS_CLI_CONCAT(gs_command_, __LINE__)(name, summary, fn)
