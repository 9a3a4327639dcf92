// JSON model specs and the built-in architectures (see spec.h, docs/models.md).
#include "lib/model/spec.h"

#include <cmath>
#include <iomanip>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "lib/core/json_read.h"
#include "lib/layers/add.h"
#include "lib/layers/batchnorm.h"
#include "lib/layers/conv2d.h"
#include "lib/layers/dropout.h"
#include "lib/layers/linear.h"
#include "lib/layers/pool.h"
#include "lib/layers/relu.h"

namespace gradscale {
namespace {

// Whether v is a whole number in [lo, hi] (false for NaN), checked before any conversion to an integer.
bool whole_in(double v, double lo, double hi) {
  return v >= lo && v <= hi && std::floor(v) == v;
}

using json = nlohmann::json;

// Sanity limits, checked before anything is allocated (docs/models.md): a size key (in, out, kernel,
// stride, padding, channels, input dimensions) is at most kMaxSize, a layer's output and a
// convolution's unfolded input hold at most kMaxSampleValues values per sample, and a model has at
// most kMaxParameters parameters and kMaxLayers layers. Products are taken in double (no overflow).
constexpr std::int64_t kMaxSize = std::int64_t{1} << 24;
constexpr std::int64_t kMaxSampleValues = std::int64_t{1} << 26;
constexpr std::int64_t kMaxParameters = std::int64_t{1} << 26;
constexpr std::size_t kMaxLayers = 10000;

double per_sample(const Shape& batch_shape) {
  double n = 1;
  for (std::size_t i = 1; i < batch_shape.size(); ++i) n *= static_cast<double>(batch_shape[i]);
  return n;
}

// Reads the keys of one layer object, rejecting unknown keys and wrong types with the layer's name.
class LayerKeys {
 public:
  LayerKeys(const json& obj, std::string where, std::set<std::string> allowed)
      : obj_(obj), where_(std::move(where)), allowed_(std::move(allowed)) {
    allowed_.insert({"type", "name", "inputs"});
    for (const auto& [k, v] : obj_.items())
      GS_CHECK_CONFIG(allowed_.count(k),
                      where_ << ": unknown key '" << text_excerpt(k) << "' (allowed: " << list() << ")");
  }
  std::int64_t integer(const std::string& key, std::optional<std::int64_t> fallback,
                       std::int64_t min_value) const {
    if (!obj_.contains(key)) {
      GS_CHECK_CONFIG(fallback.has_value(), where_ << ": missing required key '" << key << "'");
      return *fallback;
    }
    const json& v = obj_.at(key);
    GS_CHECK_CONFIG(v.is_number_integer(),
                    where_ << ": key '" << key << "' must be an integer, got " << json_excerpt(v));
    const bool fits =
        !v.is_number_unsigned() || v.get<std::uint64_t>() <= static_cast<std::uint64_t>(kMaxSize);
    GS_CHECK_CONFIG(!fits || v.get<std::int64_t>() >= min_value,
                    where_ << ": key '" << key << "' must be >= " << min_value << ", got " << v.dump());
    GS_CHECK_CONFIG(fits && v.get<std::int64_t>() <= kMaxSize,
                    where_ << ": key '" << key << "' must be <= " << kMaxSize << ", got " << v.dump());
    return v.get<std::int64_t>();
  }
  double real(const std::string& key, double fallback, double lo, double hi, bool hi_open = false) const {
    if (!obj_.contains(key)) return fallback;
    const json& v = obj_.at(key);
    GS_CHECK_CONFIG(v.is_number(),
                    where_ << ": key '" << key << "' must be a number, got " << json_excerpt(v));
    const auto x = v.get<double>();
    GS_CHECK_CONFIG(x >= lo && (hi_open ? x < hi : x <= hi),
                    where_ << ": key '" << key << "' must be in [" << lo << ", " << hi
                           << (hi_open ? ")" : "]") << ", got " << x);
    return x;
  }
  bool boolean(const std::string& key, bool fallback) const {
    if (!obj_.contains(key)) return fallback;
    GS_CHECK_CONFIG(obj_.at(key).is_boolean(), where_ << ": key '" << key << "' must be true or false");
    return obj_.at(key).get<bool>();
  }
  std::string text(const std::string& key, const std::string& fallback) const {
    if (!obj_.contains(key)) return fallback;
    GS_CHECK_CONFIG(obj_.at(key).is_string(), where_ << ": key '" << key << "' must be a string");
    return obj_.at(key).get<std::string>();
  }

