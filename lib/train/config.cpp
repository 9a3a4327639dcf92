// TrainConfig JSON reading and writing (see config.h, docs/config.md).
#include "lib/train/config.h"

#include <cmath>
#include <set>

#include "lib/core/error.h"
#include "lib/core/json_read.h"
#include "lib/scaler/scaler.h"

namespace gradscale {
namespace {

using json = nlohmann::json;

std::int64_t integer_in(const json& v, const char* key, std::int64_t lo, std::int64_t hi) {
  GS_CHECK_CONFIG(v.is_number_integer(),
                  "config key '" << key << "' must be an integer, got " << json_excerpt(v));
  // An unsigned value above the int64 range is out of range, not a negative number.
  const bool fits = !v.is_number_unsigned() || v.get<std::uint64_t>() <= static_cast<std::uint64_t>(hi);
  GS_CHECK_CONFIG(fits && v.get<std::int64_t>() >= lo && v.get<std::int64_t>() <= hi,
                  "config key '" << key << "' must be in [" << lo << ", " << hi << "], got " << v.dump());
  return v.get<std::int64_t>();
}

std::string text(const json& v, const char* key) {
  GS_CHECK_CONFIG(v.is_string(), "config key '" << key << "' must be a string, got " << json_excerpt(v));
  return v.get<std::string>();
}

// An optimizer / schedule given as a name or an object.
json named_object(const json& v, const char* key) {
  if (v.is_string()) return {{"name", v.get<std::string>()}};
  GS_CHECK_CONFIG(v.is_object(), "config key '" << key << "' must be a name or an object with \"name\"");
  return v;
}

}  // namespace

void TrainConfig::merge_json(const json& j) {
  GS_CHECK_CONFIG(j.is_object(), "a training config must be a JSON object");
  static const std::set<std::string> keys = {"model",        "model_spec", "data",      "format",
                                             "weight_grads", "scaler",     "optimizer", "schedule",
                                             "lr",           "epochs",     "batch",     "eval_batch",   "eval_every",
                                             "max_steps",    "seed",       "threads",   "progress_seconds", "device",
                                             "conv_algorithm",
                                             "checkpoint",   "save_every", "resume",
                                             "grad_format",  "trace",      "trace_every", "trace_hist",
                                             "shadow"};
  for (const auto& [k, v] : j.items()) {
    if (!keys.count(k)) {
      std::string allowed;
      for (const auto& a : keys) allowed += (allowed.empty() ? "" : ", ") + a;
      throw ConfigError("unknown config key '" + text_excerpt(k) + "' (allowed: " + allowed + ")");
    }
    if (k == "model") {
      model = text(v, "model");
    } else if (k == "model_spec") {
      if (v.is_string()) {  // a path to a spec file
        model_spec = read_json_file(v.get<std::string>(), "config key 'model_spec'", JsonSource::config);
      } else {
        GS_CHECK_CONFIG(v.is_object() || v.is_null(),
                        "config key 'model_spec' must be a spec object or a file path");
        model_spec = v;
      }
    } else if (k == "data") {
      data = text(v, "data");
    } else if (k == "format") {
      format = parse_format(text(v, "format"));
    } else if (k == "grad_format") {
      if (v.is_null())
        grad_format.reset();
      else
        grad_format = parse_format(text(v, "grad_format"));
    } else if (k == "trace") {
      trace_path = text(v, "trace");
    } else if (k == "trace_every") {
      trace_every = integer_in(v, "trace_every", 1, std::int64_t{1} << 40);
    } else if (k == "trace_hist") {
      GS_CHECK_CONFIG(v.is_boolean(), "config key 'trace_hist' must be true or false, got " << json_excerpt(v));
      trace_hist = v.get<bool>();
    } else if (k == "shadow") {
      GS_CHECK_CONFIG(v.is_boolean(), "config key 'shadow' must be true or false, got " << json_excerpt(v));
      shadow = v.get<bool>();
    } else if (k == "weight_grads") {
      const std::string w = text(v, "weight_grads");
      GS_CHECK_CONFIG(
          w == "format" || w == "fp32",
          "config key 'weight_grads' must be \"format\" or \"fp32\", got '" << text_excerpt(w) << "'");
      quantize_weight_grads = w == "format";
    } else if (k == "scaler") {
      scaler = v.is_string() ? parse_scaler_spec(v.get<std::string>()) : v;
      GS_CHECK_CONFIG(scaler.is_object(),
                      "config key 'scaler' must be a policy name, \"static:S\" or an object");
    } else if (k == "optimizer") {
      optimizer = named_object(v, "optimizer");
    } else if (k == "schedule") {
      schedule = named_object(v, "schedule");
    } else if (k == "lr") {
      GS_CHECK_CONFIG(v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() >= 0,
                      "config key 'lr' must be a finite number >= 0, got " << json_excerpt(v));
      lr = v.get<double>();
    } else if (k == "epochs") {
      epochs = integer_in(v, "epochs", 1, 100000);
    } else if (k == "batch") {
      batch = integer_in(v, "batch", 1, 1 << 20);
    } else if (k == "eval_batch") {
      eval_batch = integer_in(v, "eval_batch", 1, 1 << 20);
    } else if (k == "eval_every") {
      eval_every = integer_in(v, "eval_every", 0, std::int64_t{1} << 40);
    } else if (k == "max_steps") {
      max_steps = integer_in(v, "max_steps", 0, std::int64_t{1} << 40);
    } else if (k == "seed") {
      seed = static_cast<std::uint64_t>(integer_in(v, "seed", 0, std::int64_t{1} << 62));
    } else if (k == "device") {
      device = text(v, "device");
      GS_CHECK_CONFIG(device == "cpu" || device == "cuda" ||
                          (device.rfind("cuda:", 0) == 0 && device.size() > 5 && device.size() <= 8 &&
                           device.find_first_not_of("0123456789", 5) == std::string::npos),
                      "config key 'device' must be cpu, cuda or cuda:N, got '" << text_excerpt(device) << "'");
    } else if (k == "conv_algorithm") {
      conv_algorithm = text(v, "conv_algorithm");
      GS_CHECK_CONFIG(conv_algorithm == "im2col" || conv_algorithm == "implicit",
                      "config key 'conv_algorithm' must be im2col or implicit, got '" << text_excerpt(conv_algorithm)
                                                                                      << "'");
    } else if (k == "threads") {
      threads = static_cast<int>(integer_in(v, "threads", 0, 1024));
    } else if (k == "progress_seconds") {
      GS_CHECK_CONFIG(v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() >= 0,
                      "config key 'progress_seconds' must be a finite number >= 0, got " << json_excerpt(v));
      progress_seconds = v.get<double>();
    } else if (k == "checkpoint") {
      checkpoint_dir = text(v, "checkpoint");
    } else if (k == "save_every") {
      save_every = integer_in(v, "save_every", 0, std::int64_t{1} << 40);
    } else if (k == "resume") {
      resume_dir = text(v, "resume");
    }
  }
}

json TrainConfig::to_json() const {
  json j = {{"model", model},
            {"data", data},
            {"format", format_name(format)},
            {"grad_format", format_name(grad_format.value_or(format))},
            {"weight_grads", quantize_weight_grads ? "format" : "fp32"},
            {"scaler", scaler},
            {"optimizer", optimizer},
            {"schedule", schedule},
            {"lr", lr},
            {"epochs", epochs},
            {"batch", batch},
            {"eval_batch", eval_batch},
            {"max_steps", max_steps},
            {"seed", seed},
            {"threads", threads},
            {"device", device},
            {"conv_algorithm", conv_algorithm},
            {"progress_seconds", progress_seconds},
            {"checkpoint", checkpoint_dir},
            {"save_every", save_every},
            {"resume", resume_dir},
            {"trace", trace_path},
            {"trace_every", trace_every},
            {"trace_hist", trace_hist}};
  if (!model_spec.is_null()) j["model_spec"] = model_spec;
  if (eval_every > 0) j["eval_every"] = eval_every;  // absent when off, as shadow
  if (shadow) j["shadow"] = true;  // absent when off: configs of runs without it stay as they were
  return j;
}

}  // namespace gradscale
