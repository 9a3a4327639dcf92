// Tests of how `gradscale ablate` runs an ablation (experiments/ablate/runner.cpp, shard.cpp): resume
// (a finished run is skipped, a half-written one runs again), --shard K/N, run locks between processes,
// and scripts/slurm_ablate.sh.
#include <catch2/catch.hpp>

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiments/ablate/ablation.h"
#include "experiments/ablate/out_dir.h"
#include "experiments/ablate/plots.h"
#include "experiments/ablate/runner.h"
#include "experiments/ablate/shard.h"
#include "experiments/ablate/stats.h"
#include "experiments/ablate/table.h"
#include "lib/train/trace.h"
#include "lib/core/error.h"
#include "tests/ablate_fixtures.h"
#include "tests/cli_run.h"
#include "tests/skip.h"
#include "tests/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using namespace gradscale;
using gradscale::testing::TempDir;
using namespace gradscale::ablate;
using namespace gradscale::test::ablate_fixtures;

}  // namespace

TEST_CASE("ablate resume: a finished run is skipped, a half-written one runs again", "[ablate][cli]") {
  TempDir tmp;
  const std::string file = tmp / "a.json", out = tmp / "out";
  write_text(file, std::string("{") + kTinyBase + R"(, "axes": {"scaler": ["none", "torch", "static:8"]}})");
  const std::string cmd = "ablate '" + file + "' --out '" + out + "' --no-plots";
  const auto first = gradscale::test::run_cli(cmd);
  INFO(joined(first.lines));
  REQUIRE(first.status == 0);
  const RunPaths none = run_paths(out, "none_seed0"), torch = run_paths(out, "torch_seed0"),
                 stat = run_paths(out, "static-8_seed0");
  for (const RunPaths& p : {none, torch, stat}) {
    REQUIRE(run_state(p) == RunState::done);
    CHECK(fs::exists(p.trace + ".json"));
    CHECK(fs::exists(p.log));
    CHECK(fs::exists(p.status));
  }
  // torch: killed mid-run (no result, a trace cut short); static: a failure recorded by the runner.
  fs::remove(torch.result);
  fs::remove(torch.status);
  fs::remove(torch.trace + ".json");
  CHECK(run_state(torch) == RunState::half_written);
  fs::remove(stat.result);
  write_text(stat.status, R"({"exit_code": 1, "signal": null, "seconds": 0.5})");
  CHECK(run_state(stat) == RunState::failed);
  write_text(none.result + ".marker", "");  // the finished run's directory must be left alone
  const auto none_result = read_text(none.result);
  const auto none_time = fs::last_write_time(none.result);

  const auto second = gradscale::test::run_cli(cmd);
  INFO(joined(second.lines));
  REQUIRE(second.status == 0);
  const std::string log = joined(second.lines);
  CHECK(contains(log, "2 already finished, 1 to run (1 half-written, run again)"));
  CHECK(contains(log, "torch_seed0: done"));
  CHECK_FALSE(contains(log, "none_seed0: done"));
  CHECK(run_state(torch) == RunState::done);
  CHECK(fs::exists(torch.trace + ".json"));
  CHECK(read_text(none.result) == none_result);
  CHECK(fs::last_write_time(none.result) == none_time);
  CHECK(fs::exists(none.result + ".marker"));
  CHECK(run_state(stat) == RunState::failed);  // skipped, and the table says so
  CHECK(contains(read_text(out + "/table.md"), "0/1 (1 failed)"));

  const auto retry = gradscale::test::run_cli(cmd + " --retry-failed");
  INFO(joined(retry.lines));
  REQUIRE(retry.status == 0);
  CHECK(run_state(stat) == RunState::done);

  // The ablation file changed under a finished run: refused, naming the run and the key.
  const std::string base = kTinyBase;
  write_text(file, "{" + base.substr(0, base.size() - 1) +
                       R"(, "lr": 0.01}, "axes": {"scaler": ["none", "torch", "static:8"]}})");
  const auto changed = gradscale::test::run_cli(cmd);
  CHECK(changed.status == 2);
  REQUIRE(!changed.lines.empty());
  CHECK(contains(changed.lines[0], "none_seed0"));
  CHECK(contains(changed.lines[0], "'lr'"));
}

