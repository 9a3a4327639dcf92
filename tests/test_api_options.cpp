// The API a user's own program meets: threads without <omp.h>, the evaluation helper
// against the loop every user wrote around predict, and layers built by named options with their input
// sizes inferred at finalize (the same weights as the positional constructors).
#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <Eigen/Core>

#include <gradscale/gradscale.h>

#include "tests/weight_bits.h"
#include "tests/precision_fp16.h"

using namespace gradscale;
using gradscale::testing::fp16;
using gradscale::testing::weight_bits;
using json = nlohmann::json;
using Catch::Matchers::Contains;

namespace {

// conv → BatchNorm → ReLU → max-pool → [conv] + shortcut → flatten → linear, by positional constructors.
std::unique_ptr<Model> positional_net(std::uint64_t seed) {
  Rng rng(seed);
  const InitSpec init;
  auto net = std::make_unique<Model>();
  const int c1 = net->add(std::make_unique<Conv2d>("c1", 1, 4, 3, 1, 1, false, init, rng), {Model::kModelInput});
  const int bn = net->add(std::make_unique<BatchNorm>("bn", 4), {c1});
  const int r1 = net->add(std::make_unique<ReLU>("r1"), {bn});
  const int p1 = net->add(std::make_unique<MaxPool2d>("p1", 2), {r1});
  const int c2 = net->add(std::make_unique<Conv2d>("c2", 4, 4, 3, 1, 1, true, init, rng), {p1});
  const int j = net->add(std::make_unique<Add>("j"), {c2, p1});
  const int f = net->add(std::make_unique<Flatten>("f"), {j});
  net->add(std::make_unique<Linear>("fc", 4 * 14 * 14, 10, true, init, rng), {f});
  net->finalize({1, 28, 28});
  return net;
}

// The same network by named options: no input size anywhere, the weights drawn at finalize.
std::unique_ptr<Model> options_net(std::uint64_t seed) {
  Rng rng(seed);
  auto net = std::make_unique<Model>("options-net");
  const int c1 = net->add(std::make_unique<Conv2d>("c1", Conv2d::Options{}.out_channels(4).kernel(3).padding(1).bias(false)),
                          {Model::kModelInput});
  const int bn = net->add(std::make_unique<BatchNorm>("bn", BatchNorm::Options{}), {c1});
  const int r1 = net->add(std::make_unique<ReLU>("r1"), {bn});
  const int p1 = net->add(std::make_unique<MaxPool2d>("p1", 2), {r1});
  const int c2 = net->add(std::make_unique<Conv2d>("c2", Conv2d::Options{}.out_channels(4).kernel(3).padding(1)), {p1});
  const int j = net->add(std::make_unique<Add>("j"), {c2, p1});
  const int f = net->add(std::make_unique<Flatten>("f"), {j});
  net->add(std::make_unique<Linear>("fc", Linear::Options{}.out_features(10)), {f});
  net->finalize({1, 28, 28}, rng);
  return net;
}

}  // namespace

TEST_CASE("set_threads: the engine's thread count without <omp.h>, and bad counts refused", "[api][threads]") {
  const int saved = threads();
  set_threads(1);
  CHECK(threads() == 1);
  CHECK(Eigen::nbThreads() == 1);
  set_threads(2);
  CHECK(threads() == 2);
  CHECK(Eigen::nbThreads() == 2);
  set_threads(0);  // every core
  CHECK(threads() >= 1);
  CHECK_THROWS_WITH(set_threads(-1), Contains("threads must be in [0, 1024]") && Contains("got -1"));
  CHECK_THROWS_AS(set_threads(5000), ConfigError);
  set_threads(saved);
}

TEST_CASE("layers by named options: sizes inferred at finalize, the positional constructors' weights",
          "[api][layers]") {
  std::unique_ptr<Model> a = positional_net(11), b = options_net(11);
  REQUIRE(a->num_parameters() == b->num_parameters());
  CHECK(weight_bits(*a) == weight_bits(*b));  // the same draws, in layer order
  CHECK(a->layer_table() == b->layer_table());
  CHECK(b->name() == "options-net");
  CHECK(a->name().empty());

  // The same logits for the same images, in training mode (BatchNorm on batch statistics).
  const DataSplit data = load_data("synthetic:64", 3);
  Tensor x({8, 1, 28, 28});
  std::copy_n(data.train.images.data(), x.size(), x.data());
  const Precision p = fp16();
  ForwardContext ctx{p, true, nullptr};
  a->prepare_weights(p);
  b->prepare_weights(p);
  const Tensor ya = a->forward(x, ctx);
  const Tensor& yb = b->forward(x, ctx);
  REQUIRE(ya.shape() == yb.shape());
  CHECK(std::equal(ya.data(), ya.data() + ya.size(), yb.data()));
}