 private:
  std::string list() const {
    std::string s;
    for (const auto& k : allowed_) s += (s.empty() ? "" : ", ") + k;
    return s;
  }
  const json& obj_;
  std::string where_;
  std::set<std::string> allowed_;
};

const std::set<std::string> kLayerTypes = {"linear",         "conv2d",    "relu",    "flatten", "maxpool",
                                           "global_avgpool", "batchnorm", "dropout", "add"};

std::string type_list() {
  std::string s;
  for (const auto& t : kLayerTypes) s += (s.empty() ? "" : ", ") + t;
  return s;
}

}  // namespace

std::unique_ptr<Model> build_model(const json& spec, Rng& rng) {
  GS_CHECK_CONFIG(spec.is_object(), "model spec must be a JSON object with \"input\" and \"layers\"");
  for (const auto& [k, v] : spec.items())
    GS_CHECK_CONFIG(k == "input" || k == "layers" || k == "name",
                    "model spec: unknown key '" << text_excerpt(k) << "' (allowed: input, layers, name)");
  GS_CHECK_CONFIG(spec.contains("input") && spec["input"].is_array() && !spec["input"].empty(),
                  "model spec: \"input\" must be the per-sample shape, e.g. [1, 28, 28]");
  Shape sample;
  for (const json& d : spec["input"]) {
    GS_CHECK_CONFIG(d.is_number_integer() && d.get<std::int64_t>() > 0 && d.get<std::int64_t>() <= kMaxSize,
                    "model spec: \"input\" dimensions must be integers in [1, "
                        << kMaxSize << "], got " << json_excerpt(spec["input"]));
    sample.push_back(d.get<std::int64_t>());
  }
  Shape batch_input = {1};
  batch_input.insert(batch_input.end(), sample.begin(), sample.end());
  GS_CHECK_CONFIG(per_sample(batch_input) <= static_cast<double>(kMaxSampleValues),
                  "model spec: \"input\" " << json_excerpt(spec["input"]) << " has more than "
                                           << kMaxSampleValues << " values per sample");
  GS_CHECK_CONFIG(spec.contains("layers") && spec["layers"].is_array() && !spec["layers"].empty() &&
                      spec["layers"].size() <= kMaxLayers,
                  "model spec: \"layers\" must be a non-empty array of at most " << kMaxLayers << " layers");

  auto model = std::make_unique<Model>();
  if (spec.contains("name")) {
    GS_CHECK_CONFIG(spec["name"].is_string(), "model spec: \"name\" must be a string, got " << json_excerpt(spec["name"]));
    model->set_name(spec["name"].get<std::string>());
  }
  std::map<std::string, int> ids;  // layer name -> node id
  // Shapes are tracked while building so "in"/"channels" can be inferred from the input.
  std::vector<Shape> shapes;
  const InitSpec default_init;
  double parameters = 0;

  for (std::size_t index = 0; index < spec["layers"].size(); ++index) {
    const json& obj = spec["layers"][index];
    GS_CHECK_CONFIG(obj.is_object(), "model spec: layer " << index << " must be an object");
    GS_CHECK_CONFIG(obj.contains("type") && obj["type"].is_string(),
                    "model spec: layer " << index << " has no \"type\" (allowed: " << type_list() << ")");
    const std::string type = obj["type"].get<std::string>();
    std::string name = type + std::to_string(index);
    if (obj.contains("name")) {
      GS_CHECK_CONFIG(obj["name"].is_string() && !obj["name"].get<std::string>().empty(),
                      "model spec: layer " << index << ": \"name\" must be a non-empty string");
      name = obj["name"].get<std::string>();
    }
    const std::string where = "model spec: layer " + std::to_string(index) + " ('" + text_excerpt(name) +
                              "', " + text_excerpt(type) + ")";
    GS_CHECK_CONFIG(kLayerTypes.count(type), where << ": unknown type (allowed: " << type_list() << ")");
    GS_CHECK_CONFIG(
        name != "input",
        where << ": the layer name 'input' is reserved (in \"inputs\" it names the model's input)");
    GS_CHECK_CONFIG(!ids.count(name), where << ": duplicate layer name");

    // Inputs: the previous layer by default (the model input for the first), else named layers.
    std::vector<int> inputs;
    if (obj.contains("inputs")) {
      GS_CHECK_CONFIG(obj["inputs"].is_array(), where << ": \"inputs\" must be an array of layer names");
      for (const json& in : obj["inputs"]) {
        GS_CHECK_CONFIG(in.is_string(), where << ": \"inputs\" must be an array of layer names");
        const std::string in_name = in.get<std::string>();
        if (in_name == "input") {
          inputs.push_back(Model::kModelInput);
          continue;
        }
        const auto it = ids.find(in_name);
        GS_CHECK_CONFIG(it != ids.end(),
                        where << ": input '" << text_excerpt(in_name) << "' is not an earlier layer");
        inputs.push_back(it->second);
      }
    } else {
      inputs.push_back(index == 0 ? Model::kModelInput : static_cast<int>(index) - 1);
    }
    std::vector<Shape> in_shapes;
    for (int in : inputs)
      in_shapes.push_back(in == Model::kModelInput ? batch_input : shapes[static_cast<std::size_t>(in)]);
    const Shape& x = in_shapes.empty() ? batch_input : in_shapes[0];
    const std::int64_t features = shape_size(x) / x[0];
    const std::int64_t channels = x.size() >= 2 ? x[1] : 0;

    auto add_parameters = [&](double n) {
      parameters += n;
      GS_CHECK_CONFIG(parameters <= static_cast<double>(kMaxParameters),
                      where << ": the model would have " << std::fixed << std::setprecision(0) << parameters
                            << " parameters, over the limit of " << kMaxParameters);
    };
    auto init_of = [&](const LayerKeys& k) {
      return parse_init(k.text("init", "kaiming_normal"), k.real("gain", default_init.gain, 1e-6, 1e6));
    };
    std::unique_ptr<Layer> layer;
    double unfolded = 0;  // conv2d: values of one output position's input patch
    if (type == "linear") {
      LayerKeys k(obj, where, {"in", "out", "bias", "init", "gain"});
      const std::int64_t in = k.integer("in", features, 1);
      GS_CHECK_CONFIG(in == features, where << ": \"in\" is " << in << " but its input " << shape_string(x)
                                            << " has " << features << " features per sample");
      const std::int64_t out = k.integer("out", std::nullopt, 1);
      const bool bias = k.boolean("bias", true);
      add_parameters(static_cast<double>(in) * static_cast<double>(out) +
                     (bias ? static_cast<double>(out) : 0));
      layer = std::make_unique<Linear>(name, in, out, bias, init_of(k), rng);
    } else if (type == "conv2d") {
      LayerKeys k(obj, where, {"in", "out", "kernel", "stride", "padding", "bias", "init", "gain"});
      GS_CHECK_CONFIG(x.size() == 4, where << ": needs an [N, C, H, W] input, got " << shape_string(x));
      const std::int64_t in = k.integer("in", channels, 1);
      GS_CHECK_CONFIG(in == channels,
                      where << ": \"in\" is " << in << " but its input has " << channels << " channels");
      const std::int64_t out = k.integer("out", std::nullopt, 1),
                         kernel = k.integer("kernel", std::nullopt, 1);
      const bool bias = k.boolean("bias", true);
      const double patch =
          static_cast<double>(in) * static_cast<double>(kernel) * static_cast<double>(kernel);
      add_parameters(static_cast<double>(out) * patch + (bias ? static_cast<double>(out) : 0));
      layer = std::make_unique<Conv2d>(name, in, out, kernel, k.integer("stride", 1, 1),
                                       k.integer("padding", 0, 0), bias, init_of(k), rng);
      unfolded = patch;  // times the output positions, checked below
    } else if (type == "relu") {
      LayerKeys k(obj, where, {});
      layer = std::make_unique<ReLU>(name);
    } else if (type == "flatten") {
      LayerKeys k(obj, where, {});
      layer = std::make_unique<Flatten>(name);
    } else if (type == "maxpool") {
      LayerKeys k(obj, where, {"kernel", "stride"});
      const std::int64_t kernel = k.integer("kernel", std::nullopt, 1);
      layer = std::make_unique<MaxPool2d>(name, kernel, k.integer("stride", kernel, 1));
    } else if (type == "global_avgpool") {
      LayerKeys k(obj, where, {});
      layer = std::make_unique<GlobalAvgPool>(name);
    } else if (type == "batchnorm") {
      LayerKeys k(obj, where, {"channels", "eps", "momentum"});
      GS_CHECK_CONFIG(x.size() == 2 || x.size() == 4,
                      where << ": needs [N, C] or [N, C, H, W], got " << shape_string(x));
      const std::int64_t c = k.integer("channels", channels, 1);
      GS_CHECK_CONFIG(c == channels, where << ": \"channels\" is " << c << " but its input has " << channels);
      add_parameters(2.0 * static_cast<double>(c));
      layer = std::make_unique<BatchNorm>(name, c, k.real("eps", 1e-5, 1e-12, 1.0),
                                          k.real("momentum", 0.1, 0.0, 1.0));
    } else if (type == "dropout") {
      LayerKeys k(obj, where, {"p"});
      layer = std::make_unique<Dropout>(name, k.real("p", 0.5, 0.0, 1.0, true));
    } else {  // add
      LayerKeys k(obj, where, {});
      GS_CHECK_CONFIG(inputs.size() == 2, where << ": \"inputs\" must name exactly two layers");
      layer = std::make_unique<Add>(name);
    }
    GS_CHECK_CONFIG(static_cast<int>(inputs.size()) == layer->num_inputs(),
                    where << ": takes " << layer->num_inputs() << " input(s), got " << inputs.size());
    try {
      shapes.push_back(layer->output_shape(in_shapes));
    } catch (const ShapeError& e) {
      throw ConfigError(where + ": " + e.what());
    }
    const Shape& y = shapes.back();
    const double positions = y.size() == 4 ? static_cast<double>(y[2]) * static_cast<double>(y[3]) : 1.0;
    GS_CHECK_CONFIG(per_sample(y) <= static_cast<double>(kMaxSampleValues) &&
                        unfolded * positions <= static_cast<double>(kMaxSampleValues),
                    where << ": output " << shape_string(y)
                          << (unfolded > 0 ? " (unfolded for the GEMM)" : "") << " holds more than "
                          << kMaxSampleValues << " values per sample");
    ids[name] = model->add(std::move(layer), inputs);
  }
  try {
    model->finalize(sample);
  } catch (const ShapeError& e) {
    throw ConfigError(std::string("model spec: ") + e.what());
  }
  return model;
}

namespace {

// "name:key=value,key=value" -> (name, {key: value}).
std::map<std::string, double> parse_params(const std::string& text, const std::string& model,
                                           const std::map<std::string, double>& defaults) {
  std::map<std::string, double> params = defaults;
  std::set<std::string> given;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto eq = item.find('=');
    GS_CHECK_CONFIG(eq != std::string::npos,
                    "model '" << model << "': parameter '" << item << "' is not key=value");
    const std::string key = item.substr(0, eq);
    GS_CHECK_CONFIG(defaults.count(key), "model '" << model << "': unknown parameter '" << key << "'");
    GS_CHECK_CONFIG(given.insert(key).second, "model '" << model << "': parameter '" << text_excerpt(key)
                                                        << "' is given twice (give each once)");
    try {
      std::size_t used = 0;
      params[key] = std::stod(item.substr(eq + 1), &used);
      GS_CHECK_CONFIG(used == item.size() - eq - 1, "");
    } catch (const std::exception&) {
      throw ConfigError("model '" + model + "': parameter '" + key + "' is not a number");
    }
  }
  return params;
}

json conv(const std::string& name, std::int64_t out, std::int64_t kernel, std::int64_t stride,
          std::int64_t padding, bool bias, const std::string& input = "") {
  json j = {{"type", "conv2d"}, {"name", name},       {"out", out},  {"kernel", kernel},
            {"stride", stride}, {"padding", padding}, {"bias", bias}};
  if (!input.empty()) j["inputs"] = {input};
  return j;
}

}  // namespace

