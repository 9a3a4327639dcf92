// Inputs that could hang a command, exhaust it or crash it are refused with one line, before any work:
// FIFOs and devices where a file is read, an ablation of a million runs, labels longer than a file
// name, a result file of the wrong types, control characters in names shown on the terminal, and model
// specs and options that only fail once training has started unless they are checked first.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "experiments/ablate/runner.h"
#include "lib/core/error.h"
#include "lib/core/file_read.h"
#include "lib/core/json_read.h"
#include "tests/cli_case.h"
#include "tests/cli_run.h"
#include "tests/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using namespace gradscale::test;
using gradscale::testing::TempDir;
using json = nlohmann::json;

const std::string kAblation =
    R"({"base":{"data":"synthetic:64","model":"mlp","batch":32,"max_steps":2,"threads":1},)"
    R"("axes":{"scaler":["none","torch"]}})";

}  // namespace

TEST_CASE("read_bounded never blocks on a FIFO and stops a device at the cap", "[io]") {
  using namespace gradscale;
  TempDir tmp;
  REQUIRE(::mkfifo((tmp / "fifo").c_str(), 0644) == 0);
  const BoundedRead fifo = read_bounded(tmp / "fifo", 1024);
  CHECK(fifo.problem == ReadProblem::not_regular);
  CHECK(read_problem_message(fifo, "ablation file", "f", 1024) == "ablation file 'f' is a FIFO, not a regular file");
  CHECK(read_bounded(tmp.str(), 1024).detail == "directory");
  CHECK(read_bounded("/dev/zero", 1 << 20).problem == ReadProblem::too_large);
  write_text(tmp / "a.json", "{\"a\": 1}");
  CHECK(read_bounded(tmp / "a.json", 8).text == "{\"a\": 1}");
  CHECK(read_bounded(tmp / "a.json", 7).problem == ReadProblem::too_large);
  CHECK_THROWS_WITH(read_json_file(tmp / "fifo", "config file", JsonSource::config), Contains("is a FIFO"));
}

TEST_CASE("ablate --dry-run does not block on a FIFO in a run directory", "[ablate][cli]") {
  TempDir tmp;
  write_text(tmp / "s.json", kAblation);
  fs::create_directories(tmp / "out/runs/none_seed0");
  fs::create_directories(tmp / "out/runs/torch_seed0");
  REQUIRE(::mkfifo((tmp / "out/runs/none_seed0/result.json").c_str(), 0644) == 0);
  REQUIRE(::mkfifo((tmp / "out/runs/torch_seed0/status.json").c_str(), 0644) == 0);
  const CliResult r = in_dir(tmp, "ablate s.json --out out --dry-run");
  INFO(joined(r));
  CHECK(r.status == 0);
  CHECK_THAT(joined(r), Contains("half-written"));
  CHECK(gradscale::ablate::run_state(gradscale::ablate::run_paths(tmp / "out", "none_seed0")) ==
        gradscale::ablate::RunState::half_written);
}

TEST_CASE("ablate: the number of runs is capped before they are built", "[ablate][cli]") {
  TempDir tmp;
  std::string values;
  for (int i = 0; i < 1000; ++i) values += (i ? "," : "") + std::to_string(i + 1);
  write_text(tmp / "big.json", R"({"base":{"data":"synthetic:64"},"axes":{"seed":[)" + values + R"(],"epochs":[)" +
                                   values + R"(],"batch":[)" + values + "]}}");
  check_error(in_dir(tmp, "ablate big.json --dry-run"), 2,
              "big.json: 1000 seeds x 1000 (epochs) x 1000 (batch) make more than 10000 runs (\"max_runs\")");
  write_text(tmp / "capped.json", std::string(R"({"max_runs": 1,)") + kAblation.substr(1));
  check_error(in_dir(tmp, "ablate capped.json --dry-run"), 2, "make more than 1 runs");
  write_text(tmp / "raised.json", std::string(R"({"max_runs": 2,)") + kAblation.substr(1));
  CHECK(in_dir(tmp, "ablate raised.json --dry-run").status == 0);
  write_text(tmp / "bad.json", std::string(R"({"max_runs": -1,)") + kAblation.substr(1));
  check_error(in_dir(tmp, "ablate bad.json --dry-run"), 2, "\"max_runs\" must be an integer in [1, 1000000]");
}

TEST_CASE("ablate and inspect read /dev/zero and directories without hanging",
          "[cli][io]") {
  TempDir tmp;
  check_error(in_dir(tmp, "ablate /dev/zero --dry-run"), 2, "ablation file '/dev/zero' is larger than 64 MiB");
  check_error(in_dir(tmp, "inspect /dev/zero"), 1, "the trace '/dev/zero' is larger than 256 MiB");
  check_error(in_dir(tmp, "inspect ."), 1, "the trace '.' is a directory, not a regular file");
  REQUIRE(::mkfifo((tmp / "t.json").c_str(), 0644) == 0);
  check_error(in_dir(tmp, "inspect t.json"), 1, "the trace 't.json' is a FIFO");
  check_error(in_dir(tmp, "ablate t.json --dry-run"), 2, "ablation file 't.json' is a FIFO");
}

