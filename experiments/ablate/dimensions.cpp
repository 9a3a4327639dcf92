// Reading an ablation's dimensions, seeds and target (see dimensions.h).
#include "experiments/ablate/dimensions.h"
#include "experiments/ablate/doc_values.h"
#include "experiments/ablate/labels.h"
#include "experiments/ablate/settings.h"

#include <cstdio>
#include <set>

#include "lib/core/error.h"
#include "lib/core/json_read.h"

namespace gradscale::ablate {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// The last component of a key, for run names: "scaler.n_uf" → "n_uf".
std::string short_key(const std::string& key) {
  const auto dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
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

}  // namespace

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

}  // namespace gradscale::ablate
