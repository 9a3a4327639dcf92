// The device seam on the GPU (lib/cuda/backend.h), built only with CUDA; every case skips visibly
// without a GPU:
//  - tensors in device memory: fill, copies within and across devices, the copy constructor;
//  - the queued measurement of a rounding, entered into the monitor at finish_backward, equals the
//    CPU's round_gradient on the same values: statistics, found_inf, max|g|, the rounded bits;
//  - every built-in layer kind has a GPU twin, and each twin's forward and backward equal the CPU
//    layer's on the same values at fp16, with 16-bit GEMM operands and with fp32 ones — outputs, input
//    gradients, parameter gradients and the statistics in the monitor (exact sums by construction, so
//    bit for bit; BatchNorm within one F ulp);
//  - a user-defined layer runs on the host inside a GPU model (HostLayer) with the CPU's numerics;
//  (training on the GPU against the CPU: test_cuda_backend_training.cpp).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <sstream>
#include <filesystem>
#include <vector>

#include "lib/backend/backend.h"
#include "lib/core/random.h"
#include "lib/cuda/backend.h"
#include "lib/cuda/layers.h"
#include "lib/layers/batchnorm.h"
#include "lib/layers/conv2d.h"
#include "lib/layers/dropout.h"
#include "lib/layers/linear.h"
#include "lib/layers/pool.h"
#include "lib/layers/precision_ops.h"
#include "lib/model/spec.h"
#include "lib/numeric/quantize.h"
#include "lib/scaler/scaler.h"
#include "lib/train/trainer.h"
#include "tests/cuda_test.h"
#include "tests/host_values.h"
#include "tests/temp_dir.h"

using namespace gradscale;
using json = nlohmann::json;
using gradscale::test::host_values;

namespace {

// Gradient-like values over many binades, some below fp16's subnormals, a few zeros.
Tensor gradient_values(std::int64_t n, std::uint64_t seed) {
  Rng rng(seed);
  Tensor t({n});
  for (std::int64_t i = 0; i < n; ++i) {
    const double e = -30.0 + 28.0 * static_cast<double>(uniform_below(rng, 1u << 20)) / (1 << 20);
    t[i] = static_cast<float>((i % 2 ? -1 : 1) * std::ldexp(1.0, static_cast<int>(e)) * (1.0 + 0.3 * (i % 7)));
    if (i % 97 == 0) t[i] = 0.0f;
  }
  return t;
}

// The kernels f launches (counted on the CPU execution target; test::kernel_launches).
long long launches(const std::function<void()>& f) {
  const long long before = test::kernel_launches();
  f();
  return test::kernel_launches() - before;
}

// k·unit with k uniform in [lo, hi]: exact in fp16, and the sums the layers form stay exact in fp32.
Tensor grid_tensor(const Shape& s, Rng& rng, int lo, int hi, double unit) {
  Tensor t(s);
  for (std::int64_t i = 0; i < t.size(); ++i)
    t[i] = static_cast<float>(
        unit * (lo + static_cast<int>(uniform_below(rng, static_cast<std::uint64_t>(hi - lo + 1)))));
  return t;
}

// One forward and backward of a layer at fp16 under a static scale (global policy: s = 1), on the CPU or
// (with `backend`) on its twin; everything comes back in host memory.
struct LayerRun {
  Tensor y, gx;
  double gx_scale = 0;
  std::vector<Tensor> param_grads, buffers;
  StepMonitor monitor;
};

LayerRun run_layer(Layer& layer, Backend& backend, const Tensor& x, const Tensor& g, bool training,
                   std::uint64_t mask_seed) {
  Precision p;
  p.format = Format::fp16;
  const std::unique_ptr<Scaler> scaler = make_scaler(json{{"policy", "static"}, {"scale", 1024}}, Format::fp16);
  LayerRun r;
  r.monitor.reset(1, true, 0.0);
  Rng rng(mask_seed);
  ForwardContext fctx{p, training, &rng};
  const Tensor dx = x.to(backend.memory());
  Tensor y(backend.memory());
  layer.prepare_weights(p);
  layer.forward({&dx}, y, fctx);
  const ScaledGrad gy{g.to(backend.memory()), 1024.0};
  ScaledGrad gx{Tensor(backend.memory()), 0.0};
  BackwardContext bctx{p, *scaler, r.monitor, 0};
  note_backward(layer.id(), gy.scale, r.monitor);
  layer.backward({&dx}, y, gy, {&gx}, bctx);
  backend.finish_backward(r.monitor);
  r.y = y.to_host();
  r.gx = gx.g.to_host();
  r.gx_scale = gx.scale;
  for (Parameter* q : layer.parameters()) r.param_grads.push_back(q->grad.to_host());
  for (auto& [name, t] : layer.buffers()) r.buffers.push_back(t->to_host());
  return r;
}

std::vector<float> values_of(const Tensor& t) { return std::vector<float>(t.data(), t.data() + t.size()); }

// |a − b| ≤ one fp16 ulp of b (2^-10·|b|, or the smallest subnormal near 0) for every element.
std::string within_f_ulp(const Tensor& got, const Tensor& want) {
  if (got.shape() != want.shape()) return "shapes differ";
  std::size_t bad = 0;
  std::ostringstream os;
  for (std::int64_t i = 0; i < want.size(); ++i) {
    const double tol = std::max(0x1p-10 * std::fabs(static_cast<double>(want[i])), 0x1p-24);
    if (std::fabs(static_cast<double>(got[i]) - want[i]) <= tol) continue;
    if (++bad <= 8) os << "  [" << i << "] got " << got[i] << " want " << want[i] << "\n";
  }
  return bad == 0 ? "" : std::to_string(bad) + " of " + std::to_string(want.size()) + " differ:\n" + os.str();
}

// The statistics the two runs entered into the monitor: equal counts and histograms.
void check_same_records(const StepMonitor& gpu, const StepMonitor& cpu) {
  CHECK(gpu.found_inf == cpu.found_inf);
  const LayerRecord& a = gpu.records[0];
  const LayerRecord& b = cpu.records[0];
  CHECK(a.has_activation_grad == b.has_activation_grad);
  CHECK(a.has_weight_grad == b.has_weight_grad);
  CHECK(a.sent_max_abs == b.sent_max_abs);
  for (auto [got, want] :
       {std::pair{&a.activation_grad, &b.activation_grad}, std::pair{&a.weight_grad, &b.weight_grad}}) {
    CHECK(got->zero == want->zero);
    CHECK(got->underflow == want->underflow);
    CHECK(got->subnormal == want->subnormal);
    CHECK(got->normal == want->normal);
    CHECK(got->binades == want->binades);
    CHECK(got->max_abs == want->max_abs);
  }
}


}  // namespace

