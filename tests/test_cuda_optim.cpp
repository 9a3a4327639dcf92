// Tests of lib/cuda's optimizer kernels against lib/optim (built only with CUDA; every case skips
// visibly without a GPU): SGD and Adam over several steps with skipped steps decided on the device
// from the found_inf flag give the CPU's weights and state, and the CPU's step count.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/backend/backend.h"
#include "lib/core/random.h"
#include "lib/cuda/adam.h"
#include "lib/cuda/batchnorm.h"
#include "lib/cuda/context.h"
#include "lib/cuda/convert.h"
#include "lib/cuda/gemm.h"
#include "lib/cuda/im2col.h"
#include "lib/cuda/maxpool.h"
#include "lib/cuda/optim_step.h"
#include "lib/cuda/relu.h"
#include "lib/cuda/sgd.h"
#include "lib/cuda/softmax_cross_entropy.h"
#include "lib/layers/batchnorm.h"
#include "lib/layers/conv2d.h"
#include "lib/layers/pool.h"
#include "lib/layers/relu.h"
#include "lib/layers/softmax_cross_entropy.h"
#include "lib/optim/optimizer.h"
#include "lib/scaler/scaler.h"
#include "tests/cuda_layers_fixtures.h"
#include "tests/cuda_test.h"
#include "tests/host_values.h"

using namespace gradscale;
using test::bit_mismatches;
using test::host_values;
using namespace gradscale::test::cuda_layers_fixtures;

namespace {

// Parameters of both sides: the CPU's Parameter objects and device copies of value and gradient.
struct OptimParams {
  std::vector<Parameter> cpu;
  std::vector<cuda::DeviceBuffer<float>> w, g;
  OptimParams(cuda::CudaContext& ctx, Rng& rng) {
    for (std::int64_t n : {1, 1000, 70001}) {  // 70001: the CPU's OpenMP path
      Parameter p;
      p.name = "p" + std::to_string(cpu.size());
      p.value = tensor_of({n}, normals(static_cast<std::size_t>(n), rng));
      p.grad = Tensor({n}, 0.0f);
      p.weight_decay = cpu.size() != 1;  // the second one is excluded from weight decay
      w.push_back(test::to_device(values(p.value), ctx));
      g.push_back(cuda::DeviceBuffer<float>(static_cast<std::size_t>(n)));
      cpu.push_back(std::move(p));
    }
  }
  std::vector<Parameter*> pointers() {
    std::vector<Parameter*> v;
    for (Parameter& p : cpu) v.push_back(&p);
    return v;
  }
  // A new gradient for every parameter, the same on both sides.
  void new_gradients(cuda::CudaContext& ctx, Rng& rng) {
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      const std::vector<float> grad = normals(static_cast<std::size_t>(cpu[i].grad.size()), rng, 0.5);
      std::copy(grad.begin(), grad.end(), cpu[i].grad.data());
      g[i].upload(grad.data(), grad.size(), ctx.stream());
    }
  }
};

// Steps 1..6 with found_inf on steps 3 and 5: the CPU simply does not call step(); the GPU sets the
// device flag and lets optimizer_begin_step decide.
constexpr int kSteps = 6;
bool skipped(int step) {
  return step == 3 || step == 5;
}

}  // namespace

