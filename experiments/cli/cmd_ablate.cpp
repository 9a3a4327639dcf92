// `gradscale ablate`: runs a paper-style ablation (docs/ablations.md) from one JSON file: expands and
// validates every run first, runs them as child `gradscale train` processes N at a time (resuming an
// interrupted ablation), then writes the tables and plots. With --shard K/N it runs only the K-th of N
// disjoint subsets of the runs (experiments/ablate/shard.h) and leaves the tables to --table-only.
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

#include "experiments/ablate/ablation.h"
#include "experiments/ablate/out_dir.h"
#include "experiments/ablate/plots.h"
#include "experiments/ablate/runner.h"
#include "experiments/ablate/shard.h"
#include "experiments/ablate/table.h"
#include "experiments/ablate/torch_runs.h"
#include "experiments/cli/command.h"
#include "experiments/cli/parse.h"
#include "lib/core/error.h"

namespace gradscale::cli {
namespace {

using namespace gradscale::ablate;

void print_dry_run(const Ablation& ab, const std::string& out_dir, const Shard& shard, std::ostream& os) {
  if (!ab.description.empty()) os << ab.description << "\n\n";
  std::size_t width = 4;
  for (const AblationRun& r : ab.runs) width = std::max(width, r.name.size());
  int to_run = 0, in_shard = 0;
  for (std::size_t i = 0; i < ab.runs.size(); ++i) {
    if (!shard.holds(i)) continue;
    ++in_shard;
    const AblationRun& r = ab.runs[i];
    os << std::left << std::setw(static_cast<int>(width)) << r.name << "  ";
    if (!out_dir.empty()) {
      const RunState s = run_state(run_paths(out_dir, r.name));
      to_run += s == RunState::pending || s == RunState::half_written;
      os << std::setw(12) << state_name(s) << "  ";
    }
    std::string settings;
    for (const auto& [k, v] : r.settings.items())
      settings += (settings.empty() ? "" : " ") + k + "=" + v.dump();
    os << "seed=" << r.seed << (settings.empty() ? "" : " ") << settings << "\n";
  }
  os << ab.runs.size() << " runs in " << ab.groups.size() << " configurations";
  if (!shard.all()) os << "; shard " << shard.label() << " holds " << in_shard << " of them";
  if (!out_dir.empty()) os << "; " << to_run << " to run in " << out_dir;
  os << "\n";
}

int run_ablate(const std::vector<std::string>& args) {
  po::options_description desc("options");
  desc.add_options()("file", po::value<std::string>(), "the ablation file (positional)")(
      "out", po::value<std::string>(),
      "output directory: runs/<name>/ per run, table.{md,csv,tex,json}, table.png")(
      "jobs", po::value<int>()->default_value(1),
      "runs at a time; the machine's threads are split between them")(
      "threads", po::value<int>()->default_value(0),
      "threads per run when the config has no \"threads\" (0: the machine's threads / --jobs)")(
      "dry-run", po::bool_switch(), "list the runs (and their state in --out) and stop")(
      "retry-failed", po::bool_switch(), "run again the runs that failed (exit status other than 0 and 3)")(
      "reuse", po::value<std::vector<std::string>>()->composing(),
      "DIR (repeatable): another ablation's --out; its finished runs whose config equals a run of this "
      "file that has not run in --out are copied there instead of run")(
      "table-only", po::bool_switch(),
      "run nothing: write the tables (and plots) from the runs found in --out")(
      "no-plots", po::bool_switch(), "make no plots")("no-trace-plots", po::bool_switch(),
                                                      "no per-run trace plots (scripts/plot_trace.py)")(
      "progress-seconds", po::value<double>()->default_value(10.0), "seconds between progress lines")(
      "python", po::value<std::string>(),
      "the interpreter of PyTorch runs (python -m gradscale.run; default $GRADSCALE_PYTHON, else the "
      "checkout's .venv/bin/python, else python3)")(
      "shard", po::value<std::string>(),
      "K/N: run only the K-th of N disjoint subsets of the runs (run i is in shard i mod N + 1), beside "
      "the other shards in the same --out; no tables (--table-only makes them when all have ended)");
  po::positional_options_description pos;
  pos.add("file", 1);
  po::variables_map vm;
  if (!parse_options("gradscale ablate FILE.json --out DIR [--jobs N] [--dry-run]", desc, args, vm, &pos))
    return 0;
  GS_CHECK_CONFIG(vm.count("file"), "the ablation file is missing: gradscale ablate FILE.json --out DIR");
  const bool dry_run = vm["dry-run"].as<bool>();
  GS_CHECK_CONFIG(dry_run || vm.count("out"), "--out DIR is required (where the runs and tables go)");
  const int jobs = vm["jobs"].as<int>();
  GS_CHECK_CONFIG(jobs >= 1 && jobs <= 1024, "--jobs must be in [1, 1024], got " << jobs);
  const int threads = vm["threads"].as<int>();
  GS_CHECK_CONFIG(threads >= 0 && threads <= 1024, "--threads must be in [0, 1024], got " << threads);

  const double progress_seconds = vm["progress-seconds"].as<double>();
  GS_CHECK_CONFIG(std::isfinite(progress_seconds) && progress_seconds >= 0,
                  "--progress-seconds must be a finite number >= 0, got " << progress_seconds);
  const std::string file = vm["file"].as<std::string>();
  const std::string out_dir = vm.count("out") ? vm["out"].as<std::string>() : "";
  GS_CHECK_CONFIG(!vm.count("out") || !out_dir.empty(), "--out: the path is empty: give the ablation's directory");
  if (!out_dir.empty()) check_input_outside(file, out_dir);
  const Shard shard = vm.count("shard") ? parse_shard(vm["shard"].as<std::string>()) : Shard{};
  GS_CHECK_CONFIG(!vm.count("reuse") || !vm["table-only"].as<bool>(),
                  "--reuse and --table-only together: --table-only runs and copies nothing");
  GS_CHECK_CONFIG(!vm.count("shard") || !vm["table-only"].as<bool>(),
                  "--shard and --table-only together: the tables are made over every run; run --table-only "
                  "without --shard once all the shards have ended");

  // Everything is expanded and validated before anything runs.
  const Ablation ab = load_ablation(file);
  // PyTorch runs: their models and data are built once each, now (a missing torchvision, an unknown
  // model, a factory that raises, an output that does not fit the data stop the ablation here).
  export_python_path();
  const std::string python = vm.count("python") ? vm["python"].as<std::string>() : default_python();
  if (!vm["table-only"].as<bool>()) check_torch_runs(ab, python, std::filesystem::temp_directory_path().string());
  if (dry_run) {
    print_dry_run(ab, out_dir, shard, std::cout);
    return 0;
  }
  // --out is ours from here to the end of the command (out_dir.h).
  const OutDirLock lock(out_dir, /*create=*/!vm["table-only"].as<bool>(), shard);

  RunnerOptions options;
  options.out_dir = out_dir;
  options.jobs = jobs;
  options.threads = threads;
  options.retry_failed = vm["retry-failed"].as<bool>();
  options.progress_seconds = progress_seconds;
  options.shard = shard;
  options.python = python;
  if (vm.count("reuse")) options.reuse = vm["reuse"].as<std::vector<std::string>>();
  RunnerSummary s;
  if (!vm["table-only"].as<bool>()) {
    s = run_ablation(ab, options, std::cerr);
  } else {
    check_existing_runs(ab, out_dir);
  }
  if (!shard.all()) {
    // Tables over every run are the merge's job: shards end at different times, and the other shards'
    // runs are not finished yet.
    std::cerr << "ablate: shard " << shard.label() << ": " << s.total << " of " << ab.runs.size() << " runs ("
              << s.ran << " run now in " << std::fixed << std::setprecision(1) << s.seconds << " s, "
              << s.skipped << " already finished, " << s.elsewhere << " left to another process; "
              << s.diverged << " diverged, " << s.failed
              << " failed); when every shard has ended: gradscale ablate " << file << " --out " << out_dir
              << " --table-only" << std::endl;
    return 0;
  }

  const Table table = build_table(ab, out_dir);
  write_tables(table, out_dir);
  if (!vm["no-plots"].as<bool>()) make_plots(out_dir, !vm["no-trace-plots"].as<bool>(), std::cerr);
  std::cout << table_markdown(table);
  int diverged = 0, failed = 0, missing = 0;
  for (const TableRow& r : table.rows) {
    diverged += r.diverged;
    failed += r.failed;
    missing += r.missing;
  }
  std::cerr << "ablate: " << ab.runs.size() << " runs";
  if (!vm["table-only"].as<bool>())
    std::cerr << " (" << s.ran << " run now in " << std::fixed << std::setprecision(1) << s.seconds << " s, "
              << s.skipped << " already finished"
              << (s.elsewhere > 0 ? ", " + std::to_string(s.elsewhere) + " left to another process" : "")
              << ")";
  if (diverged + failed + missing > 0)
    std::cerr << "; " << diverged << " diverged, " << failed << " failed, " << missing << " not run";
  std::cerr << "; tables in " << out_dir << "/table.{md,csv,tex,json}" << std::endl;
  return 0;
}

}  // namespace

GS_REGISTER_COMMAND("ablate", "run an ablation file: runs, tables, plots (docs/ablations.md)", run_ablate);

}  // namespace gradscale::cli