TEST_CASE("CUDA backend: device tensors: fill, copies within and across devices", "[cuda][backend]") {
  test::require_cuda_device();
  cuda::CudaBackend backend(0);
  DeviceMemory* mem = backend.memory();
  Tensor d({3, 5}, 2.5f, mem);
  CHECK(d.device() == Device::cuda);
  CHECK(host_values(d) == std::vector<float>(15, 2.5f));
  Tensor h({3, 5});
  for (int i = 0; i < 15; ++i) h[i] = static_cast<float>(i) - 7.25f;
  d.copy_from(h);
  const Tensor copy = d;  // device to device
  CHECK(copy.device() == Device::cuda);
  CHECK(host_values(copy) == std::vector<float>(h.data(), h.data() + 15));
  d.fill(-0.0f);
  CHECK(std::signbit(host_values(d)[3]));
  CHECK_THROWS_WITH(d.matrix(3, 5), Catch::Contains("cuda memory"));
}

TEST_CASE("CUDA backend: a rounding measured on the GPU fills the monitor as the CPU's round_gradient does",
          "[cuda][backend]") {
  test::require_cuda_device();
  cuda::CudaBackend backend(0);
  for (Format f : {Format::fp16, Format::bf16, Format::fp8_e5m2, Format::fp8_e4m3}) {
    Precision p;
    p.format = f;
    for (float multiplier : {1.0f, 1024.0f, 65536.0f}) {
      INFO(format_name(f) << " multiplier " << multiplier);
      const Tensor values = gradient_values(100003, 17);
      StepMonitor ref, gpu;
      ref.reset(3, true, 0.0);
      gpu.reset(3, true, 0.0);
      Tensor c = values;
      const float ref_max = round_gradient(c.data(), static_cast<std::size_t>(c.size()), multiplier,
                                           GradSite::upstream, 1, p, ref);
      Tensor d = values.to(backend.memory());
      backend.round_gradient(d.data(), static_cast<std::size_t>(d.size()), multiplier, GradSite::upstream, 1, p,
                             gpu);
      backend.finish_backward(gpu);
      CHECK(test::bit_mismatches(host_values(d), std::vector<float>(c.data(), c.data() + c.size())).empty());
      const TensorStats& want = ref.records[1].activation_grad;
      const TensorStats& got = gpu.records[1].activation_grad;
      CHECK(gpu.records[1].has_activation_grad);
      CHECK(got.zero == want.zero);
      CHECK(got.underflow == want.underflow);
      CHECK(got.subnormal == want.subnormal);
      CHECK(got.normal == want.normal);
      CHECK(got.overflow == want.overflow);
      CHECK(got.nonfinite == want.nonfinite);
      CHECK(got.binades == want.binades);
      CHECK(got.max_abs == want.max_abs);
      CHECK(gpu.records[1].sent_max_abs == ref_max);
      CHECK(gpu.found_inf == ref.found_inf);
      CHECK(gpu.first_nonfinite_layer == ref.first_nonfinite_layer);
    }
  }
}

