// The device seam on the GPU (lib/cuda/backend.h), built only with CUDA; every case skips visibly
// without a GPU:
//  - tensors in device memory: fill, copies within and across devices, the copy constructor;
//  - the queued measurement of a rounding, entered into the monitor at finish_backward, equals the
//    CPU's round_gradient on the same values: statistics, found_inf, max|g|, the rounded bits;
//  - training on `--device cuda` tracks the CPU emulation step by step (the GEMMs add in another order:
//    losses agree to a stated tolerance), for a global and two adaptive policies, an MLP on the GPU's
//    own layers and a CNN whose convolutions run as host layers; a checkpoint written on the GPU resumes
//    on the CPU.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <vector>

#include "lib/backend/backend.h"
#include "lib/core/random.h"
#include "lib/cuda/backend.h"
#include "lib/train/trainer.h"
#include "tests/cuda_test.h"
#include "tests/temp_dir.h"

using namespace gradscale;
using json = nlohmann::json;

namespace {

std::vector<float> host_values(const Tensor& t) {
  const Tensor h = t.to_host();
  return std::vector<float>(h.data(), h.data() + h.size());
}

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

TrainConfig config_for(const std::string& model, Format f, const json& scaler, const std::string& device) {
  TrainConfig c;
  c.model = model;
  c.data = "synthetic:512";
  c.batch = 64;
  c.epochs = 1;
  c.max_steps = 8;
  c.threads = 1;
  c.seed = 5;
  c.format = f;
  c.scaler = scaler;
  c.device = device;
  c.progress_seconds = 1e9;
  return c;
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

TEST_CASE("CUDA backend: training on the GPU tracks the CPU emulation step by step", "[cuda][backend][train]") {
  test::require_cuda_device();
  struct Case {
    const char* model;
    Format format;
    json scaler;
  };
  const std::vector<Case> cases = {
      {"mlp", Format::fp16, {{"policy", "static"}, {"scale", 1024}}},
      {"mlp", Format::fp16, {{"policy", "torch"}}},
      {"deep-mlp", Format::fp16, {{"policy", "adaptive"}, {"method", "approx_range"}}},
      {"deep-mlp", Format::bf16, {{"policy", "adaptive"}, {"method", "measured"}}},
      {"cnn", Format::fp16, {{"policy", "adaptive"}, {"method", "approx_range"}}},  // host convolutions
  };
  for (const Case& k : cases) {
    INFO(k.model << " " << format_name(k.format) << " " << k.scaler.dump());
    Trainer cpu(config_for(k.model, k.format, k.scaler, "cpu"));
    Trainer gpu(config_for(k.model, k.format, k.scaler, "cuda"));
    Batcher batches(cpu.data().train, 64, 5);
    Tensor x;
    std::vector<std::int32_t> y;
    for (int step = 0; step < 8; ++step) {
      REQUIRE(batches.next(x, y));
      const StepOutcome a = cpu.train_step(x, y);
      const StepOutcome b = gpu.train_step(x, y);
      INFO("step " << step + 1);
      // Products of F values are exact in fp32 on both; the sums are added in another order, so values
      // that round to F differ by at most one F ulp in rare elements: the loss agrees closely.
      CHECK(b.loss == Approx(a.loss).epsilon(2e-3));
      CHECK(b.skipped == a.skipped);
      CHECK(b.loss_scale == a.loss_scale);
    }
  }
}

TEST_CASE("CUDA backend: a checkpoint written on the GPU resumes on the CPU with the same weights", "[cuda][backend][checkpoint]") {
  test::require_cuda_device();
  testing::TempDir dir;
  const json scaler = {{"policy", "adaptive"}, {"method", "approx_range"}};
  TrainConfig c = config_for("mlp", Format::fp16, scaler, "cuda");
  c.checkpoint_dir = (dir.path() / "ckpt").string();
  c.save_every = 4;
  Trainer gpu(c);
  gpu.run();
  TrainConfig r = config_for("mlp", Format::fp16, scaler, "cpu");
  r.resume_dir = c.checkpoint_dir;
  r.max_steps = 8;  // nothing left to do: the resumed model is the saved one
  Trainer cpu(r);
  std::vector<float> on_gpu, on_cpu;
  for (Parameter* p : gpu.model().parameters()) {
    const std::vector<float> v = host_values(p->value);
    on_gpu.insert(on_gpu.end(), v.begin(), v.end());
  }
  for (Parameter* p : cpu.model().parameters()) on_cpu.insert(on_cpu.end(), p->value.data(), p->value.data() + p->value.size());
  CHECK(test::bit_mismatches(on_cpu, on_gpu).empty());
}
