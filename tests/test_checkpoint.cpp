// Checkpoints are not trusted: random damage to checkpoint.json is refused (or changes nothing), a
// field edited to a wrong type or an inconsistent value is refused with a message naming the field,
// the tensor file is checked against the model before it is read, files left by a killed save are
// removed after a resume, and the config and data of a resumed run must be the checkpoint's.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "lib/core/error.h"
#include "lib/train/checkpoint.h"
#include "lib/train/resume_check.h"
#include "lib/train/trainer.h"
#include "tests/weight_bits.h"

using namespace gradscale;
using gradscale::testing::weight_bits;
using Catch::Matchers::Contains;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

TrainConfig small_config() {
  TrainConfig c;
  c.model = "tiny";
  c.model_spec = json::parse(R"({"name": "tiny", "input": [1, 28, 28], "layers": [{"type": "flatten"},
      {"type": "linear", "name": "fc1", "out": 32}, {"type": "relu"}, {"type": "linear", "name": "fc2", "out": 10}]})");
  c.data = "synthetic:256";
  c.batch = 64;
  c.epochs = 2;
  c.threads = 1;
  c.seed = 5;
  c.format = Format::fp16;
  c.scaler = {{"policy", "torch"}, {"init_scale", 1 << 20}};
  return c;
}

std::string fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("gradscale_ckpt_" + name);
  fs::remove_all(dir);
  return dir.string();
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

// A checkpoint after 6 of the 8 iterations (inside epoch 2), in `dir`.
void make_checkpoint(const std::string& dir) {
  TrainConfig c = small_config();
  c.max_steps = 6;
  c.checkpoint_dir = dir;
  c.save_every = 3;
  Trainer(c).run();
}

TrainConfig resume_config(const std::string& dir) {
  TrainConfig c = small_config();
  c.resume_dir = dir;
  return c;
}

// Edits checkpoint.json with `edit`, seals it again (so only the field checks can refuse it) and
// returns the message of the refusal ("" when the resume was accepted).
std::string refusal_after(const std::string& dir, const std::function<void(json&)>& edit) {
  const fs::path path = fs::path(dir) / "checkpoint.json";
  const std::string original = read_text(path);
  json meta = json::parse(original);
  edit(meta);
  seal_checkpoint_json(meta);
  write_text(path, meta.dump(1));
  std::string message;
  try {
    Trainer t(resume_config(dir));
  } catch (const Error& e) {
    message = e.what();
  }
  write_text(path, original);
  return message;
}

}  // namespace

TEST_CASE("random bit flips in checkpoint.json are refused or change nothing", "[checkpoint]") {
  const std::string dir = fresh_dir("flips");
  make_checkpoint(dir);
  Trainer whole(small_config());
  whole.run();
  const auto expected = weight_bits(whole);

  const fs::path path = fs::path(dir) / "checkpoint.json";
  const std::string original = read_text(path);
  std::mt19937_64 rng(2024);
  int refused = 0, accepted = 0;
  for (int trial = 0; trial < 150; ++trial) {
    std::string damaged = original;
    const std::size_t bit = rng() % (damaged.size() * 8);
    damaged[bit / 8] = static_cast<char>(damaged[bit / 8] ^ (1 << (bit % 8)));
    write_text(path, damaged);
    try {
      Trainer t(resume_config(dir));
      t.run();
      ++accepted;
      INFO("bit " << bit << " accepted");
      CHECK(weight_bits(t) == expected);  // only a flip that changes nothing may be accepted
    } catch (const Error& e) {
      ++refused;
    }
  }
  write_text(path, original);
  CHECK(refused > 140);
  Trainer t(resume_config(dir));  // the undamaged file still resumes
  t.run();
  CHECK(weight_bits(t) == expected);
}

TEST_CASE("an edited checkpoint.json is refused by its checksum", "[checkpoint]") {
  const std::string dir = fresh_dir("checksum");
  make_checkpoint(dir);
  const fs::path path = fs::path(dir) / "checkpoint.json";
  json meta = json::parse(read_text(path));
  meta["batcher"]["epoch"] = 99;
  write_text(path, meta.dump(1));
  CHECK_THROWS_AS(Trainer(resume_config(dir)), DataError);
  CHECK_THROWS_WITH(Trainer(resume_config(dir)), Contains("checkpoint.json: checksum mismatch"));
}

