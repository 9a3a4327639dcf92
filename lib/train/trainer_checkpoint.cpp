// The training loop's checkpoints (see trainer.h): ScaledTraining saves the model, optimizer, scaler,
// iteration count and dropout generator; the loop adds its own counters, data order and history, and
// checks every field it reads back.
#include <filesystem>

#include "lib/core/json_read.h"
#include "lib/train/checkpoint.h"
#include "lib/train/resume_check.h"
#include "lib/train/trainer.h"

namespace gradscale {

// The model, optimizer, scaler, iteration count and dropout generator are ScaledTraining's to save; the
// loop's own counters, data order and history go with them as extra keys.
void Trainer::save_checkpoint(const std::string& dir) {
  // Data-parallel: the ranks hold the same state (checked); rank 0 writes it, with nothing of N in it,
  // so any number of ranks resumes it.
  if (comm_) DataParallel(*comm_).check_same_weights(model_->parameters(), "at step " + std::to_string(steps()));
  if (!writes_) return;
  nlohmann::json history = nlohmann::json::array();
  for (const EpochSummary& e : history_) history.push_back(epoch_json(e));
  const nlohmann::json extra = {{"config", config_.to_json()},
                                {"data_checksum", data_.checksum},
                                {"skipped_steps", skipped_},
                                {"overflow_steps", overflow_steps_},
                                {"scaler_seconds", scaler_seconds_},
                                {"epoch_loss_sum", json_real(epoch_loss_sum_)},
                                {"epoch_correct", epoch_correct_},
                                {"epoch_seen", epoch_seen_},
                                {"epoch_seconds", epoch_seconds_},
                                {"nonfinite_loss_steps", divergence_.nonfinite_loss_steps()},
                                {"history", history},
                                {"evaluations", evaluations_},
                                {"batcher", batcher_->state()}};
  training_->save(dir, extra);
}

// Every field of checkpoint.json is checked before it is used: the seal and schema (read_checkpoint_meta),
// then that it is this run (model and format, config, data), then each field's type and range and
// that the counters agree with each other; the tensor file last. A refusal names the field.
void Trainer::load_checkpoint(const std::string& dir) {
  // The model, optimizer, scaler, iteration count and generator, each checked (scaled_training.cpp);
  // it refuses another model, format or scaler.
  const nlohmann::json meta = training_->load(dir);
  const JsonFields f(meta, (std::filesystem::path(dir) / kCheckpointJson).string());
  const nlohmann::json changed = check_resume_config(f.object("config"), config_.to_json(), dir);
  const std::string data_checksum = f.text("data_checksum");
  GS_CHECK_CONFIG(data_checksum == data_.checksum,
                  "--resume " << dir << ": the data differs from the checkpoint's (content checksum "
                              << text_excerpt(data_checksum, 40) << "; this run's data has " << data_.checksum
                              << ": " << data_.source << "); resume needs the same data");

  // The loop's counters: types, ranges, and agreement with each other and with the data order.
  const std::int64_t steps = this->steps();
  const std::int64_t skipped = f.integer("skipped_steps", 0, steps);
  const std::int64_t overflows = f.integer("overflow_steps", 0, steps);
  const double scaler_seconds = f.number("scaler_seconds", 0, kMaxSeconds);
  const std::int64_t seen = f.integer("epoch_seen", 0, batcher_->size());
  const std::int64_t correct = f.integer("epoch_correct", 0, seen);
  const double loss_sum = f.real("epoch_loss_sum");
  const double seconds = f.number("epoch_seconds", 0, kMaxSeconds);
  const std::int64_t nonfinite =
      f.integer("nonfinite_loss_steps", 0, std::min(steps, kNonFiniteLossLimit - 1));
  const nlohmann::json& saved_history = f.array("history");
  const std::int64_t per_epoch = batcher_->batches_per_epoch();
  std::vector<EpochSummary> history;
  for (std::size_t i = 0; i < saved_history.size(); ++i) {
    const std::string where = "history[" + std::to_string(i) + "]";
    history.push_back(epoch_from_json(JsonFields(saved_history[i], f.file(), where)));
    const EpochSummary& e = history.back();
    if (e.epoch != static_cast<std::int64_t>(i) + 1 || e.steps != e.epoch * per_epoch ||
        (i > 0 && e.skipped_steps < history[i - 1].skipped_steps) || e.skipped_steps > skipped)
      f.fail(where.c_str(), "is epoch " + std::to_string(e.epoch) + " ending at step " +
                                std::to_string(e.steps) + " with " + std::to_string(e.skipped_steps) +
                                " skipped; expected epoch " + std::to_string(i + 1) + " ending at step " +
                                std::to_string((i + 1) * per_epoch));
  }
  nlohmann::json evaluations = nlohmann::json::array();  // absent in checkpoints written without the key
  if (f.has("evaluations")) {
    const nlohmann::json& saved = f.array("evaluations");
    for (std::size_t i = 0; i < saved.size(); ++i) {
      const std::string where = "evaluations[" + std::to_string(i) + "]";
      const JsonFields e(saved[i], f.file(), where);
      const std::int64_t at = e.integer("step", 1, steps);
      if (!evaluations.empty() && at <= evaluations.back()["step"].get<std::int64_t>())
        f.fail(where.c_str(), "is at step " + std::to_string(at) + ", not after the evaluation before it");
      evaluations.push_back(
          {{"step", at}, {"test_loss", json_real(e.real("test_loss"))}, {"test_accuracy", e.number("test_accuracy", 0, 1)}});
    }
  }
  try {
    batcher_->restore(f.object("batcher"));
  } catch (const ConfigError& e) {
    f.fail("batcher", std::string("is refused: ") + e.what());
  }
  if (batcher_->epoch() != static_cast<std::int64_t>(history.size()))
    f.fail("batcher", "is at epoch " + std::to_string(batcher_->epoch()) + " but 'history' has " +
                          std::to_string(history.size()) + " finished epochs");
  if (seen != batcher_->position())
    f.fail("epoch_seen", "is " + std::to_string(seen) + " but the batcher is at example " +
                             std::to_string(batcher_->position()) + " of its epoch");
  const std::int64_t expect_steps =
      batcher_->epoch() * per_epoch + (batcher_->position() + config_.batch - 1) / config_.batch;
  if (steps != expect_steps)
    f.fail("steps", "is " + std::to_string(steps) + " but the batcher has served " +
                        std::to_string(expect_steps) + " batches");
  if (optimizer_->step_count() != steps - skipped)
    f.fail("optimizer.step", "is " + std::to_string(optimizer_->step_count()) + " but " +
                                 std::to_string(steps) + " steps with " + std::to_string(skipped) +
                                 " skipped applied " + std::to_string(steps - skipped));

  skipped_ = skipped;
  overflow_steps_ = overflows;
  scaler_seconds_ = scaler_seconds;
  epoch_loss_sum_ = loss_sum;
  epoch_correct_ = correct;
  epoch_seen_ = seen;
  epoch_seconds_ = seconds;
  history_ = std::move(history);
  evaluations_ = std::move(evaluations);
  divergence_.restore(nonfinite);
  resumed_ = {{"from", dir}, {"step", steps}, {"changed", changed}};
  const int removed = remove_orphaned_checkpoint_files(dir, meta.at("tensor_file").get<std::string>());
  if (log_) {
    *log_ << "resumed from '" << dir << "' at step " << steps << "\n";
    if (removed > 0)
      *log_ << "removed " << removed << " file(s) left in '" << dir << "' by an interrupted save\n";
  }
}

}  // namespace gradscale
