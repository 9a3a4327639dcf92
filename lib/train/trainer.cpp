// The training loop (see trainer.h).
#include "lib/train/trainer.h"

#include <cmath>
#include <cstdio>
#include <ostream>

#include "lib/core/checksum.h"
#include "lib/core/clock.h"
#include "lib/core/json_read.h"
#include "lib/core/threads.h"
#include "lib/layers/softmax_cross_entropy.h"
#include "lib/model/spec.h"
#include "lib/train/evaluation.h"
#include "lib/train/trace.h"

namespace gradscale {

Trainer::Trainer(TrainConfig config, std::ostream* log, Communicator* comm, const std::string& gpu_collectives)
    : config_(std::move(config)), log_(log), comm_(comm && comm->size() > 1 ? comm : nullptr) {
  writes_ = comm_ == nullptr || comm_->rank() == 0;
  if (config_.threads > 0) set_threads(config_.threads);
  precision_.format = config_.format;
  precision_.grad_format = config_.grad_format;
  precision_.quantize_weight_grads = config_.quantize_weight_grads;

  data_ = load_data(config_.data, config_.seed);
  if (log_) *log_ << "data: " << data_.source << "\n";

  if (config_.model_spec.is_null()) config_.model_spec = builtin_model_spec(config_.model);
  Rng init_rng(config_.seed);
  model_ = build_model(config_.model_spec, init_rng);
  // Data-parallel on GPUs: each rank on its machine its own device where there are enough ("cuda"
  // names none); "cuda:N" is taken as given.
  const int devices = comm_ && config_.device == "cuda" ? cuda_device_count() : 0;
  backend_ = make_backend(devices > 0 ? "cuda:" + std::to_string(comm_->local_rank() % devices) : config_.device);
  backend_->set_conv_algorithm(config_.conv_algorithm);
  model_->use_backend(*backend_);
  if (log_ && config_.device != "cpu") *log_ << "device: " << backend_->description() << "\n";
  Shape sample(data_.train.images.shape().begin() + 1, data_.train.images.shape().end());
  GS_CHECK_CONFIG(sample == model_->sample_shape(), "the model takes samples of shape "
                                                        << shape_string(model_->sample_shape())
                                                        << ", the data has " << shape_string(sample));
  GS_CHECK_CONFIG(model_->classes() == data_.train.classes,
                  "the model outputs " << model_->classes() << " classes (its last layer), the data has "
                                       << data_.train.classes << ": the last layer must have \"out\": "
                                       << data_.train.classes);

  // Scalers size themselves for the format they scale: the gradients'.
  std::unique_ptr<Scaler> scaler = make_scaler(config_.scaler, precision_.gradient_format());
  config_.scaler = scaler->config();
  optimizer_ = make_optimizer(config_.optimizer);
  config_.optimizer = optimizer_->config();
  training_ =
      std::make_unique<ScaledTraining>(*model_, *optimizer_, precision_, std::move(scaler), config_.seed);
  batcher_ = std::make_unique<Batcher>(data_.train, config_.batch, config_.seed);
  nlohmann::json sched = config_.schedule;
  if (!sched.contains("lr")) sched["lr"] = config_.lr;
  if (sched.value("name", "") == "cosine" && !sched.contains("total_steps"))
    sched["total_steps"] = config_.epochs * batcher_->batches_per_epoch();
  schedule_ = std::make_unique<LrSchedule>(LrSchedule::from_json(sched));
  config_.schedule = schedule_->config();

  if (comm_) {
    GS_CHECK_CONFIG(config_.batch >= comm_->size(), "--batch " << config_.batch << " is smaller than the "
                                                               << comm_->size() << " ranks: each needs a row");
    const std::int64_t last = data_.train.images.dim(0) % config_.batch;  // an epoch's partial batch
    GS_CHECK_CONFIG(last == 0 || last >= comm_->size(),
                    "the last batch of each epoch has " << last << " samples (" << data_.train.images.dim(0)
                                                        << " % --batch " << config_.batch << "), fewer than the "
                                                        << comm_->size()
                                                        << " ranks: choose a batch that leaves none or at least "
                                                           "one sample per rank");
    // What every rank reads must agree (docs/distributed.md, "What is checked at the start"): the model,
    // formats and scaler, the whole config, and the data, which each rank loads from its own files.
    training_->distribute(*comm_, gpu_collectives);
    DataParallel(*comm_).check_same_config(config_.to_json());
    DataParallel(*comm_).check_same_input("content checksum " + data_.checksum,
                                          "the data '" + config_.data + "'");
    const DeviceCollectives* device = training_->data_parallel()->device();
    if (log_) *log_ << "data-parallel: " << comm_->size() << " ranks (" << comm_->backend()
                    << (device ? ", GPU gradients: " + device->backend() : std::string()) << "), "
                    << config_.batch << " samples per batch split over them\n";
  }
  if (!config_.resume_dir.empty()) {
    load_checkpoint(config_.resume_dir);
    // Each rank resumes from its own copy: the same step and weights, or the ranks would part at once.
    if (comm_)
      DataParallel(*comm_).check_same_input(
          "step " + std::to_string(steps()) + ", weights " +
              checksum_text(DataParallel::weights_checksum(model_->parameters())),
          "the --resume checkpoint '" + config_.resume_dir + "'");
  }
  if (config_.shadow) {
    GS_CHECK_CONFIG(!config_.trace_path.empty(),
                    "shadow: the fp32 shadow's figures are written to the trace: give one (--trace PATH)");
    training_->set_shadow(true);  // ConfigError on a device or with several ranks
  }
  if (!config_.trace_path.empty() && writes_)
    trace_ = std::make_unique<TraceWriter>(config_.trace_path, training_->trace_header(config_.to_json()),
                                           config_.trace_every, config_.trace_hist,
                                           config_.resume_dir.empty() ? -1 : steps());
}

Trainer::~Trainer() = default;

// One iteration through the public API, exactly as a user's own loop does it (docs/api.md).
StepOutcome Trainer::train_step(const Tensor& batch_images, const std::vector<std::int32_t>& batch_labels) {
  ScaledTraining& t = *training_;
  const Tensor& images = comm_ ? rank_rows(batch_images, batch_labels) : batch_images;
  const std::vector<std::int32_t>& labels = comm_ ? rank_y_ : batch_labels;
  // Every rank records on the same steps (rank 0 traces them): the statistics are reduced on those.
  const bool record = comm_ ? config_.trace_every > 0 && !config_.trace_path.empty() &&
                                  (t.steps() + 1) % config_.trace_every == 0
                            : trace_ && trace_->samples(t.steps() + 1);
  t.begin_step(record);
  const Tensor& logits = t.forward(images);
  t.loss_backward(logits, labels);  // S0 as the scaler chooses it (on the model's device where it can)
  // The schedule counts applied steps only (docs/optim.md).
  const StepOutcome out = t.step(schedule_->lr(optimizer_->step_count()));
  scaler_seconds_ += out.scaler_seconds;
  skipped_ += out.skipped;
  overflow_steps_ += out.found_inf;
  divergence_.observe(out.step, out.loss, !out.skipped, model_->parameters(), model_->backend());
  if (trace_) {
    TraceStep ts;
    ts.step = out.step;
    ts.epoch = batcher_->epoch() + 1;
    ts.loss = out.loss;
    ts.loss_scale = out.loss_scale;
    ts.phi = out.phi;
    ts.skipped = out.skipped;
    trace_->write_step(ts, t.monitor());
  }
  return out;
}

const Tensor& Trainer::rank_rows(const Tensor& images, const std::vector<std::int32_t>& labels) {
  const auto b = static_cast<std::int64_t>(labels.size());
  const std::int64_t ranks = comm_->size(), r = comm_->rank();
  const std::int64_t begin = b * r / ranks, end = b * (r + 1) / ranks;
  Shape shape = images.shape();
  shape[0] = end - begin;
  rank_x_.resize(shape);
  const std::int64_t row = images.size() / std::max<std::int64_t>(1, b);
  std::copy(images.data() + begin * row, images.data() + end * row, rank_x_.data());
  rank_y_.assign(labels.begin() + begin, labels.begin() + end);
  return rank_x_;
}

EvalResult Trainer::evaluate(const Dataset& data) {
  const Evaluation e = gradscale::evaluate(*training_, data, config_.eval_batch);
  return {e.loss, e.accuracy};
}

void Trainer::progress(bool force) {
  if (!log_) return;
  const double t = now_seconds();
  if (!force && t - last_progress_ < config_.progress_seconds) return;
  last_progress_ = t;
  const std::int64_t per_epoch = batcher_->batches_per_epoch();
  const std::int64_t total = config_.max_steps > 0 ? std::min(config_.max_steps, config_.epochs * per_epoch)
                                                   : config_.epochs * per_epoch;
  const double rate = static_cast<double>(steps() - steps_at_run_start_) / std::max(1e-9, t - run_start_);
  const double eta = static_cast<double>(total - steps()) / std::max(1e-9, rate);
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
      training_->scaler().loss_scale(), static_cast<long long>(skipped_), rate, format_duration(eta).c_str());
  *log_ << line << std::endl;
}

