// Tests of lib/layers: every layer's backward against central finite differences of its own forward
// (loss L = Σ w_out ⊙ y), Linear/Conv2d forward against naive fp64 references, the emulated fp16 GEMM
// against quantize(fp32 GEMM of quantized inputs), scale propagation (local scale s, static power-of-two
// S), found_inf, shape errors naming the layer, and bit-determinism of Conv2d.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "lib/core/error.h"
#include "lib/core/random.h"
#include "lib/layers/add.h"
#include "lib/layers/batchnorm.h"
#include "lib/layers/conv2d.h"
#include "lib/layers/dropout.h"
#include "lib/layers/linear.h"
#include "lib/layers/pool.h"
#include "lib/layers/relu.h"
#include "lib/scaler/scaler.h"

using namespace gradscale;
using nlohmann::json;

namespace {

constexpr double kU32 = FLT_EPSILON / 2;  // unit roundoff of fp32: one rounding errs by at most u·|v|
constexpr std::uint64_t kMaskSeed = 77;   // every forward of a check reseeds here: Dropout's mask stays fixed

// A global-style scaler for tests: S0 = 1, a settable local scale, never skips. It keeps a copy of
// the last query so tests can see what a layer told the controller.
class TestScaler final : public Scaler, public LayerController {
 public:
  double local = 1.0;
  LocalScaleQuery last;
  std::vector<float> last_upstream;
  int queries = 0;

  std::string policy() const override { return "test"; }
  double loss_scale() const override { return 1.0; }
  LayerController* layer_controller() override { return this; }
  void bind(const std::vector<LayerInfo>&, Format) override {}
  void begin_step(const StepBegin&) override {}
  StatNeeds needs(int) const override { return 0; }
  void end_step(const StepMonitor&) override {}
  LocalScale decide(const LocalScaleQuery& q) override {
    last = q;
    last_upstream.assign(q.upstream, q.upstream + q.upstream_size);
    ++queries;
    return {local, local};
  }
  StepReport update(const StepStatistics&) override { return StepReport{}; }
  json config() const override { return json::object(); }
  json state() const override { return json::object(); }
  void restore_state(const json&) override {}
};

// Values k·unit with k uniform in [lo, hi] (never 0 when `nonzero`): exact in fp32 and small enough that
// every sum of products the tests form stays exact.
void fill_grid(Tensor& t, Rng& rng, int lo, int hi, double unit, bool nonzero = false) {
  for (std::int64_t i = 0; i < t.size(); ++i) {
    int k = 0;
    do {
      k = lo + static_cast<int>(uniform_below(rng, static_cast<std::uint64_t>(hi - lo + 1)));
    } while (nonzero && k == 0);
    t[i] = static_cast<float>(k * unit);
  }
}

void fill_normal(Tensor& t, Rng& rng, double sigma = 1.0, double mean = 0.0) {
  for (std::int64_t i = 0; i < t.size(); ++i) t[i] = static_cast<float>(mean + sigma * standard_normal(rng));
}

Tensor make_grid(const Shape& s, std::uint64_t seed, int lo, int hi, double unit, bool nonzero = false) {
  Tensor t(s);
  Rng rng(seed);
  fill_grid(t, rng, lo, hi, unit, nonzero);
  return t;
}

Tensor make_normal(const Shape& s, std::uint64_t seed, double sigma = 1.0, double mean = 0.0) {
  Tensor t(s);
  Rng rng(seed);
  fill_normal(t, rng, sigma, mean);
  return t;
}

std::vector<const Tensor*> pointers(const std::vector<Tensor>& ts) {
  std::vector<const Tensor*> p;
  for (const Tensor& t : ts) p.push_back(&t);
  return p;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(float)) == 0;
}

bool any_nonzero(const Tensor& t) {
  for (std::int64_t i = 0; i < t.size(); ++i)
    if (t[i] != 0.0f) return true;
  return false;
}

// Runs one layer forward and backward with explicit contexts.
struct Runner {
  Precision precision;
  TestScaler scaler;
  StepMonitor monitor;
  Rng rng{kMaskSeed};
  bool training = true;

  explicit Runner(Format f = Format::fp32) { precision.format = f; }

  void forward(Layer& layer, const std::vector<Tensor>& inputs, Tensor& out) {
    rng.seed(kMaskSeed);
    ForwardContext ctx{precision, training, &rng};
    layer.forward(pointers(inputs), out, ctx);
  }
  // Backward of the last forward; returns one scaled gradient per input (all requested unless `skip`).
  std::vector<ScaledGrad> backward(Layer& layer, const std::vector<Tensor>& inputs, const Tensor& out,
                                   const ScaledGrad& g, bool skip_inputs = false) {
    std::vector<ScaledGrad> gx(inputs.size());
    std::vector<ScaledGrad*> ptr;
    for (ScaledGrad& s : gx) ptr.push_back(skip_inputs ? nullptr : &s);
    BackwardContext ctx{precision, scaler, monitor};
    layer.backward(pointers(inputs), out, g, ptr, ctx);
    return gx;
  }
};

// One Conv2d forward and backward of g from zeroed parameter gradients; returns the input gradient
// (empty when not requested) followed by every parameter gradient.
std::vector<Tensor> conv_gradients(Conv2d& conv, const Tensor& x, const Tensor& g, bool with_input,
                                   bool training_forward = true) {
  Runner r;
  r.monitor.reset(1, false, 0.0);
  r.training = training_forward;
  conv.set_id(0);
  conv.prepare_weights(r.precision);
  for (Parameter* p : conv.parameters()) p->grad.fill(0.0f);
  Tensor y;
  r.forward(conv, {x}, y);
  auto gx = r.backward(conv, {x}, y, ScaledGrad{g, 1.0}, !with_input);
  std::vector<Tensor> out{gx[0].g};
  for (Parameter* p : conv.parameters()) out.push_back(p->grad);
  return out;
}

