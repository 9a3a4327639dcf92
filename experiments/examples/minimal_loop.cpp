// The README's example: a small residual network of gradscale layers trained in fp16 by a loop of its
// own, with per-layer adaptive loss scaling. The lines between the "README begin/end" markers are the
// README's C++ excerpt, verbatim (tests/test_api.cpp checks it); docs/api.md shows the whole file.
// residual_fashion_mnist.cpp is the full version (own data feed, trace, save/resume).
#include <gradscale/gradscale.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

namespace gs = gradscale;

int main(int argc, char** argv) {
  const long long steps = argc > 1 ? std::atoll(argv[1]) : 200;

  // A network: conv -> ReLU -> [conv] + shortcut -> flatten -> linear, for 1x28x28 images. Input sizes
  // come from the graph at finalize, which draws the weights from `rng`.
  gs::Rng rng(0);
  gs::Model net("minimal");
  const auto conv3x3 = gs::Conv2d::Options{}.out_channels(8).kernel(3).padding(1);
  const int conv = net.add(std::make_unique<gs::Conv2d>("conv", gs::Conv2d::Options{conv3x3}.stride(2)),
                           {gs::Model::kModelInput});
  const int relu = net.add(std::make_unique<gs::ReLU>("relu"), {conv});
  const int res = net.add(std::make_unique<gs::Conv2d>("res", conv3x3), {relu});
  const int add = net.add(std::make_unique<gs::Add>("add"), {res, relu});
  const int flat = net.add(std::make_unique<gs::Flatten>("flatten"), {add});
  net.add(std::make_unique<gs::Linear>("fc", gs::Linear::Options{}.out_features(10)), {flat});
  net.finalize({1, 28, 28}, rng);

  // The data, an optimizer and a precision.
  const gs::DataSplit data = gs::load_data("fashion-mnist", 0);  // synthetic when the files are absent
  gs::Batcher batches(data.train, 64, 0);
  gs::Tensor x;
  std::vector<std::int32_t> y;
  std::unique_ptr<gs::Optimizer> adam = gs::make_optimizer({{"name", "adam"}});
  gs::Precision fp16;
  fp16.format = gs::Format::fp16;

  // A scaler attached in one call, then the loop: forward, the loss with an explicit scale, backward
  // with per-layer scales, apply or skip.
  // README begin
  gs::ScaledTraining training(
      net, *adam, fp16,
      {{"policy", "adaptive"}, {"method", "measured"}, {"init_scale", "auto"}, {"cast_form", "measured"},
       {"bounds", "derived"}});
  for (long long i = 0; i < steps; ++i) {
    if (!batches.next(x, y)) batches.next(x, y);  // the end of an epoch: start the next
    training.begin_step(i + 1 == steps);          // full statistics on the last step
    const gs::Tensor& logits = training.forward(x);
    const double s0 = training.loss_scale(logits, y);  // S0: an argument, not a global
    training.loss_backward(logits, y, s0);             // backward with a scale per layer
    const gs::StepResult r = training.step(1e-3);      // apply, or skip on an overflow
    if (r.step % 50 == 0)
      std::printf("step %lld  loss %.3f  S0 %g  skipped %s\n", static_cast<long long>(r.step), r.loss,
                  r.loss_scale, r.skipped ? "yes" : "no");
  }
  // README end
  // Per layer: the local scale s, the accumulated scale received and sent (s * S_in), and the fraction
  // of the gradient sent upstream that still underflowed in fp16 (statistics of the last step).
  for (const gs::LayerScale& l : training.layer_scales())
    if (l.parametric && l.sent)
      std::printf("%-3s s %-3g S_in %-4g S_out %-5g underflow %.2e\n", l.name.c_str(), l.s, l.scale_in,
                  l.scale_out, l.underflow_rate);
  return 0;
}
