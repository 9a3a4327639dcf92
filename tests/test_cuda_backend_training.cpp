// Training on the GPU with the device seam (lib/cuda/backend.h), built only with CUDA; every case skips
// visibly without a GPU: training on `--device cuda` tracks the CPU emulation step by step (the GEMMs add
// in another order: losses agree to a stated tolerance), for a global and two adaptive policies, an MLP,
// a CNN and resnet-mini; a step waits for the device twice; scales decided on the device equal the
// host's; a diverging run and a scale outside float32's range end as on the CPU; a checkpoint written on
// the GPU resumes on the CPU. (The seam's tensors, roundings and layer twins: test_cuda_backend.cpp.)
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
#include "lib/scaler/scaler.h"
#include "lib/train/trainer.h"
#include "tests/cuda_test.h"
#include "tests/host_values.h"
#include "tests/temp_dir.h"

using namespace gradscale;
using json = nlohmann::json;
using gradscale::test::host_values;

namespace {

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
      {"mlp", Format::fp16, {{"policy", "popart_als"}}},  // the edge counts, added up on the device
      {"deep-mlp", Format::fp16, {{"policy", "adaptive"}, {"method", "approx_range"}}},
      {"deep-mlp", Format::bf16, {{"policy", "adaptive"}, {"method", "measured"}}},
      {"cnn", Format::fp16, {{"policy", "adaptive"}, {"method", "approx_range"}}},
      {"resnet-mini", Format::fp16, {{"policy", "torch"}}},
      {"resnet-mini", Format::fp16, {{"policy", "adaptive"}, {"method", "measured"}}},
  };
  for (const Case& k : cases) {
    INFO(k.model << " " << format_name(k.format) << " " << k.scaler.dump());
    // A smaller batch on the CPU target (each step is slow there); the comparison is the same.
    const int batch = test::gpu_or_cpu_target(64, 16);
    TrainConfig cpu_config = config_for(k.model, k.format, k.scaler, "cpu");
    TrainConfig gpu_config = config_for(k.model, k.format, k.scaler, "cuda");
    cpu_config.batch = gpu_config.batch = batch;
    Trainer cpu(cpu_config);
    Trainer gpu(gpu_config);
    Batcher batches(cpu.data().train, batch, 5);
    Tensor x;
    std::vector<std::int32_t> y;
    // Fewer steps on the CPU target (each is slow there); the tolerances hold from the first step on.
    for (int step = 0; step < test::gpu_or_cpu_target(8, 3); ++step) {
      REQUIRE(batches.next(x, y));
      const StepOutcome a = cpu.train_step(x, y);
      const StepOutcome b = gpu.train_step(x, y);
      INFO("step " << step + 1);
      // Products of F values are exact in fp32 on both; the sums are added in another order, so values
      // that round to F differ by one F ulp in rare elements. From the same weights (step 1) the loss
      // agrees closely; then training amplifies those flips step after step (a deep MLP drifts by about
      // 1e-4 in fp32 and a few 1e-3 in fp16 and bf16 over 8 steps), so later steps track the CPU within a
      // tolerance set by the format's precision, with the same loss scales and skips throughout.
      const double later = k.format == Format::bf16 ? 3e-2 : 1e-2;
      CHECK(b.loss == Approx(a.loss).epsilon(step == 0 ? 5e-4 : later));
      CHECK(b.skipped == a.skipped);
      CHECK(b.loss_scale == a.loss_scale);
    }
  }
}

