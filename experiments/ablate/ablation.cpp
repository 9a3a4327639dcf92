// Ablation files: reading, expansion into runs and validation (see ablation.h, docs/ablations.md).
#include "experiments/ablate/ablation.h"
#include "experiments/ablate/limits.h"
#include "experiments/ablate/torch_runs.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "lib/core/error.h"
#include "lib/core/file_read.h"
#include "lib/core/json_read.h"
#include "lib/data/synthetic.h"
#include "lib/model/spec.h"
#include "lib/optim/lr_schedule.h"
#include "lib/optim/optimizer.h"
#include "lib/scaler/scaler.h"
#include "lib/train/config.h"

namespace gradscale::ablate {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// Keys the runner owns: each run's trace goes to its own directory, and an ablation resumes run by
// run (a half-written run is run again), not from checkpoints.
const std::set<std::string> kRunnerKeys = {"trace", "checkpoint", "save_every", "resume"};
const char* const kTopLevelKeys =
    "description, base, axes, variants, seeds, max_runs, extra_rows, target, compare_to";

// At most this much of a value goes into a message: a long model spec stays readable.
std::string shown(const json& v) {
  std::string s = v.dump();
  if (s.size() > 120) s = s.substr(0, 117) + "...";
  return s;
}

json to_json(const ordered_json& v) {
  return json::parse(v.dump());
}

// One choice along a dimension of the ablation (a value of an axis, or a variant): its label in the
// table, its part of the run names, and the keys it sets, in file order.
struct Choice {
  std::string label;
  std::string name_part;
  std::string source;  // for messages: "axis 'scaler' value \"torch\"", "variant 2 ('fp16')"
  std::vector<std::pair<std::string, json>> settings;
};

// An axis, or the variants: one table column and its choices.
struct Dimension {
  std::string column;
  std::vector<Choice> choices;
};

// The last component of a key, for run names: "scaler.n_uf" → "n_uf".
std::string short_key(const std::string& key) {
  const auto dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

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

// A data spec only PyTorch runs read: text:PATH, or an image shape after fashion-mnist / mnist:DIR /
// synthetic:N (the forms both engines read are checked as the C++ engine reads them).
bool torch_only_data(const json& value) {
  const std::string spec = value.get<std::string>();
  if (spec.compare(0, 5, "text:") == 0) return true;
  const auto colon = spec.rfind(':');
  if (colon == std::string::npos) return false;
  const std::string tail = spec.substr(colon + 1);
  return tail.size() >= 5 && (tail[0] == '1' || tail[0] == '3') && tail[1] == 'x';
}

// Labels and keys are shown in tables, file names and on the terminal: a control character (a byte
// below 0x20, or 0x7f) in one is refused here, so no output has to guess how to show it.
void check_printable(const std::string& text, const std::string& what) {
  for (const char ch : text) {
    const auto b = static_cast<unsigned char>(ch);
    if (b >= 0x20 && b != 0x7f) continue;
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", b);
    std::string shown_text;
    for (const char c : text_excerpt(text, 60))
      shown_text += static_cast<unsigned char>(c) < 0x20 || c == 0x7f ? std::string("?") : std::string(1, c);
    throw ConfigError(what + " '" + shown_text + "' contains a control character (byte " + hex +
                      "); labels and keys are shown in tables, file names and on the terminal");
  }
}

// Checks a key an axis or a variant sets, and (for plain keys) the value on its own.
void check_setting(const std::string& key, const json& value, const std::string& what) {
  GS_CHECK_CONFIG(!key.empty(), what << ": empty key");
  GS_CHECK_CONFIG(!kRunnerKeys.count(key), what << ": key '" << key
                                                << "' is set by the ablation runner (each run gets its own "
                                                   "trace; an ablation resumes run by run), not by the file");
  if (key.find('.') != std::string::npos) {
    json probe = json::object();
    try {
      apply_setting(probe, key, value);
    } catch (const ConfigError& e) {
      throw ConfigError(what + ": " + e.what());
    }
    return;
  }
  // A PyTorch run's model, data forms only its runs read, and its own keys: checked by torch_runs.h.
  const bool torch_data =
      key == "data" && (value.is_object() || (value.is_string() && torch_only_data(value)));
  if ((key == "model" && is_torch_model(value)) || torch_data || is_torch_only_key(key)) {
    try {
      check_torch_setting(key, value);
    } catch (const ConfigError& e) {
      throw ConfigError(what + ": " + e.what());
    }
    return;
  }
  try {
    TrainConfig c;
    c.merge_json(json{{key, value}});
    if (key == "model") builtin_model_spec(value.get<std::string>());
    if (key == "data") check_data_spec(value.get<std::string>());
  } catch (const ConfigError& e) {
    throw ConfigError(what + ": " + e.what());
  }
}

// The settings of a {"key": value, ...} object (a variant, or an axis value's "set"); `label` gets
// the "label" key when `labelled`, and is otherwise left alone.
std::vector<std::pair<std::string, json>> read_settings(const ordered_json& obj, const std::string& what,
                                                        std::string* label) {
  std::vector<std::pair<std::string, json>> settings;
  for (const auto& [key, value] : obj.items()) {
    if (label && key == "label") {
      GS_CHECK_CONFIG(value.is_string() && !value.get<std::string>().empty(),
                      what << ": \"label\" must be a non-empty string, got " << shown(to_json(value)));
      *label = value.get<std::string>();
      continue;
    }
    check_printable(key, what + ": key");
    const json j = to_json(value);
    GS_CHECK_CONFIG(key != "seed", what << " sets 'seed': list seeds in \"seeds\"");
    check_setting(key, j, what + " key '" + key + "'");
    settings.emplace_back(key, j);
  }
  return settings;
}

// "format=fp16,scaler=torch": the label of settings that have none.
std::string settings_label(const std::vector<std::pair<std::string, json>>& settings) {
  std::string label;
  for (const auto& [k, v] : settings)
    label += (label.empty() ? "" : ",") + short_key(k) + "=" + value_label(v);
  return label;
}

// An axis: {"key": [V, {"label": L, "value": V}, {"label": L, "set": {"key": V, ...}}, ...]}. A value
// with "set" sets several keys at once; the axis key is then only the column's name.
Dimension read_axis(const std::string& key, const ordered_json& values, const std::string& where) {
  check_printable(key, where + ": axis");
  const std::string what = where + ": axis '" + key + "'";
  GS_CHECK_CONFIG(values.is_array() && !values.empty(),
                  what << " must be a non-empty array of values, got " << shown(to_json(values)));
  Dimension axis{key, {}};
  std::set<std::string> labels;
  for (const auto& item : values) {
    Choice c;
    const bool labelled_value =
        item.is_object() && item.size() == 2 && item.contains("label") && item.contains("value");
    const bool set = item.is_object() && item.contains("set") &&
                     item.size() == (item.contains("label") ? std::size_t{2} : std::size_t{1});
    if (set) {
      c.source = what + " value " + shown(to_json(item));
      // {"label": L, "set": {}} sets nothing: a column that does not apply to the row (an extra row's
      // "bounds" of a global scaler).
      GS_CHECK_CONFIG(item["set"].is_object() && (!item["set"].empty() || item.contains("label")),
                      c.source << ": \"set\" must be a non-empty object of config keys (an empty one only with a \"label\")");
      c.settings = read_settings(item["set"], c.source, nullptr);
      if (item.contains("label")) {
        GS_CHECK_CONFIG(
            item["label"].is_string() && !item["label"].get<std::string>().empty(),
            what << ": \"label\" must be a non-empty string, got " << shown(to_json(item["label"])));
        c.label = item["label"].get<std::string>();
      } else {
        c.label = settings_label(c.settings);
      }
      c.name_part = c.settings.empty() ? "" : c.label;  // a value that sets nothing adds nothing to run names
    } else {
      json value = to_json(labelled_value ? item["value"] : item);
      if (labelled_value) {
        GS_CHECK_CONFIG(
            item["label"].is_string() && !item["label"].get<std::string>().empty(),
            what << ": \"label\" must be a non-empty string, got " << shown(to_json(item["label"])));
        c.label = item["label"].get<std::string>();
      } else {
        c.label = value_label(value);
      }
      c.source = what + " value " + shown(value);
      check_setting(key, value, c.source);
      // A number alone says little in a run name: "n_uf=0.01_seed0".
      c.name_part =
          value.is_string() || value.is_object() || labelled_value ? c.label : short_key(key) + "=" + c.label;
      c.settings.emplace_back(key, std::move(value));
    }
    check_printable(c.label, what + ": label");
    GS_CHECK_CONFIG(labels.insert(c.label).second,
                    what << ": two values have the label '" << c.label
                         << "' (each value needs its own; name them with {\"label\": ..., \"value\": ...})");
    axis.choices.push_back(std::move(c));
  }
  return axis;
}

Dimension read_variants(const ordered_json& doc, const std::string& where) {
  GS_CHECK_CONFIG(
      doc.is_array() && !doc.empty(),
      where << ": \"variants\" must be a non-empty array of objects, got " << shown(to_json(doc)));
  Dimension variants{"variant", {}};
  std::set<std::string> labels;
  for (std::size_t i = 0; i < doc.size(); ++i) {
    const std::string what = where + ": variant " + std::to_string(i + 1);
    GS_CHECK_CONFIG(doc[i].is_object(),
                    what << " must be an object of config keys, got " << shown(to_json(doc[i])));
    Choice c;
    c.settings = read_settings(doc[i], what, &c.label);
    if (c.label.empty()) c.label = c.settings.empty() ? "base" : settings_label(c.settings);
    c.name_part = c.label;
    check_printable(c.label, what + ": label");
    c.source = what + " ('" + c.label + "')";
    GS_CHECK_CONFIG(labels.insert(c.label).second, what << ": another variant has the label '" << c.label
                                                        << "' (give each a distinct \"label\")");
    variants.choices.push_back(std::move(c));
  }
  return variants;
}

std::vector<std::uint64_t> read_seeds(const ordered_json& doc, const std::string& what) {
  GS_CHECK_CONFIG(doc.is_array() && !doc.empty(),
                  what << " must be a non-empty array of integers, got " << shown(to_json(doc)));
  std::vector<std::uint64_t> seeds;
  std::set<std::uint64_t> seen;
  for (const auto& s : doc) {
    const json j = to_json(s);
    GS_CHECK_CONFIG(j.is_number_integer() && j.get<std::int64_t>() >= 0,
                    what << ": a seed must be an integer >= 0, got " << shown(j));
    const auto seed = j.get<std::uint64_t>();
    GS_CHECK_CONFIG(seen.insert(seed).second, what << ": seed " << seed << " is listed twice");
    seeds.push_back(seed);
  }
  return seeds;
}

// "target": {"fraction": F} (of the fp32 reference row's final accuracy) or {"accuracy": A}.
Target read_target(const ordered_json& v, const std::string& where) {
  const std::string what = where + ": \"target\"";
  GS_CHECK_CONFIG(
      v.is_object() && v.size() == 1 && (v.contains("fraction") || v.contains("accuracy")),
      what << " must be {\"fraction\": F} (of the fp32 row's final accuracy) or {\"accuracy\": A}, got "
           << shown(to_json(v)));
  Target t;
  t.absolute = v.contains("accuracy");
  const json x = to_json(t.absolute ? v["accuracy"] : v["fraction"]);
  GS_CHECK_CONFIG(x.is_number() && x.get<double>() > 0 && x.get<double>() <= 1,
                  what << ": " << (t.absolute ? "accuracy" : "fraction")
                       << " must be a number in (0, 1], got " << shown(x));
  t.value = x.get<double>();
  return t;
}

// Applies settings: plain keys first, then dotted keys, so "scaler.n_uf" refines whichever scaler the
// run ends up with.
void apply_all(json& config, const std::vector<std::pair<std::string, json>>& settings) {
  for (const auto& [k, v] : settings)
    if (k.find('.') == std::string::npos) apply_setting(config, k, v);
  for (const auto& [k, v] : settings)
    if (k.find('.') != std::string::npos) apply_setting(config, k, v);
}

}  // namespace

void apply_setting(json& config, const std::string& key, const json& value) {
  const auto dot = key.find('.');
  if (dot == std::string::npos) {
    config[key] = value;
    return;
  }
  const std::string head = key.substr(0, dot), param = key.substr(dot + 1);
  GS_CHECK_CONFIG(
      head == "scaler" || head == "optimizer" || head == "schedule",
      "key '" << key << "': only scaler.P, optimizer.P and schedule.P may name a parameter inside a key");
  GS_CHECK_CONFIG(!param.empty() && param.find('.') == std::string::npos,
                  "key '" << key << "': expected " << head << ".PARAMETER");
  GS_CHECK_CONFIG(param != (head == "scaler" ? "policy" : "name"),
                  "key '" << key << "': set '" << head << "' itself to change the " << param);
  json obj = config.contains(head) ? config[head] : json();
  if (obj.is_null()) obj = head == "scaler" ? json("none") : json(head == "optimizer" ? "adam" : "constant");
  if (obj.is_string()) {
    obj =
        head == "scaler" ? parse_scaler_spec(obj.get<std::string>()) : json{{"name", obj.get<std::string>()}};
  }
  GS_CHECK_CONFIG(obj.is_object(),
                  "key '" << key << "': '" << head << "' is " << shown(obj) << ", not an object");
  obj[param] = value;
  config[head] = obj;
}

std::string value_label(const json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (!value.is_object()) return value.dump();
  std::string label;
  for (const char* head : {"policy", "name", "method"})
    if (value.contains(head) && value[head].is_string())
      label += (label.empty() ? "" : " ") + value[head].get<std::string>();
  for (const auto& [k, v] : value.items()) {
    if ((k == "policy" || k == "name" || k == "method") && v.is_string()) continue;
    label += (label.empty() ? "" : " ") + k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
  }
  return label.empty() ? "{}" : label;
}

std::string file_safe(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '_' || c == '=' || c == '+' || c == '-';
    if (keep)
      out += c;
    else if (out.empty() || out.back() != '-')
      out += '-';
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  while (!out.empty() && (out.front() == '-' || out.front() == '.')) out.erase(out.begin());
  return out.empty() ? "run" : out;
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

Ablation expand_ablation(const ordered_json& doc, const std::string& where) {
  GS_CHECK_CONFIG(doc.is_object(),
                  where << ": an ablation must be a JSON object with \"base\" and \"axes\" and/or "
                           "\"variants\"");
  for (const auto& [k, v] : doc.items()) {
    (void)v;
    GS_CHECK_CONFIG(k == "description" || k == "base" || k == "axes" || k == "variants" || k == "seeds" ||
                        k == "max_runs" || k == "extra_rows" || k == "target" || k == "compare_to",
                    where << ": unknown top-level key '" << k << "' (allowed: " << kTopLevelKeys << ")");
  }
  GS_CHECK_CONFIG(doc.contains("axes") || doc.contains("variants") || doc.contains("seeds"),
                  where << ": nothing to vary: give \"axes\", \"variants\" or \"seeds\"");
  Ablation ab;
  if (doc.contains("description")) {
    GS_CHECK_CONFIG(doc["description"].is_string(), where << ": \"description\" must be a string");
    ab.description = doc["description"].get<std::string>();
  }

  json base = json::object();
  if (doc.contains("base")) {
    GS_CHECK_CONFIG(doc["base"].is_object(), where << ": \"base\" must be an object of config keys");
    for (const auto& [k, v] : doc["base"].items()) {
      GS_CHECK_CONFIG(
          k.find('.') == std::string::npos,
          where << ": base key '" << k
                << "': write the whole object in the base (dotted keys are for axes and variants)");
      check_setting(k, to_json(v), where + ": base");
      base[k] = to_json(v);
    }
    try {
      // A base without a model may hold a PyTorch run's own keys for the runs whose model an axis sets:
      // they are checked per run, where the model is known.
      json checked = base;
      if (!checked.contains("model"))
        for (auto it = checked.begin(); it != checked.end();)
          it = is_torch_only_key(it.key()) ? checked.erase(it) : std::next(it);
      validate_config(checked);
    } catch (const ConfigError& e) {
      throw ConfigError(where + ": base: " + e.what());
    }
  }

  // The dimensions in file order: the variants where "variants" stands relative to "axes", the axes in
  // their order. They are the table's columns, and its rows come in their product's order.
  std::vector<Dimension> dims;
  std::vector<std::uint64_t> seeds;
  bool seeds_given = false;
  for (const auto& [key, value] : doc.items()) {
    if (key == "variants") dims.push_back(read_variants(value, where));
    if (key != "axes") continue;
    GS_CHECK_CONFIG(value.is_object(), where << ": \"axes\" must be an object {\"key\": [values]}");
    for (const auto& [k, v] : value.items()) {
      if (k == "seed") {
        GS_CHECK_CONFIG(!doc.contains("seeds"),
                        where << ": seeds are given twice (\"seeds\" and axis 'seed')");
        seeds = read_seeds(v, where + ": axis 'seed'");
        seeds_given = true;
        continue;
      }
      dims.push_back(read_axis(k, v, where));
    }
  }
  if (doc.contains("seeds")) {
    seeds = read_seeds(doc["seeds"], where + ": \"seeds\"");
    seeds_given = true;
  }
  if (!seeds_given) seeds = {base.contains("seed") ? base["seed"].get<std::uint64_t>() : 0};
  for (const Dimension& d : dims) ab.columns.push_back(d.column);
  std::vector<std::pair<std::string, std::size_t>> sizes;
  for (const Dimension& d : dims) sizes.emplace_back(d.column, d.choices.size());
  check_run_count(doc, sizes, seeds.size(), where);

  // The configurations, in table order: the product of the dimensions, the first outermost.
  struct Config {
    std::vector<std::string> labels;
    std::vector<std::string> name_parts;
    std::vector<std::pair<std::string, json>> settings;
  };
  const auto make_config = [&](const std::vector<const Choice*>& choices) {
    Config c;
    std::map<std::string, const Choice*> set_by;
    for (const Choice* choice : choices) {
      c.labels.push_back(choice->label);
      c.name_parts.push_back(choice->name_part);
      for (const auto& [k, v] : choice->settings) {
        const auto [it, fresh] = set_by.emplace(k, choice);
        GS_CHECK_CONFIG(fresh, where << ": key '" << k << "' is set both by "
                                     << it->second->source.substr(where.size() + 2) << " and by "
                                     << choice->source.substr(where.size() + 2)
                                     << " (a run can take it from one place only)");
        c.settings.emplace_back(k, v);
      }
    }
    return c;
  };
  // Calls f(at) for every index vector of the dimensions' product, the first outermost; a dimension
  // whose entry in `fixed` is set stays at that choice.
  const auto for_each_product = [&](const std::vector<const Choice*>& fixed, const auto& f) {
    std::vector<std::size_t> at(dims.size(), 0);
    while (true) {
      std::vector<const Choice*> choices;
      for (std::size_t d = 0; d < dims.size(); ++d)
        choices.push_back(fixed[d] ? fixed[d] : &dims[d].choices[at[d]]);
      f(choices);
      std::size_t d = dims.size();
      while (d > 0 && (fixed[d - 1] || ++at[d - 1] == dims[d - 1].choices.size())) {
        if (!fixed[d - 1]) at[d - 1] = 0;
        --d;
      }
      if (d == 0) break;
    }
  };
  std::vector<Config> configs;
  for_each_product(
      std::vector<const Choice*>(dims.size(), nullptr),
      [&](const std::vector<const Choice*>& choices) { configs.push_back(make_config(choices)); });
  // Configurations beside the product: each entry of "extra_rows" fixes some axes, the other
  // dimensions take each of their choices; its rows follow the last product row that has their labels
  // in those dimensions (an fp32 reference row after its model's scalers).
  if (doc.contains("extra_rows")) {
    const auto& extra = doc["extra_rows"];
    GS_CHECK_CONFIG(
        extra.is_array() && !extra.empty(),
        where << ": \"extra_rows\" must be a non-empty array of objects {\"axis\": value, ...}, got "
              << shown(to_json(extra)));
    std::vector<std::vector<Config>> after(configs.size());
    std::set<std::string> labels_seen;
    for (const Config& c : configs) labels_seen.insert(json(c.labels).dump());
    std::uint64_t count = configs.size();
    for (std::size_t e = 0; e < extra.size(); ++e) {
      const std::string what = where + ": extra_rows[" + std::to_string(e + 1) + "]";
      GS_CHECK_CONFIG(
          extra[e].is_object() && !extra[e].empty(),
          what << " must be a non-empty object {\"axis\": value, ...}, got " << shown(to_json(extra[e])));
      std::vector<Dimension> entry;  // one choice per axis it names, alive while make_config reads it
      entry.reserve(extra[e].size());
      std::vector<const Choice*> fixed(dims.size(), nullptr);
      for (const auto& [k, v] : extra[e].items()) {
        std::size_t d = 0;
        while (d < dims.size() && dims[d].column != k) ++d;
        std::string axes;
        for (const Dimension& dim : dims)
          if (!(dim.column == "variant" && doc.contains("variants")))
            axes += (axes.empty() ? "" : ", ") + dim.column;
        GS_CHECK_CONFIG(d < dims.size() && !(k == "variant" && doc.contains("variants")),
                        what << ": '" << k << "' names no axis of the file (axes: " << axes << ")");
        ordered_json one = ordered_json::array();
        one.push_back(v);
        entry.push_back(read_axis(k, one, what));
        fixed[d] = &entry.back().choices.front();
      }
      std::uint64_t rows = 1;
      for (std::size_t d = 0; d < dims.size(); ++d)
        if (!fixed[d]) rows = rows <= kLargestMaxRuns ? rows * dims[d].choices.size() : rows;
      count += rows;
      check_run_count(doc, {{"configurations with \"extra_rows\"", count}}, seeds.size(), where);
      for_each_product(fixed, [&](const std::vector<const Choice*>& choices) {
        Config c = make_config(choices);
        GS_CHECK_CONFIG(
            labels_seen.insert(json(c.labels).dump()).second,
            what << ": the configuration (" << json(c.labels).dump() << ") is already a row of the table");
        std::size_t last = 0;
        for (std::size_t i = 0; i < configs.size(); ++i) {
          bool same = true;
          for (std::size_t d = 0; d < dims.size(); ++d)
            same = same && (fixed[d] || configs[i].labels[d] == c.labels[d]);
          if (same) last = i;
        }
        after[last].push_back(std::move(c));
      });
    }
    std::vector<Config> merged;
    for (std::size_t i = 0; i < configs.size(); ++i) {
      merged.push_back(std::move(configs[i]));
      for (Config& c : after[i]) merged.push_back(std::move(c));
    }
    configs = std::move(merged);
  }

  if (doc.contains("target")) ab.target = read_target(doc["target"], where);
  if (doc.contains("compare_to")) {
    const auto& cmp = doc["compare_to"];
    GS_CHECK_CONFIG(cmp.is_object() && !cmp.empty(),
                    where << ": \"compare_to\" must be a non-empty object {\"column\": \"label\"}, got "
                          << shown(to_json(cmp)));
    for (const auto& [k, v] : cmp.items()) {
      const auto col = std::find(ab.columns.begin(), ab.columns.end(), k);
      GS_CHECK_CONFIG(col != ab.columns.end(),
                      where << ": \"compare_to\": '" << k << "' is not a column of the table");
      const std::size_t d = static_cast<std::size_t>(col - ab.columns.begin());
      std::set<std::string> labels;
      for (const Config& c : configs) labels.insert(c.labels[d]);
      std::string allowed;
      for (const std::string& l : labels) allowed += (allowed.empty() ? "" : ", ") + l;
      GS_CHECK_CONFIG(v.is_string() && labels.count(v.get<std::string>()),
                      where << ": \"compare_to\": '" << k << "' must be one of its labels (" << allowed
                            << "), got " << shown(to_json(v)));
      ab.compare_to.emplace_back(k, v.get<std::string>());
    }
  }

  std::set<std::string> names;
  std::vector<std::string> config_names;
  for (const Config& c : configs) {
    std::string joined;
    for (const std::string& p : c.name_parts)
      if (!p.empty()) joined += (joined.empty() ? "" : "_") + p;
    std::string name = file_safe(joined.empty() ? "base" : joined);
    for (int k = 2; names.count(name); ++k) name = file_safe(joined) + "-" + std::to_string(k);
    names.insert(name);
    config_names.push_back(name);
    std::string group;
    for (const std::string& l : c.labels) group += (group.empty() ? "" : "\x1f") + l;
    ab.groups.push_back(group);
  }

  std::map<std::string, json> spec_files;  // model_spec path → its content, read once
  for (const std::uint64_t seed : seeds) {
    for (std::size_t i = 0; i < configs.size(); ++i) {
      AblationRun r;
      r.name = config_names[i] + "_seed" + std::to_string(seed);
      r.labels = configs[i].labels;
      r.group = ab.groups[i];
      r.seed = seed;
      r.settings = json::object();
      for (const auto& [k, v] : configs[i].settings) r.settings[k] = v;
      check_run_name(r.name, where);
      r.config = base;
      try {
        apply_all(r.config, configs[i].settings);
        r.config["seed"] = seed;
        inline_model_spec(r.config, spec_files);
        validate_config(r.config);
      } catch (const ConfigError& e) {
        std::string settings;
        for (const auto& [k, v] : configs[i].settings)
          settings += (settings.empty() ? "" : ", ") + k + "=" + shown(v);
        throw ConfigError(where + ": run '" + r.name + "' (" + (settings.empty() ? "the base" : settings) +
                          "): " + e.what());
      }
      ab.runs.push_back(std::move(r));
    }
  }
  return ab;
}

Ablation load_ablation(const std::string& path) {
  const BoundedRead text = read_bounded(path, kMaxJsonFileBytes);
  GS_CHECK_CONFIG(text.problem == ReadProblem::none,
                  read_problem_message(text, "ablation file", path, kMaxJsonFileBytes));
  ordered_json doc;
  check_json_depth(text.text, "ablation file '" + path + "'", JsonSource::config);
  try {
    doc = ordered_json::parse(text.text);
  } catch (const ordered_json::exception& e) {  // parse_error, and out_of_range for numbers such as 1e400
    throw ConfigError("ablation file '" + path + "' is not valid JSON: " + text_excerpt(e.what(), 320));
  }
  return expand_ablation(doc, path);
}

}  // namespace gradscale::ablate
