// The ablation runner: each run is a child `gradscale train` process (the same binary), N at a time,
// each in DIR/runs/<name>/ with its config, result, trace, log and exit status. Resuming skips runs
// that finished (a result, or a recorded failure) and runs half-written ones again from the start.
//
// Why child processes and not threads in this process: the thread count of a run is process-wide
// (OpenMP, Eigen), so concurrent runs with their own share of the cores need their own processes; a
// run that crashes, diverges (exit 3) or raises (deepspeed at its minimum) ends only itself, and its
// exit status is recorded in the table instead of aborting the ablation.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiments/ablate/ablation.h"
#include "experiments/ablate/shard.h"

namespace gradscale::ablate {

// Where one run's files go.
struct RunPaths {
  std::string dir;     // DIR/runs/<name>
  std::string config;  // config.json: the run's config as expanded (what --config reads)
  std::string result;  // result.json: written by the run when it ends (gradscale.result/1)
  std::string trace;   // trace: the run writes trace.jsonl while it runs and trace.json at the end
  std::string log;     // log.txt: the run's stdout and stderr
  std::string status;  // status.json: written by the runner when the child exited
};
RunPaths run_paths(const std::string& out_dir, const std::string& name);

// The state of a run directory, as resume sees it.
enum class RunState {
  pending,       // nothing there
  half_written,  // files but no outcome (the run or the runner was killed): run again
  done,          // result.json without "diverged": true
  diverged,      // result.json with "diverged": true (exit 3)
  failed,        // no result, status.json with a non-zero exit code (not a signal)
};
RunState run_state(const RunPaths& p);
const char* state_name(RunState s);

struct RunnerOptions {
  std::string out_dir;
  int jobs = 1;
  int threads = 0;  // per run when the config has no "threads"; 0: the machine's threads / jobs
  bool retry_failed = false;
  double progress_seconds = 10;               // a progress line at least this often while runs go on
  std::string executable = "/proc/self/exe";  // the gradscale binary each run executes
  std::string python;  // the interpreter PyTorch runs execute (torch_runs.h); "": default_python()
  Shard shard;  // only the runs of this shard (shard.h); every run by default
  // Other ablations' --out directories whose finished runs are taken where their config equals a run
  // of this one that has not run here (reuse_finished_runs).
  std::vector<std::string> reuse;
};

// Threads per run: options.threads, else max(1, hardware threads / jobs).
int threads_per_run(const RunnerOptions& options);

// Refuses (ConfigError) an out_dir whose finished runs were made from another config: their
// config.json differs from the expansion (the message names the run and the first differing key), or
// their data files now hold other content (the result's data_checksum; the data is loaded once per
// data spec; synthetic data is identified by its config).
void check_existing_runs(const Ablation& ablation, const std::string& out_dir);

// Copies into options.out_dir, for each run of options.shard that has nothing there yet, a finished
// run (done or diverged) of one of options.reuse whose config.json equals the run's config, under the
// run's own name (the copy is made beside it and renamed into place, so an interrupted copy leaves
// no run). The copies are then checked as resumed runs are (check_existing_runs: the config and the
// data's checksum). Refuses (ConfigError) a directory that is not an ablation directory (no marker) or
// is --out itself. Returns how many runs were copied; logs one line per directory.
int reuse_finished_runs(const Ablation& ablation, const RunnerOptions& options, std::ostream& log);

struct RunnerSummary {
  // skipped: finished before (or by another process meanwhile); elsewhere: left to another process that
  // held the run's lock (still running there, or left half-written when it ends).
  int total = 0, skipped = 0, elsewhere = 0, ran = 0, done = 0, diverged = 0, failed = 0;
  double seconds = 0;
};

// Runs every run of options.shard that has not finished (see RunState), `jobs` at a time, writing
// progress lines to `log`. Each run is locked while it runs (out_dir.h RunLock): a run another process
// holds is left to it, and a run another process finished meanwhile is not run again. Interrupts end the children too (they share the process group; and each child is sent
// SIGTERM when the runner dies). Writes DIR/ablation.json (the expansion) first.
RunnerSummary run_ablation(const Ablation& ablation, const RunnerOptions& options, std::ostream& log);

}  // namespace gradscale::ablate
