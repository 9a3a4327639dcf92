// The training loop end to end on synthetic data: the loss falls, runs are bit-reproducible, a static
// power-of-two loss scale changes nothing in fp32, a forced overflow skips the step without touching
// weights or optimizer state, and an interrupted + resumed run equals an uninterrupted one.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>

#include "lib/train/trace.h"
#include "lib/train/trainer.h"
#include "tests/weight_bits.h"

using namespace gradscale;
using gradscale::testing::weight_bits;
using json = nlohmann::json;

namespace {

TrainConfig small_config() {
  TrainConfig c;
  c.model = "mlp";
  c.data = "synthetic:512";
  c.batch = 64;
  c.epochs = 2;
  c.threads = 1;
  c.seed = 11;
  c.lr = 1e-3;
  return c;
}

json without_timing(json r) {
  r.erase("epoch_seconds");
  r.erase("scaler_seconds");
  r.erase("train_seconds");
  r.erase("config");
  r.erase("resumed");  // a resumed run records where it resumed from
  for (auto& e : r["history"]) e.erase("seconds");
  return r;
}

std::string temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("gradscale_test_" + name);
  std::filesystem::remove_all(dir);
  return dir.string();
}

}  // namespace

TEST_CASE("a short synthetic run lowers the loss", "[train]") {
  TrainConfig c = small_config();
  Trainer t(c);
  const json r = t.run();
  REQUIRE(r["history"].size() == 2);
  CHECK(r["history"][1]["train_loss"].get<double>() < r["history"][0]["train_loss"].get<double>());
  CHECK(r["test_accuracy"].get<double>() > 0.5);  // 10 classes: chance is 0.1
  CHECK(r["steps"] == 16);
  CHECK(r["skipped_steps"] == 0);
  CHECK(r["epoch_seconds"].size() == 2);
}

TEST_CASE("same seed and one thread give bit-identical runs", "[train]") {
  for (const char* format : {"fp32", "fp16"}) {
    TrainConfig c = small_config();
    c.format = parse_format(format);
    c.scaler = {{"policy", "static"}, {"scale", 256}};
    Trainer a(c), b(c);
    const json ra = a.run(), rb = b.run();
    INFO(format);
    CHECK(weight_bits(a) == weight_bits(b));
    CHECK(without_timing(ra) == without_timing(rb));
  }
}

TEST_CASE("fp32: a static power-of-two scale gives bit-identical updates to S = 1", "[train]") {
  TrainConfig c = small_config();
  c.epochs = 1;
  Trainer unscaled(c);
  c.scaler = {{"policy", "static"}, {"scale", 1024}};
  Trainer scaled(c);
  unscaled.run();
  scaled.run();
  CHECK(weight_bits(unscaled) == weight_bits(scaled));
}

TEST_CASE("a forced overflow skips the step: weights and optimizer untouched", "[train]") {
  TrainConfig c = small_config();
  c.format = Format::fp16;
  c.scaler = {{"policy", "static"}, {"scale", 1e30}};  // the scaled loss gradient overflows fp16
  Trainer t(c);
  Tensor x;
  std::vector<std::int32_t> y;
  Batcher batches(t.data().train, 64, 1);
  REQUIRE(batches.next(x, y));
  const auto before = weight_bits(t);
  const StepOutcome s = t.train_step(x, y);
  CHECK(s.found_inf);
  CHECK(s.skipped);
  CHECK(weight_bits(t) == before);
  CHECK(t.optimizer().step_count() == 0);
  CHECK(t.optimizer().state_tensors().empty());

  TrainConfig ok = small_config();
  ok.format = Format::fp16;
  ok.scaler = {{"policy", "static"}, {"scale", 128}};
  Trainer u(ok);
  const StepOutcome s2 = u.train_step(x, y);
  CHECK_FALSE(s2.found_inf);
  CHECK_FALSE(s2.skipped);
  CHECK(weight_bits(u) != before);  // same init seed, so the step really changed the weights
  CHECK(u.optimizer().step_count() == 1);
}

TEST_CASE("interrupted and resumed training ends bit-identical to an uninterrupted run",
          "[train][checkpoint]") {
  for (const char* scaler : {"torch", "deepspeed"}) {
    TrainConfig c = small_config();
    c.format = Format::fp16;
    c.scaler = {{"policy", scaler}, {"init_scale", 1 << 20}};
    c.epochs = 2;
    Trainer whole(c);
    const json full = whole.run();

    const std::string dir = temp_dir(std::string("resume_") + scaler);
    TrainConfig first = c;
    first.max_steps = 11;  // stops inside epoch 2
    first.checkpoint_dir = dir;
    first.save_every = 4;
    Trainer part(first);
    part.run();
    TrainConfig second = c;
    second.resume_dir = dir;
    Trainer resumed(second);
    const json rest = resumed.run();
    INFO(scaler);
    CHECK(weight_bits(resumed) == weight_bits(whole));
    CHECK(without_timing(rest) == without_timing(full));
    CHECK(full["skipped_steps"].get<int>() > 0);  // init 2^20 overflows fp16: the scalers really acted
  }
}

TEST_CASE("a checkpoint of another model or format is refused", "[train][checkpoint]") {
  TrainConfig c = small_config();
  c.epochs = 1;
  c.max_steps = 2;
  const std::string dir = temp_dir("refuse");
  c.checkpoint_dir = dir;
  c.save_every = 2;
  Trainer(c).run();
  TrainConfig other = small_config();
  other.resume_dir = dir;
  other.format = Format::bf16;
  CHECK_THROWS_WITH(Trainer(other), Catch::Contains("another model or format"));
  other.format = Format::fp32;
  other.model = "deep-mlp:depth=2,width=32";
  CHECK_THROWS_WITH(Trainer(other), Catch::Contains("another model or format"));
  // A damaged tensor file is reported by name.
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().extension() == ".bin") std::filesystem::resize_file(entry.path(), 100);
  TrainConfig same = small_config();
  same.resume_dir = dir;
  CHECK_THROWS_WITH(Trainer(same), Catch::Contains(".bin"));
}

