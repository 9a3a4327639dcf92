// Plots of an ablation through the Python scripts (see plots.h).
#include "experiments/ablate/plots.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <ostream>
#include <vector>

namespace gradscale::ablate {
namespace {

namespace fs = std::filesystem;
constexpr const char* kPython = "/usr/bin/python3";  // Debian's, where python3-matplotlib installs

// Runs argv[0] with the arguments and waits; output goes to ours unless `silent`. Returns the exit
// status, or -1 when it could not run or was killed.
int run_and_wait(const std::vector<std::string>& args, bool silent) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const int null_fd = silent ? ::open("/dev/null", O_WRONLY | O_CLOEXEC) : -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (null_fd >= 0) {
      ::dup2(null_fd, 1);
      ::dup2(null_fd, 2);
    }
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  if (null_fd >= 0) ::close(null_fd);
  if (pid < 0) return -1;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

bool has_plotter(const fs::path& dir) {
  std::error_code ec;
  return !dir.empty() && fs::is_regular_file(dir / "plot_ablation.py", ec);
}

}  // namespace

std::string find_scripts_dir() {
  if (const char* env = std::getenv("GRADSCALE_SCRIPTS_DIR"); env && *env) return has_plotter(env) ? env : "";
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path near = exe.parent_path().parent_path() / "scripts";
    if (has_plotter(near)) return near.string();
  }
#ifdef GRADSCALE_SOURCE_DIR
  const fs::path source = fs::path(GRADSCALE_SOURCE_DIR) / "scripts";
  if (has_plotter(source)) return source.string();
#endif
  return "";
}

bool have_matplotlib() {
  std::error_code ec;
  if (!fs::exists(kPython, ec)) return false;
  return run_and_wait({kPython, "-c", "import matplotlib"}, true) == 0;
}

bool make_plots(const std::string& out_dir, bool trace_plots, std::ostream& log) {
  if (!have_matplotlib()) {
    log << "ablate: no plots: " << kPython
        << " with matplotlib is not installed (scripts/setup.sh installs python3-matplotlib)" << std::endl;
    return false;
  }
  const std::string scripts = find_scripts_dir();
  if (scripts.empty()) {
    log << "ablate: no plots: scripts/plot_ablation.py not found (set GRADSCALE_SCRIPTS_DIR)" << std::endl;
    return false;
  }
  const fs::path d(out_dir);
  std::vector<std::string> args = {kPython, (fs::path(scripts) / "plot_ablation.py").string(),
                                   (d / "table.csv").string(), "--out", (d / "table.png").string()};
  std::error_code ec;
  if (trace_plots) {
    if (fs::is_regular_file(fs::path(scripts) / "plot_trace.py", ec))
      args.insert(args.end(), {"--trace-plots", (d / "runs").string()});
    else
      log << "ablate: no per-run trace plots: scripts/plot_trace.py is not in this tree" << std::endl;
  }
  const int status = run_and_wait(args, false);
  if (status != 0) {
    log << "ablate: plot_ablation.py failed (exit " << status << "); the tables are written" << std::endl;
    return false;
  }
  return true;
}

}  // namespace gradscale::ablate
