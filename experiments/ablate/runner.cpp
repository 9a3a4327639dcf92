// The ablation runner (see runner.h): child processes, resume, progress and ETA.
#include "experiments/ablate/runner.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <sstream>
#include <thread>

#include "experiments/ablate/files.h"
#include "experiments/ablate/out_dir.h"
#include "experiments/ablate/torch_runs.h"
#include "lib/core/error.h"
#include "lib/core/clock.h"
#include "lib/core/json_read.h"
#include "lib/data/dataset.h"
#include "lib/train/checkpoint.h"  // write_file_atomic

namespace gradscale::ablate {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// "epoch 2/10  step 120/469" from the last progress line of a run's log, or "".
std::string child_progress(const std::string& log_path) {
  const auto lines = lines_of(file_tail(log_path, 4096));
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    if (it->compare(0, 6, "epoch ") != 0) continue;
    const auto step = it->find("  step ");
    if (step == std::string::npos) continue;
    const auto end = it->find("  ", step + 2);
    return it->substr(0, end);
  }
  return "";
}

// The first key where two config objects differ, for the message of check_existing_runs.
std::string first_difference(const json& a, const json& b) {
  for (const auto& [k, v] : a.items())
    if (!b.contains(k) || b[k] != v) return k;
  for (const auto& [k, v] : b.items()) {
    (void)v;
    if (!a.contains(k)) return k;
  }
  return "?";
}

// What the cost of a run depends on, for the ETA: runs with the same key take about as long.
std::string cost_key(const json& config) {
  json k = json::object();
  for (const char* key :
       {"model", "model_spec", "data", "epochs", "max_steps", "batch", "format", "grad_format"})
    if (config.contains(key)) k[key] = config[key];
  return k.dump();
}

int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const unsigned h = std::thread::hardware_concurrency();
  return h > 0 ? static_cast<int>(h) : 1;
}

struct Child {
  std::size_t run = 0;  // index into ablation.runs
  pid_t pid = -1;
  double start = 0;
  int threads = 0;
  std::vector<std::string> argv;
};

// fork + exec with stdout and stderr into `log_path`. The child asks for SIGTERM when the runner dies,
// so an ablation killed from outside leaves no orphan runs.
pid_t spawn(const std::string& executable, const std::vector<std::string>& args,
            const std::string& log_path) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const int out = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  GS_CHECK_DATA(out >= 0, "cannot create '" << log_path << "': " << std::strerror(errno));
  const int in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {  // only async-signal-safe calls until exec
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);
    if (in >= 0) ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(out, 2);
    ::execv(executable.c_str(), argv.data());
    const char msg[] = "gradscale ablate: cannot execute the run's program (the gradscale binary, or the Python of a PyTorch run)\n";
    [[maybe_unused]] const auto n = ::write(2, msg, sizeof msg - 1);
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(out);
  if (in >= 0) ::close(in);
  GS_CHECK_DATA(pid > 0, "cannot start a run: fork failed: " << std::strerror(fork_errno));
  return pid;
}

std::string last_log_line(const std::string& log_path) {
  const auto lines = lines_of(file_tail(log_path, 4096));
  return lines.empty() ? "" : lines.back();
}

// A finished run read its data from files (fashion-mnist, mnist:DIR; synthetic data is made from the
// config alone): the files must still hold what the run trained on, by content, as for --resume.
void check_same_data(const AblationRun& r, const RunPaths& p, std::map<std::string, std::string>& checksums) {
  const std::string spec = r.config.contains("data") && r.config["data"].is_string()
                               ? r.config["data"].get<std::string>()
                               : std::string("fashion-mnist");
  if (spec.compare(0, 9, "synthetic") == 0) return;
  const json result = read_json_or_null(p.result);
  if (!result.is_object() || !result.contains("data_checksum") || !result["data_checksum"].is_string()) return;
  auto it = checksums.find(spec);
  if (it == checksums.end()) it = checksums.emplace(spec, load_data(spec, 0).checksum).first;
  const std::string had = result["data_checksum"].get<std::string>();
  GS_CHECK_CONFIG(had == it->second, "'" << p.dir << "' was run on other data: its data had content checksum "
                                         << text_excerpt(had, 40) << ", '" << spec << "' now has " << it->second
                                         << ": use another --out, or remove that run's directory to run it again");
}

}  // namespace

RunPaths run_paths(const std::string& out_dir, const std::string& name) {
  const fs::path dir = fs::path(out_dir) / "runs" / name;
  return RunPaths{dir.string(),
                  (dir / "config.json").string(),
                  (dir / "result.json").string(),
                  (dir / "trace").string(),
                  (dir / "log.txt").string(),
                  (dir / "status.json").string()};
}