// TraceWriter::finish checks its summary as `gradscale inspect` does, and counts the skipped and
// overflowing iterations from the step records itself, the records kept by a resumed run included.
TEST_CASE("TraceWriter::finish refuses a summary a reader would refuse and counts skips across a resume",
          "[train][trace]") {
  const std::string dir = temp_dir("trace_finish");
  std::filesystem::create_directories(dir);
  const std::string base = dir + "/run";
  const json header = {{"layers", json::array({{{"id", 0}}, {{"id", 1}}})}};
  const json totals = {{"train_loss", 0.5},        {"train_accuracy", 0.25}, {"test_loss", nullptr},
                       {"test_accuracy", nullptr}, {"wall_seconds", 1.0},    {"scaler_seconds", 0.0}};
  StepMonitor overflowed, clean;
  overflowed.found_inf = true;
  overflowed.first_nonfinite_layer = 1;
  {
    TraceWriter trace(base, header, /*every=*/2, /*histograms=*/false);
    CHECK(trace.write_step({1, 1, 0.5, 1024, 1, true}, overflowed));  // traced: a skip
    CHECK(trace.write_step({2, 1, 0.5, 512, 1, false}, clean));       // traced: every 2nd
    CHECK_FALSE(trace.write_step({3, 1, 0.5, 512, 1, false}, clean));
    json missing = totals;
    missing.erase("wall_seconds");
    CHECK_THROWS_AS(trace.finish(missing), ConfigError);
    CHECK_THROWS_WITH(trace.finish(missing), Catch::Contains("missing key 'wall_seconds'"));
    json wrong = totals;
    wrong["overflows"] = 2;
    CHECK_THROWS_WITH(trace.finish(wrong),
                      Catch::Contains("key 'overflows' is 2 but 1 step records have found_inf"));
    json text = totals;
    text["steps"] = "3";
    CHECK_THROWS_WITH(trace.finish(text),
                      Catch::Contains("key 'steps' must be a non-negative integer, got string"));
    // Nothing of the refused summaries was written: header and two step lines.
    CHECK(TraceWriter::read_jsonl(base + ".jsonl").contains("summary") == false);
  }
  // A run resumed from its checkpoint at step 2 keeps steps 1-2 and counts their skip.
  TraceWriter resumed(base, header, 2, false, /*resume_steps=*/2);
  CHECK(resumed.write_step({3, 2, 0.5, 512, 1, true}, overflowed));
  CHECK(resumed.write_step({4, 2, 0.5, 256, 1, false}, clean));  // every 2nd (and S0 changed)
  CHECK_FALSE(resumed.write_step({5, 2, 0.5, 256, 1, false}, clean));
  resumed.finish(totals);
  const json summary = TraceWriter::read_jsonl(base + ".jsonl").at("summary");
  CHECK(summary["steps"] == 5);
  CHECK(summary["traced_steps"] == 4);
  CHECK(summary["skipped"] == 2);
  CHECK(summary["overflows"] == 2);
  std::filesystem::remove_all(dir);
}

TEST_CASE("eval_every evaluates the test set every N steps without changing the training", "[train][checkpoint]") {
  TrainConfig c = small_config();  // 8 steps per epoch, 2 epochs
  c.format = Format::fp16;
  c.scaler = {{"policy", "adaptive"}, {"method", "measured"}, {"init_scale", "auto"}, {"bounds", "derived"}};
  Trainer plain(c);
  const json without = plain.run();
  CHECK_FALSE(without.contains("evaluations"));

  c.eval_every = 3;
  Trainer evaluated(c);
  const json with = evaluated.run();
  REQUIRE(with.contains("evaluations"));
  const json& e = with["evaluations"];
  REQUIRE(e.size() == 5);  // steps 3, 6, 9, 12, 15 of 16
  for (std::size_t i = 0; i < e.size(); ++i) {
    CHECK(e[i]["step"] == 3 * static_cast<int>(i + 1));
    const double a = e[i]["test_accuracy"].get<double>();
    CHECK((a >= 0 && a <= 1));
  }
  CHECK(weight_bits(evaluated) == weight_bits(plain));
  json a = without_timing(with), b = without_timing(without);
  a.erase("evaluations");
  CHECK(a == b);

  // An evaluation at an epoch's end gives that epoch's test accuracy.
  c.eval_every = 8;
  Trainer at_ends(c);
  const json ends = at_ends.run();
  REQUIRE(ends["evaluations"].size() == 2);
  CHECK(ends["evaluations"][0]["test_accuracy"] == ends["history"][0]["test_accuracy"]);
  CHECK(ends["evaluations"][1]["test_accuracy"] == ends["history"][1]["test_accuracy"]);

  // A resumed run keeps the evaluations made before its checkpoint.
  c.eval_every = 3;
  const std::string dir = temp_dir("resume_eval_every");
  TrainConfig first = c;
  first.max_steps = 11;
  first.checkpoint_dir = dir;
  first.save_every = 4;
  Trainer part(first);
  part.run();
  TrainConfig second = c;
  second.resume_dir = dir;
  Trainer resumed(second);
  const json rest = resumed.run();
  CHECK(rest["evaluations"] == with["evaluations"]);
}