// ---- finite differences ----------------------------------------------------------------------------
// L = Σ w_out·y is evaluated in double from the layer's float outputs. Its error has two sources:
// (a) the forward's own rounding, modelled per output element as forward_rel·|y| + forward_abs;
// (b) for layers with curvature the truncation error of the central difference, O(h²). For (b) we
// difference at h and h/2: truncation scales as h², so |D(h) − D(h/2)| ≈ 3·trunc(h/2) and bounds it,
// including the noise of (a) in both. The analytic gradient itself is rounded: grad_rel·|a|.
// Piecewise linear layers on exact inputs (multiples of 1/4 or 1/8, steps of 1/16, never crossing a
// kink or a tie) have no error of either kind: every value is exact and the check is equality.
struct FdOptions {
  double h = 1.0 / 16;
  double forward_rel = 0;  // relative rounding error of each output element
  double forward_abs = 0;  // absolute error of each output element (double-precision intermediates)
  double grad_rel = 0;     // relative rounding error of each analytic gradient element
  bool smooth = false;     // nonzero third derivative: add the h / h/2 truncation estimate
};

struct LossEval {
  double value, error;  // L and the bound on its rounding error
};

class FdCheck {
 public:
  FdCheck(Layer& layer, std::vector<Tensor> inputs, FdOptions opt, bool training = true)
      : layer_(layer), inputs_(std::move(inputs)), opt_(opt) {
    runner_.training = training;
    runner_.monitor.reset(1, false, 0.0);
    layer_.set_id(0);
    layer_.prepare_weights(runner_.precision);
    Tensor y;
    runner_.forward(layer_, inputs_, y);
    w_out_ = make_grid(y.shape(), 4242, -3, 3, 1.0);
    REQUIRE(any_nonzero(w_out_));
  }

  // Compares the analytic input and parameter gradients with central differences, element by element.
  void run() {
    for (Parameter* p : layer_.parameters()) p->grad.fill(0.0f);
    Tensor y;
    runner_.forward(layer_, inputs_, y);
    const std::vector<ScaledGrad> gx = runner_.backward(layer_, inputs_, y, ScaledGrad{w_out_, 1.0});
    REQUIRE_FALSE(runner_.monitor.found_inf);
    for (std::size_t i = 0; i < inputs_.size(); ++i) {
      INFO("input " << i);
      REQUIRE(gx[i].scale == 1.0);
      REQUIRE(gx[i].g.shape() == inputs_[i].shape());
      REQUIRE(any_nonzero(gx[i].g));
      for (std::int64_t j = 0; j < inputs_[i].size(); ++j) compare(gx[i].g[j], inputs_[i][j], false, j);
    }
    for (Parameter* p : layer_.parameters()) {
      INFO("parameter " << p->name);
      const Tensor analytic = p->grad;
      REQUIRE(any_nonzero(analytic));
      for (std::int64_t j = 0; j < p->value.size(); ++j) compare(analytic[j], p->value[j], true, j);
    }
  }

 private:
  LossEval loss() {
    Tensor y;
    runner_.forward(layer_, inputs_, y);
    double l = 0, mag = 0, wsum = 0;
    for (std::int64_t i = 0; i < y.size(); ++i) {
      l += static_cast<double>(w_out_[i]) * y[i];
      mag += std::abs(static_cast<double>(w_out_[i]) * y[i]);
      wsum += std::abs(w_out_[i]);
    }
    // + the double sum of L itself: n·DBL_EPSILON·Σ|w·y|.
    const double n = static_cast<double>(y.size());
    return {l, (opt_.forward_rel + n * DBL_EPSILON) * mag + opt_.forward_abs * wsum};
  }

  // Central difference with the steps actually taken in float; returns the estimate and its noise.
  std::pair<double, double> central(float& v, bool is_param, double h) {
    const float v0 = v;
    const float plus = static_cast<float>(v0 + h), minus = static_cast<float>(v0 - h);
    v = plus;
    if (is_param) layer_.prepare_weights(runner_.precision);
    const LossEval lp = loss();
    v = minus;
    if (is_param) layer_.prepare_weights(runner_.precision);
    const LossEval lm = loss();
    v = v0;
    if (is_param) layer_.prepare_weights(runner_.precision);
    const double step = static_cast<double>(plus) - static_cast<double>(minus);
    return {(lp.value - lm.value) / step, (lp.error + lm.error) / step};
  }

  void compare(float analytic, float& v, bool is_param, std::int64_t j) {
    auto [d, noise] = central(v, is_param, opt_.h);
    double tol = noise;
    if (opt_.smooth) {
      const auto [d2, noise2] = central(v, is_param, opt_.h / 2);
      tol = noise2 + std::abs(d - d2);
      d = d2;
    }
    tol += opt_.grad_rel * std::abs(analytic);
    INFO("element " << j << ": analytic " << analytic << ", finite difference " << d << ", tolerance "
                    << tol);
    CHECK(std::abs(analytic - d) <= tol);
  }

  Layer& layer_;
  std::vector<Tensor> inputs_;
  FdOptions opt_;
  Runner runner_;
  Tensor w_out_;
};

// Exact-by-construction parameters: weights k/8, biases k/4, |k| small.
void set_exact_parameters(Layer& layer, std::uint64_t seed) {
  Rng rng(seed);
  for (Parameter* p : layer.parameters())
    fill_grid(p->value, rng, -8, 8, p->name.find("bias") == std::string::npos ? 0.125 : 0.25);
}

InitSpec kaiming() {
  return InitSpec{};
}

