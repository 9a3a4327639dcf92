// The training loop (see trainer.h).
#include "lib/train/trainer.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <ostream>
#include <sstream>

#include <Eigen/Core>

#include "lib/layers/softmax_cross_entropy.h"
#include "lib/model/spec.h"
#include "lib/train/checkpoint.h"
#include "lib/train/trace.h"

namespace gradscale {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto t = static_cast<long long>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", t / 60, t % 60);
  return buf;
}

nlohmann::json epoch_json(const EpochSummary& e) {
  return {
      {"epoch", e.epoch},         {"train_loss", e.train_loss},       {"train_accuracy", e.train_accuracy},
      {"test_loss", e.test_loss}, {"test_accuracy", e.test_accuracy}, {"seconds", e.seconds},
      {"steps", e.steps},         {"skipped_steps", e.skipped_steps}, {"scale", e.scale}};
}

EpochSummary epoch_from_json(const nlohmann::json& j) {
  EpochSummary e;
  e.epoch = j.at("epoch");
  e.train_loss = j.at("train_loss");
  e.train_accuracy = j.at("train_accuracy");
  e.test_loss = j.at("test_loss");
  e.test_accuracy = j.at("test_accuracy");
  e.seconds = j.at("seconds");
  e.steps = j.at("steps");
  e.skipped_steps = j.at("skipped_steps");
  e.scale = j.at("scale");
  return e;
}

// The identity of what is being trained: a checkpoint is only resumed into the same model and format.
nlohmann::json identity(const TrainConfig& c, const nlohmann::json& spec) {
  return {{"model_spec", spec},
          {"format", format_name(c.format)},
          {"grad_format", format_name(c.grad_format.value_or(c.format))},
          {"weight_grads", c.quantize_weight_grads}};
}

}  // namespace

Trainer::Trainer(TrainConfig config, std::ostream* log) : config_(std::move(config)), log_(log) {
  if (config_.threads > 0) {
    omp_set_num_threads(config_.threads);
    Eigen::setNbThreads(config_.threads);
  }
  precision_.format = config_.format;
  precision_.grad_format = config_.grad_format;
  precision_.quantize_weight_grads = config_.quantize_weight_grads;

  data_ = load_data(config_.data, config_.seed);
  if (log_) *log_ << "data: " << data_.source << "\n";

  if (config_.model_spec.is_null()) config_.model_spec = builtin_model_spec(config_.model);
  Rng init_rng(config_.seed);
  model_ = build_model(config_.model_spec, init_rng);
  Shape sample(data_.train.images.shape().begin() + 1, data_.train.images.shape().end());
  GS_CHECK_CONFIG(sample == model_->sample_shape(), "the model takes samples of shape "
                                                        << shape_string(model_->sample_shape())
                                                        << ", the data has " << shape_string(sample));

  // Scalers size themselves for the format they scale: the gradients'.
  scaler_ = make_scaler(config_.scaler, precision_.gradient_format());
  config_.scaler = scaler_->config();
  scaler_->bind(model_->layer_infos(), precision_.gradient_format());
  optimizer_ = make_optimizer(config_.optimizer);
  config_.optimizer = optimizer_->config();
  batcher_ = std::make_unique<Batcher>(data_.train, config_.batch, config_.seed);
  nlohmann::json sched = config_.schedule;
  if (!sched.contains("lr")) sched["lr"] = config_.lr;
  if (sched.value("name", "") == "cosine" && !sched.contains("total_steps"))
    sched["total_steps"] = config_.epochs * batcher_->batches_per_epoch();
  schedule_ = std::make_unique<LrSchedule>(LrSchedule::from_json(sched));
  config_.schedule = schedule_->config();
  rng_.seed(config_.seed ^ 0x9E3779B97F4A7C15ull);

  if (!config_.resume_dir.empty()) load_checkpoint(config_.resume_dir);
  if (!config_.trace_path.empty()) {
    nlohmann::json header = {{"version", GRADSCALE_VERSION},
                             {"config", config_.to_json()},
                             {"format", format_name(precision_.format)},
                             {"grad_format", format_name(precision_.gradient_format())},
                             {"scaler", config_.scaler},
                             {"seed", config_.seed},
                             {"trace_every", config_.trace_every},
                             {"trace_hist", config_.trace_hist},
                             {"layers", model_->layer_table()}};
    trace_ = std::make_unique<TraceWriter>(config_.trace_path, std::move(header), config_.trace_every,
                                           config_.trace_hist, config_.resume_dir.empty() ? -1 : steps_);
  }
}

