// Ablation files: reading and expansion into runs, each validated (see ablation.h, docs/ablations.md).
// The dimensions are read by dimensions.cpp, the keys checked and applied by settings.cpp, a run's
// config checked by validate.cpp.
#include "experiments/ablate/ablation.h"
#include "experiments/ablate/dimensions.h"
#include "experiments/ablate/doc_values.h"
#include "experiments/ablate/limits.h"
#include "experiments/ablate/torch_runs.h"

#include <algorithm>
#include <map>
#include <set>

#include "lib/core/error.h"
#include "lib/core/file_read.h"
#include "lib/core/json_read.h"

namespace gradscale::ablate {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

const char* const kTopLevelKeys =
    "description, base, axes, variants, seeds, max_runs, extra_rows, target, compare_to";

}  // namespace

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