TEST_CASE("CUDA backend: a step waits for the device twice, under a global or an adaptive policy",
          "[cuda][backend][train]") {
  test::require_cuda_device();
  // Once for the step's measurements (one copy: statistics, loss, edge counts and the scales decided on
  // the device), once for the divergence check (one index per parameter) when the step was applied;
  // nothing per layer: an adaptive controller's rule is evaluated on the device, and a join's T is
  // chosen there, and so is the adaptive policy's S0 (its floor reads the exact fp32 loss gradient every
  // step, SPEC §6.5: Scaler::device_loss_rule, evaluated where the gradient's statistics are). With
  // device decisions off the host decides: one wait for S0, one per weight or bias tensor for its factor
  // r (6 in mlp, 8 in cnn), one per controller query (every weight layer that sends a gradient upstream:
  // all but the first) and per join (three in resnet-mini). The count does not depend on the batch: a
  // small one.
  struct Case {
    const char* model;
    json scaler;
    bool device_decisions;
    std::int64_t waits;
  };
  const json approx_range = {{"policy", "adaptive"}, {"method", "approx_range"}};
  const json measured = {{"policy", "adaptive"}, {"method", "measured"}};
  const std::vector<Case> cases = {
      {"mlp", {{"policy", "torch"}}, true, 2},
      {"mlp", {{"policy", "popart_als"}}, true, 2},
      {"deep-mlp", {{"policy", "static"}, {"scale", 1024}}, true, 2},
      {"cnn", {{"policy", "torch"}}, true, 2},
      {"mlp", approx_range, true, 2},
      {"deep-mlp", approx_range, true, 2},
      {"cnn", measured, true, 2},
      {"resnet-mini", {{"policy", "static"}, {"scale", 1}}, true, 2},
      {"resnet-mini", measured, true, 2},
      {"cnn", {{"policy", "adaptive"}, {"method", "measured"}, {"init_scale", "auto"}, {"cast_form", "measured"}},
       true, 2},
      {"mlp", {{"policy", "adaptive"}, {"method", "approx_range"}, {"init_scale", "auto"}}, true, 2 + 1},
      {"mlp", approx_range, false, 2 + 1 + 2 + 6},
      {"cnn", measured, false, 2 + 1 + 3 + 8},
      {"resnet-mini", {{"policy", "static"}, {"scale", 1}}, false, 2 + 3},
  };
  for (const Case& k : cases) {
    INFO(k.model << " " << k.scaler.dump() << (k.device_decisions ? "" : ", device decisions off"));
    TrainConfig c = config_for(k.model, Format::fp16, k.scaler, "cuda");
    c.batch = 8;
    Trainer gpu(c);
    dynamic_cast<cuda::CudaBackend&>(gpu.model().backend()).set_device_decisions(k.device_decisions);
    Batcher batches(gpu.data().train, 8, 5);
    Tensor x;
    std::vector<std::int32_t> y;
    int applied = 0;
    for (int step = 0; step < test::gpu_or_cpu_target(6, 3); ++step) {  // step 1 sizes the buffers
      REQUIRE(batches.next(x, y));
      const std::int64_t before = gpu.model().backend().host_waits();
      const StepOutcome r = gpu.train_step(x, y);
      INFO("step " << step + 1 << (r.skipped ? " (skipped)" : ""));
      applied += !r.skipped;
      const std::int64_t waits = gpu.model().backend().host_waits() - before;
      if (step > 0) CHECK(waits == k.waits - (r.skipped ? 1 : 0));  // step 1 sizes the buffers
    }
    CHECK(applied > 0);
  }
}

