// The training loop of the CPU engine (SPEC §4–§5): data, epochs, evaluation, progress lines, traces,
// checkpoints and resume around ScaledTraining (scaled_training.h), which does each iteration —
// working weights in F, forward in F, the loss in fp32 with S0 from the scaler, backward with scaled
// gradients, the scaler's verdict (apply or skip) and the optimizer step — as a user's own loop would.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/backend/backend.h"
#include "lib/core/random.h"
#include "lib/data/batcher.h"
#include "lib/data/dataset.h"
#include "lib/model/model.h"
#include "lib/optim/lr_schedule.h"
#include "lib/optim/optimizer.h"
#include "lib/scaler/scaler.h"
#include "lib/train/config.h"
#include "lib/train/divergence.h"
#include "lib/train/epoch_summary.h"
#include "lib/train/scaled_training.h"

namespace gradscale {

struct EvalResult {
  double loss = 0, accuracy = 0;
};

// The outcome of one iteration: what ScaledTraining::step reports.
using StepOutcome = StepResult;

class TraceWriter;

class Trainer {
 public:
  // Builds data, model, scaler, optimizer from the config (and restores a checkpoint when
  // config.resume_dir is set). `log` receives the data line and the progress lines (may be null).
  // With `comm` of more than one rank (borrowed; outlives the trainer): data-parallel training
  // (docs/distributed.md) — every rank loads the same data and draws the same batches, trains on its
  // rows of each (rank r of N: rows [r·b/N, (r+1)·b/N) of a batch of b), and takes the same decisions;
  // only rank 0 writes the trace and checkpoints (and should be the one to log and write the result).
  // On a GPU ("device": "cuda"), rank r takes device (its rank on its machine) mod (the devices it
  // sees), and `gpu_collectives` sums the weight gradients (ScaledTraining::distribute).
  explicit Trainer(TrainConfig config, std::ostream* log = nullptr, Communicator* comm = nullptr,
                   const std::string& gpu_collectives = "auto");
  ~Trainer();

  // Trains for config.epochs (or until max_steps, or until the run diverges); returns the result
  // document (docs/config.md: test_accuracy, test_loss, steps, history, diverged, config, ...).
  nlohmann::json run();

  // One iteration on a batch (exposed for tests and custom loops).
  StepOutcome train_step(const Tensor& images, const std::vector<std::int32_t>& labels);
  EvalResult evaluate(const Dataset& data);

  void save_checkpoint(const std::string& dir);

  Model& model() { return *model_; }
  Scaler& scaler() { return training_->scaler(); }
  ScaledTraining& training() { return *training_; }
  Optimizer& optimizer() { return *optimizer_; }
  const DataSplit& data() const { return data_; }
  const TrainConfig& config() const { return config_; }
  const Precision& precision() const { return precision_; }
  double scaler_seconds() const { return scaler_seconds_; }

 private:
  void load_checkpoint(const std::string& dir);
  // Data-parallel: this rank's rows of a batch (into rank_x_, rank_y_).
  const Tensor& rank_rows(const Tensor& images, const std::vector<std::int32_t>& labels);
  void progress(bool force);
  nlohmann::json result_json();  // evaluates the test set when stopped mid-epoch

  TrainConfig config_;
  std::ostream* log_;
  Precision precision_;
  DataSplit data_;
  std::unique_ptr<Backend> backend_;  // config_.device's; outlives the model
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<ScaledTraining> training_;  // the scaler, the dropout generator, the iteration count
  std::unique_ptr<LrSchedule> schedule_;
  Communicator* comm_ = nullptr;  // data-parallel: this rank's communicator (null: one process)
  bool writes_ = true;            // this rank writes the trace and checkpoints (rank 0)
  Tensor rank_x_;                 // this rank's rows of the batch
  std::vector<std::int32_t> rank_y_;
  std::unique_ptr<Batcher> batcher_;
  DivergenceCheck divergence_;
  std::unique_ptr<TraceWriter> trace_;
  Tensor batch_x_;
  std::vector<std::int32_t> batch_y_;

  std::int64_t steps() const { return training_->steps(); }  // iterations done

  // Counters (all saved in checkpoints).
  std::int64_t skipped_ = 0, overflow_steps_ = 0;
  double scaler_seconds_ = 0;  // time in the scaler and its controller, statistics for queries included
  double epoch_loss_sum_ = 0;
  std::int64_t epoch_correct_ = 0, epoch_seen_ = 0;
  double epoch_seconds_ = 0;  // training time accumulated in the current epoch
  std::vector<EpochSummary> history_;
  // eval_every's evaluations: {"step", "test_loss", "test_accuracy"} in step order (saved in checkpoints).
  nlohmann::json evaluations_ = nlohmann::json::array();
  double last_progress_ = -1e300, run_start_ = 0;
  std::int64_t steps_at_run_start_ = 0;
  nlohmann::json resumed_;  // after a resume: where from and which changeable keys changed
};

}  // namespace gradscale