// Naive fp64 convolution; `mag` receives Σ|x·w| + |b| per output element (the scale of its rounding error).
std::vector<double> conv_reference(const Tensor& x, const Tensor& w, const Tensor* b, std::int64_t stride,
                                   std::int64_t pad, std::vector<double>& mag) {
  const std::int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), wd = x.dim(3);
  const std::int64_t o = w.dim(0), k = w.dim(2);
  const std::int64_t ho = (h + 2 * pad - k) / stride + 1, wo = (wd + 2 * pad - k) / stride + 1;
  std::vector<double> y(static_cast<std::size_t>(n * o * ho * wo));
  mag.assign(y.size(), 0.0);
  for (std::int64_t s = 0; s < n; ++s)
    for (std::int64_t oc = 0; oc < o; ++oc)
      for (std::int64_t oh = 0; oh < ho; ++oh)
        for (std::int64_t ow = 0; ow < wo; ++ow) {
          double acc = b ? (*b)[oc] : 0.0, m = b ? std::abs((*b)[oc]) : 0.0;
          for (std::int64_t ic = 0; ic < c; ++ic)
            for (std::int64_t ki = 0; ki < k; ++ki)
              for (std::int64_t kj = 0; kj < k; ++kj) {
                const std::int64_t ih = oh * stride - pad + ki, iw = ow * stride - pad + kj;
                if (ih < 0 || ih >= h || iw < 0 || iw >= wd) continue;
                const double p = static_cast<double>(x[((s * c + ic) * h + ih) * wd + iw]) *
                                 w[((oc * c + ic) * k + ki) * k + kj];
                acc += p;
                m += std::abs(p);
              }
          const auto idx = static_cast<std::size_t>(((s * o + oc) * ho + oh) * wo + ow);
          y[idx] = acc;
          mag[idx] = m;
        }
  return y;
}

template <class Fn>
void require_shape_error_naming(const std::string& name, Fn&& fn) {
  bool thrown = false;
  try {
    fn();
  } catch (const ShapeError& e) {
    thrown = true;
    INFO(e.what());
    CHECK(std::string(e.what()).find("'" + name + "'") != std::string::npos);
  }
  CHECK(thrown);
}

}  // namespace

// ---- backward vs finite differences -----------------------------------------------------------------

TEST_CASE("Linear backward matches finite differences", "[layers]") {
  Rng rng(1);
  for (bool bias : {true, false}) {
    Linear layer("fc", 5, 4, bias, kaiming(), rng);
    set_exact_parameters(layer, 2);
    FdCheck check(layer, {make_grid({3, 5}, 3, -8, 8, 0.25)}, FdOptions{});
    check.run();
  }
}

TEST_CASE("Conv2d backward matches finite differences (stride, padding, no bias)", "[layers]") {
  struct Case {
    std::int64_t kernel, stride, padding;
    bool bias;
    Shape input;
  };
  const std::vector<Case> cases = {{3, 2, 1, true, {2, 2, 6, 5}},
                                   {3, 1, 1, true, {2, 2, 5, 4}},
                                   {2, 1, 0, false, {1, 3, 4, 5}},
                                   {3, 3, 2, true, {2, 1, 7, 6}}};
  Rng rng(4);
  for (const Case& c : cases) {
    INFO("kernel " << c.kernel << " stride " << c.stride << " padding " << c.padding);
    Conv2d layer("conv", c.input[1], 3, c.kernel, c.stride, c.padding, c.bias, kaiming(), rng);
    set_exact_parameters(layer, 5);
    FdCheck check(layer, {make_grid(c.input, 6, -8, 8, 0.25)}, FdOptions{});
    check.run();
  }
}

TEST_CASE("Conv2d sparse backward path matches finite differences", "[layers]") {
  Rng rng(41);
  for (std::int64_t stride : {1, 2}) {
    INFO("stride " << stride);
    Conv2d layer("conv", 8, 3, 3, stride, 1, true, kaiming(), rng);
    layer.set_sparse_backward_density(1.0);  // every sample takes the sparse path
    set_exact_parameters(layer, 42);
    FdCheck check(layer, {make_grid({2, 8, 5, 4}, 43, -8, 8, 0.25)}, FdOptions{});
    check.run();
  }
}

TEST_CASE("Conv2d sparse and dense backward paths give the same bits on exact values", "[layers]") {
  // Grid values keep every product and partial sum exact, so the two summation orders must agree
  // bit for bit; a wrong index in the channels-last patches or the weight permutation cannot.
  struct Case {
    std::int64_t c, o, kernel, stride, pad;
    bool bias;
    Shape hw;
  };
  const std::vector<Case> cases = {{8, 5, 3, 1, 1, true, {7, 6}},
                                   {6, 4, 3, 2, 1, true, {9, 8}},
                                   {16, 3, 2, 1, 0, false, {5, 5}},
                                   {4, 2, 5, 3, 2, true, {11, 10}}};
  const int saved_threads = omp_get_max_threads();
  for (const Case& cs : cases) {
    INFO("C " << cs.c << " kernel " << cs.kernel << " stride " << cs.stride << " pad " << cs.pad);
    Rng rng(44);
    Conv2d conv("conv", cs.c, cs.o, cs.kernel, cs.stride, cs.pad, cs.bias, kaiming(), rng);
    set_exact_parameters(conv, 45);
    const Tensor x = make_grid({5, cs.c, cs.hw[0], cs.hw[1]}, 46, -8, 8, 0.25);
    Shape ys = conv.output_shape({x.shape()});
    // Samples 0, 2, 4: about 80% zeros; samples 1, 3: dense. The default threshold mixes the paths.
    Tensor g = make_grid(ys, 47, -3, 3, 1.0, true);
    Rng keep(48);
    const std::int64_t per_sample = g.size() / 5;
    for (std::int64_t i = 0; i < g.size(); ++i)
      if ((i / per_sample) % 2 == 0 && uniform_below(keep, 5) != 0) g[i] = 0.0f;
    auto run = [&](double density, bool with_input) {
      conv.set_sparse_backward_density(density);
      return conv_gradients(conv, x, g, with_input);
    };
    for (int threads : {1, 2}) {
      INFO(threads << " threads");
      omp_set_num_threads(threads);
      for (bool with_input : {true, false}) {
        INFO("input gradient " << with_input);
        const auto dense = run(0.0, with_input);
        const auto sparse = run(1.0, with_input), mixed = run(Conv2d::kDefaultSparseDensity, with_input);
        REQUIRE(any_nonzero(dense[1]));
        if (with_input) REQUIRE(any_nonzero(dense[0]));
        for (std::size_t k = 0; k < dense.size(); ++k) {
          INFO("output " << k);
          CHECK(same_bits(dense[k], sparse[k]));
          CHECK(same_bits(dense[k], mixed[k]));
        }
      }
    }
  }
  omp_set_num_threads(saved_threads);
}