TEST_CASE("cuda SGD equals lib/optim's SGD bit for bit and skips on the device flag", "[cuda][optim]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  const std::vector<nlohmann::json> configs = {{{"name", "sgd"}},
                                               {{"name", "sgd"}, {"momentum", 0.9}},
                                               {{"name", "sgd"}, {"momentum", 0.9}, {"nesterov", true}},
                                               {{"name", "sgd"}, {"momentum", 0.8}, {"weight_decay", 0.01}}};
  for (const nlohmann::json& cfg : configs) {
    INFO(cfg.dump());
    Rng rng(10);
    OptimParams params(ctx, rng);
    auto opt = make_optimizer(cfg);
    const double lr = 0.05, momentum = cfg.value("momentum", 0.0);
    std::vector<cuda::DeviceBuffer<float>> buffers;
    for (const Parameter& p : params.cpu) {
      buffers.emplace_back(momentum > 0 ? static_cast<std::size_t>(p.value.size()) : 0);
      buffers.back().fill_bytes(0, ctx.stream());
    }
    cuda::DeviceBuffer<cuda::DeviceOptimizerStep> step(1);
    step.fill_bytes(0, ctx.stream());
    cuda::DeviceBuffer<int> flag(1);
    for (int t = 1; t <= kSteps; ++t) {
      INFO("step " << t);
      params.new_gradients(ctx, rng);
      if (!skipped(t)) opt->step(params.pointers(), lr);
      const std::vector<int> f = {skipped(t) ? 1 : 0};
      flag.upload(f.data(), 1, ctx.stream());
      cuda::optimizer_begin_step(flag.data(), step.data(), nullptr, ctx.stream());
      for (std::size_t i = 0; i < params.cpu.size(); ++i) {
        const cuda::SgdParams sp{lr, momentum, cfg.value("nesterov", false),
                                 params.cpu[i].weight_decay ? cfg.value("weight_decay", 0.0) : 0.0};
        cuda::sgd_update(params.w[i].data(), params.g[i].data(), momentum > 0 ? buffers[i].data() : nullptr,
                         params.w[i].size(), sp, step.data(), ctx.stream());
      }
      CHECK(test::to_host(step, ctx)[0].applied == opt->step_count());
      CHECK(test::to_host(step, ctx)[0].current == (skipped(t) ? 0 : opt->step_count()));
      const auto state = opt->state_tensors();
      for (std::size_t i = 0; i < params.cpu.size(); ++i) {
        INFO("parameter " << i);
        CHECK(bit_mismatches(test::to_host(params.w[i], ctx), values(params.cpu[i].value)).empty());
        if (momentum > 0)
          CHECK(bit_mismatches(test::to_host(buffers[i], ctx), values(*state[i].second)).empty());
      }
    }
  }
}

TEST_CASE(
    "cuda Adam / AdamW equal lib/optim's moments bit for bit and weights to an ulp, and skip on the flag",
    "[cuda][optim]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  const std::vector<nlohmann::json> configs = {
      {{"name", "adam"}},
      {{"name", "adam"}, {"weight_decay", 0.01}},
      {{"name", "adamw"}, {"weight_decay", 0.01}},
      {{"name", "adam"}, {"beta1", 0.8}, {"beta2", 0.99}, {"eps", 1e-6}}};
  for (const nlohmann::json& cfg : configs) {
    INFO(cfg.dump());
    Rng rng(12);
    OptimParams params(ctx, rng);
    auto opt = make_optimizer(cfg);
    const nlohmann::json full = opt->config();  // defaults resolved
    const double lr = 1e-3;
    std::vector<cuda::DeviceBuffer<float>> m, v;
    for (const Parameter& p : params.cpu) {
      m.emplace_back(static_cast<std::size_t>(p.value.size()));
      v.emplace_back(static_cast<std::size_t>(p.value.size()));
      m.back().fill_bytes(0, ctx.stream());
      v.back().fill_bytes(0, ctx.stream());
    }
    cuda::DeviceBuffer<cuda::DeviceOptimizerStep> step(1);
    step.fill_bytes(0, ctx.stream());
    cuda::DeviceBuffer<int> flag(1);
    const double beta1 = full["beta1"].get<double>(), beta2 = full["beta2"].get<double>();
    const cuda::AdamSchedule schedule{lr, beta1, beta2};
    for (int t = 1; t <= kSteps; ++t) {
      INFO("step " << t);
      params.new_gradients(ctx, rng);
      std::vector<std::vector<float>> before;  // the weights both sides start the step from
      for (const Parameter& p : params.cpu) before.push_back(values(p.value));
      if (!skipped(t)) opt->step(params.pointers(), lr);
      const std::vector<int> f = {skipped(t) ? 1 : 0};
      flag.upload(f.data(), 1, ctx.stream());
      cuda::optimizer_begin_step(flag.data(), step.data(), &schedule, ctx.stream());
      for (std::size_t i = 0; i < params.cpu.size(); ++i) {
        const cuda::AdamParams ap{lr,
                                  beta1,
                                  beta2,
                                  full["eps"].get<double>(),
                                  params.cpu[i].weight_decay ? full["weight_decay"].get<double>() : 0.0,
                                  full["name"].get<std::string>() == "adamw"};
        cuda::adam_update(params.w[i].data(), params.g[i].data(), m[i].data(), v[i].data(),
                          params.w[i].size(), ap, step.data(), ctx.stream());
      }
      CHECK(test::to_host(step, ctx)[0].applied == opt->step_count());
      const auto state = opt->state_tensors();  // exp_avg, exp_avg_sq per parameter
      for (std::size_t i = 0; i < params.cpu.size(); ++i) {
        INFO("parameter " << i);
        CHECK(bit_mismatches(test::to_host(m[i], ctx), values(*state[2 * i].second)).empty());
        CHECK(bit_mismatches(test::to_host(v[i], ctx), values(*state[2 * i + 1].second)).empty());
        // The step's scalars −lr/(1 − beta1^t) and sqrt(1 − beta2^t) come from CUDA's pow (2 ulp in
        // double) and may round to floats one ulp apart: |Δw| ≤ 2^-22·|w − w_before| + one ulp of w.
        const std::vector<float> got = test::to_host(params.w[i], ctx);
        const std::vector<float> want = values(params.cpu[i].value);
        std::size_t bad = 0;
        for (std::size_t j = 0; j < got.size(); ++j) {
          const double moved = std::fabs(static_cast<double>(want[j]) - before[i][j]);
          const double tol = 0x1p-22 * moved + 0x1p-23 * std::fabs(static_cast<double>(want[j]));
          bad += !(std::fabs(static_cast<double>(got[j]) - want[j]) <= tol);
        }
        CHECK(bad == 0);
        if (skipped(t)) CHECK(bit_mismatches(got, before[i]).empty());  // a skipped step changes nothing
        // Both sides start the next step from the CPU's weights, so an allowed ulp cannot grow (and,
        // through Adam's coupled weight decay, reach the moments).
        params.w[i].upload(want.data(), want.size(), ctx.stream());
      }
    }
  }
}