Trainer::~Trainer() = default;

StepOutcome Trainer::train_step(const Tensor& images, const std::vector<std::int32_t>& labels) {
  StepOutcome out;
  model_->prepare_weights(precision_);
  ForwardContext fctx{precision_, true, &rng_};
  const Tensor& logits = model_->forward(images, fctx);

  const std::int64_t step = steps_;  // this iteration's index, from 0
  const bool sampled = trace_ && trace_->samples(step + 1);
  monitor_.reset(model_->num_layers(), sampled, scaler_->gradient_edge());
  const auto t0 = std::chrono::steady_clock::now();
  scaler_->begin_step(step);
  // S0: a policy that chooses it from the loss gradient sees that gradient in fp32 at scale 1 first.
  LocalScaleQuery loss_query;
  QueryStatistics loss_stats;
  if (const StatNeeds needs = scaler_->loss_needs()) {
    softmax_cross_entropy_fp32(logits, labels.data(), 1.0, &loss_fp32_);
    loss_query.layer_name = "loss";
    loss_query.step = step;
    loss_query.format = precision_.gradient_format();
    loss_query.reduction = 0;
    loss_query.grad_shape = loss_fp32_.shape();
    loss_query.grad = loss_fp32_.data();
    loss_query.grad_size = loss_fp32_.size();
    // The values S0 will multiply before the one rounding: the "upstream" of this cast point.
    loss_query.upstream_shape = loss_fp32_.shape();
    loss_query.upstream = loss_fp32_.data();
    loss_query.upstream_size = loss_fp32_.size();
    loss_stats.attach(needs, loss_query, precision_.round);
  }
  out.loss_scale = scaler_->choose_loss_scale(loss_query);
  GS_CHECK_NUMERIC(std::isfinite(out.loss_scale) && out.loss_scale > 0,
                   "scaler '" << scaler_->policy() << "' chose loss scale " << out.loss_scale);
  double scaler_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const LossResult loss = softmax_cross_entropy(logits, labels.data(), out.loss_scale, precision_,
                                                &loss_grad_, &monitor_, model_->num_layers() - 1);
  model_->zero_grads();
  BackwardContext bctx{precision_, *scaler_, monitor_, step};
  model_->backward(loss_grad_, bctx);

  const auto t1 = std::chrono::steady_clock::now();
  if (LayerController* controller = scaler_->layer_controller()) controller->end_step(monitor_);
  StepStatistics stats;
  stats.found_inf = monitor_.found_inf;
  stats.first_nonfinite_layer = monitor_.first_nonfinite_layer;
  stats.grad_below_edge = monitor_.grad_below_edge;
  stats.grad_above_edge = monitor_.grad_above_edge;
  stats.step = step;
  stats.monitor = &monitor_;
  out.report = scaler_->update(stats);
  scaler_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count() +
                    monitor_.scaler_seconds;
  scaler_seconds_ += scaler_seconds;
  out.found_inf = stats.found_inf;
  out.first_nonfinite_layer = stats.first_nonfinite_layer;
  out.skipped = out.report.skipped;
  // A skipped step touches neither weights nor optimizer moments nor the schedule, which counts
  // applied steps only (docs/optim.md).
  if (!out.skipped) optimizer_->step(model_->parameters(), schedule_->lr(optimizer_->step_count()));
  out.loss = loss.loss;
  out.correct = loss.correct;
  ++steps_;
  skipped_ += out.skipped;
  overflow_steps_ += out.found_inf;
  if (trace_) {
    TraceStep t;
    t.step = steps_;
    t.epoch = batcher_->epoch() + 1;
    t.loss = out.loss;
    t.loss_scale = out.loss_scale;
    t.phi = out.report.state.is_object() ? out.report.state.value("phi", 1.0) : 1.0;
    t.skipped = out.skipped;
    trace_->write_step(t, monitor_);
  }
  return out;
}

