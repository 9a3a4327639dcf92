// An epoch's summary as JSON (see epoch_summary.h).
#include "lib/train/epoch_summary.h"

namespace gradscale {

nlohmann::json epoch_json(const EpochSummary& e) {
  return {{"epoch", e.epoch},
          {"train_loss", json_real(e.train_loss)},
          {"train_accuracy", e.train_accuracy},
          {"test_loss", json_real(e.test_loss)},
          {"test_accuracy", e.test_accuracy},
          {"seconds", e.seconds},
          {"steps", e.steps},
          {"skipped_steps", e.skipped_steps},
          {"scale", json_real(e.scale)}};
}

EpochSummary epoch_from_json(const JsonFields& f) {
  EpochSummary e;
  e.epoch = f.integer("epoch", 1, kMaxCount);
  e.train_loss = f.real("train_loss");
  e.train_accuracy = f.number("train_accuracy", 0, 1);
  e.test_loss = f.real("test_loss");
  e.test_accuracy = f.number("test_accuracy", 0, 1);
  e.seconds = f.number("seconds", 0, kMaxSeconds);
  e.steps = f.integer("steps", 0, kMaxCount);
  e.skipped_steps = f.integer("skipped_steps", 0, e.steps);
  e.scale = f.real("scale");
  return e;
}

}  // namespace gradscale
