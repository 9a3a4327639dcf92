// The per-layer controllers (SPEC §6, adaptive/) and te_delayed (SPEC §7) through the engine: scales
// composing exactly through a deep network, local scales applied before rounding, joins, saturation as
// overflow, te_delayed's delayed amax, resume in the middle of an update_every interval, and traces.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "adaptive/math.h"
#include "adaptive/method.h"
#include "lib/core/random.h"
#include "lib/layers/linear.h"
#include "lib/layers/precision_ops.h"
#include "lib/layers/conv2d.h"
#include "lib/layers/softmax_cross_entropy.h"
#include "lib/model/spec.h"
#include "lib/scaler/scaler.h"
#include "lib/train/trace.h"
#include "lib/train/trainer.h"
#include "tests/adaptive_fixtures.h"

using namespace gradscale;
using json = nlohmann::json;
using Catch::Matchers::Contains;
using namespace gradscale::test::adaptive_fixtures;

namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(float)) == 0;
}

// Backward through a chain of Linear layers fed by `x`, from `g` at scale S0; returns the input gradient.
ScaledGrad chain_backward(std::vector<std::unique_ptr<Linear>>& layers, const Tensor& x, const Tensor& g,
                          double s0, Scaler& scaler, const Precision& p) {
  StepMonitor monitor;
  monitor.reset(static_cast<int>(layers.size()), false, 0);
  std::vector<Tensor> acts(layers.size() + 1);
  acts[0] = x;
  ForwardContext f{p, true, nullptr};
  for (std::size_t i = 0; i < layers.size(); ++i) {
    layers[i]->prepare_weights(p);
    for (Parameter* par : layers[i]->parameters()) par->grad.fill(0.0f);
    layers[i]->forward({&acts[i]}, acts[i + 1], f);
  }
  Tensor gs = g;
  for (std::int64_t i = 0; i < gs.size(); ++i) gs[i] *= static_cast<float>(s0);
  ScaledGrad cur{gs, s0};
  BackwardContext b{p, scaler, monitor, 0};
  scaler.begin_step(0);
  for (std::size_t k = layers.size(); k-- > 0;) {
    ScaledGrad next;
    std::vector<ScaledGrad*> gi{&next};
    layers[k]->backward({&acts[k]}, acts[k + 1], cur, gi, b);
    cur = next;
  }
  return cur;
}

std::vector<std::unique_ptr<Linear>> six_linears(std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::unique_ptr<Linear>> layers;
  for (int i = 0; i < 6; ++i) {
    layers.push_back(std::make_unique<Linear>("fc" + std::to_string(i), 8, 8, true, InitSpec{}, rng));
    layers.back()->set_id(i);
  }
  return layers;
}

TrainConfig tiny_config() {
  TrainConfig c;
  c.model = "mlp";
  c.data = "synthetic:512";
  c.batch = 64;
  c.epochs = 2;
  c.threads = 1;
  c.seed = 11;
  c.format = Format::fp16;
  return c;
}

std::string temp_path(const std::string& name) {
  const auto p = std::filesystem::temp_directory_path() / ("gradscale_adaptive_" + name);
  std::filesystem::remove_all(p);
  return p.string();
}

json strip_timing(json r) {
  for (const char* k : {"epoch_seconds", "train_seconds", "config", "scaler_seconds", "trace", "resumed"}) r.erase(k);
  for (auto& e : r["history"]) e.erase("seconds");
  return r;
}

}  // namespace