TEST_CASE("ReLU and Flatten backward match finite differences", "[layers]") {
  // Odd multiples of 1/4: |x| >= 1/4 > h, no step crosses the kink at 0.
  Tensor x = make_grid({2, 3, 2, 2}, 7, -4, 3, 0.25);
  for (std::int64_t i = 0; i < x.size(); ++i) x[i] = x[i] * 2 + 0.25f;
  ReLU relu("relu");
  FdCheck(relu, {x}, FdOptions{}).run();
  Flatten flatten("flatten");
  FdCheck(flatten, {x}, FdOptions{}).run();
}

TEST_CASE("MaxPool2d backward matches finite differences", "[layers]") {
  // Distinct values 1/4 apart (a shuffled ramp): no window has a tie within 2h, argmax is stable.
  const Shape s{2, 2, 5, 6};
  Tensor x(s);
  std::vector<int> perm(static_cast<std::size_t>(x.size()));
  for (std::size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int>(i);
  Rng rng(8);
  for (std::size_t i = perm.size() - 1; i > 0; --i) std::swap(perm[i], perm[uniform_below(rng, i + 1)]);
  for (std::int64_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(perm[static_cast<std::size_t>(i)] - 30) * 0.25f;
  SECTION("kernel 2, stride 2") {
    MaxPool2d pool("pool", 2);
    FdCheck(pool, {x}, FdOptions{}).run();
  }
  SECTION("overlapping windows: kernel 3, stride 2") {
    MaxPool2d pool("pool", 3, 2);
    FdCheck(pool, {x}, FdOptions{}).run();
  }
}

TEST_CASE("GlobalAvgPool backward matches finite differences", "[layers]") {
  // H·W = 6: the mean is rounded once (double sum of exact values, one rounding to fp32), the gradient
  // g/6 once; L is linear in x, so there is no truncation error.
  GlobalAvgPool pool("gap");
  FdOptions opt;
  opt.forward_rel = kU32;
  opt.grad_rel = kU32;
  FdCheck(pool, {make_grid({2, 3, 3, 2}, 9, -8, 8, 0.25)}, opt).run();
}

TEST_CASE("BatchNorm backward matches finite differences (train and eval, 1d and 2d)", "[layers]") {
  // Outputs and gradients are computed in double and rounded once to fp32 (forward_rel, grad_rel = u);
  // double-precision intermediates of O(1) values err by ~1e-15, bounded here by 1e-12 per element.
  // BatchNorm is nonlinear in x (through the batch statistics): the truncation error is estimated.
  FdOptions opt;
  opt.h = 1.0 / 64;
  opt.forward_rel = kU32;
  opt.forward_abs = 1e-12;
  opt.grad_rel = kU32;
  opt.smooth = true;
  auto set_affine = [](BatchNorm& bn, std::uint64_t seed) {
    Rng rng(seed);
    fill_normal(bn.parameters()[0]->value, rng, 0.5, 1.0);
    fill_normal(bn.parameters()[1]->value, rng, 0.5, 0.0);
  };
  SECTION("1d train") {
    BatchNorm bn("bn1", 3);
    set_affine(bn, 10);
    FdCheck(bn, {make_normal({6, 3}, 11, 1.5, 0.5)}, opt).run();
  }
  SECTION("2d train") {
    BatchNorm bn("bn2", 2);
    set_affine(bn, 12);
    FdCheck(bn, {make_normal({2, 2, 3, 2}, 13, 1.0, -0.5)}, opt).run();
  }
  SECTION("2d eval") {
    BatchNorm bn("bn3", 2);
    set_affine(bn, 14);
    auto buffers = bn.buffers();
    REQUIRE(buffers.size() == 2);
    CHECK(buffers[0].first == "bn3.running_mean");
    CHECK(buffers[1].first == "bn3.running_var");
    (*buffers[0].second)[0] = 0.25f;
    (*buffers[0].second)[1] = -1.0f;
    (*buffers[1].second)[0] = 2.0f;
    (*buffers[1].second)[1] = 0.5f;
    opt.smooth = false;  // affine in x with the running statistics
    FdCheck(bn, {make_normal({2, 2, 3, 2}, 15)}, opt, /*training=*/false).run();
  }
}

TEST_CASE("BatchNorm running statistics follow PyTorch", "[layers]") {
  BatchNorm bn("bn", 2, 1e-5, 0.1);
  Precision p;
  bn.prepare_weights(p);
  const Tensor x = make_normal({4, 2, 2, 3}, 16, 2.0, 1.0);
  Tensor y;
  Rng rng(1);
  ForwardContext ctx{p, true, &rng};
  bn.forward({&x}, y, ctx);
  for (std::int64_t c = 0; c < 2; ++c) {
    double sum = 0, ss = 0;
    const int m = 4 * 6;
    for (std::int64_t n = 0; n < 4; ++n)
      for (std::int64_t i = 0; i < 6; ++i) sum += x[(n * 2 + c) * 6 + i];
    const double mean = sum / m;
    for (std::int64_t n = 0; n < 4; ++n)
      for (std::int64_t i = 0; i < 6; ++i) ss += std::pow(x[(n * 2 + c) * 6 + i] - mean, 2);
    // Running values are stored in fp32: one rounding of a double result.
    CHECK(bn.buffers()[0].second->operator[](c) == Approx(0.1 * mean).epsilon(2 * kU32));
    CHECK(bn.buffers()[1].second->operator[](c) == Approx(0.9 + 0.1 * ss / (m - 1)).epsilon(2 * kU32));
    // The training output is normalised per channel (γ = 1, β = 0): mean 0, biased variance 1 − O(eps).
    double ym = 0, yv = 0;
    for (std::int64_t n = 0; n < 4; ++n)
      for (std::int64_t i = 0; i < 6; ++i) ym += y[(n * 2 + c) * 6 + i];
    ym /= m;
    for (std::int64_t n = 0; n < 4; ++n)
      for (std::int64_t i = 0; i < 6; ++i) yv += std::pow(y[(n * 2 + c) * 6 + i] - ym, 2);
    CHECK(std::abs(ym) < 1e-6);
    CHECK(yv / m == Approx(ss / m / (ss / m + 1e-5)).epsilon(1e-6));
  }
  // One value per channel cannot be normalised in training.
  const Tensor single = make_normal({1, 2}, 17);
  require_shape_error_naming("bn", [&] { bn.forward({&single}, y, ctx); });
}

TEST_CASE("Dropout backward matches finite differences with a fixed mask", "[layers]") {
  // p = 1/4: the factor float(4/3) is inexact, so x·f and g·f are rounded once each; linear in x.
  Dropout drop("drop", 0.25);
  FdOptions opt;
  opt.forward_rel = kU32;
  opt.grad_rel = kU32;
  const Tensor x = make_grid({4, 10}, 18, -8, 8, 0.25, true);
  FdCheck(drop, {x}, opt).run();

  // The mask keeps and drops (x is never 0), the same seed gives the same mask, eval is the identity.
  Runner r;
  Tensor y1, y2;
  r.forward(drop, {x}, y1);
  r.forward(drop, {x}, y2);
  CHECK(same_bits(y1, y2));
  int dropped = 0;
  for (std::int64_t i = 0; i < y1.size(); ++i) dropped += y1[i] == 0.0f;
  CHECK(dropped > 0);
  CHECK(dropped < y1.size());
  r.training = false;
  r.forward(drop, {x}, y1);
  CHECK(same_bits(y1, x));
}

TEST_CASE("Add backward matches finite differences and passes the scale to both inputs", "[layers]") {
  Add add("join");
  CHECK(add.num_inputs() == 2);
  FdCheck(add, {make_grid({2, 3, 2}, 19, -8, 8, 0.25), make_grid({2, 3, 2}, 20, -8, 8, 0.25)}, FdOptions{})
      .run();

  Runner r;
  const std::vector<Tensor> in = {make_grid({5}, 21, -8, 8, 1), make_grid({5}, 22, -8, 8, 1)};
  Tensor y;
  r.forward(add, in, y);
  const Tensor g = make_grid({5}, 23, -8, 8, 1);
  const auto gx = r.backward(add, in, y, ScaledGrad{g, 512.0});
  for (const ScaledGrad& s : gx) {
    CHECK(same_bits(s.g, g));
    CHECK(s.scale == 512.0);
  }
}

// ---- forward references ------------------------------------------------------------------------------

TEST_CASE("Linear and Conv2d forward match a naive fp64 reference", "[layers]") {
  // Any summation order of the K products and the bias errs by at most γ_{K+2}·(Σ|x·w| + |b|) with
  // γ_n = n·u/(1 − n·u) (the products' own roundings included).
  auto gamma = [](std::int64_t n) {
    return static_cast<double>(n) * kU32 / (1 - static_cast<double>(n) * kU32);
  };
  Rng rng(24);
  Precision p;
  Rng drop(0);
  ForwardContext ctx{p, true, &drop};
  SECTION("Linear") {
    const std::int64_t in = 300, out = 17, n = 9;
    Linear fc("fc", in, out, true, kaiming(), rng);
    fill_normal(fc.parameters()[1]->value, rng);
    fc.prepare_weights(p);
    const Tensor x = make_normal({n, in}, 25);
    Tensor y({n, out}, std::numeric_limits<float>::quiet_NaN());
    fc.forward({&x}, y, ctx);
    const Tensor& w = fc.parameters()[0]->value;
    const Tensor& b = fc.parameters()[1]->value;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t o = 0; o < out; ++o) {
        double ref = b[o], mag = std::abs(b[o]);
        for (std::int64_t k = 0; k < in; ++k) {
          ref += static_cast<double>(x[i * in + k]) * w[o * in + k];
          mag += std::abs(static_cast<double>(x[i * in + k]) * w[o * in + k]);
        }
        CHECK(std::abs(y[i * out + o] - ref) <= gamma(in + 2) * mag);
      }
  }
  SECTION("Conv2d") {
    struct Case {
      std::int64_t c, o, k, stride, pad;
      Shape input;
    };
    for (const Case& cs : {Case{3, 8, 3, 1, 1, {3, 3, 9, 8}}, Case{4, 5, 3, 2, 1, {2, 4, 9, 10}},
                           Case{2, 3, 1, 2, 0, {2, 2, 7, 7}}}) {
      Conv2d conv("conv", cs.c, cs.o, cs.k, cs.stride, cs.pad, true, kaiming(), rng);
      fill_normal(conv.parameters()[1]->value, rng);
      conv.prepare_weights(p);
      const Tensor x = make_normal(cs.input, 26);
      Tensor y(conv.output_shape({x.shape()}), std::numeric_limits<float>::quiet_NaN());
      conv.forward({&x}, y, ctx);
      std::vector<double> mag;
      const auto ref = conv_reference(x, conv.parameters()[0]->value, &conv.parameters()[1]->value, cs.stride,
                                      cs.pad, mag);
      REQUIRE(static_cast<std::size_t>(y.size()) == ref.size());
      for (std::size_t i = 0; i < ref.size(); ++i) {
        INFO("element " << i << " got " << y[static_cast<std::int64_t>(i)] << " want " << ref[i]);
        CHECK(std::abs(y[static_cast<std::int64_t>(i)] - ref[i]) <= gamma(cs.c * cs.k * cs.k + 2) * mag[i]);
      }
      // Eval mode (columns not kept) gives the same bits.
      Tensor y_eval;
      ForwardContext eval{p, false, &drop};
      conv.forward({&x}, y_eval, eval);
      CHECK(same_bits(y, y_eval));
    }
  }
}

TEST_CASE("Emulated fp16 GEMMs equal quantize(fp32 GEMM of quantized inputs)", "[layers]") {
  // Inputs are integers (|x| <= 63) and master weights are k/64 plus 2^-19, which fp16 rounds away;
  // every product k·x/64 and every sum of K of them is a multiple of 1/64 below 2^17/64: exact in fp32 in
  // any order, while the outputs need up to 17 bits, so the final rounding to fp16 is exercised.
  Precision p;
  p.format = Format::fp16;
  Rng rng(27);
  Rng drop(0);
  ForwardContext ctx{p, true, &drop};
  auto set_master = [](Parameter& param, Rng& r, double unit) {
    for (std::int64_t i = 0; i < param.value.size(); ++i) {
      int k = 0;
      while (k == 0) k = -63 + static_cast<int>(uniform_below(r, 127));
      param.value[i] = static_cast<float>(k * unit + 0x1p-19 * (k > 0 ? 1 : -1));
    }
  };
  auto quantized = [&](const Tensor& t) {
    Tensor q(t.shape());
    quantize(t.data(), q.data(), static_cast<std::size_t>(t.size()), p.format, p.round);
    return q;
  };
  auto check_output = [&](const Tensor& y, const std::vector<double>& ref) {
    REQUIRE(static_cast<std::size_t>(y.size()) == ref.size());
    int rounded = 0;
    for (std::int64_t i = 0; i < y.size(); ++i) {
      REQUIRE_FALSE(std::isnan(y[i]));  // the sentinel was overwritten
      const float fp32 = static_cast<float>(ref[static_cast<std::size_t>(i)]);
      REQUIRE(static_cast<double>(fp32) == ref[static_cast<std::size_t>(i)]);  // exact by construction
      const float want = quantize(fp32, Format::fp16);
      CHECK(y[i] == want);
      rounded += want != fp32;
    }
    CHECK(rounded > 0);
  };
  SECTION("Linear") {
    const std::int64_t in = 32, out = 6, n = 5;
    Linear fc("fc", in, out, true, kaiming(), rng);
    set_master(*fc.parameters()[0], rng, 1.0 / 64);
    set_master(*fc.parameters()[1], rng, 1.0 / 4);
    fc.prepare_weights(p);
    const Tensor x = make_grid({n, in}, 28, -63, 63, 1);
    const Tensor wq = quantized(fc.parameters()[0]->value), bq = quantized(fc.parameters()[1]->value);
    for (std::int64_t i = 0; i < wq.size(); ++i) REQUIRE(wq[i] * 64 == std::round(wq[i] * 64));
    Tensor y({n, out}, std::numeric_limits<float>::quiet_NaN());
    fc.forward({&x}, y, ctx);
    std::vector<double> ref(static_cast<std::size_t>(n * out));
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t o = 0; o < out; ++o) {
        double acc = bq[o];
        for (std::int64_t k = 0; k < in; ++k) acc += static_cast<double>(x[i * in + k]) * wq[o * in + k];
        ref[static_cast<std::size_t>(i * out + o)] = acc;
      }
    check_output(y, ref);
  }
  SECTION("Conv2d") {
    Conv2d conv("conv", 3, 4, 3, 1, 1, true, kaiming(), rng);
    set_master(*conv.parameters()[0], rng, 1.0 / 64);
    set_master(*conv.parameters()[1], rng, 1.0 / 4);
    conv.prepare_weights(p);
    const Tensor x = make_grid({2, 3, 5, 6}, 29, -63, 63, 1);
    Tensor wq = quantized(conv.parameters()[0]->value), bq = quantized(conv.parameters()[1]->value);
    Tensor y(conv.output_shape({x.shape()}), std::numeric_limits<float>::quiet_NaN());
    conv.forward({&x}, y, ctx);
    std::vector<double> mag;
    check_output(y, conv_reference(x, wq, &bq, 1, 1, mag));
  }
}