TEST_CASE("CUDA ArrayOps: a rounding with its factor from the table and its division is one kernel, with the "
          "separate calls' bits (counted on the CPU execution target)",
          "[cuda][backend]") {
  test::require_launch_counts();
  cuda::CudaBackend backend(0);
  ArrayOps& ops = backend.array_ops();
  Precision p;
  p.format = Format::fp16;
  const Tensor values = gradient_values(70001, 9);
  const Tensor src = values.to(backend.memory());
  const auto n = static_cast<std::size_t>(values.size());
  StepMonitor monitor;
  monitor.reset(4, true, 0.0);
  const int big = ops.new_scale(1024.0), odd = ops.new_scale(3.0);
  RoundingScales by_entries;  // the plug-in's upstream gradient (s from the table), divided by an entry's S
  by_entries.multiply_by = big;
  by_entries.divide_by = odd;
  RoundingScales by_values;  // a weight gradient at a host scale: r, then divided by r·S
  by_values.multiplier = 0.5f;
  by_values.divide = true;
  by_values.divisor = 3.0f;
  float fused_max[2] = {-1, -1}, separate_max[2] = {-1, -1};
  std::vector<Tensor> fused, separate;
  for (int k = 0; k < 2; ++k) {
    fused.emplace_back(values.shape(), 0.0f, backend.memory());
    separate.emplace_back(values.shape(), 0.0f, backend.memory());
    const RoundingScales& scales = k == 0 ? by_entries : by_values;
    CHECK(launches([&] {
            ops.queue_scaled_rounding(src.data(), fused[k].data(), n, scales, GradSite::upstream, 1, p, monitor,
                                      [&, k](float m) { fused_max[k] = m; });
          }) == 1);
    // ArrayOps' own composition: multiply_by_local, queue_rounding, divide or divide_by_scale.
    ops.ArrayOps::queue_scaled_rounding(src.data(), separate[k].data(), n, scales, GradSite::upstream, 2, p,
                                        monitor, [&, k](float m) { separate_max[k] = m; });
  }
  // r on the device: its statistics' launch decides it, then the rounding divides by r·S_in in its pass;
  // a gradient of one block's values takes r in its rounding's launch.
  Tensor weight(values.shape(), 0.0f, backend.memory());
  CHECK(launches([&] { ops.queue_weight_gradient(src.data(), weight.data(), n, 65504.0, big, 3, p, monitor, {}); }) ==
        2);
  CHECK(launches([&] { ops.queue_weight_gradient(src.data(), weight.data(), 1000, 65504.0, big, 3, p, monitor, {}); }) ==
        1);
  ops.flush();
  for (int k = 0; k < 2; ++k) {
    INFO((k == 0 ? "factors from the table" : "host factors"));
    CHECK(fused_max[k] == separate_max[k]);
    CHECK(fused_max[k] > 0);
    CHECK(test::bit_mismatches(host_values(fused[k]), host_values(separate[k])).empty());
  }
  CHECK_FALSE(monitor.found_inf);
}

