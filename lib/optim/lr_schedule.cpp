// Learning-rate schedules over applied optimizer steps (see lr_schedule.h): closed forms of PyTorch's
// StepLR, CosineAnnealingLR and LinearLR warm-up chained as SequentialLR would chain them.
#include "lib/optim/lr_schedule.h"

#include <cmath>
#include <limits>

#include "lib/core/error.h"
#include "lib/core/config_reader.h"

namespace gradscale {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kPi = 3.14159265358979323846;
constexpr std::int64_t kMaxSteps = std::numeric_limits<std::int64_t>::max();
const Interval kLrRange{0.0, kInf, false, true};
const Interval kGammaRange{0.0, 1.0, true, false};
const Interval kStartFactorRange{0.0, 1.0, true, false};

const char* kind_name(LrSchedule::Kind kind) {
  switch (kind) {
    case LrSchedule::Kind::constant:
      return "constant";
    case LrSchedule::Kind::step:
      return "step";
    case LrSchedule::Kind::cosine:
      return "cosine";
  }
  return "?";
}

void check_options(const LrSchedule::Options& o) {
  const std::string ctx = std::string("lr schedule '") + kind_name(o.kind) + "'";
  GS_CHECK_CONFIG(kLrRange.contains(o.lr),
                  ctx << ": 'lr' must be in " << kLrRange.text() << ", got " << o.lr);
  GS_CHECK_CONFIG(o.warmup_steps >= 0,
                  ctx << ": 'warmup_steps' must be an integer >= 0, got " << o.warmup_steps);
  GS_CHECK_CONFIG(kStartFactorRange.contains(o.warmup_start_factor),
                  ctx << ": 'warmup_start_factor' must be in " << kStartFactorRange.text() << ", got "
                      << o.warmup_start_factor);
  if (o.kind == LrSchedule::Kind::step) {
    GS_CHECK_CONFIG(o.step_size >= 1, ctx << ": 'step_size' must be an integer >= 1, got " << o.step_size);
    GS_CHECK_CONFIG(kGammaRange.contains(o.gamma),
                    ctx << ": 'gamma' must be in " << kGammaRange.text() << ", got " << o.gamma);
  }
  if (o.kind == LrSchedule::Kind::cosine) {
    GS_CHECK_CONFIG(o.total_steps > o.warmup_steps,
                    ctx << ": 'total_steps' must be greater than 'warmup_steps' (" << o.warmup_steps
                        << "), got " << o.total_steps);
    const Interval min_range{0.0, o.lr, false, false};
    GS_CHECK_CONFIG(min_range.contains(o.min_lr),
                    ctx << ": 'min_lr' must be in " << min_range.text() << " (up to 'lr'), got " << o.min_lr);
  }
}

}  // namespace

LrSchedule LrSchedule::from_json(const nlohmann::json& cfg) {
  const std::string name = config_name(cfg, "lr schedule", {"constant", "step", "cosine"});
  std::vector<std::string> keys = {"name", "lr", "warmup_steps", "warmup_start_factor"};
  Options o;
  if (name == "step") {
    o.kind = Kind::step;
    keys.insert(keys.end(), {"step_size", "gamma"});
  } else if (name == "cosine") {
    o.kind = Kind::cosine;
    keys.insert(keys.end(), {"total_steps", "min_lr"});
  }
  const ConfigReader r(cfg, "lr schedule '" + name + "'", keys);
  o.lr = r.required_number("lr", kLrRange);
  o.warmup_steps = r.integer("warmup_steps", o.warmup_steps, 0, kMaxSteps);
  o.warmup_start_factor = r.number("warmup_start_factor", o.warmup_start_factor, kStartFactorRange);
  if (o.kind == Kind::step) {
    o.step_size = r.required_integer("step_size", 1, kMaxSteps);
    o.gamma = r.number("gamma", o.gamma, kGammaRange);
  }
  if (o.kind == Kind::cosine) {
    o.total_steps = r.required_integer("total_steps", 1, kMaxSteps);
    o.min_lr = r.number("min_lr", o.min_lr, Interval{0.0, o.lr, false, false});
  }
  return LrSchedule(o);
}

LrSchedule::LrSchedule(const Options& options) : options_(options) {
  check_options(options_);
}

double LrSchedule::lr(std::int64_t applied_step) const {
  GS_CHECK(applied_step >= 0, "applied step " << applied_step << " is negative");
  const Options& o = options_;
  if (applied_step < o.warmup_steps) {
    const double progress = static_cast<double>(applied_step) / static_cast<double>(o.warmup_steps);
    return o.lr * (o.warmup_start_factor + (1.0 - o.warmup_start_factor) * progress);
  }
  const std::int64_t j = applied_step - o.warmup_steps;
  switch (o.kind) {
    case Kind::constant:
      return o.lr;
    case Kind::step:
      return o.lr * std::pow(o.gamma, static_cast<double>(j / o.step_size));
    case Kind::cosine: {
      const std::int64_t span = o.total_steps - o.warmup_steps;
      if (j >= span) return o.min_lr;
      const double progress = static_cast<double>(j) / static_cast<double>(span);
      return o.min_lr + (o.lr - o.min_lr) * (1.0 + std::cos(kPi * progress)) / 2.0;
    }
  }
  return o.lr;
}

nlohmann::json LrSchedule::config() const {
  const Options& o = options_;
  nlohmann::json cfg = {{"name", kind_name(o.kind)},
                        {"lr", o.lr},
                        {"warmup_steps", o.warmup_steps},
                        {"warmup_start_factor", o.warmup_start_factor}};
  if (o.kind == Kind::step) {
    cfg["step_size"] = o.step_size;
    cfg["gamma"] = o.gamma;
  }
  if (o.kind == Kind::cosine) {
    cfg["total_steps"] = o.total_steps;
    cfg["min_lr"] = o.min_lr;
  }
  return cfg;
}

}  // namespace gradscale