// ---- scales ------------------------------------------------------------------------------------------

TEST_CASE("A local scale s multiplies the upstream gradient exactly and the scale becomes s·S", "[layers]") {
  Rng rng(30);
  auto run = [](Layer& layer, const Tensor& x, const Tensor& g, double s) {
    Runner r;
    r.monitor.reset(4, false, 0.0);
    layer.set_id(3);
    layer.prepare_weights(r.precision);
    r.scaler.local = s;
    Tensor y;
    r.forward(layer, {x}, y);
    auto gx = r.backward(layer, {x}, y, ScaledGrad{g, 2.0});
    REQUIRE(r.scaler.queries == 1);
    CHECK(r.scaler.last.layer_id == 3);
    CHECK(r.scaler.last.scale_in == 2.0);
    CHECK(r.scaler.last.reduction == layer.reduction_length());
    CHECK(r.scaler.last.grad_size == g.size());
    // The controller saw the fp32 upstream gradient before s was applied.
    REQUIRE(static_cast<std::int64_t>(r.scaler.last_upstream.size()) == gx[0].g.size());
    for (std::int64_t i = 0; i < gx[0].g.size(); ++i)
      CHECK(gx[0].g[i] == static_cast<float>(s) * r.scaler.last_upstream[static_cast<std::size_t>(i)]);
    return gx[0];
  };
  SECTION("Linear") {
    Linear fc("fc", 7, 5, true, kaiming(), rng);
    CHECK(fc.reduction_length() == 5);
    const Tensor x = make_normal({4, 7}, 31), g = make_normal({4, 5}, 32);
    const ScaledGrad one = run(fc, x, g, 1.0), four = run(fc, x, g, 4.0);
    CHECK(one.scale == 2.0);
    CHECK(four.scale == 8.0);
    for (std::int64_t i = 0; i < one.g.size(); ++i) CHECK(four.g[i] == 4.0f * one.g[i]);
  }
  SECTION("Conv2d") {
    Conv2d conv("conv", 2, 3, 3, 2, 1, true, kaiming(), rng);
    CHECK(conv.reduction_length() == 3 * 3 * 3);
    const Tensor x = make_normal({2, 2, 7, 6}, 33), g = make_normal({2, 3, 4, 3}, 34);
    const ScaledGrad one = run(conv, x, g, 1.0), four = run(conv, x, g, 4.0);
    CHECK(one.scale == 2.0);
    CHECK(four.scale == 8.0);
    for (std::int64_t i = 0; i < one.g.size(); ++i) CHECK(four.g[i] == 4.0f * one.g[i]);
  }
}