TEST_CASE("CUDA backend: scales decided on the device equal the host's decisions bit for bit",
          "[cuda][backend][train]") {
  test::require_cuda_device();
  // The same statistics (the GPU's), the same formulas (lib/scaler/scale_rule.h, lib/model/join_target.h):
  // a run whose controller, joins and S0 decide on the device and one whose host decides must take the same
  // steps — losses, loss scales, every layer record's s, unbound s, S_in and S_out, the controller's
  // state and the final weights, all bit for bit.
  struct Case {
    const char* model;
    json scaler;
  };
  const std::vector<Case> cases = {
      {"deep-mlp", {{"policy", "adaptive"}, {"method", "approx_range"}}},
      {"deep-mlp", {{"policy", "adaptive"}, {"method", "abs_range"}, {"update_every", 3}}},
      {"cnn", {{"policy", "adaptive"}, {"method", "measured"}}},
      {"resnet-mini", {{"policy", "adaptive"}, {"method", "measured"}, {"accum_upper_bound", 1e9}}},
      {"resnet-mini", {{"policy", "adaptive"}, {"method", "measured"}, {"bounds", "derived"}}},
      {"resnet-mini", {{"policy", "torch"}}},
      // S0 chosen on the device (Scaler::device_loss_rule): its floor alone ("auto", cast_form measured),
      // and φ·init_scale against the floor.
      {"cnn", {{"policy", "adaptive"}, {"method", "measured"}, {"init_scale", "auto"}, {"cast_form", "measured"}}},
      {"deep-mlp", {{"policy", "adaptive"}, {"method", "approx_range"}, {"init_scale", 65536}}},
  };
  for (const Case& k : cases) {
    INFO(k.model << " " << k.scaler.dump());
    TrainConfig c = config_for(k.model, Format::fp16, k.scaler, "cuda");
    c.batch = test::gpu_or_cpu_target(16, 8);
    Trainer on_device(c), on_host(c);
    dynamic_cast<cuda::CudaBackend&>(on_host.model().backend()).set_device_decisions(false);
    Batcher batches(on_device.data().train, c.batch, 5);
    Tensor x;
    std::vector<std::int32_t> y;
    for (int step = 0; step < test::gpu_or_cpu_target(6, 3); ++step) {
      INFO("step " << step + 1);
      REQUIRE(batches.next(x, y));
      const StepOutcome a = on_device.train_step(x, y);
      const StepOutcome b = on_host.train_step(x, y);
      CHECK(std::memcmp(&a.loss, &b.loss, sizeof a.loss) == 0);
      CHECK(a.loss_scale == b.loss_scale);
      CHECK(a.skipped == b.skipped);
      const StepMonitor& ma = on_device.training().monitor();
      const StepMonitor& mb = on_host.training().monitor();
      REQUIRE(ma.records.size() == mb.records.size());
      for (std::size_t i = 0; i < ma.records.size(); ++i) {
        INFO("layer " << i);
        CHECK(ma.records[i].local_scale == mb.records[i].local_scale);
        CHECK(ma.records[i].unbound_scale == mb.records[i].unbound_scale);
        CHECK(ma.records[i].scale_in == mb.records[i].scale_in);
        CHECK(ma.records[i].scale_out == mb.records[i].scale_out);
        CHECK(ma.records[i].scale_limit == mb.records[i].scale_limit);
      }
    }
    CHECK(on_device.scaler().state() == on_host.scaler().state());
    const std::vector<Parameter*> pa = on_device.model().parameters(), pb = on_host.model().parameters();
    REQUIRE(pa.size() == pb.size());
    for (std::size_t i = 0; i < pa.size(); ++i) {
      INFO(pa[i]->name);
      const std::vector<float> va = host_values(pa[i]->value), vb = host_values(pb[i]->value);
      CHECK(std::memcmp(va.data(), vb.data(), va.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("CUDA backend: a diverging run stops at the CPU's step, naming the same parameter",
          "[cuda][backend][train]") {
  test::require_cuda_device();
  // The update itself makes the master weights non-finite (the scan runs on the device).
  const json scaler = {{"policy", "static"}, {"scale", 1}};
  TrainConfig c = config_for("mlp", Format::fp32, scaler, "cpu");
  c.optimizer = json{{"name", "sgd"}};
  c.lr = 1e300;
  Trainer cpu(c);
  c.device = "cuda";
  Trainer gpu(c);
  const json a = cpu.run(), b = gpu.run();
  REQUIRE(a.at("diverged") == true);
  CHECK(b.at("diverged") == true);
  CHECK(b.at("diverged_step") == a.at("diverged_step"));
  CHECK(b.at("divergence") == a.at("divergence"));
}

TEST_CASE("CUDA backend: a step whose accumulated scale leaves float32's range is skipped, as on the CPU",
          "[cuda][backend][train]") {
  test::require_cuda_device();
  // Scales outside float32's range. Each layer's s is at most 1e-30: over the mlp's linear layers S
  // falls far below 2^-126, where 1/S is inf. Whoever decides the scales, host or device, the step is skipped (the
  // CPU's rule), never applied with 0·inf weights and never a failure.
  const json scaler = {{"policy", "adaptive"}, {"scale_upper_bound", 1e-30}};
  TrainConfig c = config_for("mlp", Format::fp16, scaler, "cpu");
  c.max_steps = 3;
  c.batch = test::gpu_or_cpu_target(64, 16);
  const json on_cpu = Trainer(c).run();
  REQUIRE(on_cpu.at("skipped_steps") == 3);
  c.device = "cuda";
  for (const bool device_decisions : {true, false}) {
    INFO((device_decisions ? "scales decided on the device" : "scales decided by the host"));
    Trainer gpu(c);
    dynamic_cast<cuda::CudaBackend&>(gpu.model().backend()).set_device_decisions(device_decisions);
    const json r = gpu.run();
    CHECK(r.at("diverged") == false);
    CHECK(r.at("skipped_steps") == 3);
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

TEST_CASE("CUDA backend: conv_algorithm implicit trains as im2col does (bit for bit on the CPU target)",
          "[cuda][backend][train]") {
  test::require_cuda_device();
  // The CNN's convolutions have biases; resnet-mini's are strided, 1x1 and followed by BatchNorm.
  const std::vector<std::pair<const char*, json>> cases = {
      {"cnn", {{"policy", "adaptive"}, {"method", "measured"}}},
      {"resnet-mini", {{"policy", "adaptive"}, {"method", "measured"}}},
      {"resnet-mini", {{"policy", "static"}, {"scale", 1024}}}};
  for (const auto& [model, scaler] : cases) {
    INFO(model << " " << scaler.dump());
    TrainConfig a_config = config_for(model, Format::fp16, scaler, "cuda");
    a_config.batch = test::gpu_or_cpu_target(64, 8);
    TrainConfig b_config = a_config;
    b_config.conv_algorithm = "implicit";
    Trainer a(a_config);
    Trainer b(b_config);
    Batcher batches(a.data().train, a_config.batch, 5);
    Tensor x;
    std::vector<std::int32_t> y;
    for (int step = 0; step < test::gpu_or_cpu_target(8, 3); ++step) {
      REQUIRE(batches.next(x, y));
      const StepOutcome ra = a.train_step(x, y);
      const StepOutcome rb = b.train_step(x, y);
      INFO("step " << step + 1);
      CHECK(rb.skipped == ra.skipped);
      CHECK(rb.loss_scale == ra.loss_scale);
      // On the CPU target both algorithms add each output's column rows in order (its reference GEMM's
      // order), so every bit agrees; cuBLAS adds in its own order, so on a GPU the losses agree as two
      // summation orders do (the tolerance of the case above).
      if (test::on_cpu_execution_target())
        CHECK(rb.loss == ra.loss);
      else
        CHECK(rb.loss == Approx(ra.loss).epsilon(step == 0 ? 5e-4 : 1e-2));
    }
    if (test::on_cpu_execution_target()) {
      std::vector<float> wa, wb;
      for (Parameter* p : a.model().parameters()) {
        const std::vector<float> v = host_values(p->value);
        wa.insert(wa.end(), v.begin(), v.end());
      }
      for (Parameter* p : b.model().parameters()) {
        const std::vector<float> v = host_values(p->value);
        wb.insert(wb.end(), v.begin(), v.end());
      }
      CHECK(test::bit_mismatches(wa, wb).empty());
    }
  }
}
