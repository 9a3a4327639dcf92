// Tests of lib/cuda's BatchNorm and softmax cross-entropy kernels against the CPU layers (built only
// with CUDA; every case skips visibly without a GPU): training and eval, 1d and 2d, and the loss with a
// loss scale, within one fp32 ulp of the CPU (sums in another order; CUDA's exp/log).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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

using namespace gradscale;
using test::bit_mismatches;
using namespace gradscale::test::cuda_layers_fixtures;

namespace {

// |gpu − cpu| ≤ 2^-23·|cpu| + 1e-11·max|cpu|: one fp32 rounding apart (a double result rounded to
// float once, from double sums added in another order), plus double-level noise where terms cancel.
std::string ulp_mismatches(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  if (gpu.size() != cpu.size()) return "sizes differ";
  double scale = 0;
  for (float x : cpu) scale = std::max(scale, std::fabs(static_cast<double>(x)));
  std::size_t bad = 0;
  std::ostringstream os;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    const double tol = 0x1p-23 * std::fabs(static_cast<double>(cpu[i])) + 1e-11 * scale;
    if (std::fabs(static_cast<double>(gpu[i]) - cpu[i]) <= tol) continue;
    if (++bad <= 8) os << "  [" << i << "] got " << gpu[i] << " want " << cpu[i] << "\n";
  }
  return bad == 0 ? "" : std::to_string(bad) + " of " + std::to_string(cpu.size()) + " differ:\n" + os.str();
}

}  // namespace

TEST_CASE("cuda batch norm matches BatchNorm within one fp32 ulp (training and eval, 1d and 2d)",
          "[cuda][layers]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  Rng rng(6);
  // A channel's sums spread over one block per 2048 values (at most 64): the first two shapes take one
  // block per channel, the others 3, 5 and 32 (64 on a GPU).
  const std::int64_t many = test::gpu_or_cpu_target<std::int64_t>(160, 72);
  for (const Shape& xs : {Shape{6, 4}, Shape{3, 5, 4, 7}, Shape{4100, 3}, Shape{40, 3, 16, 16},
                          Shape{many, 2, 30, 30}}) {
    const std::int64_t channels = xs[1], plane = xs.size() == 4 ? xs[2] * xs[3] : 1;
    const cuda::BatchNormShape s{xs[0], channels, plane};
    const std::vector<float> x = normals(static_cast<std::size_t>(shape_size(xs)), rng, 2.0, 3.0);
    BatchNorm bn("bn", channels);
    bn.set_id(0);
    const std::vector<float> gamma = normals(static_cast<std::size_t>(channels), rng, 0.2, 1.0);
    const std::vector<float> beta = normals(static_cast<std::size_t>(channels), rng, 0.5);
    std::copy(gamma.begin(), gamma.end(), bn.parameters()[0]->value.data());
    std::copy(beta.begin(), beta.end(), bn.parameters()[1]->value.data());
    CpuRun cpu;
    bn.prepare_weights(cpu.precision);
    auto d_x = test::to_device(x, ctx);
    auto d_gamma = test::to_device(gamma, ctx);
    auto d_beta = test::to_device(beta, ctx);
    auto d_rmean = test::to_device(std::vector<float>(static_cast<std::size_t>(channels), 0.0f), ctx);
    auto d_rvar = test::to_device(std::vector<float>(static_cast<std::size_t>(channels), 1.0f), ctx);
    cuda::DeviceBuffer<double> d_mean(static_cast<std::size_t>(channels)),
        d_invstd(static_cast<std::size_t>(channels));
    const Tensor xt = tensor_of(xs, x);

    for (bool training : {true, false}) {
      INFO("input " << shape_string(xs) << (training ? ", training" : ", eval"));
      if (!training) {  // eval normalises with the running statistics: start both sides from the CPU's
        d_rmean.upload(bn.buffers()[0].second->data(), static_cast<std::size_t>(channels), ctx.stream());
        d_rvar.upload(bn.buffers()[1].second->data(), static_cast<std::size_t>(channels), ctx.stream());
      }
      const Tensor y = cpu.forward(bn, xt, training);
      auto d_y = test::sentinel_buffer<float>(x.size(), ctx);
      if (training)
        cuda::batchnorm_forward_training(ctx, d_x.data(), s, d_gamma.data(), d_beta.data(), 1e-5, 0.1,
                                         d_rmean.data(), d_rvar.data(), d_mean.data(), d_invstd.data(),
                                         d_y.data());
      else
        cuda::batchnorm_forward_eval(d_x.data(), s, d_gamma.data(), d_beta.data(), d_rmean.data(),
                                     d_rvar.data(), 1e-5, d_mean.data(), d_invstd.data(), d_y.data(),
                                     ctx.stream());
      CHECK(ulp_mismatches(test::to_host(d_y, ctx), values(y)).empty());
      if (training) {
        CHECK(ulp_mismatches(test::to_host(d_rmean, ctx), values(*bn.buffers()[0].second)).empty());
        CHECK(ulp_mismatches(test::to_host(d_rvar, ctx), values(*bn.buffers()[1].second)).empty());
      }

      const std::vector<float> g = normals(x.size(), rng);
      for (Parameter* p : bn.parameters()) p->grad.fill(0.0f);
      const Tensor gx = cpu.backward(bn, xt, y, tensor_of(xs, g));
      auto d_g = test::to_device(g, ctx);
      auto d_gx = test::sentinel_buffer<float>(x.size(), ctx);
      auto d_dgamma = test::sentinel_buffer<float>(static_cast<std::size_t>(channels), ctx);
      auto d_dbeta = test::sentinel_buffer<float>(static_cast<std::size_t>(channels), ctx);
      cuda::batchnorm_backward(ctx, d_x.data(), d_g.data(), s, d_gamma.data(), d_mean.data(), d_invstd.data(),
                               training, d_gx.data(), d_dgamma.data(), d_dbeta.data());
      CHECK(ulp_mismatches(test::to_host(d_gx, ctx), values(gx)).empty());
      CHECK(ulp_mismatches(test::to_host(d_dgamma, ctx), values(bn.parameters()[0]->grad)).empty());
      CHECK(ulp_mismatches(test::to_host(d_dbeta, ctx), values(bn.parameters()[1]->grad)).empty());
    }
  }
}