EvalResult Trainer::evaluate(const Dataset& data) {
  model_->prepare_weights(precision_);
  ForwardContext fctx{precision_, false, nullptr};
  Batcher batches(data, config_.eval_batch, 0, false);
  Tensor x;
  std::vector<std::int32_t> y;
  double loss_sum = 0;
  std::int64_t correct = 0, seen = 0;
  while (batches.next(x, y)) {
    const Tensor& logits = model_->forward(x, fctx);
    const LossResult r = softmax_cross_entropy(logits, y.data(), 1.0, precision_, nullptr, nullptr, -1);
    const auto n = static_cast<std::int64_t>(y.size());
    loss_sum += r.loss * static_cast<double>(n);
    correct += r.correct;
    seen += n;
  }
  EvalResult e;
  if (seen) {
    e.loss = loss_sum / static_cast<double>(seen);
    e.accuracy = static_cast<double>(correct) / static_cast<double>(seen);
  }
  return e;
}

void Trainer::progress(bool force) {
  if (!log_) return;
  const double t = now_seconds();
  if (!force && t - last_progress_ < config_.progress_seconds) return;
  last_progress_ = t;
  const std::int64_t per_epoch = batcher_->batches_per_epoch();
  const std::int64_t total = config_.max_steps > 0 ? std::min(config_.max_steps, config_.epochs * per_epoch)
                                                   : config_.epochs * per_epoch;
  const double rate = static_cast<double>(steps_ - steps_at_run_start_) / std::max(1e-9, t - run_start_);
  const double eta = static_cast<double>(total - steps_) / std::max(1e-9, rate);
  char line[256];
  std::snprintf(
      line, sizeof line,
      "epoch %lld/%lld  step %lld/%lld  loss %.4f  acc %.4f  S %.6g  skipped %lld  %.1f steps/s  ETA %s",
      static_cast<long long>(batcher_->epoch() + 1), static_cast<long long>(config_.epochs),
      static_cast<long long>(batcher_->position() / config_.batch +
                             (batcher_->position() % config_.batch != 0)),
      static_cast<long long>(per_epoch),
      epoch_seen_ ? epoch_loss_sum_ / static_cast<double>(epoch_seen_) : 0.0,
      epoch_seen_ ? static_cast<double>(epoch_correct_) / static_cast<double>(epoch_seen_) : 0.0,
      scaler_->loss_scale(), static_cast<long long>(skipped_), rate, format_duration(eta).c_str());
  *log_ << line << std::endl;
}

