// Inputs that would give a wrong result without a word are refused, or skipped, with a message: a tensor
// file swapped between checkpoints, scales outside float32's range, u_min/u_max against the format's
// defaults, a model spec or data file edited under a finished ablation, stray arguments, and trace
// checks whose arithmetic overflows.
#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "lib/scaler/scale_range.h"
#include "tests/cli_case.h"
#include "tests/cli_run.h"
#include "tests/idx_dir.h"
#include "tests/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using namespace gradscale::test;
using gradscale::testing::TempDir;
using json = nlohmann::json;

const std::string kTrain = "train --model mlp --data synthetic:512 --batch 32 --threads 1 --quiet";

// A small finished trace (TRACE.json) in `dir`, from a real run.
json traced_run(const TempDir& dir) {
  REQUIRE(in_dir(dir, "train --model mlp --data synthetic:64 --batch 32 --max-steps 2 --threads 1 --quiet "
                      "--trace tr --trace-every 1")
              .status == 0);
  return json::parse(read_text(dir / "tr.json"));
}

}  // namespace

TEST_CASE("resume refuses a tensor file of another checkpoint", "[cli][checkpoint]") {
  TempDir tmp;
  REQUIRE(in_dir(tmp, kTrain + " --max-steps 6 --checkpoint a --save-every 3").status == 0);
  REQUIRE(in_dir(tmp, kTrain + " --max-steps 6 --checkpoint b --save-every 3 --lr 0.01").status == 0);
  CHECK(json::parse(read_text(tmp / "a/checkpoint.json"))["tensor_checksum"].get<std::string>().rfind("xxh64:", 0) ==
        0);
  fs::copy_file(tmp / "b/tensors-6.bin", tmp / "a/tensors-6.bin", fs::copy_options::overwrite_existing);
  check_error(in_dir(tmp, kTrain + " --max-steps 8 --resume a"), 1,
              "tensors-6.bin: content checksum xxh64:");
  CHECK_THAT(in_dir(tmp, kTrain + " --max-steps 8 --resume a").lines.back(),
             Contains("this tensor file belongs to another checkpoint"));
}

TEST_CASE("scales that float32 cannot hold and divide out are refused at configuration",
          "[cli][scaler]") {
  CHECK(gradscale::scale_in_float_range(1.0));
  CHECK(gradscale::scale_in_float_range(0x1p-126));
  CHECK_FALSE(gradscale::scale_in_float_range(0x1p-127));
  CHECK(gradscale::scale_in_float_range(std::numeric_limits<float>::max()));
  CHECK_FALSE(gradscale::scale_in_float_range(1e39));
  TempDir tmp;
  const std::string fp16 = kTrain + " --max-steps 3 --format fp16 --scaler ";
  check_error(in_dir(tmp, fp16 + "static:1e-46"), 2, "scaler 'static': 'scale' is 1e-46, outside the range");
  check_error(in_dir(tmp, fp16 + "'{\"policy\":\"adaptive\",\"init_scale\":1e-46}'"), 2,
              "scaler 'adaptive': 'init_scale' is 1e-46");
  check_error(in_dir(tmp, fp16 + "'{\"policy\":\"apex\",\"init_scale\":1e-300}'"), 2,
              "scaler 'apex': 'init_scale' is 1e-300");
  check_error(in_dir(tmp, fp16 + "'{\"policy\":\"adaptive\",\"scale_upper_bound\":1e-40}'"), 2,
              "scaler 'adaptive': 'scale_upper_bound' is 1e-40");
  check_error(in_dir(tmp, fp16 + "'{\"policy\":\"cerebras\",\"init_scale\":1e-40}'"), 2,
              "scaler 'cerebras': 'init_scale' is 9.99995e-41");
  check_error(in_dir(tmp, fp16 + "'{\"policy\":\"megatron\",\"min_scale\":1e-40}'"), 2,
              "scaler 'megatron': 'min_scale' is");
  CHECK(fs::is_empty(tmp.path()));
}

TEST_CASE("a step whose accumulated scale leaves float32's range is skipped, never applied",
          "[cli][scaler]") {
  TempDir tmp;
  // Each layer's s is at most 1e-30: the product over three linear layers is far below 2^-126, so
  // the unscale 1/S would be inf (0·inf = NaN weights if applied, then exit 3 "diverged").
  const CliResult r = in_dir(tmp, kTrain + " --max-steps 3 --format fp16 --result r.json --scaler "
                                           "'{\"policy\":\"adaptive\",\"scale_upper_bound\":1e-30}'");
  INFO(joined(r));
  REQUIRE(r.status == 0);
  const json result = json::parse(read_text(tmp / "r.json"));
  CHECK(result["diverged"] == false);
  CHECK(result["skipped_steps"] == 3);
  CHECK(result["test_loss"].is_number());
}

