// Helpers shared by the tests of lib/layers (tests/test_layers_*.cpp): exact-by-construction inputs, a
// runner of one layer's forward and backward with explicit contexts, a test scaler, the central
// finite-difference check of a backward, and a naive fp64 convolution.
#pragma once

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

namespace gradscale::test::layers_fixtures {

inline constexpr double kU32 = FLT_EPSILON / 2;  // unit roundoff of fp32: one rounding errs by at most u·|v|
inline constexpr std::uint64_t kMaskSeed =
    77;  // every forward of a check reseeds here: Dropout's mask stays fixed

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
  nlohmann::json config() const override { return nlohmann::json::object(); }
  nlohmann::json state() const override { return nlohmann::json::object(); }
  void restore_state(const nlohmann::json&) override {}
};

// Values k·unit with k uniform in [lo, hi] (never 0 when `nonzero`): exact in fp32 and small enough that
// every sum of products the tests form stays exact.
inline void fill_grid(Tensor& t, Rng& rng, int lo, int hi, double unit, bool nonzero = false) {
  for (std::int64_t i = 0; i < t.size(); ++i) {
    int k = 0;
    do {
      k = lo + static_cast<int>(uniform_below(rng, static_cast<std::uint64_t>(hi - lo + 1)));
    } while (nonzero && k == 0);
    t[i] = static_cast<float>(k * unit);
  }
}

inline void fill_normal(Tensor& t, Rng& rng, double sigma = 1.0, double mean = 0.0) {
  for (std::int64_t i = 0; i < t.size(); ++i) t[i] = static_cast<float>(mean + sigma * standard_normal(rng));
}

inline Tensor make_grid(const Shape& s, std::uint64_t seed, int lo, int hi, double unit,
                        bool nonzero = false) {
  Tensor t(s);
  Rng rng(seed);
  fill_grid(t, rng, lo, hi, unit, nonzero);
  return t;
}

inline Tensor make_normal(const Shape& s, std::uint64_t seed, double sigma = 1.0, double mean = 0.0) {
  Tensor t(s);
  Rng rng(seed);
  fill_normal(t, rng, sigma, mean);
  return t;
}

inline std::vector<const Tensor*> pointers(const std::vector<Tensor>& ts) {
  std::vector<const Tensor*> p;
  for (const Tensor& t : ts) p.push_back(&t);
  return p;
}

inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(float)) == 0;
}

inline bool any_nonzero(const Tensor& t) {
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
inline std::vector<Tensor> conv_gradients(Conv2d& conv, const Tensor& x, const Tensor& g, bool with_input,
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
inline void set_exact_parameters(Layer& layer, std::uint64_t seed) {
  Rng rng(seed);
  for (Parameter* p : layer.parameters())
    fill_grid(p->value, rng, -8, 8, p->name.find("bias") == std::string::npos ? 0.125 : 0.25);
}

inline InitSpec kaiming() {
  return InitSpec{};
}

// Naive fp64 convolution; `mag` receives Σ|x·w| + |b| per output element (the scale of its rounding error).
inline std::vector<double> conv_reference(const Tensor& x, const Tensor& w, const Tensor* b,
                                          std::int64_t stride, std::int64_t pad, std::vector<double>& mag) {
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

}  // namespace gradscale::test::layers_fixtures