TEST_CASE("cuda softmax cross-entropy matches the CPU loss and its scaled gradient", "[cuda][layers]") {
  test::require_cuda_device();
  cuda::CudaContext ctx;
  Rng rng(8);
  const std::int64_t n = 37, classes = 10;
  std::vector<float> logits = normals(static_cast<std::size_t>(n * classes), rng, 3.0);
  for (float& z : logits) z = quantize(z, Format::fp16);  // logits are values in F
  std::vector<std::int32_t> labels(static_cast<std::size_t>(n));
  for (auto& y : labels) y = static_cast<std::int32_t>(uniform_below(rng, classes));
  const Tensor lt = tensor_of({n, classes}, logits);
  auto d_logits = test::to_device(logits, ctx);
  auto d_labels = test::to_device(labels, ctx);
  cuda::DeviceBuffer<cuda::DeviceLoss> d_loss(1);

  for (double loss_scale : {1.0, 1024.0, 3.0}) {
    INFO("loss scale " << loss_scale);
    Tensor grad;
    const LossResult cpu = softmax_cross_entropy_fp32(lt, labels.data(), loss_scale, &grad);
    auto d_grad = test::sentinel_buffer<float>(logits.size(), ctx);
    cuda::softmax_cross_entropy(ctx, d_logits.data(), d_labels.data(), n, classes, loss_scale, d_grad.data(),
                                d_loss.data());
    const cuda::DeviceLoss loss = test::to_host(d_loss, ctx)[0];
    CHECK(loss.bad_labels == 0);
    CHECK(loss.correct == cpu.correct);
    // exp/log within an ulp in double: the mean loss to 1e-12 relative.
    CHECK(std::fabs(loss.loss_sum / static_cast<double>(n) - cpu.loss) <= 1e-12 * (1 + std::fabs(cpu.loss)));
    // The float probability may round one ulp apart (≤ 2^-24 absolute, as p ≤ 1), and p − onehot and the
    // product with float(S0/N) round once more each: |Δg| ≤ 2^-22·S0/N + 2^-23·|g|.
    const std::vector<float> got = test::to_host(d_grad, ctx);
    const double scale_over_n = loss_scale / static_cast<double>(n);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double tol = 0x1p-22 * scale_over_n +
                         0x1p-23 * std::fabs(static_cast<double>(grad[static_cast<std::int64_t>(i)]));
      bad += !(std::fabs(static_cast<double>(got[i]) - grad[static_cast<std::int64_t>(i)]) <= tol);
    }
    CHECK(bad == 0);
  }

  // Labels outside [0, classes) are counted, give a NaN loss and a zero gradient row; no gradient wanted.
  std::vector<std::int32_t> bad_labels = labels;
  bad_labels[3] = -1;
  bad_labels[20] = static_cast<std::int32_t>(classes);
  auto d_bad = test::to_device(bad_labels, ctx);
  auto d_grad = test::sentinel_buffer<float>(logits.size(), ctx);
  cuda::softmax_cross_entropy(ctx, d_logits.data(), d_bad.data(), n, classes, 1.0, d_grad.data(),
                              d_loss.data());
  const cuda::DeviceLoss loss = test::to_host(d_loss, ctx)[0];
  CHECK(loss.bad_labels == 2);
  CHECK(std::isnan(loss.loss_sum));
  const std::vector<float> got = test::to_host(d_grad, ctx);
  for (std::int64_t k = 0; k < classes; ++k) {
    CHECK(got[static_cast<std::size_t>(3 * classes + k)] == 0.0f);
    CHECK(got[static_cast<std::size_t>(20 * classes + k)] == 0.0f);
  }
  cuda::softmax_cross_entropy(ctx, d_logits.data(), d_labels.data(), n, classes, 1.0, nullptr, d_loss.data());
  CHECK(test::to_host(d_loss, ctx)[0].bad_labels == 0);
}