TEST_CASE("A static power-of-two S gives bit-identical fp32 weight gradients to S = 1", "[layers]") {
  // Multiplying g by 2^e scales every product and partial sum exactly (no overflow or underflow at these
  // magnitudes), and accumulate_weight_grad divides by 2^e exactly: the master gradients agree bit for bit.
  Rng rng(35);
  auto grads = [](Layer& layer, const Tensor& x, const Tensor& g, double scale, Tensor& gx) {
    Runner r;
    r.monitor.reset(1, false, 0.0);
    layer.set_id(0);
    layer.prepare_weights(r.precision);
    for (Parameter* p : layer.parameters()) p->grad.fill(0.0f);
    Tensor y;
    r.forward(layer, {x}, y);
    Tensor gs = g;
    for (std::int64_t i = 0; i < gs.size(); ++i) gs[i] *= static_cast<float>(scale);
    const auto out = r.backward(layer, {x}, y, ScaledGrad{gs, scale});
    CHECK(out[0].scale == scale);
    gx = out[0].g;
    std::vector<Tensor> result;
    for (Parameter* p : layer.parameters()) result.push_back(p->grad);
    return result;
  };
  auto compare = [&](Layer& layer, const Tensor& x, const Tensor& g) {
    Tensor gx1, gxs;
    const auto ref = grads(layer, x, g, 1.0, gx1);
    for (double s : {0x1p-4, 0x1p10, 0x1p16}) {
      INFO("S = " << s);
      const auto got = grads(layer, x, g, s, gxs);
      REQUIRE(got.size() == ref.size());
      for (std::size_t i = 0; i < ref.size(); ++i) {
        REQUIRE(any_nonzero(ref[i]));
        CHECK(same_bits(got[i], ref[i]));
      }
      for (std::int64_t i = 0; i < gx1.size(); ++i) CHECK(gxs[i] == static_cast<float>(s) * gx1[i]);
    }
  };
  SECTION("Linear") {
    Linear fc("fc", 40, 12, true, kaiming(), rng);
    compare(fc, make_normal({16, 40}, 36), make_normal({16, 12}, 37));
  }
  SECTION("Conv2d") {
    Conv2d conv("conv", 3, 6, 3, 1, 1, true, kaiming(), rng);
    compare(conv, make_normal({5, 3, 8, 8}, 38), make_normal({5, 6, 8, 8}, 39));
  }
}