TEST_CASE("every field of checkpoint.json is checked, and a refusal names the field", "[checkpoint]") {
  const std::string dir = fresh_dir("fields");
  make_checkpoint(dir);
  CHECK(refusal_after(dir, [](json&) {}).empty());  // the resealed original resumes
  const std::vector<std::pair<std::function<void(json&)>, std::string>> cases = {
      {[](json& m) { m["schema"] = "gradscale.checkpoint/9"; }, "field 'schema' is 'gradscale.checkpoint/9'"},
      {[](json& m) { m.erase("identity"); }, "field 'identity' is missing"},
      {[](json& m) { m.erase("scaler"); }, "field 'scaler' is missing"},
      {[](json& m) { m["scaler"].erase("state"); }, "field 'scaler.state' is missing"},
      {[](json& m) { m["scaler"]["state"] = 7; }, "field 'scaler.state' must be an object"},
      {[](json& m) { m["scaler"]["state"]["scale"] = "big"; },
       "field 'scaler.state' is refused: scaler 'torch'"},
      {[](json& m) { m["steps"] = -1; }, "field 'steps' must be an integer in [0, "},
      {[](json& m) { m["steps"] = 7; }, "field 'steps' is 7 but the batcher has served 6 batches"},
      {[](json& m) { m["skipped_steps"] = 100; }, "field 'skipped_steps' must be an integer in [0, 6]"},
      {[](json& m) { m["batcher"]["epoch"] = 99; }, "field 'batcher' is at epoch 99 but 'history' has 1"},
      {[](json& m) { m["batcher"]["position"] = -5; },
       "field 'batcher' is refused: batcher state: 'position'"},
      {[](json& m) { m["optimizer"]["step"] = 1; }, "field 'optimizer.step' is 1 but 6 steps with"},
      {[](json& m) { m["epoch_seen"] = 3, m["epoch_correct"] = 0; },
       "field 'epoch_seen' is 3 but the batcher is at example 128"},
      {[](json& m) { m["epoch_correct"] = "many"; }, "field 'epoch_correct' must be an integer"},
      {[](json& m) { m["epoch_seconds"] = -1.0; }, "field 'epoch_seconds' must be a finite number in [0, "},
      {[](json& m) { m["history"][0]["steps"] = 5; }, "field 'history[0]' is epoch 1 ending at step 5"},
      {[](json& m) { m["history"][0]["test_accuracy"] = 2; }, "field 'history[0].test_accuracy'"},
      {[](json& m) { m["history"] = json::array(); }, "field 'batcher' is at epoch 1 but 'history' has 0"},
      {[](json& m) { m["rng"] = "12 34"; }, "field 'rng' is not the state of the random generator"},
      {[](json& m) { m["rng"] = m["rng"].get<std::string>() + " 5"; }, "field 'rng'"},
      {[](json& m) { m["nonfinite_loss_steps"] = 5; },
       "field 'nonfinite_loss_steps' must be an integer in [0, 4]"},
      {[](json& m) { m["tensor_file"] = "../../etc/passwd"; },
       "field 'tensor_file' must name a file tensors-<tag>.bin"},
      {[](json& m) { m["tensor_bytes"] = 10; }, "tensors-6.bin: "},
      {[](json& m) { m["data_checksum"] = "xxh64:0"; }, "the data differs from the checkpoint's"},
      {[](json& m) { m["config"]["lr"] = 0.5; },
       "config key 'lr' is 0.5 in the checkpoint but 0.001 in this run"},
      {[](json& m) { m["identity"]["format"] = "bf16"; }, "another model or format"},
  };
  for (const auto& [edit, message] : cases) {
    INFO(message);
    CHECK_THAT(refusal_after(dir, edit), Contains(message));
  }
}

TEST_CASE("a tensor file is checked against the model before anything is read into it", "[checkpoint]") {
  const std::string dir = fresh_dir("tensors");
  make_checkpoint(dir);
  const fs::path bin = fs::path(dir) / "tensors-6.bin";
  const std::string original = read_text(bin);
  // A small file (the fuzzer found one of 249 bytes asking for 192 GB) that checkpoint.json vouches for.
  std::string small = original.substr(0, 241) + original.substr(original.size() - 8);
  write_text(bin, small);
  CHECK_THAT(refusal_after(dir, [&](json& m) { m["tensor_bytes"] = small.size(); }),
             Contains("tensors-6.bin: 249 bytes, but the model's") && Contains("tensors take"));
  // A damaged byte anywhere: the checksum of the file.
  std::string flipped = original;
  flipped[100] = static_cast<char>(flipped[100] ^ 4);
  write_text(bin, flipped);
  CHECK_THROWS_WITH(Trainer(resume_config(dir)), Contains("tensors-6.bin: checksum mismatch"));
  write_text(bin, original);
  CHECK_NOTHROW(Trainer(resume_config(dir)));
}

