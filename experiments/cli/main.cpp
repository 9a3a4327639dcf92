// `gradscale`: the command-line front end. One subcommand per verb (cmd_*.cpp registers itself);
// this file dispatches and turns every error into one clear line and a non-zero exit: 2 for bad input
// (ConfigError, a bad option), 1 for anything else (a bad file, a failed write, an internal error).
// `train` itself returns 3 for a diverged run (docs/config.md, "Exit status"). GRADSCALE_DEBUG=1 adds the
// file:line of a failed check to the line.
#include <boost/program_options/errors.hpp>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <new>
#include <string>
#include <vector>

#include "experiments/cli/command.h"
#include "experiments/cli/terminal_text.h"
#include "lib/core/error.h"

namespace gradscale::cli {
namespace {

struct Entry {
  const char* summary;
  CommandFn fn;
};

std::map<std::string, Entry>& commands() {
  static std::map<std::string, Entry> m;
  return m;
}

// The message of `e`, and with GRADSCALE_DEBUG set (non-empty) the file:line of the check that failed:
// debug output only, so a user's message never shows a source location.
std::string message_of(const std::exception& e) {
  std::string text = e.what();
  const char* debug = std::getenv("GRADSCALE_DEBUG");
  const auto* error = dynamic_cast<const Error*>(&e);
  if (debug != nullptr && *debug != '\0' && error != nullptr && !error->where().empty())
    text += " [" + error->where() + "]";
  return terminal_message(text);  // a message may quote a file: no control character reaches the terminal
}

void usage(std::ostream& os) {
  os << "usage: gradscale <command> [options]   (gradscale <command> --help for its options)\n\ncommands:\n";
  for (const auto& [name, e] : commands())
    os << "  " << name << std::string(10 - std::min<std::size_t>(9, name.size()), ' ') << e.summary << "\n";
}

}  // namespace

CommandRegistrar::CommandRegistrar(const char* name, const char* summary, CommandFn fn) {
  commands()[name] = Entry{summary, std::move(fn)};
}

}  // namespace gradscale::cli

int main(int argc, char** argv) {
  using namespace gradscale;
  auto& cmds = cli::commands();
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    cli::usage(argc < 2 ? std::cerr : std::cout);
    return argc < 2 ? 2 : 0;
  }
  if (std::string(argv[1]) == "--version") {
    std::cout << "gradscale " << GRADSCALE_VERSION << "\n";
    return 0;
  }
  const auto it = cmds.find(argv[1]);
  if (it == cmds.end()) {
    std::cerr << "gradscale: unknown command '" << argv[1] << "'\n";
    cli::usage(std::cerr);
    return 2;
  }
  const std::vector<std::string> args(argv + 2, argv + argc);
  try {
    return it->second.fn(args);
  } catch (const ConfigError& e) {
    std::cerr << "gradscale " << argv[1] << ": " << cli::message_of(e) << "\n";
    return 2;
  } catch (const boost::program_options::error& e) {
    std::cerr << "gradscale " << argv[1] << ": " << cli::terminal_message(e.what()) << " (see gradscale "
              << argv[1] << " --help)\n";
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr << "gradscale " << argv[1] << ": out of memory\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "gradscale " << argv[1] << ": " << cli::message_of(e) << "\n";
    return 1;
  }
}
