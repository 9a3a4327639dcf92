// `gradscale train` (and `replay`) as a hostile-but-realistic user runs it, through the built binary:
// deeply nested JSON, values that overflow, huge model sizes, diverging runs, bad output paths and
// resumes that are not the same run. Each case must end in one clear line and a documented exit status
// (docs/config.md): 2 for bad input, 3 for a diverged run, never a crash or a silent wrong result.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/cli_run.h"
#include "tests/idx_dir.h"

using Catch::Matchers::Contains;
using gradscale::test::CliResult;
using gradscale::test::run_cli;
using gradscale::test::run_shell;
using gradscale::test::shell_quote;
using gradscale::test::write_idx_dir;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// A fresh, empty directory for one test case.
fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("gradscale_cli_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

json read_json(const fs::path& path) {
  return json::parse(read_text(path));
}

std::string nested(int depth) {
  return std::string(static_cast<std::size_t>(depth), '[') +
         std::string(static_cast<std::size_t>(depth), ']');
}

// The one line an error exit prints, with its status.
void check_error(const CliResult& r, int status, const std::string& text) {
  INFO((r.lines.empty() ? std::string("(no output)") : r.lines.back()));
  CHECK(r.status == status);
  REQUIRE(r.lines.size() == 1);
  CHECK_THAT(r.lines[0], Contains(text));
}

// Training commands: `kSmall` runs 8 iterations of the mlp on synthetic data.
const std::string kTrain = "train --threads 1 --quiet";
const std::string kSmall = kTrain + " --data synthetic:512 --batch 64";

std::vector<fs::path> entries(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename());
  return out;
}

}  // namespace

TEST_CASE("deeply nested JSON anywhere is one line and exit 2, not a crash", "[cli][json]") {
  const fs::path dir = fresh_dir("deep");
  write_text(dir / "config.json", "{\"model\": " + nested(100000) + "}");
  check_error(run_cli("train --config " + shell_quote((dir / "config.json").string())), 2,
              "nested deeper than 64");
  write_text(dir / "spec.json", nested(100000));
  check_error(
      run_cli("train --quiet --data synthetic:64 --model-spec " + shell_quote((dir / "spec.json").string())),
      2, "nested deeper than 64");
  // One command-line argument holds at most 128 KiB: 60,000 levels fit.
  check_error(run_cli("train --data synthetic:64 --scaler " + shell_quote(nested(60000))), 2,
              "nested deeper than 64");
  check_error(run_cli("replay --events F --scaler " + shell_quote(nested(60000))), 2,
              "nested deeper than 64");
  check_error(run_cli("train --data synthetic:64 --optimizer '{\"name\":" + nested(60000) + "}'"), 2,
              "nested deeper than 64");
  check_error(run_cli("train --data synthetic:64 --schedule '{\"name\":" + nested(60000) + "}'"), 2,
              "nested deeper than 64");
}

// An error line is for the user: no source file in it; GRADSCALE_DEBUG=1 adds the failed check's file:line.
TEST_CASE("an error line names no source file unless GRADSCALE_DEBUG is set", "[cli]") {
  const std::string bad = kSmall + " --scaler no_such_policy";
  const CliResult plain = run_cli(bad);
  check_error(plain, 2, "unknown scaler policy 'no_such_policy'");
  REQUIRE(plain.lines.size() == 1);
  CHECK(plain.lines[0].find(".cpp") == std::string::npos);
  const CliResult debug = run_shell("GRADSCALE_DEBUG=1 \"$GS\" " + bad);
  check_error(debug, 2, "unknown scaler policy 'no_such_policy'");
  REQUIRE(debug.lines.size() == 1);
  CHECK_THAT(debug.lines[0], Contains(" [registry.cpp:"));
  CHECK(debug.lines[0].find('/') == std::string::npos);
}

TEST_CASE("a trace nested deeper than 64 levels is refused by inspect when it is parsed", "[cli][json]") {
  // The shipped small trace with 100,000 nested arrays in its header's config: the JSON library would
  // parse it, and crash later in any copy or dump of that value.
  const fs::path dir = fresh_dir("deep_trace");
  for (const char* name : {"trace_small.json", "trace_small.jsonl"}) {
    std::string text = read_text(fs::path(GRADSCALE_SOURCE_DIR) / "tests/data" / name);
    const std::size_t config = text.find('{', text.find("\"config\""));
    REQUIRE(config != std::string::npos);
    text.insert(config + 1, "\"deep\":" + nested(100000) + ",");
    write_text(dir / name, text);
    check_error(run_cli("inspect " + shell_quote((dir / name).string())), 1, "not valid JSON");
  }
}