RunState run_state(const RunPaths& p) {
  // Files a run wrote, read without trusting their types: a result whose "steps" is not a count or
  // whose "diverged" is not true/false is no result (the run is half-written and runs again).
  const json result = read_json_or_null(p.result);
  if (result.is_object() && result.contains("steps") && result["steps"].is_number_integer()) {
    const json diverged = result.contains("diverged") ? result["diverged"] : json(false);
    if (diverged.is_boolean()) return diverged.get<bool>() ? RunState::diverged : RunState::done;
  }
  // Its process ended (the runner wrote its exit code) without a result: failed. A program that exits 0
  // and wrote no result file at all (a --python that is no Python with gradscale, a factory that calls
  // sys.exit(0)) failed too, and is not run again unasked; a result file damaged after the run is
  // half-written (below) and runs again.
  const json status = read_json_or_null(p.status);
  std::error_code ec;
  if (status.is_object() && status.contains("exit_code") && status["exit_code"].is_number_integer() &&
      (status["exit_code"] != 0 || !fs::exists(p.result, ec)))
    return RunState::failed;
  if (fs::is_directory(p.dir, ec) && !fs::is_empty(p.dir, ec)) return RunState::half_written;
  return RunState::pending;
}

const char* state_name(RunState s) {
  switch (s) {
    case RunState::pending:
      return "pending";
    case RunState::half_written:
      return "half-written";
    case RunState::done:
      return "done";
    case RunState::diverged:
      return "diverged";
    case RunState::failed:
      return "failed";
  }
  return "?";
}

int threads_per_run(const RunnerOptions& options) {
  if (options.threads > 0) return options.threads;
  return std::max(1, available_cpus() / std::max(1, options.jobs));
}

void check_existing_runs(const Ablation& ablation, const std::string& out_dir) {
  std::map<std::string, std::string> data_checksums;  // data spec → content checksum, loaded once
  for (const AblationRun& r : ablation.runs) {
    const RunPaths p = run_paths(out_dir, r.name);
    const RunState s = run_state(p);
    if (s == RunState::pending || s == RunState::half_written) continue;
    const json had = read_json_or_null(p.config);
    GS_CHECK_CONFIG(!had.is_null(), "'" << p.dir
                                        << "' holds a finished run but no config.json: it was not "
                                           "written by gradscale ablate; use another --out");
    GS_CHECK_CONFIG(had == r.config, "'" << p.dir << "' was run with another config (key '"
                                         << first_difference(had, r.config)
                                         << "' differs from the ablation file): use another --out, or remove "
                                            "that run's directory to run it again");
    check_same_data(r, p, data_checksums);
  }
}

int reuse_finished_runs(const Ablation& ablation, const RunnerOptions& options, std::ostream& log) {
  int copied = 0;
  for (const std::string& from : options.reuse) {
    std::error_code ec;
    GS_CHECK_CONFIG(fs::is_regular_file(fs::path(from) / kMarkerFile, ec),
                    "--reuse: '" << from << "' is not an ablation directory (no " << kMarkerFile
                                 << "): name another ablation's --out");
    GS_CHECK_CONFIG(!fs::equivalent(from, options.out_dir, ec),
                    "--reuse: '" << from << "' is the --out directory itself");
    // The finished runs of `from`, by their config (the first of equal configs).
    std::map<std::string, std::string> finished;
    for (const fs::directory_entry& e : fs::directory_iterator(fs::path(from) / "runs", ec)) {
      const std::string name = e.path().filename().string();
      if (name.empty() || name[0] == '.' || !e.is_directory(ec)) continue;
      const RunPaths q = run_paths(from, name);
      const RunState state = run_state(q);
      if (state != RunState::done && state != RunState::diverged) continue;
      const json config = read_json_or_null(q.config);
      if (config.is_object()) finished.emplace(config.dump(), q.dir);
    }
    int here = 0;
    for (std::size_t i = 0; i < ablation.runs.size(); ++i) {
      if (!options.shard.holds(i)) continue;
      const AblationRun& r = ablation.runs[i];
      const RunPaths p = run_paths(options.out_dir, r.name);
      if (run_state(p) != RunState::pending) continue;
      const auto hit = finished.find(r.config.dump());
      if (hit == finished.end()) continue;
      const fs::path dest(p.dir), part = dest.parent_path() / ("." + r.name + ".reuse");
      fs::create_directories(dest.parent_path());
      fs::remove_all(part);
      fs::copy(hit->second, part, fs::copy_options::recursive);
      fs::remove(dest, ec);  // an empty directory (pending) may stand there
      fs::rename(part, dest);
      ++here;
    }
    log << "ablate: reused " << here << " finished run" << (here == 1 ? "" : "s") << " of '" << from << "' ("
        << finished.size() << " there; the configs equal)" << std::endl;
    copied += here;
  }
  return copied;
}