json builtin_model_spec(const std::string& full_name) {
  const auto colon = full_name.find(':');
  const std::string name = full_name.substr(0, colon);
  const std::string args = colon == std::string::npos ? "" : full_name.substr(colon + 1);
  if (name == "mlp" || name == "cnn")
    GS_CHECK_CONFIG(args.empty(), "model '" << name << "' takes no parameters");
  if (name == "mlp") {
    return {{"name", "mlp"},
            {"input", {1, 28, 28}},
            {"layers",
             {{{"type", "flatten"}, {"name", "flatten"}},
              {{"type", "linear"}, {"name", "fc1"}, {"out", 256}},
              {{"type", "relu"}, {"name", "relu1"}},
              {{"type", "linear"}, {"name", "fc2"}, {"out", 256}},
              {{"type", "relu"}, {"name", "relu2"}},
              {{"type", "linear"}, {"name", "fc3"}, {"out", 10}}}}};
  }
  if (name == "cnn") {
    return {{"name", "cnn"},
            {"input", {1, 28, 28}},
            {"layers",
             {conv("conv1", 32, 3, 1, 1, true),
              {{"type", "relu"}, {"name", "relu1"}},
              {{"type", "maxpool"}, {"name", "pool1"}, {"kernel", 2}},
              conv("conv2", 64, 3, 1, 1, true),
              {{"type", "relu"}, {"name", "relu2"}},
              {{"type", "maxpool"}, {"name", "pool2"}, {"kernel", 2}},
              {{"type", "flatten"}, {"name", "flatten"}},
              {{"type", "linear"}, {"name", "fc1"}, {"out", 128}},
              {{"type", "relu"}, {"name", "relu3"}},
              {{"type", "linear"}, {"name", "fc2"}, {"out", 10}}}}};
  }
  if (name == "deep-mlp") {
    const auto p = parse_params(args, name, {{"depth", 8}, {"width", 256}, {"gain", 1.0}});
    // Checked as doubles before the conversion: an out-of-range double converted to an integer is undefined.
    GS_CHECK_CONFIG(whole_in(p.at("depth"), 1, 1000), "model 'deep-mlp': depth must be an integer in [1, 1000]");
    GS_CHECK_CONFIG(whole_in(p.at("width"), 1, 65536), "model 'deep-mlp': width must be an integer in [1, 65536]");
    const auto depth = static_cast<std::int64_t>(p.at("depth")), width = static_cast<std::int64_t>(p.at("width"));
    GS_CHECK_CONFIG(p.at("gain") > 0, "model 'deep-mlp': gain must be > 0");
    json layers = {{{"type", "flatten"}, {"name", "flatten"}}};
    for (std::int64_t i = 1; i <= depth; ++i) {
      layers.push_back(
          {{"type", "linear"}, {"name", "fc" + std::to_string(i)}, {"out", width}, {"gain", p.at("gain")}});
      layers.push_back({{"type", "relu"}, {"name", "relu" + std::to_string(i)}});
    }
    layers.push_back({{"type", "linear"}, {"name", "out"}, {"out", 10}, {"gain", p.at("gain")}});
    return {{"name", full_name}, {"input", {1, 28, 28}}, {"layers", layers}};
  }
  if (name == "resnet-mini") {
    const auto p = parse_params(args, name, {{"n", 1}});
    GS_CHECK_CONFIG(whole_in(p.at("n"), 1, 64), "model 'resnet-mini': n must be an integer in [1, 64]");
    const auto n = static_cast<std::int64_t>(p.at("n"));
    json layers = {conv("stem.conv", 16, 3, 1, 1, false),
                   {{"type", "batchnorm"}, {"name", "stem.bn"}},
                   {{"type", "relu"}, {"name", "stem.relu"}}};
    std::string prev = "stem.relu";
    std::int64_t in_ch = 16;
    const std::int64_t widths[3] = {16, 32, 64};
    for (int stage = 0; stage < 3; ++stage) {
      for (std::int64_t b = 0; b < n; ++b) {
        const std::int64_t out_ch = widths[stage];
        const std::int64_t stride = (stage > 0 && b == 0) ? 2 : 1;
        const std::string pre = "s" + std::to_string(stage + 1) + ".b" + std::to_string(b + 1) + ".";
        layers.push_back(conv(pre + "conv1", out_ch, 3, stride, 1, false, prev));
        layers.push_back({{"type", "batchnorm"}, {"name", pre + "bn1"}});
        layers.push_back({{"type", "relu"}, {"name", pre + "relu1"}});
        layers.push_back(conv(pre + "conv2", out_ch, 3, 1, 1, false));
        layers.push_back({{"type", "batchnorm"}, {"name", pre + "bn2"}});
        std::string shortcut = prev;
        if (stride != 1 || in_ch != out_ch) {  // projection shortcut: 1x1 conv + BN
          layers.push_back(conv(pre + "proj", out_ch, 1, stride, 0, false, prev));
          layers.push_back({{"type", "batchnorm"}, {"name", pre + "proj_bn"}});
          shortcut = pre + "proj_bn";
        }
        layers.push_back({{"type", "add"}, {"name", pre + "add"}, {"inputs", {pre + "bn2", shortcut}}});
        layers.push_back({{"type", "relu"}, {"name", pre + "relu2"}});
        prev = pre + "relu2";
        in_ch = out_ch;
      }
    }
    layers.push_back({{"type", "global_avgpool"}, {"name", "pool"}});
    layers.push_back({{"type", "linear"}, {"name", "fc"}, {"out", 10}});
    return {{"name", full_name}, {"input", {1, 28, 28}}, {"layers", layers}};
  }
  throw ConfigError(
      "unknown model '" + text_excerpt(full_name) +
      "' (allowed: mlp, cnn, resnet-mini[:n=N], deep-mlp[:depth=D,width=W,gain=G], or --model-spec FILE)");
}

}  // namespace gradscale