// ---- found_inf ---------------------------------------------------------------------------------------

TEST_CASE("Non-finite gradients set found_inf and name the first layer in backward order", "[layers]") {
  Rng rng(40);
  SECTION("an inf in the incoming gradient of Linear") {
    Runner r;
    r.monitor.reset(8, true, 0.0);
    Linear fc("fc", 3, 2, true, kaiming(), rng);
    fc.set_id(6);
    fc.prepare_weights(r.precision);
    const Tensor x = make_normal({2, 3}, 41);
    Tensor y;
    r.forward(fc, {x}, y);
    Tensor g = make_normal({2, 2}, 42);
    g[1] = std::numeric_limits<float>::infinity();
    r.backward(fc, {x}, y, ScaledGrad{g, 1.0});
    CHECK(r.monitor.found_inf);
    CHECK(r.monitor.first_nonfinite_layer == 6);
    CHECK(r.monitor.records[6].activation_grad.nonfinite > 0);
  }
  SECTION("fp16 overflow of the upstream and weight gradients; the first layer in backward order wins") {
    // g = 49152 is exact in fp16; g·W = 98304 and x·g = 196608 exceed 65504 and round to inf.
    Runner r(Format::fp16);
    r.monitor.reset(8, true, 0.0);
    Linear first("first", 1, 1, false, kaiming(), rng), second("second", 1, 1, false, kaiming(), rng);
    first.set_id(2);
    second.set_id(5);
    for (Linear* l : {&first, &second}) {
      l->parameters()[0]->value[0] = 2.0f;
      l->prepare_weights(r.precision);
    }
    Tensor x({1, 1}, 0.5f), y;
    const Tensor g({1, 1}, 49152.0f);
    r.forward(second, {x}, y);
    const auto gx =
        r.backward(second, {x}, y, ScaledGrad{g, 1.0});  // upstream overflows, weight grad does not
    CHECK(std::isinf(gx[0].g[0]));
    CHECK(r.monitor.found_inf);
    CHECK(r.monitor.first_nonfinite_layer == 5);
    CHECK(r.monitor.records[5].activation_grad.overflow == 1);
    CHECK(std::isfinite(second.parameters()[0]->grad[0]));
    x[0] = 4.0f;
    r.forward(first, {x}, y);
    r.backward(first, {x}, y, ScaledGrad{g, 1.0}, /*skip_inputs=*/true);  // weight gradient overflows
    CHECK(std::isinf(first.parameters()[0]->grad[0]));
    CHECK(r.monitor.first_nonfinite_layer == 5);  // still the first one seen

    r.monitor.reset(8, false, 0.0);
    r.backward(first, {x}, y, ScaledGrad{g, 1.0}, true);
    CHECK(r.monitor.found_inf);
    CHECK(r.monitor.first_nonfinite_layer == 2);
  }
  SECTION("fp16 overflow in a rounding non-parametric layer (Dropout's 1/(1 − p))") {
    Runner r(Format::fp16);
    r.monitor.reset(2, false, 0.0);
    Dropout drop("drop", 0.5);
    drop.set_id(1);
    const Tensor x({1, 64}, 1.0f), g({1, 64}, 49152.0f);  // kept values become 98304 -> inf
    Tensor y;
    r.forward(drop, {x}, y);
    r.backward(drop, {x}, y, ScaledGrad{g, 1.0});
    CHECK(r.monitor.found_inf);
    CHECK(r.monitor.first_nonfinite_layer == 1);
  }
  SECTION("a finite fp16 backward leaves found_inf clear") {
    Runner r(Format::fp16);
    r.monitor.reset(1, false, 0.0);
    Conv2d conv("conv", 1, 2, 3, 1, 1, true, kaiming(), rng);
    conv.set_id(0);
    conv.prepare_weights(r.precision);
    const Tensor x = make_grid({2, 1, 4, 4}, 43, -4, 4, 0.25), g = make_grid({2, 2, 4, 4}, 44, -4, 4, 0.25);
    Tensor y;
    r.forward(conv, {x}, y);
    r.backward(conv, {x}, y, ScaledGrad{g, 1.0});
    CHECK_FALSE(r.monitor.found_inf);
    CHECK(r.monitor.first_nonfinite_layer == -1);
  }
}

