// The resolved configuration of a training run: the same keys on the command line (`gradscale train
// --key value`) and in a JSON config file (`--config file.json`; the command line overrides). The
// reference of every key is docs/config.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "lib/numeric/format.h"

namespace gradscale {

struct TrainConfig {
  std::string model = "mlp";           // a built-in model (see builtin_model_spec)
  nlohmann::json model_spec;           // a JSON model spec object; when set, `model` is only its label
  std::string data = "fashion-mnist";  // fashion-mnist | mnist:DIR | synthetic[:N]
  Format format = Format::fp32;
  std::optional<Format> grad_format;  // activation and weight gradients (unset: `format`)
  bool quantize_weight_grads = true;  // false: weight gradients stay fp32 (ablation, SPEC §4)
  nlohmann::json scaler = {{"policy", "none"}};
  nlohmann::json optimizer = {{"name", "adam"}};
  nlohmann::json schedule = {{"name", "constant"}};  // "lr" comes from `lr` unless given here
  double lr = 1e-3;
  std::int64_t epochs = 1;
  std::int64_t batch = 128;
  std::int64_t eval_batch = 1000;
  std::int64_t eval_every = 0;  // > 0: also evaluate the test set every N iterations (the result's "evaluations")
  std::int64_t max_steps = 0;  // > 0: stop after this many iterations (tests, smoke runs)
  std::uint64_t seed = 0;
  int threads = 0;                // 0: all cores
  std::string device = "cpu";     // the backend: cpu | cuda | cuda:N (lib/backend)
  std::string conv_algorithm = "im2col";  // the CUDA backend's convolutions: im2col | implicit
  double progress_seconds = 5.0;  // a progress line at most this often (0: every step)
  std::string checkpoint_dir;     // with save_every > 0: checkpoints go here
  std::int64_t save_every = 0;    // iterations between checkpoints (also one at the end)
  std::string resume_dir;         // continue from the checkpoint in this directory
  std::string trace_path;         // non-empty: write a trace to PATH.jsonl and PATH.json (SPEC §8)
  std::int64_t trace_every = 10;  // a traced step every N iterations (plus notable ones)
  bool trace_hist = false;        // binade histograms in the trace
  bool shadow = false;            // on traced steps, the fp32 shadow of the backward pass (lib/train/shadow.h)

  // Reads the keys present in `j` over the current values; unknown keys or bad values → ConfigError
  // naming the key and what is allowed.
  void merge_json(const nlohmann::json& j);
  nlohmann::json to_json() const;
};

}  // namespace gradscale
