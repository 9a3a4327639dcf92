// ExternalBackward on device arrays (device "cuda": lib/cuda's ArrayOps, the PyTorch plug-in's path for
// CUDA tensors) against the same calls on host arrays: one scripted backward of two layers with a join
// and weight gradients, twelve steps with an overflow among them, under global and per-layer policies.
// Every returned scale, every array's bits after each call, every layer row and statistic and every
// verdict must be the same — lib/cuda's counts and roundings are the host's — except what is derived
// from the moments' sums (see Log), to 1e-9 relative.
#include <catch2/catch.hpp>

#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gradscale/gradscale.h>

#include "tests/cuda_test.h"
#include "tests/precision_fp16.h"

using namespace gradscale;
using json = nlohmann::json;

namespace {

// Arrays of one side: host vectors, or device buffers (filled by a synchronous copy; read back through
// the ExternalBackward's own ArrayOps, after the work queued on its stream).
class Arrays {
 public:
  explicit Arrays(ArrayOps& ops) : ops_(ops) {}
  float* put(const std::vector<float>& v) {
    if (ops_.host_memory()) return host_.emplace_back(v).data();
    cuda::DeviceBuffer<float>& b = device_buffers_.emplace_back(v.size());
    GS_CUDA_CHECK(cudaMemcpy(b.data(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
    return b.data();
  }
  std::vector<float> get(const float* p, std::size_t n) const {
    std::vector<float> out(n);
    ops_.to_host(p, n, out.data());
    return out;
  }

 private:
  ArrayOps& ops_;
  std::deque<std::vector<float>> host_;
  std::deque<cuda::DeviceBuffer<float>> device_buffers_;
};

// Values over many binades (some underflow in fp16 at scale 1, some are large), signs mixed.
std::vector<float> spread(std::mt19937& rng, std::size_t n, int lo, int hi) {
  std::uniform_int_distribution<int> e(lo, hi);
  std::uniform_real_distribution<float> m(1.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(m(rng), e(rng)) * (rng() % 2 ? 1.0f : -1.0f);
  v[0] = 0.0f;
  return v;
}

// Everything one side produced, in order: numbers and the bits of arrays. A number derived from the
// moments' double sums (a controller's unbound scale, state kept from it) is marked inexact: the device
// adds those sums in another order (lib/cuda/stats.h), so it agrees to 1e-9 relative, not bit for bit.
struct Log {
  std::vector<double> numbers;
  std::vector<bool> exact;
  std::vector<std::uint32_t> bits;
  std::vector<std::string> labels;  // what numbers[i] is, for the report
  void number(const std::string& what, double v, bool is_exact = true) {
    numbers.push_back(v);
    exact.push_back(is_exact);
    labels.push_back(what);
  }
  void state(const json& j) {  // every value of a state: floats inexact, the rest exact
    if (j.is_structured()) {
      for (const auto& [key, value] : j.items()) {
        number("state key", double(std::hash<std::string>{}(key)));
        state(value);
      }
    } else if (j.is_number_float()) {
      number("state value", j.get<double>(), false);
    } else {
      number("state value", double(std::hash<std::string>{}(j.dump())));
    }
  }
  void array(const std::vector<float>& a) {
    for (float x : a) bits.push_back(test::bits_of(x));
  }
  void stats(const std::string& what, const TensorStats& s) {
    for (double v : {double(s.zero), double(s.underflow), double(s.subnormal), double(s.normal), double(s.overflow),
                     double(s.nonfinite), double(s.elements), s.max_abs})
      number(what, v);
  }
};

// One scripted backward per step. `held`: through the scale handles (ExternalBackward::scale_handle:
// on a device S0, the local scales and the join's T are decided there, the join's sum is the core's), else
// through the double forms with the join summed here — both log the same numbers and arrays, read after
// the step. `waits`: the host's waits for the device inside each step's backward (before finish_step).
Log run(const std::string& device, const json& scaler, Format grad_format, bool held = false,
        std::vector<std::int64_t>* waits = nullptr) {
  Precision p = testing::fp16();
  p.grad_format = grad_format;
  std::vector<LayerInfo> layers = {{0, "fc1", "linear", true, 8, {8, 6}}, {1, "fc2", "linear", true, 4, {4, 8}}};
  ExternalBackward eb(layers, p, scaler, device);
  eb.set_layer_inputs({{-1}, {0}});
  Arrays mem(eb.arrays());
  Log log;
  std::mt19937 rng(7);
  for (int step = 0; step < 12; ++step) {
    eb.begin_step(step % 3 != 2);
    const std::int64_t waits_before = eb.host_waits();
    // The loss gradient (batch 5 × 4 outputs).
    std::vector<float> g = spread(rng, 20, -34, -6);
    float* dg = mem.put(g);
    // Through handles S0 is held too (chosen on the device where the scaler gives a rule for it).
    const ScaleHandle s0 = held ? eb.loss_gradient_held(dg, dg, 20) : ScaleHandle{};
    double s0_value = held ? 0.0 : eb.loss_gradient(dg, 20);
    const std::vector<float> dg_rounded = held ? std::vector<float>{} : mem.get(dg, 20);
    // fc2: the gradient it received (the rounded loss gradient), its upstream product and weight.
    eb.round_received(1, dg, 20);
    std::vector<float> up1 = spread(rng, 40, -30, -8);
    if (step == 5) up1[3] = std::numeric_limits<float>::infinity();  // an overflow: the step is skipped
    float* dup1 = mem.put(up1);
    float* dw1 = mem.put(spread(rng, 32, -6, 0));
    double s1 = 0;
    ScaleHandle sent1;
    if (held)
      sent1 = eb.upstream(1, dup1, dup1, {5, 8}, dg, {5, 4}, dw1, {4, 8}, s0);
    else
      s1 = eb.upstream(1, dup1, {5, 8}, dg, {5, 4}, dw1, {4, 8}, s0_value);
    float* dwg1 = mem.put(spread(rng, 32, -26, -2));
    if (held)
      eb.weight_gradient(1, dwg1, dwg1, 32, s0);
    else
      eb.weight_gradient(1, dwg1, 32, s0_value);
    // A join at fc1's output: fc2's upstream (at S0·s1) and a shortcut's part (at S0).
    std::vector<float> shortcut = spread(rng, 40, -28, -10);
    float* dshort = mem.put(shortcut);
    double t = 0;
    ScaleHandle target;
    float* dsum = nullptr;
    if (held) {
      target = eb.join({dup1, dshort}, {40, 40}, {sent1, s0});
      dsum = mem.put(std::vector<float>(40, 7.0f));
      eb.sum_scaled_parts({dup1, dshort}, {sent1, s0}, target, dsum, 40);
    } else {
      t = eb.join_target({eb.arrays().max_abs(dup1, 40), eb.arrays().max_abs(dshort, 40)},
                         {eb.loss_scale() * s1, eb.loss_scale()});
      const std::vector<float> a = mem.get(dup1, 40);
      std::vector<float> sum(40);
      for (std::size_t i = 0; i < sum.size(); ++i)
        sum[i] = 0.0f + a[i] * static_cast<float>(t / (eb.loss_scale() * s1)) +
                 shortcut[i] * static_cast<float>(t / eb.loss_scale());
      dsum = mem.put(sum);
    }
    eb.round_join(0, dsum, 40);
    // fc1: upstream to the model's input, its weight gradient, each read from a source (left as it is)
    // into an array of its own, as the plug-in calls them.
    float* sup0 = mem.put(spread(rng, 30, -30, -8));
    float* dup0 = mem.put(std::vector<float>(30, 7.0f));
    float* dw0 = mem.put(spread(rng, 48, -6, 0));
    double s0_local = 0;
    ScaleHandle sent0;
    if (held)
      sent0 = eb.upstream(0, sup0, dup0, {5, 6}, dsum, {5, 8}, dw0, {8, 6}, target);
    else
      s0_local = eb.upstream(0, sup0, dup0, {5, 6}, dsum, {5, 8}, dw0, {8, 6}, t);
    float* swg0 = mem.put(spread(rng, 48, -26, -2));
    float* dwg0 = mem.put(std::vector<float>(48, 7.0f));
    if (held)
      eb.weight_gradient(0, swg0, dwg0, 48, target);
    else
      eb.weight_gradient(0, swg0, dwg0, 48, t);
    if (waits) waits->push_back(eb.host_waits() - waits_before);
    // What the backward gave, read now (the held scales' values came with the step's measurements).
    if (held) {
      s0_value = eb.scale_value(s0);
      s1 = eb.local_value(sent1);
      t = eb.scale_value(target);
      s0_local = eb.local_value(sent0);
    }
    log.number("S0", s0_value);
    log.array(held ? mem.get(dg, 20) : dg_rounded);
    log.number("s1", s1);
    log.array(mem.get(dup1, 40));
    log.array(mem.get(dwg1, 32));
    log.number("max a", eb.arrays().max_abs(dup1, 40));
    log.number("max b", eb.arrays().max_abs(dshort, 40));
    log.number("T", t);
    log.array(mem.get(dsum, 40));
    log.number("s0", s0_local);
    log.array(mem.get(dup0, 30));
    log.array(mem.get(sup0, 30));
    log.array(mem.get(dwg0, 48));
    log.array(mem.get(swg0, 48));
    // The forward roundings and statistics the plug-in takes with the same object.
    float* dx = mem.put(spread(rng, 16, -20, 3));
    eb.arrays().quantize(dx, dx, 16, Format::fp8_e4m3, RoundOptions{});
    log.array(mem.get(dx, 16));
    log.stats("stats", eb.arrays().statistics(dx, 16, Format::fp8_e5m2, RoundOptions{}));
    // A rounded copy in one pass (src to dst; src unchanged), and fp32's plain copy.
    float* dsrc = mem.put(spread(rng, 16, -26, 17));
    float* ddst = mem.put(std::vector<float>(16, 7.0f));
    eb.arrays().quantize(dsrc, ddst, 16, Format::fp16, RoundOptions{});
    log.array(mem.get(dsrc, 16));
    log.array(mem.get(ddst, 16));
    eb.arrays().quantize(dsrc, ddst, 16, Format::fp32, RoundOptions{});
    log.array(mem.get(ddst, 16));
    // A join's maxima at once (max_abs_each), an empty array among them.
    const float* const arrays[] = {dsrc, dup0, dx};
    const std::size_t sizes[] = {16, 30, 0};
    float maxima[3];
    eb.arrays().max_abs_each(arrays, sizes, 3, maxima);
    for (float m : maxima) log.number("max_abs_each", m);

    const StepResult r = eb.finish_step(0.5);
    for (double v : {double(r.skipped), double(r.found_inf), double(r.first_nonfinite_layer), r.loss_scale,
                     r.report.scale})
      log.number("verdict", v);
    for (const LayerScale& row : eb.layer_scales()) {
      for (double v : {row.s, row.scale_in, row.scale_out, double(row.recorded), row.underflow_rate})
        log.number("row " + row.name, v);
      log.number("unbound " + row.name, row.unbound, false);
    }
    const StepMonitor& m = eb.monitor();
    log.number("edge", double(m.grad_below_edge));
    log.number("edge", double(m.grad_above_edge));
    if (m.has_loss_grad) log.stats("loss grad", m.loss_grad);
    for (const LayerRecord& rec : m.records) {
      if (rec.has_activation_grad) log.stats("activation", rec.activation_grad);
      if (rec.has_weight_grad) log.stats("weight", rec.weight_grad);
      if (rec.has_joined_grad) log.stats("joined", rec.joined_grad);
      log.number("sent max", rec.sent_max_abs);
      log.number("r", rec.weight_grad_scale);
    }
    log.state(eb.state());
  }
  return log;
}

}  // namespace

TEST_CASE("cuda external backward: device arrays give the host's scales, bits and statistics", "[cuda]") {
  test::require_cuda_device();
  const std::vector<std::pair<json, Format>> cases = {
      {json("torch"), Format::fp16},
      {json("static:1000"), Format::fp8_e5m2},  // not a power of two: the unscale divides
      {json{{"policy", "adaptive"}, {"method", "measured"}}, Format::fp8_e5m2},
      {json{{"policy", "adaptive"}, {"method", "measured"}, {"init_scale", "auto"}}, Format::fp16},
      {json{{"policy", "adaptive"}, {"method", "measured"}, {"init_scale", "auto"}, {"cast_form", "measured"}},
       Format::fp8_e4m3},
      {json{{"policy", "adaptive"}, {"method", "approx_range"}}, Format::fp8_e4m3},
      {json{{"policy", "adaptive"}, {"method", "abs_range"}, {"init_scale", "auto"}, {"cast_form", "lognormal"}},
       Format::fp16},
      {json("popart_als"), Format::fp16},
  };
  for (const auto& [scaler, grad_format] : cases)
    for (const auto& [device_name, held] :
         {std::pair<std::string, bool>{"cuda", false}, {"cuda", true}, {"cpu", true}}) {
      INFO("scaler " << scaler.dump() << ", gradients in " << format_name(grad_format) << ", " << device_name
                     << (held ? " through scale handles" : ""));
      const Log host = run("cpu", scaler, grad_format);
      const Log device = run(device_name, scaler, grad_format, held);
      REQUIRE(host.numbers.size() == device.numbers.size());
      for (std::size_t i = 0; i < host.numbers.size(); ++i) {
        INFO("number " << i << ": " << host.labels[i]);
        if (std::isnan(host.numbers[i]))
          CHECK(std::isnan(device.numbers[i]));
        else if (host.exact[i])
          CHECK(host.numbers[i] == device.numbers[i]);
        else
          CHECK(device.numbers[i] == Approx(host.numbers[i]).epsilon(1e-9));
      }
      REQUIRE(host.bits.size() == device.bits.size());
      std::size_t differ = 0;
      for (std::size_t i = 0; i < host.bits.size(); ++i) differ += host.bits[i] != device.bits[i];
      CHECK(differ == 0);
    }
}

TEST_CASE("cuda external backward: scale handles keep the local scales and join targets on the device",
          "[cuda]") {
  test::require_cuda_device();
  // Controllers whose decisions are device rules, and S0 by the adaptive policy's rule (its floor reads
  // the loss gradient: Scaler::device_loss_rule): the backward through handles waits for nothing; through
  // the double forms it waits for S0, each decision and the join's maxima. S0 from init_scale "auto"
  // with a moment-based cast_form has no device rule: one wait.
  for (const auto& [scaler, waits] :
       {std::pair<json, std::int64_t>{{{"policy", "adaptive"}, {"method", "measured"}}, 0},
        {{{"policy", "adaptive"}, {"method", "approx_range"}}, 0},
        {{{"policy", "adaptive"}, {"method", "measured"}, {"init_scale", "auto"}, {"cast_form", "measured"}}, 0},
        {{{"policy", "adaptive"}, {"method", "measured"}, {"init_scale", "auto"}}, 1}}) {
    INFO("scaler " << scaler.dump());
    std::vector<std::int64_t> held, doubles;
    run("cuda", scaler, Format::fp8_e5m2, true, &held);
    run("cuda", scaler, Format::fp8_e5m2, false, &doubles);
    CHECK(held == std::vector<std::int64_t>(12, waits));
    for (std::int64_t w : doubles) CHECK(w >= 4);  // S0, the two decisions and the join
  }
}

TEST_CASE("cuda external backward: naming the stream in use again waits for nothing", "[cuda]") {
  test::require_cuda_device();
  // The plug-in names PyTorch's current stream before every forward; its default is the legacy
  // default stream, handle 0. Moving onto it waits once (for the context's own stream); naming it
  // again must not, nor may it move the work back to the context's own stream.
  Precision p = testing::fp16();
  std::vector<LayerInfo> layers = {{0, "fc", "linear", true, 4, {4, 4}}};
  ExternalBackward eb(layers, p, json("torch"), "cuda");
  const std::int64_t start = eb.host_waits();
  eb.arrays().set_stream(0);
  CHECK(eb.host_waits() == start + 1);
  for (int i = 0; i < 3; ++i) eb.arrays().set_stream(0);
  CHECK(eb.host_waits() == start + 1);
}

TEST_CASE("cuda external backward: a device name the program cannot serve is refused by name", "[cuda]") {
  test::require_cuda_device();
  Precision p = testing::fp16();
  std::vector<LayerInfo> layers = {{0, "fc", "linear", true, 4, {4, 4}}};
  CHECK_THROWS_WITH(ExternalBackward(layers, p, json("torch"), "tpu"), Catch::Matchers::Contains("unknown device 'tpu'"));
}