TEST_CASE("CUDA backend: a gradient's rounding is one kernel, its unscale and its scale decisions none of "
          "their own (counted on the CPU execution target)",
          "[cuda][backend]") {
  test::require_launch_counts();
  cuda::CudaBackend backend(0);
  cuda::CudaContext& ctx = backend.context();
  Precision p;
  p.format = Format::fp16;
  const Tensor values = gradient_values(70001, 5);
  Tensor d = values.to(backend.memory()), master(values.shape(), 0.0f, backend.memory());
  StepMonitor monitor;
  monitor.reset(3, true, 0.0);
  const auto n = static_cast<std::size_t>(d.size());
  // The multiplier, the statistics and the rounding.
  CHECK(launches([&] { backend.round_gradient(d.data(), n, 1024.0f, GradSite::upstream, 1, p, monitor); }) == 1);
  // A weight gradient's: the same, and its unscale into the master.
  const cuda::UnscaleJob unscale{d.data(), master.data(), n, 1024.0};
  CHECK(launches([&] {
          backend.round_gradient(d.data(), n, 1.0f, GradSite::weight, 1, p, monitor, nullptr, &unscale);
        }) == 1);
  // A decision: the statistics' launch takes it (a local scale from g and W, an r, S0).
  auto entries = test::to_device(std::vector<cuda::DeviceScale>(2), ctx);
  auto stats = test::sentinel_buffer<cuda::DeviceStats>(3, ctx);
  const std::vector<cuda::StatsJob> jobs = {cuda::job_of(d.data(), d.size(), p.format, {}),
                                            cuda::job_of(master.data(), master.size(), p.format, {})};
  cuda::StatsDecision decision;
  decision.kind = cuda::StatsDecision::kLocalScale;
  decision.rule.formula = ScaleRule::kApproxRange;
  decision.grad = 0;
  decision.weight = 1;
  decision.in = entries.data();
  decision.out = entries.data() + 1;
  CHECK(launches([&] { cuda::tensor_stats(ctx, jobs.data(), 2, stats.data(), decision); }) == 1);
  decision.kind = cuda::StatsDecision::kWeightGradScale;
  decision.u_max = 65504;
  CHECK(launches([&] { cuda::tensor_stats(ctx, jobs.data(), 1, stats.data(), decision); }) == 1);
  decision.kind = cuda::StatsDecision::kLossScale;
  CHECK(launches([&] { cuda::tensor_stats(ctx, jobs.data(), 1, stats.data(), decision); }) == 1);
  backend.finish_backward(monitor);
  CHECK_FALSE(monitor.found_inf);
}

TEST_CASE("CUDA backend: every built-in layer kind has a GPU twin, other layers run on the host", "[cuda][backend]") {
  // Needs no GPU: which kinds have twins is a property of the build.
  for (const char* kind : {"linear", "relu", "flatten", "add", "conv2d", "maxpool2d", "global_avgpool",
                           "batchnorm", "dropout"})
    CHECK(cuda::runs_on_gpu(kind));
  CHECK_FALSE(cuda::runs_on_gpu("my_layer"));
}