TEST_CASE("an ablation file nested too deeply, or with a number out of range, is exit 2", "[cli][json]") {
  const fs::path dir = fresh_dir("deep_ablation");
  write_text(dir / "deep.json", "{\"base\": {\"model\": " + nested(100000) + "}}");
  check_error(run_cli("ablate " + shell_quote((dir / "deep.json").string()) + " --out " +
                      shell_quote((dir / "out").string())),
              2, "nested deeper than 64");
  write_text(dir / "big.json", R"({"base": {"lr": 1e400}})");
  check_error(run_cli("ablate " + shell_quote((dir / "big.json").string()) + " --out " +
                      shell_quote((dir / "out").string())),
              2, "number overflow");
  CHECK_FALSE(fs::exists(dir / "out"));
}

TEST_CASE("an error message shows a cut excerpt of a long value", "[cli][json]") {
  const fs::path dir = fresh_dir("excerpt");
  std::string zeros;
  for (int i = 0; i < 100000; ++i) zeros += i ? ",0" : "0";
  write_text(dir / "config.json", "{\"model\": [" + zeros + "]}");
  const CliResult r = run_cli("train --config " + shell_quote((dir / "config.json").string()));
  check_error(r, 2, "config key 'model' must be a string, got [0,0,0");
  CHECK(r.lines[0].size() < 400);
  const CliResult name = run_cli("train --data synthetic:64 --scaler " + std::string(100000, 'x'));
  check_error(name, 2, "unknown scaler policy 'xxxx");
  CHECK(name.lines[0].size() < 800);
}

TEST_CASE("numbers out of range in a config file are bad input: exit 2", "[cli][config]") {
  const fs::path dir = fresh_dir("overflow");
  write_text(dir / "lr.json", R"({"lr": 1e400})");
  check_error(run_cli("train --config " + shell_quote((dir / "lr.json").string())), 2, "number overflow");
  write_text(dir / "progress.json", R"({"progress_seconds": 1e999})");
  check_error(run_cli("train --config " + shell_quote((dir / "progress.json").string())), 2,
              "number overflow");
  write_text(dir / "seed.json", R"({"seed": 9223372036854775808})");
  const CliResult seed = run_cli("train --config " + shell_quote((dir / "seed.json").string()));
  check_error(seed, 2, "config key 'seed' must be in [0, 4611686018427387904], got 9223372036854775808");
  CHECK_THAT(seed.lines[0], !Contains("-9223372036854775808"));
}

TEST_CASE("absurd model sizes are config errors naming the key, checked before allocating", "[cli][model]") {
  const fs::path dir = fresh_dir("sizes");
  const std::string big = "1099511627776";  // 2^40
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type":"conv2d","out":4,"kernel":)" + big + "}", "'kernel' must be <= 16777216"},
      {R"({"type":"conv2d","out":4,"kernel":3,"padding":)" + big + "}", "'padding' must be <= 16777216"},
      {R"({"type":"conv2d","out":1,"kernel":4096,"padding":2048})", "more than 67108864 values per sample"},
      {R"({"type":"conv2d","out":65536,"kernel":64,"padding":32})", "parameters, over the limit"},
  };
  for (const auto& [layer, message] : cases) {
    write_text(dir / "spec.json", R"({"input":[1,28,28],"layers":[)" + layer +
                                      R"(,{"type":"flatten"},{"type":"linear","out":10}]})");
    check_error(run_cli("train --quiet --data synthetic:64 --model-spec " +
                        shell_quote((dir / "spec.json").string())),
                2, message);
  }
  write_text(dir / "spec.json",
             R"({"input":[1,28,28],"layers":[{"type":"flatten"},{"type":"linear","out":)" + big + "}]}");
  check_error(
      run_cli("train --quiet --data synthetic:64 --model-spec " + shell_quote((dir / "spec.json").string())),
      2, "'out' must be <= 16777216");
  check_error(
      run_cli("train --quiet --data synthetic:64 --model deep-mlp:width=16384"), 2,
      "layer 3 ('fc2', linear): the model would have 281313280 parameters, over the limit of 67108864");
}