TEST_CASE("ablate --reuse: another ablation's finished runs of equal config are copied, not run",
          "[ablate][cli]") {
  TempDir tmp;
  const std::string small = tmp / "small.json", big = tmp / "big.json", other = tmp / "other.json";
  const std::string from = tmp / "from", out = tmp / "out", out2 = tmp / "out2";
  const std::string base = kTinyBase;
  write_text(small, std::string("{") + base + R"(, "axes": {"scaler": ["none", "torch"]}})");
  write_text(big, std::string("{") + base + R"(, "axes": {"scaler": ["none", "torch", "static:8"]}})");
  // The same runs with another learning rate: equal names, other configs.
  write_text(other,
             "{" + base.substr(0, base.size() - 1) + R"(, "lr": 0.01}, "axes": {"scaler": ["none"]}})");
  REQUIRE(gradscale::test::run_cli("ablate '" + small + "' --out '" + from + "' --no-plots").status == 0);
  const RunPaths none_from = run_paths(from, "none_seed0");
  write_text(none_from.log, "the log of the run in 'from'\n");  // marks what was copied rather than run

  const auto r =
      gradscale::test::run_cli("ablate '" + big + "' --out '" + out + "' --no-plots --reuse '" + from + "'");
  INFO(joined(r.lines));
  REQUIRE(r.status == 0);
  const std::string log = joined(r.lines);
  CHECK(contains(log, "reused 2 finished runs of '" + from + "'"));
  CHECK(contains(log, "2 already finished, 1 to run"));
  for (const std::string name : {"none_seed0", "torch_seed0"}) {
    const RunPaths p = run_paths(out, name), q = run_paths(from, name);
    CHECK(run_state(p) == RunState::done);
    CHECK(read_text(p.result) == read_text(q.result));
    CHECK(fs::exists(p.trace + ".json"));
  }
  CHECK(read_text(run_paths(out, "none_seed0").log) == "the log of the run in 'from'\n");
  CHECK(run_state(run_paths(out, "static-8_seed0")) == RunState::done);
  CHECK(contains(read_text(out + "/table.md"), "static"));
  CHECK(run_state(none_from) == RunState::done);  // the source is left as it was
  for (const fs::directory_entry& e : fs::directory_iterator(out + "/runs"))
    CHECK(e.path().filename().string()[0] != '.');  // no partial copy left

  // Another config under the same run name is not taken; what is not an ablation directory is refused.
  const auto o = gradscale::test::run_cli("ablate '" + other + "' --out '" + out2 + "' --no-plots --reuse '" +
                                          from + "'");
  INFO(joined(o.lines));
  REQUIRE(o.status == 0);
  CHECK(contains(joined(o.lines), "reused 0 finished runs"));
  CHECK(read_text(run_paths(out2, "none_seed0").log) != "the log of the run in 'from'\n");
  const std::string plain = tmp / "plain";
  fs::create_directories(plain + "/runs");
  const auto bad =
      gradscale::test::run_cli("ablate '" + big + "' --out '" + out + "' --reuse '" + plain + "'");
  CHECK(bad.status == 2);
  REQUIRE(!bad.lines.empty());
  CHECK(contains(bad.lines[0], "not an ablation directory"));
  const auto self =
      gradscale::test::run_cli("ablate '" + big + "' --out '" + out + "' --reuse '" + out + "'");
  CHECK(self.status == 2);
  REQUIRE(!self.lines.empty());
  CHECK(contains(self.lines[0], "the --out directory itself"));
  const auto table = gradscale::test::run_cli("ablate '" + big + "' --out '" + out +
                                              "' --table-only --reuse '" + from + "'");
  CHECK(table.status == 2);
}