TEST_CASE("read_checkpoint_tensors checks names and shapes and fills nothing on a mismatch", "[checkpoint]") {
  const std::string dir = fresh_dir("tensor_names");
  Tensor a({2, 3}, 1.5f), empty({0}), b({4}, -2.0f);
  write_checkpoint(dir, "1", json::object(), {{"a", &a}, {"empty", &empty}, {"b", &b}});
  const json meta = read_checkpoint_meta(dir);
  Tensor a2({2, 3}, 0.0f), empty2({0}), b2({4}, 0.0f), wrong({5}, 0.0f);
  read_checkpoint_tensors(dir, meta, {{"a", &a2}, {"empty", &empty2}, {"b", &b2}});
  CHECK(a2[5] == 1.5f);
  CHECK(b2[3] == -2.0f);
  Tensor a3({2, 3}, 0.0f);
  // Same total size, other shapes: refused by the directory, before any tensor is filled.
  Tensor c({3, 2}, 0.0f);
  CHECK_THROWS_WITH(read_checkpoint_tensors(dir, meta, {{"a", &c}, {"empty", &empty2}, {"b", &b2}}),
                    Contains("holds tensor 'a' of shape [2, 3] where the model expects 'a' of shape [3, 2]"));
  CHECK_THROWS_WITH(read_checkpoint_tensors(dir, meta, {{"a", &a3}, {"empty", &empty2}, {"c", &b2}}),
                    Contains("holds tensor 'b'"));
  CHECK(a3[0] == 0.0f);
  CHECK_THROWS_WITH(read_checkpoint_tensors(dir, meta, {{"a", &a3}, {"b", &wrong}}),
                    Contains("the model's 2 tensors take"));
}

TEST_CASE("files left by a killed save are removed after a successful resume", "[checkpoint]") {
  const std::string dir = fresh_dir("orphans");
  make_checkpoint(dir);
  for (const char* name :
       {"tensors-9.bin", "tensors-9.bin.tmp", "tensors-12.bin.tmp-77-0", "checkpoint.json.tmp-77-1"})
    write_text(fs::path(dir) / name, "left over");
  write_text(fs::path(dir) / "notes.txt", "mine");
  Trainer t(resume_config(dir));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  CHECK(left == std::vector<std::string>{"checkpoint.json", "notes.txt", "tensors-6.bin"});
}

TEST_CASE("a resumed run keeps the config except the changeable keys", "[checkpoint][resume]") {
  const json saved = {{"lr", 0.001},  {"epochs", 1},
                      {"threads", 0}, {"schedule", {{"name", "cosine"}, {"total_steps", 8}}},
                      {"trace", ""},  {"grad_format", "fp16"}};
  json now = saved;
  CHECK(check_resume_config(saved, now, "d") == json::object());
  now["epochs"] = 3;
  now["threads"] = 2;
  now["trace"] = "runs/t";  // trace keys (the trace writer's) may change
  const json changed = check_resume_config(saved, now, "d");
  CHECK(changed == json{{"epochs", {{"checkpoint", 1}, {"now", 3}}},
                        {"threads", {{"checkpoint", 0}, {"now", 2}}},
                        {"trace", {{"checkpoint", ""}, {"now", "runs/t"}}}});
  json other = saved;
  other["schedule"]["total_steps"] = 16;
  CHECK_THROWS_WITH(
      check_resume_config(saved, other, "d"),
      Contains("config key 'schedule' differs from the checkpoint's (at 'schedule.total_steps': 8 in "
               "the checkpoint, 16 in this run)"));
  // A key this function has never heard of falls under the rule too.
  other = saved;
  other["grad_format"] = "fp8_e5m2";
  CHECK_THROWS_AS(check_resume_config(saved, other, "d"), ConfigError);
  other = saved;
  other["new_key"] = 1;
  CHECK_THROWS_WITH(check_resume_config(saved, other, "d"),
                    Contains("'new_key' is absent in the checkpoint"));
  other = saved;
  other["schedule"]["total_steps"] = 8.0;  // numbers compare by value
  CHECK_NOTHROW(check_resume_config(saved, other, "d"));
}