TEST_CASE("a diverged run stops with one line, exit 3 and a result that says diverged", "[cli][diverge]") {
  const fs::path dir = fresh_dir("diverge");
  // The update itself makes the master weights non-finite.
  const CliResult sgd =
      run_cli(kSmall + " --optimizer sgd --lr 1e300 --result " + shell_quote((dir / "sgd.json").string()));
  check_error(sgd, 3, "diverged at step 1: parameter 'fc1.weight' is not finite after the update");
  const json r = read_json(dir / "sgd.json");
  CHECK(r["diverged"] == true);
  CHECK(r["diverged_step"] == 1);
  CHECK(r["complete"] == false);
  CHECK_THAT(r["divergence"].get<std::string>(), Contains("fc1.weight"));
  // Finite but huge weights: the forward pass overflows, every later step is skipped.
  for (const char* format : {"fp32", "fp16", "bf16"}) {
    INFO(format);
    const fs::path result = dir / (std::string(format) + ".json");
    const CliResult big = run_cli(kSmall + " --optimizer sgd --lr 1e30 --format " + format +
                                  " --checkpoint " + shell_quote((dir / format).string()) +
                                  " --save-every 1 --result " + shell_quote(result.string()));
    check_error(big, 3,
                "diverged at step 6: the loss was not finite for 5 iterations in a row (since step 2)");
    CHECK(read_json(result)["diverged"] == true);
    // No checkpoint of the diverged state: the last one is the step before.
    CHECK(read_json(dir / format / "checkpoint.json")["steps"] == 5);
  }
  // A healthy run says so too.
  const CliResult ok = run_cli(kSmall + " --result " + shell_quote((dir / "ok.json").string()));
  CHECK(ok.status == 0);
  CHECK(read_json(dir / "ok.json")["diverged"] == false);
}

TEST_CASE("a scale that overflowed is written \"inf\" in every place of the result", "[cli][result]") {
  const fs::path dir = fresh_dir("inf_scale");
  // One clean step grows megatron's scale past float32; the run ends there (a next step would be
  // refused: its S0 is not finite).
  const CliResult r = run_cli(
      "train --data synthetic:128 --batch 128 --threads 1 --quiet --scaler "
      "'{\"policy\":\"megatron\",\"initial_scale\":3e38,\"growth_interval\":1}' --result " +
      shell_quote((dir / "r.json").string()));
  REQUIRE(r.status == 0);
  const json result = read_json(dir / "r.json");
  CHECK(result["scaler_state"]["scale"] == "inf");
  CHECK(result["final_scale"] == "inf");
  CHECK(result["history"][0]["scale"] == "inf");
}

TEST_CASE("bad result paths are refused before training, and nothing is replaced", "[cli][output]") {
  const fs::path dir = fresh_dir("result_paths");
  const std::string in_dir = "cd " + shell_quote(dir.string()) + " && \"$GS\" " + kSmall;
  // An empty path leaves no ./.tmp; a directory leaves no isdir.tmp.
  check_error(run_shell(in_dir + " --result ''"), 2, "--result: the path is empty");
  fs::create_directory(dir / "isdir");
  check_error(run_shell(in_dir + " --result isdir"), 2, "--result 'isdir' is a directory");
  CHECK(entries(dir) == std::vector<fs::path>{"isdir"});
  // A FIFO stays a FIFO; the input config stays the input config.
  REQUIRE(::mkfifo((dir / "fifo").c_str(), 0644) == 0);
  check_error(run_shell(in_dir + " --result fifo"), 2, "--result 'fifo' is a FIFO, not a regular file");
  CHECK(fs::is_fifo(dir / "fifo"));
  write_text(dir / "config.json", R"({"epochs": 1})");
  check_error(run_shell(in_dir + " --config config.json --result config.json"), 2,
              "--result 'config.json' is the --config file");
  CHECK(read_text(dir / "config.json") == R"({"epochs": 1})");
  // A directory where no file can be created (even as root): found before the first step.
  check_error(run_cli(kSmall + " --result /proc/self/r.json"), 2,
              "cannot create files in the directory '/proc/self'");
  write_text(dir / "file", "x");
  check_error(run_shell(in_dir + " --result file/r.json"), 2, "--result 'file/r.json'");
  check_error(run_shell(in_dir + " --checkpoint file --save-every 2"), 2, "--checkpoint 'file' is a file");
  // What works: a new directory is created; a symlink is written through, and stays a symlink.
  REQUIRE(run_shell(in_dir + " --result new/sub/r.json").status == 0);
  CHECK(read_json(dir / "new/sub/r.json")["complete"] == true);
  fs::create_symlink("new/sub/r.json", dir / "link.json");
  REQUIRE(run_shell(in_dir + " --result link.json --epochs 2").status == 0);
  CHECK(fs::is_symlink(dir / "link.json"));
  CHECK(read_json(dir / "new/sub/r.json")["epochs_done"] == 2);
  for (const auto& e : fs::recursive_directory_iterator(dir))
    CHECK_THAT(e.path().filename().string(), !Contains(".tmp"));
}