TEST_CASE("fixed 2 with init_scale 2 through six Linear layers: input gradient at 2^7, fp32 updates bit-identical",
          "[adaptive]") {
  const Precision p;  // fp32: power-of-two scales are exact
  const Tensor x = normal_tensor({4, 8}, 21), g = normal_tensor({4, 8}, 22, 1e-3);
  auto scaled_layers = six_linears(5), plain_layers = six_linears(5);
  auto fixed = adaptive_scaler({{"method", "fixed"}, {"fixed_scale", 2}, {"init_scale", 2}}, Format::fp32);
  auto none = make_scaler("none", Format::fp32);
  REQUIRE(fixed->choose_loss_scale(LocalScaleQuery{}) == 2.0);
  const ScaledGrad a = chain_backward(scaled_layers, x, g, 2.0, *fixed, p);
  const ScaledGrad b = chain_backward(plain_layers, x, g, 1.0, *none, p);
  CHECK(a.scale == 128.0);  // 2 at the loss, ×2 at each of six layers
  CHECK(b.scale == 1.0);
  for (std::int64_t i = 0; i < a.g.size(); ++i) REQUIRE(a.g[i] == 128.0f * b.g[i]);
  for (std::size_t l = 0; l < 6; ++l) {
    const auto pa = scaled_layers[l]->parameters(), pb = plain_layers[l]->parameters();
    for (std::size_t j = 0; j < pa.size(); ++j) CHECK(same_bits(pa[j]->grad, pb[j]->grad));
  }
}

TEST_CASE("a local scale is applied before rounding to a non-fp32 format", "[adaptive]") {
  // o = g·W = 2^-26 underflows fp16 (below 2^-25); with s = 16 the product 2^-22 is exact in fp16.
  Precision p;
  p.format = Format::fp16;
  Rng rng(1);
  Linear fc("fc", 1, 1, false, InitSpec{}, rng);
  fc.set_id(0);
  fc.parameters()[0]->value[0] = 0x1p-6f;
  fc.prepare_weights(p);
  const Tensor x({1, 1}, 1.0f), g({1, 1}, 0x1p-20f);
  Tensor y;
  ForwardContext f{p, true, nullptr};
  fc.forward({&x}, y, f);
  for (double s : {1.0, 16.0}) {
    auto scaler = adaptive_scaler({{"method", "fixed"}, {"fixed_scale", s}});
    StepMonitor m;
    m.reset(1, true, 0);
    BackwardContext b{p, *scaler, m, 0};
    ScaledGrad gx;
    std::vector<ScaledGrad*> gi{&gx};
    fc.backward({&x}, y, ScaledGrad{g, 1.0}, gi, b);
    CHECK(gx.scale == s);
    CHECK(gx.g[0] == (s == 1.0 ? 0.0f : 0x1p-22f));
    CHECK(m.records[0].activation_grad.underflow == (s == 1.0 ? 1u : 0u));
    CHECK(m.records[0].local_scale == s);
  }
}

TEST_CASE("every method through a residual join: fp32 master gradients equal the unscaled ones", "[adaptive]") {
  // fp32 storage with fp16's range for the controllers: the scales are > 1 and powers of two, so every
  // product, join and unscaling is exact and the master gradients must be bit-identical to S = 1.
  const json spec = {{"input", {6}},
                     {"layers",
                      {{{"type", "linear"}, {"name", "a"}, {"out", 5}},
                       {{"type", "relu"}, {"name", "r"}},
                       {{"type", "linear"}, {"name", "b"}, {"out", 5}},
                       {{"type", "add"}, {"name", "j"}, {"inputs", {"b", "a"}}},
                       {{"type", "linear"}, {"name", "c"}, {"out", 5}},
                       {{"type", "linear"}, {"name", "out"}, {"out", 3}}}}};
  Tensor x({4, 6});
  for (std::int64_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::sin(0.7 * static_cast<double>(i)));
  const std::vector<std::int32_t> y = {0, 2, 1, 2};
  auto grads = [&](Scaler& scaler) {
    Rng rng(5);
    auto model = build_model(spec, rng);
    scaler.bind(model->layer_infos(), Format::fp32);
    const Precision p;
    model->prepare_weights(p);
    StepMonitor monitor;
    monitor.reset(model->num_layers(), true, 0);
    scaler.begin_step(0);
    ForwardContext f{p, true, nullptr};
    ScaledGrad g;
    const double s0 = scaler.choose_loss_scale(LocalScaleQuery{});
    softmax_cross_entropy(model->forward(x, f), y.data(), s0, p, &g, &monitor, model->num_layers() - 1);
    model->zero_grads();
    BackwardContext b{p, scaler, monitor, 0};
    model->backward(g, b);
    REQUIRE_FALSE(monitor.found_inf);
    std::vector<Tensor> out;
    for (Parameter* q : model->parameters()) out.push_back(q->grad);
    double largest_s = 1;
    for (const LayerRecord& r : monitor.records) largest_s = std::max(largest_s, r.local_scale);
    return std::make_pair(out, largest_s);
  };
  auto none = make_scaler("none", Format::fp32);
  const auto ref = grads(*none).first;
  for (const std::string& method : adaptive::method_names()) {
    INFO(method);
    auto s = adaptive_scaler({{"method", method}, {"u_min", 0x1p-24}, {"u_max", 65504}, {"fixed_scale", 4},
                              {"init_scale", 0x1p-16}, {"relu_factor", 1}},
                             Format::fp32);
    const auto [got, largest] = grads(*s);
    CHECK(largest > 1);  // the method really scaled somewhere
    REQUIRE(got.size() == ref.size());
    for (std::size_t i = 0; i < ref.size(); ++i) CHECK(same_bits(got[i], ref[i]));
  }
}