TEST_CASE("cuda: Optimizer::step updates every device parameter in one launch per 32, with the CPU optimizer's bits",
          "[cuda][optim]") {
  test::require_cuda_device();
  const std::unique_ptr<Backend> backend = make_backend("cuda");
  DeviceMemory* memory = backend->memory();
  const std::vector<nlohmann::json> configs = {
      {{"name", "adam"}},
      {{"name", "adamw"}, {"weight_decay", 0.01}},
      {{"name", "adam"}, {"weight_decay", 0.01}},
      {{"name", "sgd"}},
      {{"name", "sgd"}, {"momentum", 0.9}, {"nesterov", true}, {"weight_decay", 0.01}}};
  for (const nlohmann::json& cfg : configs) {
    INFO(cfg.dump());
    // 40 parameters (two launches a step), sizes 1 to 3000, every third without weight decay.
    Rng rng(31);
    std::vector<Parameter> host(40), device(40);
    for (std::size_t i = 0; i < host.size(); ++i) {
      const std::int64_t n = i == 5 ? 3000 : 1 + static_cast<std::int64_t>((i * 53) % 400);
      host[i].name = "p" + std::to_string(i);
      host[i].value = tensor_of({n}, normals(static_cast<std::size_t>(n), rng));
      host[i].grad = Tensor({n});
      host[i].weight_decay = i % 3 != 0;
      device[i].name = host[i].name;
      device[i].value = host[i].value.to(memory);
      device[i].grad = host[i].grad.to(memory);
      device[i].weight_decay = host[i].weight_decay;
    }
    std::vector<Parameter*> hp, dp;
    for (std::size_t i = 0; i < host.size(); ++i) {
      hp.push_back(&host[i]);
      dp.push_back(&device[i]);
    }
    auto cpu_opt = make_optimizer(cfg), gpu_opt = make_optimizer(cfg);
    gpu_opt->use_device(backend->optimizer_kernels());
    for (int t = 1; t <= 3; ++t) {
      INFO("step " << t);
      for (std::size_t i = 0; i < host.size(); ++i) {
        const std::vector<float> g = normals(static_cast<std::size_t>(host[i].grad.size()), rng, 0.1);
        std::copy(g.begin(), g.end(), host[i].grad.data());
        device[i].grad.copy_from(host[i].grad);
      }
      cpu_opt->step(hp, 0.01);
      const long long before = test::kernel_launches();
      gpu_opt->step(dp, 0.01);
      if (before >= 0) CHECK(test::kernel_launches() - before == 2);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < host.size(); ++i)
        bad += bit_mismatches(host_values(device[i].value), values(host[i].value)).size();
      CHECK(bad == 0);
    }
    // A step refused (a gradient of the wrong shape) changes no weight. (An update that throws after
    // others were queued: test_optim_updates.cpp.)
    std::vector<std::vector<float>> before_bits;
    for (const Parameter& p : device) before_bits.push_back(host_values(p.value));
    device[30].grad = Tensor({1}, 0.0f, memory);
    CHECK_THROWS(gpu_opt->step(dp, 0.01));
    for (std::size_t i = 0; i < device.size(); ++i) {
      INFO("parameter " << i);
      CHECK(bit_mismatches(host_values(device[i].value), before_bits[i]).empty());
    }
  }
}
