// A worked example of gradscale from outside the library: a small residual network defined here in C++,
// this program's own data feed and training loop, per-layer adaptive loss scaling (`measured`, with S0
// chosen every step from the loss gradient), a trace of every layer's scales, and the scales printed at
// the end. It builds against the installed package (CMakeLists.txt next to it; docs/api.md).
//
//   residual_fashion_mnist [--steps 300] [--batch 64] [--lr 0.001] [--format fp16] [--threads 0]
//                          [--data fashion-mnist] [--seed 0] [--trace PATH] [--save DIR] [--resume DIR]
#include <gradscale/gradscale.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

namespace gs = gradscale;

namespace {

struct Options {
  std::int64_t steps = 300, batch = 64;
  double lr = 1e-3;
  std::string format = "fp16", data = "fashion-mnist", trace = "residual_trace", save, resume;
  int threads = 0;
  std::uint64_t seed = 0;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string key = argv[i];
    if (i + 1 >= argc) throw gs::ConfigError("option " + key + " needs a value");
    const std::string value = argv[++i];
    if (key == "--steps")
      o.steps = std::stoll(value);
    else if (key == "--batch")
      o.batch = std::stoll(value);
    else if (key == "--lr")
      o.lr = std::stod(value);
    else if (key == "--format")
      o.format = value;
    else if (key == "--threads")
      o.threads = std::stoi(value);
    else if (key == "--data")
      o.data = value;
    else if (key == "--seed")
      o.seed = std::stoull(value);
    else if (key == "--trace")
      o.trace = value;
    else if (key == "--save")
      o.save = value;
    else if (key == "--resume")
      o.resume = value;
    else
      throw gs::ConfigError("unknown option " + key);
  }
  if (o.steps < 1 || o.batch < 1) throw gs::ConfigError("--steps and --batch must be >= 1");
  return o;
}

// conv 1->16 → ReLU → max-pool 2 → [conv 16->16 → ReLU → conv 16->16] + shortcut → ReLU → max-pool 2 →
// flatten → linear 784->10. The shortcut makes a fork: its two gradients meet at the join of SPEC §5.
// The layers are given by named options; their input sizes come from the graph at finalize, which draws
// the weights (Kaiming normal, gain √2) from `seed` in layer order.
std::unique_ptr<gs::Model> residual_network(std::uint64_t seed) {
  gs::Rng rng(seed);
  auto net = std::make_unique<gs::Model>("residual-example");  // the name traces show
  const auto conv3x3 = gs::Conv2d::Options{}.out_channels(16).kernel(3).padding(1);
  const int in = gs::Model::kModelInput;
  const int conv1 = net->add(std::make_unique<gs::Conv2d>("conv1", conv3x3), {in});
  const int relu1 = net->add(std::make_unique<gs::ReLU>("relu1"), {conv1});
  const int pool1 = net->add(std::make_unique<gs::MaxPool2d>("pool1", 2), {relu1});
  const int conv2 = net->add(std::make_unique<gs::Conv2d>("block.conv1", conv3x3), {pool1});
  const int relu2 = net->add(std::make_unique<gs::ReLU>("block.relu"), {conv2});
  const int conv3 = net->add(std::make_unique<gs::Conv2d>("block.conv2", conv3x3), {relu2});
  const int join = net->add(std::make_unique<gs::Add>("block.add"), {conv3, pool1});
  const int relu3 = net->add(std::make_unique<gs::ReLU>("block.out"), {join});
  const int pool2 = net->add(std::make_unique<gs::MaxPool2d>("pool2", 2), {relu3});
  const int flat = net->add(std::make_unique<gs::Flatten>("flatten"), {pool2});
  net->add(std::make_unique<gs::Linear>("fc", gs::Linear::Options{}.out_features(10)), {flat});
  net->finalize({1, 28, 28}, rng);
  return net;
}