TEST_CASE("fp8_e4m3 saturation is an overflow: found_inf and a backing-off torch scaler", "[adaptive]") {
  Precision p;
  p.format = Format::fp16;
  p.grad_format = Format::fp8_e4m3;
  StepMonitor m;
  m.reset(1, true, 0);
  std::vector<float> v = {1.0f, 500.0f};  // 500 would saturate to 448
  round_gradient(v.data(), v.size(), 1.0f, GradSite::upstream, 0, p, m);
  CHECK(m.found_inf);
  CHECK(v[1] == 448.0f);
  CHECK(m.records[0].activation_grad.overflow == 1);
  m.reset(1, false, 0);
  std::vector<float> ok = {1.0f, 440.0f};  // rounds to 448 without overflowing
  round_gradient(ok.data(), ok.size(), 1.0f, GradSite::upstream, 0, p, m);
  CHECK_FALSE(m.found_inf);
  // In training: the torch scaler backs off from 65536 with fp8_e4m3 gradients (448 is their largest).
  TrainConfig c;
  c.model = "mlp";
  c.data = "synthetic:256";
  c.batch = 64;
  c.max_steps = 4;
  c.threads = 1;
  c.format = Format::fp16;
  c.grad_format = Format::fp8_e4m3;
  c.scaler = {{"policy", "torch"}};
  Trainer t(c);
  const json r = t.run();
  CHECK(r["skipped_steps"].get<int>() == 4);
  CHECK(r["final_scale"].get<double>() == 4096.0);
}

TEST_CASE("te_delayed: scale = max_finite / amax of the history, delayed, loss and layers", "[adaptive]") {
  auto s = make_scaler(json{{"policy", "te_delayed"}, {"amax_history_len", 2}, {"margin", 1}}, Format::fp16);
  s->bind({LayerInfo{0, "fc", "linear", true, 4, {4, 4}}}, Format::fp16);
  LayerController* c = s->layer_controller();
  REQUIRE(c != nullptr);
  CHECK(s->loss_scale() == 1.0);
  LocalScaleQuery q;
  q.layer_id = 0;
  q.scale_in = 8.0;
  CHECK(c->decide(q).s == 1.0 / 8);  // the layer's gradient goes out at its own scale, 1
  StepMonitor m;
  auto step = [&](float loss_amax, float layer_amax) {
    m.reset(1, false, 0);
    m.loss_grad_max_abs = loss_amax * static_cast<float>(s->loss_scale());
    m.records[0].sent_grad = true;
    m.records[0].scale_out = 1.0;
    m.records[0].sent_max_abs = layer_amax;
    c->end_step(m);
    s->update(StepStatistics{});
  };
  step(0.5f, 2.0f);
  CHECK(s->loss_scale() == 65504.0 / 0.5 / 2);
  CHECK(c->decide(q).s == 65504.0 / 2.0 / 2 / 8);
  step(0.25f, 0.0f);  // history max still 0.5 and 2 (zeros keep the previous)
  CHECK(s->loss_scale() == 65504.0 / 0.5 / 2);
  step(0.25f, 0.0f);  // history of 2: 0.5 has left
  CHECK(s->loss_scale() == 65504.0 / 0.25 / 2);
  CHECK(c->decide(q).s == 65504.0 / 2.0 / 2 / 8);  // layer history all zero now: scale kept
  auto t = make_scaler(json{{"policy", "te_delayed"}, {"amax_history_len", 2}, {"margin", 1}}, Format::fp16);
  t->bind({LayerInfo{0, "fc", "linear", true, 4, {4, 4}}}, Format::fp16);
  t->restore_state(s->state());
  CHECK(t->state() == s->state());
}