TEST_CASE("adaptive u_min or u_max alone is checked against the format's default of the other",
          "[cli][scaler]") {
  TempDir tmp;
  const std::string fp16 = kTrain + " --max-steps 3 --format fp16 --scaler ";
  check_error(in_dir(tmp, fp16 + "'{\"policy\":\"adaptive\",\"u_max\":1e-10}'"), 2,
              "'u_max' (1e-10) must be above 'u_min', which is 5.96046e-08 (the smallest subnormal of fp16)");
  check_error(in_dir(tmp, fp16 + "'{\"policy\":\"adaptive\",\"u_min\":1e6}'"), 2,
              "'u_min' (1e+06) must be below 'u_max', which is 65504 (the largest finite value of fp16)");
  CHECK(in_dir(tmp, fp16 + "'{\"policy\":\"adaptive\",\"u_max\":1e3}'").status == 0);
}

TEST_CASE("ablate: a model_spec file edited under finished runs is not counted as done",
          "[ablate][cli]") {
  TempDir tmp;
  const std::string spec = R"({"input":[1,28,28],"layers":[{"type":"flatten"},{"type":"linear","out":10}]})";
  write_text(tmp / "spec.json", spec);
  write_text(tmp / "s.json",
             R"({"base":{"data":"synthetic:64","model_spec":"spec.json","batch":32,"max_steps":2,"threads":1},)"
             R"("axes":{"scaler":["none"]}})");
  REQUIRE(in_dir(tmp, "ablate s.json --out out --no-plots").status == 0);
  // The run's config holds the spec's content, not its path.
  CHECK(json::parse(read_text(tmp / "out/runs/none_seed0/config.json"))["model_spec"] == json::parse(spec));
  CHECK(in_dir(tmp, "ablate s.json --out out --no-plots").status == 0);  // unchanged: all done
  write_text(tmp / "spec.json",
             R"({"input":[1,28,28],"layers":[{"type":"flatten"},{"type":"linear","out":32},)"
             R"({"type":"relu"},{"type":"linear","out":10}]})");
  const CliResult r = in_dir(tmp, "ablate s.json --out out --no-plots");
  INFO(joined(r));
  CHECK(r.status == 2);
  REQUIRE(!r.lines.empty());
  CHECK_THAT(r.lines[0], Contains("none_seed0") && Contains("'model_spec'"));
}

TEST_CASE("a stray argument is refused, not ignored", "[cli]") {
  TempDir tmp;
  check_error(in_dir(tmp, kTrain + " --max-steps 3 out.json"), 2, "unexpected argument 'out.json'");
  CHECK_FALSE(fs::exists(tmp / "out.json"));
  check_error(in_dir(tmp, "replay --scaler torch out.json"), 2, "unexpected argument 'out.json'");
  // Commands with a positional argument take one.
  check_error(in_dir(tmp, "inspect a.json b.json"), 2, "too many positional options");
}

TEST_CASE("inspect --check: S = s * S_in is checked when the product overflows a double",
          "[cli][trace]") {
  TempDir tmp;
  json doc = traced_run(tmp);
  json& layer = doc["steps"][0]["layers"][0];
  layer["s"] = 1e200;
  layer["S_in"] = 1e200;
  layer["S"] = 1.0;
  write_text(tmp / "bad.json", doc.dump());
  const CliResult r = in_dir(tmp, "inspect --check bad.json");
  INFO(joined(r));
  CHECK(r.status == 1);
  CHECK_THAT(joined(r), Contains("key 'S' is 1, but s * S_in"));
}

TEST_CASE("inspect --check: class counts that wrap around 2^64 are refused", "[cli][trace]") {
  TempDir tmp;
  json doc = traced_run(tmp);
  json& g = doc["steps"][0]["loss_grad"];
  const std::uint64_t elements = g["elements"].get<std::uint64_t>();
  g["zero"] = std::numeric_limits<std::uint64_t>::max();  // + (elements + 1) wraps to elements
  g["normal"] = elements + 1;
  for (const char* k : {"underflow", "subnormal", "overflow", "nonfinite"}) g[k] = 0;
  write_text(tmp / "bad.json", doc.dump());
  const CliResult r = in_dir(tmp, "inspect --check bad.json");
  INFO(joined(r));
  CHECK(r.status == 1);
  CHECK_THAT(joined(r), Contains("add up to more than 2^64 - 1 (at 'loss_grad.normal' = " +
                                  std::to_string(elements + 1) + "), not elements = " + std::to_string(elements)));
}

TEST_CASE("ablate: data files changed under finished runs are not counted as done",
          "[ablate][cli]") {
  TempDir tmp;
  write_idx_dir(tmp.path() / "mnist", 32);
  write_text(tmp / "s.json", R"({"base":{"data":"mnist:mnist","model":"mlp","batch":16,"max_steps":2,"threads":1},)"
                             R"("axes":{"scaler":["none"]}})");
  REQUIRE(in_dir(tmp, "ablate s.json --out out --no-plots").status == 0);
  CHECK(in_dir(tmp, "ablate s.json --out out --no-plots").status == 0);  // the same files: all done
  std::string pixels = read_text(tmp / "mnist/train-images-idx3-ubyte");
  pixels[16 + 100] = static_cast<char>(pixels[16 + 100] ^ 1);
  write_text(tmp / "mnist/train-images-idx3-ubyte", pixels);
  check_error(in_dir(tmp, "ablate s.json --out out --no-plots"), 2, "none_seed0' was run on other data");
}