TEST_CASE("ablate --shard: K/N parsed and checked, the shards partition the runs", "[ablate][shard]") {
  CHECK(parse_shard("2/8").index == 2);
  CHECK(parse_shard("2/8").count == 8);
  CHECK(gradscale::ablate::Shard{}.all());
  CHECK_FALSE(parse_shard("1/1").all());  // a shard, though it holds every run: no tables
  CHECK(parse_shard("1/1").holds(0));
  CHECK(parse_shard("1/1").holds(7));
  CHECK_THROWS_WITH(parse_shard("0/2"), Catch::Contains("K must be in [1, 2]"));
  CHECK_THROWS_WITH(parse_shard("3/2"), Catch::Contains("K must be in [1, 2]"));
  CHECK_THROWS_WITH(parse_shard("1/0"), Catch::Contains("N must be in [1, 100000]"));
  CHECK_THROWS_WITH(parse_shard("x/2"), Catch::Contains("expected K/N"));
  CHECK_THROWS_WITH(parse_shard("2"), Catch::Contains("expected K/N"));
  CHECK_THROWS_WITH(parse_shard("-1/2"), Catch::Contains("expected K/N"));
  for (int n : {1, 2, 3, 7}) {
    std::vector<int> owners(20, 0);
    for (int k = 1; k <= n; ++k)
      for (std::size_t i = 0; i < owners.size(); ++i) owners[i] += parse_shard(std::to_string(k) + "/" + std::to_string(n)).holds(i);
    for (int o : owners) CHECK(o == 1);  // every run in exactly one shard
  }
}

TEST_CASE("ablate --shard: two shards at once in one --out run every run once, --table-only merges",
          "[ablate][shard][cli]") {
  TempDir tmp;
  const std::string file = tmp / "a.json", out = tmp / "out";
  write_text(file, std::string("{") + kTinyBase + R"(, "axes": {"scaler": ["none", "torch", "static:8"]}, "seeds": [0, 1]})");
  const std::string cmd = "\"$GS\" ablate '" + file + "' --out '" + out + "' --no-plots --progress-seconds 0";
  const auto bad = gradscale::test::run_cli("ablate '" + file + "' --out '" + out + "' --shard 3/2");
  CHECK(bad.status == 2);
  CHECK(contains(joined(bad.lines), "--shard '3/2': K must be in [1, 2]"));
  const auto both = gradscale::test::run_cli("ablate '" + file + "' --out '" + out + "' --shard 1/2 --table-only");
  CHECK(both.status == 2);
  CHECK(contains(joined(both.lines), "--shard and --table-only together"));
  CHECK_FALSE(fs::exists(out));

  // Both shards started together, into one directory that neither has created yet.
  const auto r = gradscale::test::run_shell("(" + cmd + " --shard 1/2 > '" + (tmp / "s1.log") + "' 2>&1; echo $? > '" +
                                            (tmp / "s1.rc") + "') & (" + cmd + " --shard 2/2 > '" + (tmp / "s2.log") +
                                            "' 2>&1; echo $? > '" + (tmp / "s2.rc") + "') & wait");
  const std::string log1 = read_text(tmp / "s1.log"), log2 = read_text(tmp / "s2.log");
  INFO(log1 << "\n----\n" << log2);
  REQUIRE(r.status == 0);
  CHECK(read_text(tmp / "s1.rc") == "0\n");
  CHECK(read_text(tmp / "s2.rc") == "0\n");
  CHECK(contains(log1, "shard 1/2 (3 of 6 runs)"));
  CHECK(contains(log2, "shard 2/2 (3 of 6 runs)"));
  const Ablation ab = load_ablation(file);
  REQUIRE(ab.runs.size() == 6);
  for (std::size_t i = 0; i < ab.runs.size(); ++i) {
    const std::string done = ab.runs[i].name + ": done";
    CHECK(run_state(run_paths(out, ab.runs[i].name)) == RunState::done);
    // Run i by shard i mod 2 + 1, and by that shard only.
    CHECK(contains(i % 2 == 0 ? log1 : log2, done));
    CHECK_FALSE(contains(i % 2 == 0 ? log2 : log1, done));
  }
  CHECK_FALSE(fs::exists(out + "/table.md"));  // shards leave the tables to the merge
  const auto merged = gradscale::test::run_cli("ablate '" + file + "' --out '" + out + "' --no-plots --table-only");
  INFO(joined(merged.lines));
  REQUIRE(merged.status == 0);
  CHECK_FALSE(contains(joined(merged.lines), "not run"));
  CHECK(contains(read_text(out + "/table.md"), "| none | 2 |"));  // both seeds, from both shards

  // A shard's second copy at once is refused, naming the holder; so is an ablation without --shard.
  {
    const OutDirLock held(out, /*create=*/true, parse_shard("2/2"));
    const auto twice = gradscale::test::run_cli("ablate '" + file + "' --out '" + out + "' --shard 2/2");
    CHECK(twice.status == 2);
    CHECK(contains(joined(twice.lines), "shard 2/2 is already running there (pid " + std::to_string(::getpid())));
    const auto whole = gradscale::test::run_cli("ablate '" + file + "' --out '" + out + "' --no-plots");
    CHECK(whole.status == 2);
    CHECK(contains(joined(whole.lines), "is in use by another gradscale ablate"));
    CHECK(gradscale::test::run_cli("ablate '" + file + "' --out '" + out + "' --shard 1/2").status == 0);
  }
}

