// The resume rule (see resume_check.h): a recursive comparison that reports the first differing path.
#include "lib/train/resume_check.h"

#include <set>
#include <sstream>

#include "lib/core/error.h"
#include "lib/core/json_read.h"

namespace gradscale {
namespace {

using json = nlohmann::json;

// The first place where two configs differ: its dotted path and the two values there (null pointer:
// absent on that side).
struct Difference {
  std::string path;
  const json* saved = nullptr;
  const json* now = nullptr;
};

// Compares `a` and `b` below `path`; false (and `d` filled) at the first difference. Numbers compare
// by value (1 == 1.0); a member missing on one side is a difference.
bool same(const json& a, const json& b, const std::string& path, Difference& d) {
  if (a.is_object() && b.is_object()) {
    std::set<std::string> keys;
    for (const auto& item : a.items()) keys.insert(item.key());
    for (const auto& item : b.items()) keys.insert(item.key());
    for (const std::string& k : keys) {
      const std::string sub = path.empty() ? k : path + "." + k;
      if (!a.contains(k) || !b.contains(k)) {
        d = {sub, a.contains(k) ? &a.at(k) : nullptr, b.contains(k) ? &b.at(k) : nullptr};
        return false;
      }
      if (!same(a.at(k), b.at(k), sub, d)) return false;
    }
    return true;
  }
  if (a.is_array() && b.is_array() && a.size() == b.size()) {
    for (std::size_t i = 0; i < a.size(); ++i)
      if (!same(a[i], b[i], path + "[" + std::to_string(i) + "]", d)) return false;
    return true;
  }
  if (a == b) return true;
  d = {path, &a, &b};
  return false;
}

std::string shown(const json* v) {
  return v ? json_excerpt(*v) : "absent";
}

std::string changeable_list() {
  std::string s;
  for (const std::string& k : resume_changeable_keys()) s += (s.empty() ? "" : ", ") + k;
  return s;
}

}  // namespace

const std::vector<std::string>& resume_changeable_keys() {
  static const std::vector<std::string> keys = {
      "checkpoint", "data",       "epochs",  "eval_batch", "eval_every", "max_steps",   "progress_seconds",
      "resume",     "save_every", "threads", "device", "conv_algorithm", "trace",      "trace_every", "trace_hist",
      "shadow"};
  return keys;
}

json check_resume_config(const json& saved, const json& now, const std::string& dir) {
  GS_CHECK_CONFIG(saved.is_object() && now.is_object(),
                  "--resume " << dir << ": the checkpoint's config is not an object");
  const auto& changeable = resume_changeable_keys();
  json fixed_saved = saved, fixed_now = now, changed = json::object();
  for (const std::string& k : changeable) {
    const bool in_saved = saved.contains(k), in_now = now.contains(k);
    if ((in_saved || in_now) && (!in_saved || !in_now || saved.at(k) != now.at(k)))
      changed[k] = {{"checkpoint", in_saved ? saved.at(k) : json()}, {"now", in_now ? now.at(k) : json()}};
    fixed_saved.erase(k);
    fixed_now.erase(k);
  }
  Difference d;
  if (!same(fixed_saved, fixed_now, "", d)) {
    const std::string key = d.path.substr(0, d.path.find_first_of(".["));
    std::ostringstream what;
    what << "--resume " << dir << ": config key '" << key << "' ";
    if (key == d.path)
      what << "is " << shown(d.saved) << " in the checkpoint but " << shown(d.now) << " in this run";
    else
      what << "differs from the checkpoint's (at '" << d.path << "': " << shown(d.saved)
           << " in the checkpoint, " << shown(d.now) << " in this run)";
    what << "; a resumed run keeps the checkpoint's config except " << changeable_list()
         << " (docs/config.md)";
    throw ConfigError(what.str());
  }
  return changed;
}

}  // namespace gradscale