nlohmann::json Trainer::run() {
  run_start_ = now_seconds();
  steps_at_run_start_ = steps_;
  bool stopped = false;
  while (batcher_->epoch() < config_.epochs && !stopped) {
    const std::int64_t epoch = batcher_->epoch();
    double t0 = now_seconds();
    while (true) {
      if (config_.max_steps > 0 && steps_ >= config_.max_steps) {
        stopped = true;
        break;
      }
      if (!batcher_->next(batch_x_, batch_y_)) break;
      const StepOutcome s = train_step(batch_x_, batch_y_);
      const auto n = static_cast<std::int64_t>(batch_y_.size());
      epoch_loss_sum_ += s.loss * static_cast<double>(n);
      epoch_correct_ += s.correct;
      epoch_seen_ += n;
      const double t1 = now_seconds();
      epoch_seconds_ += t1 - t0;
      t0 = t1;
      progress(false);
      if (config_.save_every > 0 && !config_.checkpoint_dir.empty() && steps_ % config_.save_every == 0) {
        save_checkpoint(config_.checkpoint_dir);
        t0 = now_seconds();  // checkpoint time is not training time
      }
    }
    if (stopped) break;
    EpochSummary e;
    e.epoch = epoch + 1;
    e.train_loss = epoch_seen_ ? epoch_loss_sum_ / static_cast<double>(epoch_seen_) : 0.0;
    e.train_accuracy =
        epoch_seen_ ? static_cast<double>(epoch_correct_) / static_cast<double>(epoch_seen_) : 0.0;
    e.seconds = epoch_seconds_;
    const EvalResult test = evaluate(data_.test);
    e.test_loss = test.loss;
    e.test_accuracy = test.accuracy;
    e.steps = steps_;
    e.skipped_steps = skipped_;
    e.scale = scaler_->loss_scale();
    history_.push_back(e);
    epoch_loss_sum_ = 0;
    epoch_correct_ = epoch_seen_ = 0;
    epoch_seconds_ = 0;
    if (log_) {
      char line[256];
      std::snprintf(line, sizeof line,
                    "epoch %lld done: train loss %.4f acc %.4f | test loss %.4f acc %.4f | %.1f s | S %.6g | "
                    "skipped %lld",
                    static_cast<long long>(e.epoch), e.train_loss, e.train_accuracy, e.test_loss,
                    e.test_accuracy, e.seconds, e.scale, static_cast<long long>(skipped_));
      *log_ << line << std::endl;
    }
  }
  if (!config_.checkpoint_dir.empty() && config_.save_every > 0) save_checkpoint(config_.checkpoint_dir);
  nlohmann::json result = result_json();
  if (trace_) {
    trace_->finish({{"steps", steps_},
                    {"skipped", skipped_},
                    {"overflows", overflow_steps_},
                    {"train_loss", result["train_loss"]},
                    {"train_accuracy", result["train_accuracy"]},
                    {"test_loss", result["test_loss"]},
                    {"test_accuracy", result["test_accuracy"]},
                    {"wall_seconds", now_seconds() - run_start_},
                    {"scaler_seconds", scaler_seconds_}});
    result["trace"] = {{"jsonl", trace_->jsonl_path()}, {"json", trace_->json_path()}};
  }
  return result;
}

nlohmann::json Trainer::result_json() {
  nlohmann::json r;
  nlohmann::json history = nlohmann::json::array(), seconds = nlohmann::json::array();
  for (const EpochSummary& e : history_) {
    history.push_back(epoch_json(e));
    seconds.push_back(e.seconds);
  }
  const bool complete = !history_.empty() && history_.back().steps == steps_;
  r["schema"] = "gradscale.result/1";
  r["version"] = GRADSCALE_VERSION;
  r["complete"] = batcher_->epoch() >= config_.epochs;
  r["steps"] = steps_;
  r["skipped_steps"] = skipped_;
  r["overflow_steps"] = overflow_steps_;
  r["scaler_seconds"] = scaler_seconds_;
  r["applied_steps"] = optimizer_->step_count();
  r["epochs_done"] = history_.size();
  r["epoch_seconds"] = seconds;
  double train_seconds = epoch_seconds_;  // the epoch a max_steps stop cut short counts too
  for (const EpochSummary& e : history_) train_seconds += e.seconds;
  r["train_seconds"] = train_seconds;
  r["history"] = history;
  r["final_scale"] = scaler_->loss_scale();
  r["scaler_state"] = scaler_->state();
  r["data"] = data_.source;
  r["parameters"] = model_->num_parameters();
  if (complete) {
    r["test_accuracy"] = history_.back().test_accuracy;
    r["test_loss"] = history_.back().test_loss;
    r["train_loss"] = history_.back().train_loss;
    r["train_accuracy"] = history_.back().train_accuracy;
  } else {  // stopped inside an epoch (max_steps): evaluate now
    const EvalResult test = evaluate(data_.test);
    r["test_accuracy"] = test.accuracy;
    r["test_loss"] = test.loss;
    r["train_loss"] = epoch_seen_ ? epoch_loss_sum_ / static_cast<double>(epoch_seen_)
                                  : (history_.empty() ? 0.0 : history_.back().train_loss);
    r["train_accuracy"] = epoch_seen_ ? static_cast<double>(epoch_correct_) / static_cast<double>(epoch_seen_)
                                      : (history_.empty() ? 0.0 : history_.back().train_accuracy);
  }
  r["config"] = config_.to_json();
  return r;
}