TEST_CASE("ablate: a label too long for a file name is refused at the check",
          "[ablate][cli]") {
  TempDir tmp;
  const std::string label(300, 'x');
  write_text(tmp / "s.json", R"({"base":{"data":"synthetic:64","max_steps":1},"axes":{"scaler":[{"label":")" +
                                 label + R"(","value":"none"}]}})");
  check_error(in_dir(tmp, "ablate s.json --out out"), 2, "bytes long, longer than a file name may be (255)");
  CHECK_FALSE(fs::exists(tmp / "out"));
}

TEST_CASE("ablate --table-only: a result of the wrong types is no result, not a raw exception",
          "[ablate][cli]") {
  TempDir tmp;
  write_text(tmp / "s.json", kAblation);
  REQUIRE(in_dir(tmp, "ablate s.json --out out --no-plots").status == 0);
  const std::string result = tmp / "out/runs/none_seed0/result.json";
  json r = json::parse(read_text(result));
  r["diverged"] = "yes";
  write_text(result, r.dump());
  write_text(tmp / "out/runs/torch_seed0/trace.json", R"({"header": 1, "summary": {"type": 2, "layers": [{"id": "x"}]}})");
  fs::remove(tmp / "out/runs/torch_seed0/trace.jsonl");
  const CliResult t = in_dir(tmp, "ablate s.json --out out --no-plots --table-only");
  INFO(joined(t));
  CHECK(t.status == 0);
  CHECK_THAT(joined(t), !Contains("json.exception"));
  CHECK_THAT(joined(t), Contains("1 not run"));
}

TEST_CASE("inspect escapes control characters and elides long names", "[cli][trace]") {
  TempDir tmp;
  REQUIRE(in_dir(tmp, "train --model mlp --data synthetic:64 --batch 32 --max-steps 2 --threads 1 --quiet "
                      "--trace tr --trace-every 1")
              .status == 0);
  json doc = json::parse(read_text(tmp / "tr.json"));
  doc["header"]["layers"][1]["name"] = "fc\x1b[2J\a\r\nforged | row";
  doc["header"]["layers"][3]["name"] = std::string(1 << 20, 'n');
  doc["header"]["config"]["model"] = "m\x1b]0;title\a";
  write_text(tmp / "evil.json", doc.dump());
  for (const char* args : {"inspect evil.json", "inspect evil.json --at 1"}) {
    const CliResult r = in_dir(tmp, args);
    INFO(joined(r).substr(0, 2000));
    REQUIRE(r.status == 0);
    for (const std::string& line : r.lines) {
      CHECK(line.size() < 400);
      for (const char c : line) CHECK_FALSE((static_cast<unsigned char>(c) < 0x20 || c == 0x7f));
    }
    CHECK_THAT(joined(r), Contains("fc\\e[2J\\x07\\r\\nforged | row"));
  }
}

TEST_CASE("a model spec with the wrong number of classes is exit 2 before training",
          "[cli][model]") {
  TempDir tmp;
  write_text(tmp / "spec5.json", R"({"input":[1,28,28],"layers":[{"type":"flatten"},{"type":"linear","out":5}]})");
  check_error(in_dir(tmp, "train --model-spec spec5.json --data synthetic:64 --batch 32 --max-steps 2 --threads 1 --quiet"),
              2, "the model outputs 5 classes (its last layer), the data has 10");
  write_text(tmp / "s.json", R"({"base":{"data":"synthetic:64","model_spec":"spec5.json"},"axes":{"scaler":["none"]}})");
  check_error(in_dir(tmp, "ablate s.json --dry-run"), 2, "the model outputs 5 classes");
}

TEST_CASE("bad --trace and --progress-seconds values are refused", "[cli]") {
  TempDir tmp;
  const std::string train = "train --model mlp --data synthetic:64 --batch 32 --max-steps 2 --threads 1 --quiet";
  check_error(in_dir(tmp, train + " --trace dir/"), 2, "--trace 'dir/' is a directory, not a path prefix");
  check_error(in_dir(tmp, train + " --trace ."), 2, "--trace '.' is a directory");
  CHECK_FALSE(fs::exists(tmp / "dir/.json"));
  write_text(tmp / "s.json", kAblation);
  for (const char* v : {"-1", "nan", "inf"})
    check_error(in_dir(tmp, "ablate s.json --out out --progress-seconds " + std::string(v)), 2,
                "--progress-seconds must be a finite number >= 0");
  CHECK_FALSE(fs::exists(tmp / "out"));
}

TEST_CASE("a model spec layer named 'input' and a model parameter given twice are refused",
          "[cli][model]") {
  TempDir tmp;
  const std::string train = "train --data synthetic:64 --batch 32 --max-steps 1 --threads 1 --quiet";
  write_text(tmp / "spec.json", R"({"input":[1,28,28],"layers":[{"type":"flatten","name":"input"},)"
                                R"({"type":"linear","out":10,"inputs":["input"]}]})");
  check_error(in_dir(tmp, train + " --model-spec spec.json"), 2,
              "model spec: layer 0 ('input', flatten): the layer name 'input' is reserved");
  check_error(in_dir(tmp, train + " --model deep-mlp:depth=2,depth=3"), 2,
              "model 'deep-mlp': parameter 'depth' is given twice");
  check_error(in_dir(tmp, train + " --model resnet-mini:n=1,n=1"), 2,
              "model 'resnet-mini': parameter 'n' is given twice");
  CHECK(in_dir(tmp, train + " --model deep-mlp:depth=2,width=8").status == 0);
}