TEST_CASE("CUDA backend: each layer twin equals the CPU layer at fp16: outputs, gradients, statistics",
          "[cuda][backend][layers]") {
  test::require_cuda_device();
  cuda::CudaBackend backend(0);
  struct Case {
    std::string what;
    std::function<std::unique_ptr<Layer>()> make;
    Shape input;
    bool training = true;
    bool bit_exact = true;  // BatchNorm: double sums in another order, one F ulp
  };
  const auto conv = [](std::int64_t c, std::int64_t o, std::int64_t k, std::int64_t stride, std::int64_t pad,
                       bool bias) {
    return [=] {
      Rng rng(3);
      return std::unique_ptr<Layer>(std::make_unique<Conv2d>("conv", c, o, k, stride, pad, bias, InitSpec{}, rng));
    };
  };
  const std::vector<Case> cases = {
      {"linear",
       [] {
         Rng rng(3);
         return std::unique_ptr<Layer>(std::make_unique<Linear>("fc", 12, 5, true, InitSpec{}, rng));
       },
       {6, 12}},
      {"conv 3x3 pad 1 bias", conv(3, 4, 3, 1, 1, true), {2, 3, 7, 6}},
      {"conv 3x3 stride 2", conv(2, 5, 3, 2, 1, false), {3, 2, 9, 9}},
      {"conv 1x1 stride 2 (projection)", conv(4, 6, 1, 2, 0, false), {2, 4, 8, 8}},
      {"maxpool 2x2", [] { return std::unique_ptr<Layer>(std::make_unique<MaxPool2d>("pool", 2)); }, {2, 3, 8, 6}},
      {"maxpool 3x3 stride 2 (overlapping)",
       [] { return std::unique_ptr<Layer>(std::make_unique<MaxPool2d>("pool", 3, 2)); }, {2, 2, 9, 7}},
      {"global avgpool", [] { return std::unique_ptr<Layer>(std::make_unique<GlobalAvgPool>("gap")); }, {3, 4, 5, 7}},
      {"batchnorm 2d training", [] { return std::unique_ptr<Layer>(std::make_unique<BatchNorm>("bn", 4)); },
       {3, 4, 5, 5}, true, false},
      {"batchnorm 1d eval", [] { return std::unique_ptr<Layer>(std::make_unique<BatchNorm>("bn", 6)); },
       {8, 6}, false, false},
      {"dropout 0.3", [] { return std::unique_ptr<Layer>(std::make_unique<Dropout>("drop", 0.3)); }, {4, 37}},
      {"dropout eval", [] { return std::unique_ptr<Layer>(std::make_unique<Dropout>("drop", 0.3)); }, {4, 37}, false},
  };
  for (const bool gemm16 : {true, false}) {  // 16-bit GEMM operands, then fp32 ones: the same bits
    backend.set_16bit_gemms(gemm16);
    Rng rng(21);
    for (const Case& k : cases) {
      INFO(k.what << (gemm16 ? ", 16-bit GEMMs" : ", fp32 GEMMs"));
      std::unique_ptr<Layer> cpu = k.make();
      std::unique_ptr<Layer> host_twin = k.make();
      cpu->set_id(0);
      host_twin->set_id(0);
      for (std::size_t i = 0; i < cpu->parameters().size(); ++i) {  // exact weights: grid values
        Parameter* a = cpu->parameters()[i];
        const Tensor w = grid_tensor(a->value.shape(), rng, -8, 8, 0.125);
        a->value.copy_from(w);
        host_twin->parameters()[i]->value.copy_from(w);
      }
      std::unique_ptr<Layer> gpu = backend.adopt(std::move(host_twin), LayerPlacement{true, true});
      REQUIRE(gpu->kind() == cpu->kind());
      const Tensor x = grid_tensor(k.input, rng, -8, 8, 0.25);
      const Shape out = cpu->output_shape({k.input});
      const Tensor g = grid_tensor(out, rng, -4, 4, 0.25);
      const LayerRun want = run_layer(*cpu, cpu_backend(), x, g, k.training, 99);
      const LayerRun got = run_layer(*gpu, backend, x, g, k.training, 99);
      CHECK(got.gx_scale == want.gx_scale);
      REQUIRE(got.param_grads.size() == want.param_grads.size());
      REQUIRE(got.buffers.size() == want.buffers.size());
      if (k.bit_exact) {
        CHECK(test::bit_mismatches(values_of(got.y), values_of(want.y)).empty());
        CHECK(test::bit_mismatches(values_of(got.gx), values_of(want.gx)).empty());
        for (std::size_t i = 0; i < want.param_grads.size(); ++i)
          CHECK(test::bit_mismatches(values_of(got.param_grads[i]), values_of(want.param_grads[i])).empty());
        check_same_records(got.monitor, want.monitor);
      } else {
        CHECK(within_f_ulp(got.y, want.y).empty());
        CHECK(within_f_ulp(got.gx, want.gx).empty());
        for (std::size_t i = 0; i < want.param_grads.size(); ++i)
          CHECK(within_f_ulp(got.param_grads[i], want.param_grads[i]).empty());
      }
      for (std::size_t i = 0; i < want.buffers.size(); ++i)  // running statistics: fp32, one ulp
        CHECK(within_f_ulp(got.buffers[i], want.buffers[i]).empty());
    }
  }
}