TEST_CASE("adaptive and te_delayed resume bit-identically in the middle of an update_every interval",
          "[adaptive][checkpoint]") {
  const std::vector<json> scalers = {
      {{"policy", "adaptive"}, {"method", "approx_range"}, {"init_scale", "auto"}, {"update_every", 3}},
      {{"policy", "adaptive"}, {"method", "measured"}, {"update_every", 5}, {"recover_every", 4}, {"init_scale", 4096}},
      {{"policy", "te_delayed"}, {"amax_history_len", 4}}};
  for (const json& sc : scalers) {
    INFO(sc.dump());
    TrainConfig c = tiny_config();
    c.scaler = sc;
    Trainer whole(c);
    const json full = whole.run();
    const std::string dir = temp_path("resume");
    TrainConfig first = c;
    first.max_steps = 10;  // inside epoch 2, inside an interval
    first.checkpoint_dir = dir;
    first.save_every = 5;
    Trainer(first).run();
    TrainConfig second = c;
    second.resume_dir = dir;
    Trainer resumed(second);
    const json rest = resumed.run();
    CHECK(strip_timing(rest) == strip_timing(full));
  }
}

TEST_CASE("a trace: JSON Lines while running, one document at the end, the same content", "[adaptive][trace]") {
  const std::string base = temp_path("trace");
  TrainConfig c = tiny_config();
  c.epochs = 1;
  c.trace_path = base;
  c.trace_every = 3;
  c.trace_hist = true;
  c.scaler = {{"policy", "adaptive"}, {"method", "measured"}, {"init_scale", "auto"}};
  Trainer t(c);
  const json r = t.run();
  const json doc = json::parse(std::ifstream(base + ".json"));
  CHECK(doc == TraceWriter::read_jsonl(base + ".jsonl"));
  CHECK(doc["schema"] == "gradscale.trace/1");
  const json& h = doc["header"];
  CHECK(h["schema"] == "gradscale.trace/1");
  CHECK(h["grad_format"] == "fp16");
  CHECK(h["layers"].size() == static_cast<std::size_t>(t.model().num_layers()));
  const json& steps = doc["steps"];
  REQUIRE(steps.size() >= 2);
  std::int64_t last = 0;
  for (const json& s : steps) {
    CHECK(s["step"].get<std::int64_t>() > last);
    last = s["step"];
    const bool every = s["step"].get<std::int64_t>() % 3 == 0;
    CHECK(s["stats"] == every);
    for (const json& l : s["layers"]) {
      const json& row = h["layers"][l["id"].get<std::size_t>()];
      CHECK(l["S"].get<double>() == l["s"].get<double>() * l["S_in"].get<double>());
      if (!every) continue;
      if (row["parametric"] == true) {
        REQUIRE(l.contains("wgrad"));
        CHECK(l["wgrad"].contains("binades"));
      }
      if (l.contains("act")) {
        const json& a = l["act"];
        CHECK(a["zero"].get<std::uint64_t>() + a["underflow"].get<std::uint64_t>() + a["subnormal"].get<std::uint64_t>() +
                  a["normal"].get<std::uint64_t>() + a["overflow"].get<std::uint64_t>() +
                  a["nonfinite"].get<std::uint64_t>() ==
              a["elements"].get<std::uint64_t>());
      }
    }
  }
  CHECK(doc["summary"]["steps"] == r["steps"]);
  CHECK(doc["summary"]["test_accuracy"] == r["test_accuracy"]);
  CHECK(doc["summary"]["layers"].size() >= 1);
}