TEST_CASE("ablate: a run another process holds is left to it (run locks)", "[ablate][shard][cli]") {
  TempDir tmp;
  const std::string file = tmp / "a.json", out = tmp / "out";
  write_text(file, std::string("{") + kTinyBase + R"(, "axes": {"scaler": ["none", "torch"]}})");
  fs::create_directories(out);
  RunLock held(out, "torch_seed0");  // as a shard of another N running it would
  REQUIRE(held.held());
  const auto r = gradscale::test::run_cli("ablate '" + file + "' --out '" + out + "' --no-plots --shard 1/1");
  INFO(joined(r.lines));
  REQUIRE(r.status == 0);
  CHECK(contains(joined(r.lines), "torch_seed0: run by another process (pid " + std::to_string(::getpid()) + "): left to it"));
  CHECK(run_state(run_paths(out, "none_seed0")) == RunState::done);
  CHECK(run_state(run_paths(out, "torch_seed0")) == RunState::pending);
  // A shard, 1/1 too, writes no tables, and its summary counts the run it left.
  CHECK_FALSE(fs::exists(out + "/table.md"));
  CHECK(contains(joined(r.lines), "ablate: shard 1/1: 2 of 2 runs (1 run now in"));
  CHECK(contains(joined(r.lines), "0 already finished, 1 left to another process; 0 diverged, 0 failed)"));
  const RunLock second(out, "torch_seed0");  // and in-process: one holder at a time
  CHECK_FALSE(second.held());
  CHECK(second.holder() == std::to_string(::getpid()));
}

TEST_CASE("scripts/slurm_ablate.sh submits a job array of shards and a merge after it", "[ablate][shard][cli]") {
  TempDir tmp;
  const std::string file = tmp / "a.json", out = tmp / "out";
  write_text(file, std::string("{") + kTinyBase + R"(, "axes": {"scaler": ["none", "torch", "static:8"]}})");
  // A stand-in for sbatch: records its arguments, answers job ids as `sbatch --parsable` does.
  write_text(tmp / "bin/sbatch", "#!/bin/sh\nprintf '%s\\n' \"$@\" >> '" + (tmp / "sbatch.args") +
                                     "'\necho ---- >> '" + (tmp / "sbatch.args") + "'\necho 4242\n");
  ::chmod((tmp / "bin/sbatch").c_str(), 0755);
  const std::string script = std::string(GRADSCALE_SOURCE_DIR) + "/scripts/slurm_ablate.sh";
  const std::string env = "PATH='" + (tmp / "bin") + "':\"$PATH\" bash '" + script + "' ";
  const auto r = gradscale::test::run_shell(env + "'" + file + "' --out '" + out + "' --shards 3 --jobs 2 --gradscale \"$GS\"");
  INFO(joined(r.lines));
  REQUIRE(r.status == 0);
  const std::string args = read_text(tmp / "sbatch.args");
  INFO(args);
  CHECK(contains(args, "--array=1-3\n"));
  CHECK(contains(args, "--cpus-per-task=2\n"));
  CHECK(contains(args, "--shard ${SLURM_ARRAY_TASK_ID}/3 --jobs 2"));
  CHECK(contains(args, "--dependency=afterany:4242\n"));
  CHECK(contains(args, "--table-only"));
  CHECK(contains(joined(r.lines), "job array 4242"));
  // Bad input stops before anything is submitted.
  fs::remove(tmp / "sbatch.args");
  const auto bad = gradscale::test::run_shell(env + "'" + file + "' --out '" + out + "' --shards 0 --gradscale \"$GS\"");
  CHECK(bad.status == 2);
  CHECK(contains(joined(bad.lines), "--shards must be a whole number >= 1, got '0'"));
  CHECK_FALSE(fs::exists(tmp / "sbatch.args"));
}