namespace {

// A layer the library does not know: y = 2·x in fp32 (exact), the gradient doubled at the same scale.
class Doubler final : public Layer {
 public:
  using Layer::Layer;
  std::string kind() const override { return "doubler"; }
  Shape output_shape(const std::vector<Shape>& inputs) const override { return inputs[0]; }
  void forward(const std::vector<const Tensor*>& inputs, Tensor& output, ForwardContext&) override {
    GS_CHECK(inputs[0]->on_host(), "doubler runs on the host");
    output.resize(inputs[0]->shape());
    for (std::int64_t i = 0; i < output.size(); ++i) output[i] = 2.0f * (*inputs[0])[i];
  }
  void backward(const std::vector<const Tensor*>&, const Tensor& output, const ScaledGrad& grad_output,
                const std::vector<ScaledGrad*>& grad_inputs, BackwardContext&) override {
    ScaledGrad* gx = grad_inputs[0];
    gx->g.resize(output.shape());
    for (std::int64_t i = 0; i < output.size(); ++i) gx->g[i] = 2.0f * grad_output.g[i];
    gx->scale = grad_output.scale;
  }
};

}  // namespace

TEST_CASE("CUDA backend: a user-defined layer runs on the host inside a model on the GPU", "[cuda][backend][layers]") {
  test::require_cuda_device();
  cuda::CudaBackend backend(0);
  Doubler cpu("double");
  cpu.set_id(0);
  std::unique_ptr<Layer> gpu = backend.adopt(std::make_unique<Doubler>("double"), LayerPlacement{});
  gpu->set_id(0);  // as Model::use_backend does
  Rng rng(8);
  const Tensor x = grid_tensor({3, 5}, rng, -8, 8, 0.25), g = grid_tensor({3, 5}, rng, -4, 4, 0.25);
  const LayerRun want = run_layer(cpu, cpu_backend(), x, g, true, 1);
  const LayerRun got = run_layer(*gpu, backend, x, g, true, 1);
  CHECK(test::bit_mismatches(values_of(got.y), values_of(want.y)).empty());
  CHECK(test::bit_mismatches(values_of(got.gx), values_of(want.gx)).empty());
}

TEST_CASE("CUDA backend: Model::prepare_weights rounds every working copy in one launch, with the bits of one "
          "launch per tensor",
          "[cuda][backend]") {
  test::require_cuda_device();
  // Two resnet-minis from one seed, each on a backend of its own: one prepared by Model::prepare_weights
  // (queued, one launch), the other layer by layer outside that bracket (each rounding at once). The
  // logits of the same input must agree bit for bit, at fp16 (16-bit GEMM operands) and at fp8.
  for (const Format f : {Format::fp16, Format::fp8_e5m2}) {
    INFO(format_name(f));
    Rng rng_a(17), rng_b(17);
    std::unique_ptr<Model> a = build_model(builtin_model_spec("resnet-mini"), rng_a);
    std::unique_ptr<Model> b = build_model(builtin_model_spec("resnet-mini"), rng_b);
    const std::unique_ptr<Backend> backend_a = make_backend("cuda"), backend_b = make_backend("cuda");
    a->use_backend(*backend_a);
    b->use_backend(*backend_b);
    Precision p;
    p.format = f;
    std::size_t tensors = 0;
    for (Parameter* param : a->parameters()) tensors += param->value.size() > 0;
    const long long batched = launches([&] { a->prepare_weights(p); });
    const long long one_by_one = launches([&] {
      for (int i = 0; i < b->num_layers(); ++i) b->layer(i).prepare_weights(p);
    });
    if (batched >= 0) {  // counted on the CPU execution target
      CHECK(batched == 1);
      CHECK(one_by_one == static_cast<long long>(tensors));
    }
    Rng data(5);
    Tensor x({2, 1, 28, 28});
    for (std::int64_t i = 0; i < x.size(); ++i)
      x[i] = quantize(static_cast<float>(uniform_below(data, 256)) / 256.0f, f);
    ForwardContext ctx{p, false, nullptr};
    const Tensor xa = x.to(backend_a->memory()), xb = x.to(backend_b->memory());
    const std::vector<float> la = host_values(a->forward(xa, ctx)), lb = host_values(b->forward(xb, ctx));
    CHECK(test::bit_mismatches(la, lb).empty());
  }
}