nlohmann::json Trainer::run() {
  run_start_ = now_seconds();
  steps_at_run_start_ = steps();
  bool stopped = false;
  while (batcher_->epoch() < config_.epochs && !stopped) {
    const std::int64_t epoch = batcher_->epoch();
    double t0 = now_seconds();
    while (true) {
      if (config_.max_steps > 0 && steps() >= config_.max_steps) {
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
      if (divergence_.diverged()) {  // stop; the last checkpoint stays the last good state
        stopped = true;
        break;
      }
      if (config_.eval_every > 0 && steps() % config_.eval_every == 0) {
        // Evaluation reads the weights in eval mode and draws nothing from the training's generators,
        // so the run trains the same with or without it; its time is not training time.
        const EvalResult test = evaluate(data_.test);
        evaluations_.push_back(
            {{"step", steps()}, {"test_loss", json_real(test.loss)}, {"test_accuracy", test.accuracy}});
        t0 = now_seconds();
      }
      if (config_.save_every > 0 && !config_.checkpoint_dir.empty() && steps() % config_.save_every == 0) {
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
    e.steps = steps();
    e.skipped_steps = skipped_;
    e.scale = training_->scaler().loss_scale();
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
  if (!config_.checkpoint_dir.empty() && config_.save_every > 0 && !divergence_.diverged())
    save_checkpoint(config_.checkpoint_dir);
  if (comm_) DataParallel(*comm_).check_same_weights(model_->parameters(), "at the end of training");
  nlohmann::json result = result_json();
  if (comm_) {
    result["ranks"] = comm_->size();
    // What the reductions moved, per rank (docs/distributed.md: the cost model these figures check).
    const ReductionCounts& n = training_->data_parallel()->counts();
    const DeviceCollectives* device = training_->data_parallel()->device();
    result["data_parallel"] = {{"backend", comm_->backend()},
                               {"gpu_collectives", device ? nlohmann::json(device->backend()) : nlohmann::json()},
                               {"statistics_collectives", n.statistics_collectives},
                               {"statistics_bytes", n.statistics_bytes},
                               {"gradient_collectives", n.gradient_collectives},
                               {"gradient_bytes", n.gradient_bytes},
                               {"statistics_seconds", n.statistics_seconds},
                               {"gradient_seconds", n.gradient_seconds}};
  }
  if (trace_) {
    // "skipped" and "overflows": the writer counts them from the step records (a resumed run's too).
    trace_->finish({{"steps", steps()},
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
  const bool complete = !history_.empty() && history_.back().steps == steps();
  r["schema"] = "gradscale.result/1";
  r["version"] = GRADSCALE_VERSION;
  r["complete"] = batcher_->epoch() >= config_.epochs && !divergence_.diverged();
  r["diverged"] = divergence_.diverged();
  if (divergence_.diverged()) {
    r["diverged_step"] = divergence_.step();
    r["divergence"] = divergence_.reason();
  }
  r["steps"] = steps();
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
  if (config_.eval_every > 0) r["evaluations"] = evaluations_;
  r["final_scale"] = json_real(training_->scaler().loss_scale());
  r["scaler_state"] = training_->scaler().state();
  r["data"] = data_.source;
  r["data_checksum"] = data_.checksum;
  r["parameters"] = model_->num_parameters();
  if (complete) {
    r["test_accuracy"] = history_.back().test_accuracy;
    r["test_loss"] = json_real(history_.back().test_loss);
    r["train_loss"] = json_real(history_.back().train_loss);
    r["train_accuracy"] = history_.back().train_accuracy;
  } else {  // stopped inside an epoch (max_steps): evaluate now
    const EvalResult test = evaluate(data_.test);
    r["test_accuracy"] = test.accuracy;
    r["test_loss"] = json_real(test.loss);
    r["train_loss"] = json_real(epoch_seen_ ? epoch_loss_sum_ / static_cast<double>(epoch_seen_)
                                            : (history_.empty() ? 0.0 : history_.back().train_loss));
    r["train_accuracy"] = epoch_seen_ ? static_cast<double>(epoch_correct_) / static_cast<double>(epoch_seen_)
                                      : (history_.empty() ? 0.0 : history_.back().train_accuracy);
  }
  if (!resumed_.is_null()) r["resumed"] = resumed_;
  r["config"] = config_.to_json();
  return r;
}

}  // namespace gradscale