TEST_CASE("resume refuses a changed run and records what it may change", "[cli][resume]") {
  const fs::path dir = fresh_dir("resume_config");
  const std::string ckpt = shell_quote((dir / "ckpt").string());
  REQUIRE(run_cli(kSmall + " --max-steps 4 --checkpoint " + ckpt + " --save-every 2").status == 0);
  check_error(run_cli(kSmall + " --resume " + ckpt + " --lr 0.01"), 2,
              "config key 'lr' is 0.001 in the checkpoint but 0.01 in this run");
  check_error(run_cli(kSmall + " --resume " + ckpt + " --schedule cosine"), 2,
              "config key 'schedule' differs from the checkpoint's");
  check_error(run_cli(kSmall + " --resume " + ckpt + " --scaler static:8"), 2,
              "used scaler {\"policy\":\"none\"}");
  check_error(run_cli(kSmall + " --resume " + ckpt + " --seed 3"), 2, "config key 'seed'");
  // epochs may change; the result records it.
  const CliResult more = run_cli(kSmall + " --resume " + ckpt + " --epochs 2 --result " +
                                 shell_quote((dir / "r.json").string()));
  REQUIRE(more.status == 0);
  const json r = read_json(dir / "r.json");
  CHECK(r["config"]["epochs"] == 2);
  CHECK(r["resumed"]["step"] == 4);
  CHECK(r["resumed"]["changed"]["epochs"] == json{{"checkpoint", 1}, {"now", 2}});
  CHECK(r["steps"] == 16);
}

TEST_CASE("resume refuses other data with the same counts: data is identified by content", "[cli][resume]") {
  const fs::path dir = fresh_dir("resume_data");
  write_idx_dir(dir / "mnist", 64);
  const std::string data = " --data mnist:" + shell_quote((dir / "mnist").string());
  const std::string ckpt = shell_quote((dir / "ckpt").string());
  REQUIRE(
      run_cli(kTrain + data + " --batch 16 --max-steps 2 --checkpoint " + ckpt + " --save-every 2").status ==
      0);
  // The same files elsewhere: accepted.
  fs::copy(dir / "mnist", dir / "moved");
  CHECK(run_cli(kTrain + " --data mnist:" + shell_quote((dir / "moved").string()) +
                " --batch 16 --max-steps 3 " + "--resume " + ckpt)
            .status == 0);
  // One pixel changed: refused.
  std::string pixels = read_text(dir / "mnist/train-images-idx3-ubyte");
  pixels[16 + 100] = static_cast<char>(pixels[16 + 100] ^ 1);
  write_text(dir / "mnist/train-images-idx3-ubyte", pixels);
  check_error(run_cli(kTrain + data + " --batch 16 --resume " + ckpt), 2,
              "the data differs from the checkpoint's");
}

TEST_CASE("a corrupt tensor shape is refused before anything is allocated", "[cli][checkpoint]") {
  const fs::path dir = fresh_dir("tensor_shape");
  const fs::path ckpt = dir / "ckpt";
  REQUIRE(run_cli(kSmall + " --max-steps 2 --checkpoint " + shell_quote(ckpt.string()) + " --save-every 2")
              .status == 0);
  const fs::path bin = ckpt / "tensors-2.bin";
  std::string bytes = read_text(bin);
  // The first tensor is "param/fc1.weight" [256, 784]: its first dimension sits after the magic (8),
  // the count (8), the name length (4), the name (16) and the rank (4). Byte 2 set: 2^20 + 256 rows.
  REQUIRE(bytes.substr(20, 16) == "param/fc1.weight");
  bytes[40 + 2] = 0x10;
  write_text(bin, bytes);
  // With 2 GB of address space, allocating the corrupt shape (3.3 GB) fails with bad_alloc.
  const CliResult r =
      run_shell("(ulimit -v 2000000; \"$GS\" " + kSmall + " --resume " + shell_quote(ckpt.string()) + ")");
  check_error(r, 1, "tensors-2.bin: checksum mismatch");
}