TEST_CASE(
    "scripts/slurm_ablate.sh quotes for POSIX sh, and --dry-run prints what it submits",
    "[ablate][shard][cli]") {
  if (gradscale::test::run_shell("command -v dash >/dev/null").status != 0)
    gradscale::test::skip_test("no dash: Slurm's /bin/sh on Debian, which runs each job's --wrap here");
  TempDir tmp;
  // A directory name with a quote, a tab, a newline, non-ASCII bytes and a command substitution.
  const std::string dir = tmp / "Jos\xc3\xa9 it's\tx\ny $(touch pwned)";
  const std::string file = dir + "/a.json", out = dir + "/out";
  write_text(file, "{}");
  // Stand-ins: sbatch records its arguments (NUL-separated) and runs --wrap with dash, as Slurm runs it
  // with /bin/sh; the gradscale binary records its own.
  const std::string log = tmp / "args";
  write_text(tmp / "bin/sbatch", "#!/bin/sh\nprintf 'sbatch\\0' >> '" + log +
                                     "'; printf '%s\\0' \"$@\" >> '" + log +
                                     "'\nfor a; do case \"$a\" in --wrap=*) SLURM_ARRAY_TASK_ID=2 dash -c "
                                     "\"${a#--wrap=}\";; esac; done\necho '4242;cluster'\n");
  write_text(tmp / "bin/gs",
             "#!/bin/sh\nprintf 'gradscale\\0' >> '" + log + "'; printf '%s\\0' \"$@\" >> '" + log + "'\n");
  ::chmod((tmp / "bin/sbatch").c_str(), 0755);
  ::chmod((tmp / "bin/gs").c_str(), 0755);
  const std::string script = std::string(GRADSCALE_SOURCE_DIR) + "/scripts/slurm_ablate.sh";
  const std::string run = "cd '" + tmp.str() + "' && LC_ALL=C PATH='" + (tmp / "bin") + "':\"$PATH\" bash '" +
                          script + "' " + gradscale::test::shell_quote(file) + " --out " +
                          gradscale::test::shell_quote(out) + " --shards 3 --gradscale bin/gs ";
  const auto r = gradscale::test::run_shell(run + "-- --account=p");
  INFO(joined(r.lines));
  REQUIRE(r.status == 0);
  const std::string submitted = read_text(log);
  // Each job received the paths as given: the shard task, then the merge.
  const std::string task = std::string("gradscale\0ablate\0", 17) + file + '\0' + "--out" + '\0' + out +
                           '\0' + "--shard" + '\0' + "2/3" + '\0' + "--jobs" + '\0' + "1" + '\0';
  const std::string merge = std::string("gradscale\0ablate\0", 17) + file + '\0' + "--out" + '\0' + out +
                            '\0' + "--table-only" + '\0';
  CHECK(contains(submitted, task));
  CHECK(contains(submitted, merge));
  CHECK(contains(submitted, std::string("--dependency=afterany:4242") + '\0'));
  CHECK(contains(submitted, std::string("--account=p") + '\0' + "--wrap="));
  CHECK_FALSE(fs::exists(tmp / "pwned"));
  // --dry-run prints sh commands that, run, submit exactly that (the extra arguments too).
  fs::remove(log);
  const auto dry = gradscale::test::run_shell(run + "--dry-run -- --account=p > dry.sh");
  REQUIRE(dry.status == 0);
  fs::remove(log);
  const auto pasted = gradscale::test::run_shell("cd '" + tmp.str() + "' && PATH='" + (tmp / "bin") +
                                                 "':\"$PATH\" dash dry.sh");
  INFO(read_text(tmp / "dry.sh"));
  REQUIRE(pasted.status == 0);
  // The script's own check of the file ran once more in the real submission: compare from the first sbatch.
  CHECK(read_text(log) == submitted.substr(submitted.find(std::string("sbatch") + '\0')));
  CHECK_FALSE(fs::exists(tmp / "pwned"));
}