// The data feed: a new shuffle of the training set every epoch, drawn from (seed, epoch), so that a
// resumed run (epoch, position) continues with exactly the batches it would have seen.
class Feed {
 public:
  Feed(const gs::Dataset& data, std::int64_t batch, std::uint64_t seed)
      : data_(data), batch_(batch), seed_(seed) {}
  void next(gs::Tensor& x, std::vector<std::int32_t>& y) {
    if (order_.empty() || position_ >= data_.size()) {
      if (!order_.empty()) ++epoch_, position_ = 0;
      shuffle();
    }
    const std::int64_t b = std::min(batch_, data_.size() - position_);
    const std::int64_t per_image = data_.images.size() / data_.size();
    gs::Shape shape = data_.images.shape();
    shape[0] = b;
    x.resize(shape);
    y.resize(static_cast<std::size_t>(b));
    for (std::int64_t i = 0; i < b; ++i) {
      const std::int64_t k = order_[static_cast<std::size_t>(position_ + i)];
      std::copy_n(data_.images.data() + k * per_image, per_image, x.data() + i * per_image);
      y[static_cast<std::size_t>(i)] = data_.labels[static_cast<std::size_t>(k)];
    }
    position_ += b;
  }
  std::int64_t epoch() const { return epoch_; }
  nlohmann::json state() const { return {{"epoch", epoch_}, {"position", position_}}; }
  void restore(const nlohmann::json& s) {
    epoch_ = s.at("epoch");
    position_ = s.at("position");
    shuffle();
  }

 private:
  void shuffle() {
    order_.resize(static_cast<std::size_t>(data_.size()));
    std::iota(order_.begin(), order_.end(), std::int64_t{0});
    gs::Rng rng(seed_ * 1000003u + static_cast<std::uint64_t>(epoch_));
    for (std::size_t i = order_.size(); i > 1; --i)  // Fisher–Yates with an unbiased draw
      std::swap(order_[i - 1], order_[gs::uniform_below(rng, i)]);
  }
  const gs::Dataset& data_;
  std::int64_t batch_;
  std::uint64_t seed_;
  std::int64_t epoch_ = 0, position_ = 0;
  std::vector<std::int64_t> order_;
};