void Trainer::save_checkpoint(const std::string& dir) {
  std::ostringstream rng_state;
  rng_state << rng_;
  nlohmann::json history = nlohmann::json::array();
  for (const EpochSummary& e : history_) history.push_back(epoch_json(e));
  nlohmann::json meta = {{"schema", "gradscale.checkpoint/1"},
                         {"identity", identity(config_, config_.model_spec)},
                         {"config", config_.to_json()},
                         {"steps", steps_},
                         {"skipped_steps", skipped_},
                         {"overflow_steps", overflow_steps_},
                         {"scaler_seconds", scaler_seconds_},
                         {"epoch_loss_sum", epoch_loss_sum_},
                         {"epoch_correct", epoch_correct_},
                         {"epoch_seen", epoch_seen_},
                         {"epoch_seconds", epoch_seconds_},
                         {"history", history},
                         {"scaler", {{"config", scaler_->config()}, {"state", scaler_->state()}}},
                         {"optimizer", optimizer_->state()},
                         {"batcher", batcher_->state()},
                         {"rng", rng_state.str()}};
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  for (Parameter* p : model_->parameters()) tensors.emplace_back("param/" + p->name, &p->value);
  for (auto& [name, t] : model_->buffers()) tensors.emplace_back("buffer/" + name, t);
  for (auto& [name, t] : optimizer_->state_tensors()) tensors.emplace_back("optim/" + name, t);
  write_checkpoint(dir, std::to_string(steps_), meta, tensors);
}

void Trainer::load_checkpoint(const std::string& dir) {
  const Checkpoint c = read_checkpoint(dir);
  const nlohmann::json expect = identity(config_, config_.model_spec);
  GS_CHECK_CONFIG(c.meta.value("identity", nlohmann::json()) == expect,
                  "checkpoint in '" << dir << "' was written for another model or format (it has format "
                                    << c.meta["identity"].value("format", std::string("?")) << ", model "
                                    << c.meta["identity"]["model_spec"].value("name", std::string("?"))
                                    << "; this run: " << format_name(config_.format) << ", "
                                    << config_.model_spec.value("name", std::string("?")) << ")");
  GS_CHECK_CONFIG(c.meta["scaler"]["config"] == scaler_->config(),
                  "checkpoint in '" << dir << "' used scaler " << c.meta["scaler"]["config"].dump()
                                    << ", this run " << scaler_->config().dump());
  auto take = [&](const std::string& key, Tensor& into) {
    const auto it = c.tensors.find(key);
    GS_CHECK_DATA(it != c.tensors.end(), "checkpoint in '" << dir << "' has no tensor '" << key << "'");
    GS_CHECK_DATA(it->second.shape() == into.shape(),
                  "checkpoint tensor '" << key << "' has shape " << shape_string(it->second.shape())
                                        << ", expected " << shape_string(into.shape()));
    std::copy(it->second.data(), it->second.data() + into.size(), into.data());
  };
  for (Parameter* p : model_->parameters()) take("param/" + p->name, p->value);
  for (auto& [name, t] : model_->buffers()) take("buffer/" + name, *t);
  optimizer_->restore_state(c.meta.at("optimizer"), model_->parameters());
  for (auto& [name, t] : optimizer_->state_tensors()) take("optim/" + name, *t);
  scaler_->restore_state(c.meta["scaler"]["state"]);
  batcher_->restore(c.meta.at("batcher"));
  std::istringstream rng_state(c.meta.at("rng").get<std::string>());
  rng_state >> rng_;
  steps_ = c.meta.at("steps");
  skipped_ = c.meta.at("skipped_steps");
  overflow_steps_ = c.meta.value("overflow_steps", std::int64_t{0});
  scaler_seconds_ = c.meta.value("scaler_seconds", 0.0);
  epoch_loss_sum_ = c.meta.at("epoch_loss_sum");
  epoch_correct_ = c.meta.at("epoch_correct");
  epoch_seen_ = c.meta.at("epoch_seen");
  epoch_seconds_ = c.meta.at("epoch_seconds");
  history_.clear();
  for (const auto& e : c.meta.at("history")) history_.push_back(epoch_from_json(e));
  if (log_) *log_ << "resumed from '" << dir << "' at step " << steps_ << "\n";
}

}  // namespace gradscale