// ---- errors, determinism ------------------------------------------------------------------------------

TEST_CASE("Shape errors name the layer", "[layers]") {
  Rng rng(45);
  Linear fc("fc_bad", 4, 2, true, kaiming(), rng);
  Conv2d conv("conv_bad", 3, 2, 3, 1, 0, true, kaiming(), rng);
  MaxPool2d pool("pool_bad", 2);
  GlobalAvgPool gap("gap_bad");
  BatchNorm bn("bn_bad", 3);
  Add add("add_bad");
  require_shape_error_naming("fc_bad", [&] { fc.output_shape({{2, 5}}); });
  require_shape_error_naming("conv_bad", [&] { conv.output_shape({{2, 2, 5, 5}}); });
  require_shape_error_naming("conv_bad", [&] { conv.output_shape({{2, 3, 5}}); });
  require_shape_error_naming("conv_bad", [&] { conv.output_shape({{2, 3, 2, 5}}); });
  require_shape_error_naming("pool_bad", [&] { pool.output_shape({{2, 3, 1, 5}}); });
  require_shape_error_naming("gap_bad", [&] { gap.output_shape({{2, 3}}); });
  require_shape_error_naming("bn_bad", [&] { bn.output_shape({{2, 4}}); });
  require_shape_error_naming("add_bad", [&] { add.output_shape({{2, 3}, {2, 4}}); });
  require_shape_error_naming("add_bad", [&] { add.output_shape({{2, 3}}); });
  // Through forward as well.
  Runner r;
  conv.prepare_weights(r.precision);
  Tensor y;
  require_shape_error_naming("conv_bad", [&] { r.forward(conv, {Tensor({1, 2, 5, 5})}, y); });
  require_shape_error_naming("add_bad", [&] { r.forward(add, {Tensor({3}), Tensor({4})}, y); });
  // Configuration errors name the layer too.
  CHECK_THROWS_AS(Conv2d("c", 0, 2, 3, 1, 0, true, kaiming(), rng), ConfigError);
  CHECK_THROWS_AS(MaxPool2d("p", 0), ConfigError);
  CHECK_THROWS_AS(Dropout("d", 1.0), ConfigError);
  CHECK_THROWS_AS(BatchNorm("b", 2, 0.0), ConfigError);
}

TEST_CASE("MaxPool2d routes ties to the first maximum", "[layers]") {
  MaxPool2d pool("pool", 2);
  Runner r;
  const Tensor x({1, 1, 2, 2}, 3.0f);
  Tensor y;
  r.forward(pool, {x}, y);
  const auto gx = r.backward(pool, {x}, y, ScaledGrad{Tensor({1, 1, 1, 1}, 5.0f), 8.0});
  CHECK(gx[0].g[0] == 5.0f);
  CHECK(gx[0].g[1] == 0.0f);
  CHECK(gx[0].g[2] == 0.0f);
  CHECK(gx[0].g[3] == 0.0f);
  CHECK(gx[0].scale == 8.0);
}

TEST_CASE("Conv2d backward is bit-deterministic and skips the upstream gradient of a first layer",
          "[layers]") {
  Rng rng(46);
  Conv2d conv("conv", 4, 8, 3, 1, 1, true, kaiming(), rng);
  const Tensor x = make_normal({6, 4, 9, 9}, 47), g = make_normal({6, 8, 9, 9}, 48);
  // The forward mode (training or not) must not change what backward computes.
  auto run = [&](bool with_input, bool training_forward) {
    return conv_gradients(conv, x, g, with_input, training_forward);
  };
  const int saved_threads = omp_get_max_threads();
  for (int threads : {1, 2}) {
    INFO(threads << " threads");
    omp_set_num_threads(threads);
    const auto a = run(true, true), b = run(true, true), c = run(true, false);
    for (std::size_t i = 0; i < a.size(); ++i) {
      CHECK(same_bits(a[i], b[i]));
      CHECK(same_bits(a[i], c[i]));
    }
    const auto first = run(false, true);
    CHECK(first[0].empty());
    for (std::size_t i = 1; i < a.size(); ++i) CHECK(same_bits(a[i], first[i]));
  }
  omp_set_num_threads(saved_threads);
}
