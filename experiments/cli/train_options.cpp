// Training options shared by `gradscale train` and `gradscale bench step` (see train_options.h).
#include "experiments/cli/train_options.h"

#include <nlohmann/json.hpp>

#include "lib/core/error.h"
#include "lib/core/json_read.h"
#include "lib/train/checkpoint.h"

namespace gradscale::cli {
namespace {

using json = nlohmann::json;

// "adam" or '{"name":"sgd",...}'.
json name_or_object(const std::string& text, const char* what) {
  if (!text.empty() && text.front() == '{') return parse_json(text, what, JsonSource::config);
  return text;
}

}  // namespace

void add_train_options(po::options_description& desc) {
  desc.add_options()("config", po::value<std::string>(),
                     "JSON config file; command-line options override it")(
      "model", po::value<std::string>(),
      "[model] mlp | cnn | resnet-mini[:n=N] | deep-mlp[:depth=D,width=W,gain=G]")(
      "model-spec", po::value<std::string>(), "[model_spec] JSON model spec file (docs/models.md)")(
      "data", po::value<std::string>(), "[data] fashion-mnist | mnist:DIR | synthetic[:N]")(
      "format", po::value<std::string>(), "[format] fp32 | fp16 | bf16 | fp8_e5m2 | fp8_e4m3")(
      "grad-format", po::value<std::string>(),
      "[grad_format] format of activation and weight gradients (default: --format)")(
      "weight-grads", po::value<std::string>(), "[weight_grads] format (round to F, default) | fp32")(
      "scaler", po::value<std::string>(), "[scaler] none | static:S | a policy name | JSON {\"policy\":...}")(
      "optimizer", po::value<std::string>(), "[optimizer] sgd | adam | adamw | JSON {\"name\":...}")(
      "schedule", po::value<std::string>(), "[schedule] constant | step | cosine | JSON {\"name\":...}")(
      "lr", po::value<double>(), "[lr] learning rate")("epochs", po::value<std::int64_t>(), "[epochs]")(
      "batch", po::value<std::int64_t>(), "[batch] mini-batch size")("eval-batch", po::value<std::int64_t>(),
                                                                     "[eval_batch] evaluation batch size")(
      "eval-every", po::value<std::int64_t>(),
      "[eval_every] also evaluate the test set every N iterations (0: only at each epoch's end)")(
      "max-steps", po::value<std::int64_t>(), "[max_steps] stop after this many iterations (0: no limit)")(
      "seed", po::value<std::int64_t>(), "[seed]")("threads", po::value<int>(), "[threads] 0 = all cores")(
      "device", po::value<std::string>(), "[device] cpu | cuda | cuda:N")(
      "conv-algorithm", po::value<std::string>(),
      "[conv_algorithm] convolutions on cuda: im2col (+ cuBLAS) | implicit")(
      "progress-seconds", po::value<double>(), "[progress_seconds] seconds between progress lines")(
      "checkpoint", po::value<std::string>(), "[checkpoint] directory for checkpoints")(
      "save-every", po::value<std::int64_t>(), "[save_every] iterations between checkpoints")(
      "resume", po::value<std::string>(), "[resume] continue from the checkpoint in this directory")(
      "trace", po::value<std::string>(), "[trace] write a per-layer scale trace to PATH.jsonl and PATH.json")(
      "trace-every", po::value<std::int64_t>(), "[trace_every] a traced step every N iterations (default 10)")(
      "trace-hist", po::bool_switch(), "[trace_hist] add binade histograms to the trace")(
      "shadow", po::bool_switch(),
      "[shadow] on traced steps, also run the backward pass in fp32 and trace, per layer, what precision cost "
      "its gradients (underflowed mass, relative error, cosine; CPU, one process)");
}

TrainConfig train_config_from(const po::variables_map& vm) {
  TrainConfig config;
  if (vm.count("config"))
    config.merge_json(read_json_file(vm["config"].as<std::string>(), "config file", JsonSource::config));
  json overrides = json::object();
  auto str = [&](const char* flag, const char* key) {
    if (vm.count(flag)) overrides[key] = vm[flag].as<std::string>();
  };
  str("model", "model");
  str("model-spec", "model_spec");
  str("data", "data");
  str("format", "format");
  str("grad-format", "grad_format");
  str("trace", "trace");
  str("weight-grads", "weight_grads");
  str("scaler", "scaler");
  str("checkpoint", "checkpoint");
  str("resume", "resume");
  if (vm.count("optimizer"))
    overrides["optimizer"] = name_or_object(vm["optimizer"].as<std::string>(), "--optimizer");
  if (vm.count("schedule"))
    overrides["schedule"] = name_or_object(vm["schedule"].as<std::string>(), "--schedule");
  if (vm.count("lr")) overrides["lr"] = vm["lr"].as<double>();
  if (vm.count("progress-seconds")) overrides["progress_seconds"] = vm["progress-seconds"].as<double>();
  if (vm.count("threads")) overrides["threads"] = vm["threads"].as<int>();
  if (vm.count("device")) overrides["device"] = vm["device"].as<std::string>();
  if (vm.count("conv-algorithm")) overrides["conv_algorithm"] = vm["conv-algorithm"].as<std::string>();
  if (vm.count("trace-hist") && vm["trace-hist"].as<bool>()) overrides["trace_hist"] = true;
  if (vm.count("shadow") && vm["shadow"].as<bool>()) overrides["shadow"] = true;
  for (const char* flag : {"epochs", "batch", "eval-batch", "eval-every", "max-steps", "seed", "save-every", "trace-every"}) {
    if (!vm.count(flag)) continue;
    std::string key = flag;
    for (char& ch : key)
      if (ch == '-') ch = '_';
    overrides[key] = vm[flag].as<std::int64_t>();
  }
  if (vm.count("model") && !vm.count("model-spec"))
    overrides["model_spec"] = nullptr;  // --model wins over a file's spec
  config.merge_json(overrides);
  return config;
}

std::vector<InputFile> input_files(const po::variables_map& vm) {
  std::vector<InputFile> files;
  if (vm.count("config")) {
    const std::string config = vm["config"].as<std::string>();
    files.emplace_back(config, "the --config file");
    // A model spec named by the config file is an input too (read again: it was read and checked
    // when the config was built, so this cannot fail differently).
    const json doc = read_json_file(config, "config file", JsonSource::config);
    if (doc.is_object() && doc.contains("model_spec") && doc["model_spec"].is_string())
      files.emplace_back(doc["model_spec"].get<std::string>(), "the config's model_spec file");
  }
  if (vm.count("model-spec")) files.emplace_back(vm["model-spec"].as<std::string>(), "the --model-spec file");
  return files;
}

void check_trace_path(const std::string& trace) {
  if (trace.empty()) return;
  const std::string name = trace.substr(trace.rfind('/') + 1);  // npos + 1 == 0
  GS_CHECK_CONFIG(!name.empty() && name != "." && name != "..",
                  "--trace '" << trace << "' is a directory, not a path prefix: give PATH (the trace goes to "
                                          "PATH.jsonl and PATH.json)");
}

CommandFiles train_files(const po::variables_map& vm, const TrainConfig& config, const std::string& result) {
  CommandFiles files;
  for (const auto& [path, what] : input_files(vm)) files.input(path, what);
  files.directory(config.resume_dir, "the --resume checkpoint", is_checkpoint_file, /*writes=*/false);
  if (config.save_every > 0)
    files.directory(config.checkpoint_dir, "the --checkpoint directory", is_checkpoint_file, /*writes=*/true);
  files.output(result, "--result");
  if (!config.trace_path.empty()) {
    files.output(config.trace_path + ".jsonl", "the --trace file");
    files.output(config.trace_path + ".json", "the --trace file");
  }
  return files;
}

}  // namespace gradscale::cli
