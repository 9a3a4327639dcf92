// Checking a run's config without training (see validate.h): the library's own readers, given the
// config, each refuse what they would refuse at the start of a run.
#include "experiments/ablate/validate.h"
#include "experiments/ablate/torch_runs.h"

#include <cerrno>
#include <cstdlib>
#include <filesystem>

#include "lib/core/error.h"
#include "lib/data/synthetic.h"
#include "lib/model/spec.h"
#include "lib/optim/lr_schedule.h"
#include "lib/optim/optimizer.h"
#include "lib/scaler/scaler.h"
#include "lib/train/config.h"

namespace gradscale::ablate {
namespace {

using json = nlohmann::json;

}  // namespace

void check_data_spec(const std::string& spec) {
  if (spec == "fashion-mnist" || spec == "synthetic") return;
  const std::string mnist = "mnist:", synthetic = "synthetic:";
  if (spec.compare(0, mnist.size(), mnist) == 0) {
    const std::string dir = spec.substr(mnist.size());
    GS_CHECK_CONFIG(!dir.empty() && std::filesystem::is_directory(dir),
                    "config key 'data': '" << spec << "' names no directory");
    return;
  }
  if (spec.compare(0, synthetic.size(), synthetic) == 0) {
    const std::string n = spec.substr(synthetic.size());
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(n.c_str(), &end, 10);
    GS_CHECK_CONFIG(!n.empty() && end == n.c_str() + n.size() && errno == 0 && v >= 1 && v <= 10000000,
                    "config key 'data': '" << spec << "': N must be an integer in [1, 10000000]");
    return;
  }
  throw ConfigError("config key 'data': unknown data spec '" + spec +
                    "' (allowed: fashion-mnist, mnist:DIR, synthetic, synthetic:N)");
}

void validate_config(const json& config) {
  if (is_torch_run(config)) return validate_torch_config(config);
  TrainConfig c;
  c.merge_json(config);
  const Format grad = c.grad_format.value_or(c.format);
  make_scaler(c.scaler, grad);
  if (c.model_spec.is_null()) {
    builtin_model_spec(c.model);
  } else {
    Rng rng(0);
    const auto model = build_model(c.model_spec, rng);
    // Every data spec has the synthetic set's 10 classes (Fashion-MNIST, MNIST): refused here, not
    // when the first batch's labels reach the loss.
    GS_CHECK_CONFIG(model->classes() == kSyntheticClasses, "model_spec: the model outputs "
                                                               << model->classes()
                                                               << " classes (its last layer), the data has "
                                                               << kSyntheticClasses);
  }
  make_optimizer(c.optimizer);
  json sched = c.schedule;
  if (!sched.contains("lr")) sched["lr"] = c.lr;
  if (sched.value("name", "") == "cosine" && !sched.contains("total_steps")) sched["total_steps"] = 1;
  LrSchedule::from_json(sched);
  check_data_spec(c.data);
}

}  // namespace gradscale::ablate