TEST_CASE("layers by named options: what is missing or wrong is named", "[api][layers]") {
  CHECK_THROWS_WITH(Conv2d("c", Conv2d::Options{}.kernel(3)), Contains("layer 'c'") && Contains("out_channels"));
  CHECK_THROWS_WITH(Conv2d("c", Conv2d::Options{}.out_channels(4)), Contains("layer 'c'") && Contains("kernel"));
  CHECK_THROWS_WITH(Conv2d("c", Conv2d::Options{}.out_channels(4).kernel(3).stride(0)), Contains("stride"));
  CHECK_THROWS_WITH(Linear("fc", Linear::Options{}), Contains("layer 'fc'") && Contains("out_features"));
  CHECK_THROWS_WITH(Linear("fc", Linear::Options{}.in_features(-2).out_features(3)), Contains("in_features"));
  CHECK_THROWS_WITH(BatchNorm("bn", BatchNorm::Options{}.momentum(2)), Contains("momentum"));

  // Weights drawn at finalize need a generator there.
  Model m;
  const int f = m.add(std::make_unique<Flatten>("f"), {Model::kModelInput});
  m.add(std::make_unique<Linear>("fc", Linear::Options{}.out_features(10)), {f});
  CHECK_THROWS_WITH(m.finalize({1, 28, 28}), Contains("layer 'fc'") && Contains("Model::finalize(shape, rng)"));

  // A given input size that the graph contradicts.
  Rng rng(1);
  Model wrong;
  const int g = wrong.add(std::make_unique<Flatten>("f"), {Model::kModelInput});
  wrong.add(std::make_unique<Linear>("fc", Linear::Options{}.in_features(100).out_features(10)), {g});
  CHECK_THROWS_AS(wrong.finalize({1, 28, 28}, rng), ShapeError);
  Model conv_wrong;
  conv_wrong.add(std::make_unique<Conv2d>("c", Conv2d::Options{}.in_channels(3).out_channels(10).kernel(28)),
                 {Model::kModelInput});
  CHECK_THROWS_WITH(conv_wrong.finalize({1, 28, 28}, rng), Contains("layer 'c'") && Contains("[N, 3, H, W]"));
}

TEST_CASE("evaluate: the loss and accuracy of the loop users wrote around predict, batch by batch", "[api][eval]") {
  std::unique_ptr<Model> net = options_net(5);
  std::unique_ptr<Optimizer> adam = make_optimizer({{"name", "adam"}});
  ScaledTraining t(*net, *adam, fp16(), json{{"policy", "adaptive"}, {"method", "measured"}, {"init_scale", "auto"}}, 5);
  const DataSplit data = load_data("synthetic:256", 5);
  Batcher batches(data.train, 32, 5);
  Tensor x;
  std::vector<std::int32_t> y;
  for (int i = 0; i < 6 && batches.next(x, y); ++i) {
    t.begin_step();
    const Tensor& logits = t.forward(x);
    t.loss_backward(logits, y, t.loss_scale(logits, y));
    t.step(1e-3);
  }

  // The reference: the twenty lines of experiments/examples before this helper, batches of 25.
  const Dataset& split = data.test;
  const std::int64_t per_image = split.images.size() / split.size(), chunk = 25;
  double loss_sum = 0;
  std::int64_t correct = 0;
  for (std::int64_t at = 0; at < split.size(); at += chunk) {
    const std::int64_t b = std::min(chunk, split.size() - at);
    Shape shape = split.images.shape();
    shape[0] = b;
    Tensor xb(shape);
    std::copy_n(split.images.data() + at * per_image, b * per_image, xb.data());
    const LossResult r = softmax_cross_entropy(t.predict(xb), split.labels.data() + at, 1.0, t.precision(),
                                               nullptr, nullptr, -1);
    loss_sum += r.loss * static_cast<double>(b);
    correct += r.correct;
  }
  const auto n = static_cast<double>(split.size());

  const Evaluation e = evaluate(t, split, 25);
  CHECK(e.samples == split.size());
  CHECK(e.correct == correct);
  CHECK(e.accuracy == static_cast<double>(correct) / n);
  CHECK(e.loss == Approx(loss_sum / n).epsilon(1e-12));
  CHECK(e.correct > 0);
  // Another batch size: the same predictions (BatchNorm in evaluation mode works per sample).
  const Evaluation whole = evaluate(t, split.images, split.labels, 1000);
  CHECK(whole.correct == e.correct);
  CHECK(whole.loss == Approx(e.loss).epsilon(1e-6));
  // It changed no training state: the next step is the one it would have been.
  CHECK(t.steps() == 6);

  CHECK_THROWS_WITH(evaluate(t, split, 0), Contains("batch must be >= 1"));
  std::vector<std::int32_t> short_labels(split.labels.begin(), split.labels.begin() + 3);
  CHECK_THROWS_WITH(evaluate(t, split.images, short_labels), Contains("3 labels") && Contains("one label per image"));
  t.begin_step();
  CHECK_THROWS_WITH(evaluate(t, split), Contains("inside an iteration"));
}