RunnerSummary run_ablation(const Ablation& ablation, const RunnerOptions& options, std::ostream& log) {
  GS_CHECK_CONFIG(options.jobs >= 1, "--jobs must be >= 1, got " << options.jobs);
  fs::create_directories(fs::path(options.out_dir) / "runs");
  reuse_finished_runs(ablation, options, log);
  check_existing_runs(ablation, options.out_dir);
  {
    json runs = json::array();
    for (const AblationRun& r : ablation.runs)
      runs.push_back({{"name", r.name},
                      {"labels", r.labels},
                      {"seed", r.seed},
                      {"settings", r.settings},
                      {"config", r.config}});
    const json doc = {{"schema", "gradscale.ablation/1"},
                      {"description", ablation.description},
                      {"columns", ablation.columns},
                      {"runs", runs}};
    write_file_atomic((fs::path(options.out_dir) / "ablation.json").string(), doc.dump(2) + "\n");
  }

  RunnerSummary summary;
  std::vector<std::size_t> queue;
  int half_written = 0, retried = 0;
  std::map<std::string, std::pair<double, int>> cost;  // cost key → (sum of seconds, runs)
  for (std::size_t i = 0; i < ablation.runs.size(); ++i) {
    if (!options.shard.holds(i)) continue;
    ++summary.total;
    const RunPaths p = run_paths(options.out_dir, ablation.runs[i].name);
    const RunState s = run_state(p);
    const bool run = s == RunState::pending || s == RunState::half_written ||
                     (s == RunState::failed && options.retry_failed);
    if (run) {
      queue.push_back(i);
      half_written += s == RunState::half_written;
      retried += s == RunState::failed;
      continue;
    }
    ++summary.skipped;
    const json status = read_json_or_null(p.status);
    if (status.is_object() && status.value("seconds", json()).is_number()) {
      auto& c = cost[cost_key(ablation.runs[i].config)];
      c.first += status["seconds"].get<double>();
      ++c.second;
    }
  }
  const int threads = threads_per_run(options);
  const std::string python = options.python.empty() ? default_python() : options.python;
  log << "ablate: ";
  if (!options.shard.all())
    log << "shard " << options.shard.label() << " (" << summary.total << " of " << ablation.runs.size() << " runs): ";
  log << summary.total << " runs; " << summary.skipped << " already finished, " << queue.size()
      << " to run";
  if (half_written) log << " (" << half_written << " half-written, run again)";
  if (retried) log << " (" << retried << " failed, run again)";
  log << "; " << options.jobs << " at a time, " << threads << " thread" << (threads == 1 ? "" : "s")
      << " each (unless a config sets \"threads\")" << std::endl;

  const double t0 = now_seconds();
  std::vector<Child> running;
  std::map<std::size_t, RunLock> run_locks;  // run index → its lock, while it runs
  std::size_t next = 0;
  int finished = summary.skipped;
  double last_progress = t0;

  auto estimate = [&](const AblationRun& r) {
    const auto it = cost.find(cost_key(r.config));
    if (it != cost.end() && it->second.second > 0) return it->second.first / it->second.second;
    double sum = 0;
    int n = 0;
    for (const auto& [k, c] : cost) {
      (void)k;
      sum += c.first;
      n += c.second;
    }
    return n > 0 ? sum / n : std::nan("");
  };
  auto progress_line = [&]() {
    const double now = now_seconds();
    double left = 0;
    for (std::size_t q = next; q < queue.size(); ++q) left += estimate(ablation.runs[queue[q]]);
    std::string current;
    for (const Child& c : running) {
      const double e = estimate(ablation.runs[c.run]);
      left += std::max(0.0, e - (now - c.start));
      const std::string where = child_progress(run_paths(options.out_dir, ablation.runs[c.run].name).log);
      current += (current.empty() ? "" : ", ") + ablation.runs[c.run].name +
                 (where.empty() ? "" : " (" + where + ")");
    }
    log << "ablate: " << finished << "/" << summary.total << " runs finished";
    if (summary.failed + summary.diverged > 0)
      log << " (" << summary.failed << " failed, " << summary.diverged << " diverged)";
    log << " | running: " << (current.empty() ? "-" : current) << " | elapsed " << format_duration(now - t0)
        << " | ETA " << format_duration(left / options.jobs) << std::endl;
    last_progress = now;
  };

  while (next < queue.size() || !running.empty()) {
    bool changed = false;
    while (static_cast<int>(running.size()) < options.jobs && next < queue.size()) {
      const std::size_t i = queue[next++];
      const AblationRun& r = ablation.runs[i];
      const RunPaths p = run_paths(options.out_dir, r.name);
      // Another process in this directory (a shard of another N, or one started by hand) may run or
      // have run it since the queue was made: its lock, then its state again, decide.
      const auto lock = run_locks.try_emplace(i, options.out_dir, r.name).first;
      if (!lock->second.held()) {
        log << "ablate: " << r.name << ": run by another process (pid " << lock->second.holder()
            << "): left to it" << std::endl;
        run_locks.erase(lock);
        ++summary.elsewhere;
        ++finished;
        continue;
      }
      const RunState now_state = run_state(p);
      if (now_state == RunState::done || now_state == RunState::diverged ||
          (now_state == RunState::failed && !options.retry_failed)) {
        log << "ablate: " << r.name << ": finished by another process meanwhile (" << state_name(now_state)
            << ")" << std::endl;
        run_locks.erase(lock);
        ++summary.skipped;
        ++finished;
        continue;
      }
      fs::remove_all(p.dir);  // a half-written or failed run starts from nothing
      fs::create_directories(p.dir);
      write_file_atomic(p.config, r.config.dump(2) + "\n");
      Child c;
      c.run = i;
      c.threads = r.config.contains("threads") ? r.config["threads"].get<int>() : threads;
      std::string executable = options.executable;
      if (is_torch_run(r.config)) {  // python -m gradscale.run, writing the same files (torch_runs.h)
        executable = python;
        c.argv = torch_run_argv(python, p.config, p.result, p.trace, r.config.contains("threads") ? 0 : threads);
      } else {
        c.argv = {"gradscale", "train", "--config", p.config, "--result", p.result, "--trace", p.trace};
        if (!r.config.contains("threads")) c.argv.insert(c.argv.end(), {"--threads", std::to_string(threads)});
      }
      c.start = now_seconds();
      c.pid = spawn(executable, c.argv, p.log);
      running.push_back(std::move(c));
      changed = true;
    }
    for (std::size_t k = 0; k < running.size();) {
      int status = 0;
      const pid_t w = ::waitpid(running[k].pid, &status, WNOHANG);
      if (w == 0 || (w < 0 && errno == EINTR)) {
        ++k;
        continue;
      }
      const Child c = running[k];
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(k));
      const AblationRun& r = ablation.runs[c.run];
      const RunPaths p = run_paths(options.out_dir, r.name);
      const double seconds = now_seconds() - c.start;
      json st = {{"exit_code", nullptr},
                 {"signal", nullptr},
                 {"seconds", seconds},
                 {"threads", c.threads},
                 {"command", c.argv}};
      if (w > 0 && WIFEXITED(status)) st["exit_code"] = WEXITSTATUS(status);
      if (w > 0 && WIFSIGNALED(status)) st["signal"] = WTERMSIG(status);
      const RunState s = run_state(p);
      if (s != RunState::done) st["last_line"] = last_log_line(p.log);
      write_file_atomic(p.status, st.dump(2) + "\n");
      run_locks.erase(c.run);  // its outcome is on disk
      const RunState after = run_state(p);
      ++summary.ran;
      ++finished;
      log << "ablate: [" << finished << "/" << summary.total << "] " << r.name << ": ";
      if (after == RunState::done) {
        ++summary.done;
        const json result = read_json_or_null(p.result);
        const json acc = result.value("test_accuracy", json());
        log << "done, test accuracy " << (acc.is_number() ? acc.dump() : std::string("?"));
        auto& cst = cost[cost_key(r.config)];
        cst.first += seconds;
        ++cst.second;
      } else if (after == RunState::diverged) {
        ++summary.diverged;
        log << "DIVERGED (exit " << st["exit_code"].dump() << ")";
      } else {
        ++summary.failed;
        if (!st["signal"].is_null())
          log << "KILLED by signal " << st["signal"].get<int>() << " (runs again on resume)";
        else
          log << "FAILED (exit " << st["exit_code"].dump() << (st["exit_code"] == 0 ? " without a result" : "")
              << "): " << (st.value("last_line", std::string()).empty() ? std::string("(its log is empty)")
                                                                             : st.value("last_line", std::string()));
      }
      log << ", " << format_duration(seconds) << std::endl;
      changed = true;
    }
    const double now = now_seconds();
    if (changed && !running.empty()) {
      progress_line();
    } else if (now - last_progress >= options.progress_seconds && !running.empty()) {
      progress_line();
    }
    if (!changed) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  summary.seconds = now_seconds() - t0;
  return summary;
}

}  // namespace gradscale::ablate
