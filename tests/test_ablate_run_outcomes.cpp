// How gradscale ablate reads a run's outcome from its directory (experiments/ablate/runner.cpp run_state)
// and how it checks a PyTorch run's interpreter before anything runs (torch_runs.cpp check_torch_runs):
// a run's program that ends without its result failed, whatever its exit code.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "experiments/ablate/ablation.h"
#include "experiments/ablate/runner.h"
#include "experiments/ablate/torch_runs.h"
#include "lib/core/error.h"
#include "tests/cli_run.h"
#include "tests/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using gradscale::ConfigError;
using gradscale::testing::TempDir;
using namespace gradscale::ablate;

void write_text(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

// An ablation of one PyTorch run whose factory file is `models` (expansion checks that it is a file).
std::string torch_ablation(const std::string& models) {
  return R"({"base": {"model": {"python": ")" + models + R"(:make_model"}, "data": "synthetic:64",
    "max_steps": 2, "batch": 16}, "axes": {"scaler": ["none"]}})";
}

}  // namespace

TEST_CASE("ablate: a run that ended without a result failed (exit 0 too) and is not run again unasked",
          "[ablate]") {
  TempDir tmp;
  const RunPaths p = run_paths(tmp.str(), "none_seed0");
  write_text(p.config, "{}");
  write_text(p.log, "");
  CHECK(run_state(p) == RunState::half_written);  // started, not ended: runs again
  write_text(p.status, R"({"exit_code": null, "signal": 9, "seconds": 1.0})");
  CHECK(run_state(p) == RunState::half_written);  // killed: runs again
  write_text(p.status, R"({"exit_code": 1, "signal": null, "seconds": 1.0})");
  CHECK(run_state(p) == RunState::failed);
  // A program that is no trainer (a --python such as /bin/true) or a factory that calls sys.exit(0).
  write_text(p.status, R"({"exit_code": 0, "signal": null, "seconds": 0.1})");
  CHECK(run_state(p) == RunState::failed);
  // A result file damaged after a run that ended well: no result, run again.
  write_text(p.result, R"({"steps": "two"})");
  CHECK(run_state(p) == RunState::half_written);
  write_text(p.result, R"({"steps": 2, "diverged": false})");
  CHECK(run_state(p) == RunState::done);
}

TEST_CASE("ablate: a --python that is another program is refused before any PyTorch run starts",
          "[ablate][cli]") {
  TempDir tmp;
  const std::string models = tmp / "models.py";
  write_text(models, "def make_model(num_classes=10):\n    raise SystemExit(0)\n");
  const Ablation ab = expand_ablation(nlohmann::ordered_json::parse(torch_ablation(models)), "a.json");
  REQUIRE(ab.runs.size() == 1);
  for (const char* program : {"/bin/true", "/bin/echo"}) {
    INFO(program);
    try {
      check_torch_runs(ab, program, tmp.str());
      FAIL("check_torch_runs accepted " << program);
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      CHECK(what.find("exited 0 without saying 'ok: checked 1 run'") != std::string::npos);
    }
  }
  // The command: exit 2 naming the interpreter, no run directory made.
  const std::string file = tmp / "a.json";
  write_text(file, torch_ablation(models));
  const auto r = gradscale::test::run_cli("ablate '" + file + "' --out '" + (tmp / "out") + "' --python /bin/true");
  std::string out;
  for (const auto& l : r.lines) out += l + "\n";
  INFO(out);
  CHECK(r.status == 2);
  CHECK(out.find("'/bin/true -m gradscale.run --check-runs' exited 0 without saying") != std::string::npos);
  CHECK_FALSE(fs::exists(tmp / "out/runs"));
}