// What the run adds up, saved with a checkpoint so that a resumed run's totals (and trace) continue.
struct Totals {
  std::int64_t skipped = 0, correct = 0, seen = 0;
  double loss_sum = 0, scaler_seconds = 0, wall_seconds = 0;
  nlohmann::json to_json() const {
    return {{"skipped", skipped},
            {"correct", correct},
            {"seen", seen},
            {"loss_sum", loss_sum},
            {"scaler_seconds", scaler_seconds},
            {"wall_seconds", wall_seconds}};
  }
  static Totals from_json(const nlohmann::json& j) {
    Totals t;
    t.skipped = j.at("skipped");
    t.correct = j.at("correct");
    t.seen = j.at("seen");
    t.loss_sum = j.at("loss_sum");
    t.scaler_seconds = j.at("scaler_seconds");
    t.wall_seconds = j.at("wall_seconds");
    return t;
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run(const Options& o) {
  const auto start = std::chrono::steady_clock::now();
  if (o.threads > 0) gs::set_threads(o.threads);
  const gs::DataSplit data = gs::load_data(o.data, o.seed);
  std::cout << "gradscale " << gs::kVersion << ", data: " << data.source << "\n";

  // The network, its optimizer and the precision it trains in; then the scaler, attached in one call.
  std::unique_ptr<gs::Model> net = residual_network(o.seed);
  std::unique_ptr<gs::Optimizer> adam = gs::make_optimizer({{"name", "adam"}});
  gs::Precision precision;
  precision.format = gs::parse_format(o.format);
  gs::ScaledTraining training(*net, *adam, precision,
                              {{"policy", "adaptive"}, {"method", "measured"}, {"init_scale", "auto"},
                               {"cast_form", "measured"}},
                              o.seed);

  Feed feed(data.train, o.batch, o.seed);
  Totals totals;
  if (!o.resume.empty()) {
    const nlohmann::json saved = training.load(o.resume);  // model, optimizer, scaler, step count
    feed.restore(saved.at("feed"));
    totals = Totals::from_json(saved.at("totals"));
    std::cout << "resumed from " << o.resume << " at step " << training.steps() << "\n";
  }
  const nlohmann::json run_config = {{"batch", o.batch}, {"lr", o.lr}, {"data", o.data}};  // the model names itself
  gs::TraceWriter trace(o.trace, training.trace_header(run_config), /*every=*/10, /*histograms=*/false,
                        o.resume.empty() ? -1 : training.steps());

  gs::Tensor x;
  std::vector<std::int32_t> y;
  double window_loss = 0;
  std::int64_t window = 0;
  while (training.steps() < o.steps) {
    feed.next(x, y);
    const bool last = training.steps() + 1 == o.steps;
    training.begin_step(trace.samples(training.steps() + 1) || last);  // full statistics on traced steps
    const gs::Tensor& logits = training.forward(x);
    const double s0 = training.loss_scale(logits, y);  // chosen from the fp32 loss gradient ("auto")
    training.loss_backward(logits, y, s0);
    const gs::StepResult r = training.step(o.lr);
    totals.skipped += r.skipped;
    totals.correct += r.correct;
    totals.seen += static_cast<std::int64_t>(y.size());
    totals.loss_sum += r.loss * static_cast<double>(y.size());
    totals.scaler_seconds += r.scaler_seconds;
    window_loss += r.loss;
    ++window;
    trace.write_step({r.step, feed.epoch() + 1, r.loss, r.loss_scale, r.phi, r.skipped}, training.monitor());
    if (r.step % 50 == 0 || last) {
      std::printf("step %4lld  loss %.4f  S0 %-8g  phi %g  skipped %lld\n", static_cast<long long>(r.step),
                  window_loss / static_cast<double>(window), r.loss_scale, r.phi,
                  static_cast<long long>(totals.skipped));
      window_loss = 0;
      window = 0;
    }
  }

  const gs::Evaluation test = gs::evaluate(training, data.test);  // evaluation mode, 1000 images at a time
  totals.wall_seconds += seconds_since(start);
  const double seen = static_cast<double>(std::max<std::int64_t>(1, totals.seen));
  // The writer counts the skipped and overflowing steps from its records, a resumed run's kept ones too.
  trace.finish({{"steps", training.steps()},
                {"train_loss", totals.loss_sum / seen},
                {"train_accuracy", static_cast<double>(totals.correct) / seen},
                {"test_loss", test.loss},
                {"test_accuracy", test.accuracy},
                {"wall_seconds", totals.wall_seconds},
                {"scaler_seconds", totals.scaler_seconds}});
  if (!o.save.empty()) training.save(o.save, {{"feed", feed.state()}, {"totals", totals.to_json()}});

  std::printf("test accuracy %.4f after %lld steps (%lld skipped)\n", test.accuracy,
              static_cast<long long>(training.steps()), static_cast<long long>(totals.skipped));
  std::printf(
      "\nper-layer scales of the last step (s: local scale, S: accumulated scale it sends upstream)\n");
  std::printf("%-3s %-12s %-9s %10s %10s %10s %12s\n", "id", "layer", "kind", "s", "S_in", "S_out",
              "underflow");
  for (const gs::LayerScale& l : training.layer_scales()) {
    if (!l.ran) continue;
    std::printf("%-3d %-12s %-9s %10g %10g %10g", l.id, l.name.c_str(), l.kind.c_str(), l.s, l.scale_in,
                l.scale_out);
    if (l.recorded) std::printf(" %12.3e", l.underflow_rate);
    std::printf("\n");
  }
  std::printf("trace: %s and %s\n", trace.jsonl_path().c_str(), trace.json_path().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << "residual_fashion_mnist: " << e.what() << "\n";
    return 1;
  }
}
