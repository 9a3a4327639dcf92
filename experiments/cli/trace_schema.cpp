// The schema of gradscale.trace/1 as checks (see trace_schema.h; docs/trace.md). Every message names
// the file, the record, the layer and the key, so a broken writer or a hand-edited trace is easy to fix.
#include "experiments/cli/trace_schema.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <sstream>

#include "lib/core/error.h"
#include "lib/numeric/format.h"
#include "lib/train/trace_summary.h"

namespace gradscale::cli {

using nlohmann::json;

void Where::fail(const std::string& what) const {
  throw DataError(path + ": " + record + ": " + what);
}

namespace {

using nlohmann::json;

// S = s * S_in holds exactly for power-of-two scales; this allows for a writer that rounds otherwise.
constexpr double kScaleProductTolerance = 1e-9;
// Sums of counts are checked against this before they are formed: no wrap-around.
constexpr std::uint64_t kMaxCount = std::numeric_limits<std::uint64_t>::max();
// "underflow_rate" is a double computed from the counts; it must agree to double rounding.
constexpr double kRateTolerance = 1e-12;

std::string shown(const json& v) {
  std::string s = v.dump();
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

const char* type_name(const json& v) {
  return v.type_name();  // "null", "object", "array", "string", "boolean", "number"
}

const json& need(const Where& w, const json& obj, const std::string& prefix, const char* key) {
  const auto it = obj.find(key);
  if (it == obj.end()) w.fail("missing key '" + prefix + key + "'");
  return *it;
}

void wrong_type(const Where& w, const std::string& prefix, const char* key, const char* expected,
                const json& v) {
  w.fail("key '" + prefix + key + "' must be " + expected + ", got " + type_name(v) + " " + shown(v));
}

std::uint64_t need_uint(const Where& w, const json& obj, const std::string& prefix, const char* key) {
  const json& v = need(w, obj, prefix, key);
  if (!v.is_number_unsigned()) wrong_type(w, prefix, key, "a non-negative integer", v);
  return v.get<std::uint64_t>();
}

std::int64_t need_int(const Where& w, const json& obj, const std::string& prefix, const char* key) {
  const json& v = need(w, obj, prefix, key);
  if (!v.is_number_integer()) wrong_type(w, prefix, key, "an integer", v);
  return v.get<std::int64_t>();
}

double need_number(const Where& w, const json& obj, const std::string& prefix, const char* key) {
  const json& v = need(w, obj, prefix, key);
  if (!v.is_number() || !std::isfinite(v.get<double>())) wrong_type(w, prefix, key, "a finite number", v);
  return v.get<double>();
}

double need_positive(const Where& w, const json& obj, const std::string& prefix, const char* key) {
  const double x = need_number(w, obj, prefix, key);
  if (!(x > 0)) w.fail("key '" + prefix + key + "' must be > 0, got " + shown(obj[key]));
  return x;
}

// Doubles the writer may not have had as finite values: JSON has no inf/NaN, so they come as null.
void need_number_or_null(const Where& w, const json& obj, const std::string& prefix, const char* key) {
  const json& v = need(w, obj, prefix, key);
  if (!v.is_null() && !v.is_number()) wrong_type(w, prefix, key, "a number or null", v);
}

bool need_bool(const Where& w, const json& obj, const std::string& prefix, const char* key) {
  const json& v = need(w, obj, prefix, key);
  if (!v.is_boolean()) wrong_type(w, prefix, key, "true or false", v);
  return v.get<bool>();
}

const std::string& need_string(const Where& w, const json& obj, const std::string& prefix, const char* key) {
  const json& v = need(w, obj, prefix, key);
  if (!v.is_string()) wrong_type(w, prefix, key, "a string", v);
  return v.get_ref<const std::string&>();
}

const json& need_object(const Where& w, const json& obj, const std::string& prefix, const char* key) {
  const json& v = need(w, obj, prefix, key);
  if (!v.is_object()) wrong_type(w, prefix, key, "an object", v);
  return v;
}

const json& need_array(const Where& w, const json& obj, const std::string& prefix, const char* key) {
  const json& v = need(w, obj, prefix, key);
  if (!v.is_array()) wrong_type(w, prefix, key, "an array", v);
  return v;
}

void need_type(const Where& w, const json& obj, const char* type) {
  const std::string& t = need_string(w, obj, "", "type");
  if (t != type) w.fail("key 'type' is '" + t + "', expected '" + type + "'");
}

void need_schema(const Where& w, const json& obj) {
  const std::string& s = need_string(w, obj, "", "schema");
  if (s != kTraceSchema)
    w.fail("key 'schema' is '" + s + "', expected '" + kTraceSchema +
           "' (the only schema this reader knows)");
}

void need_format(const Where& w, const json& obj, const char* key) {
  const std::string& name = need_string(w, obj, "", key);
  try {
    parse_format(name);
  } catch (const ConfigError&) {
    w.fail("key '" + std::string(key) + "' is '" + name + "', not a format (" + format_names() + ")");
  }
}

// The statistics object of lib/instrument (stats_to_json) at `prefix` ("act.", "loss_grad." ...).
void check_stats(const Where& w, const json& obj, const char* key, bool with_binades) {
  const json& st = need_object(w, obj, "", key);
  const std::string p = std::string(key) + ".";
  const std::uint64_t elements = need_uint(w, st, p, "elements");
  std::uint64_t classes = 0;
  for (const char* c : {"zero", "underflow", "subnormal", "normal", "overflow", "nonfinite"}) {
    const std::uint64_t n = need_uint(w, st, p, c);
    if (n > kMaxCount - classes)  // the sum would wrap around to a small number
      w.fail("in '" + std::string(key) + "' the counts zero+underflow+subnormal+normal+overflow+nonfinite " +
             "add up to more than 2^64 - 1 (at '" + p + c + "' = " + std::to_string(n) +
             "), not elements = " + std::to_string(elements));
    classes += n;
  }
  if (classes != elements)
    w.fail("in '" + std::string(key) +
           "' the counts zero+underflow+subnormal+normal+overflow+nonfinite sum to " +
           std::to_string(classes) + ", not elements = " + std::to_string(elements));
  need_uint(w, st, p, "count");
  for (const char* f : {"sum", "sum_squares", "min", "max", "max_abs", "min_nonzero_abs"})
    need_number_or_null(w, st, p, f);
  const double rate = need_number(w, st, p, "underflow_rate");
  const double expected = stats_underflow_rate(st);
  if (std::abs(rate - expected) > kRateTolerance * std::max(1.0, expected)) {
    std::ostringstream os;
    os.precision(17);
    os << "key '" << p << "underflow_rate' is " << rate
       << ", but underflow / (elements - zero - nonfinite) = " << expected;
    w.fail(os.str());
  }
  const auto b = st.find("binades");
  if (b == st.end()) {
    if (with_binades) w.fail("missing key '" + p + "binades' (the header says trace_hist is true)");
    return;
  }
  if (!b->is_object()) wrong_type(w, p, "binades", "an object", *b);
  std::uint64_t binned = 0;
  for (const auto& [e, count] : b->items()) {
    char* end = nullptr;
    const long v = std::strtol(e.c_str(), &end, 10);
    if (e.empty() || *end != '\0' || v < -150 || v > 128)
      w.fail("key '" + p + "binades' has the bin '" + e + "', not an exponent in [-150, 128]");
    if (!count.is_number_unsigned())
      w.fail("key '" + p + "binades." + e + "' must be a non-negative integer, got " + shown(count));
    if (count.get<std::uint64_t>() > kMaxCount - binned)  // the sum would wrap around
      w.fail("key '" + p +
             "binades' counts more than 2^64 - 1 values, not elements = " + std::to_string(elements));
    binned += count.get<std::uint64_t>();
  }
  const std::uint64_t nonzero_finite =
      elements - st["zero"].get<std::uint64_t>() - st["nonfinite"].get<std::uint64_t>();
  if (binned != nonzero_finite)
    w.fail(
        "key '" + p + "binades' counts " + std::to_string(binned) +
        " values, not the non-zero finite elements - zero - nonfinite = " + std::to_string(nonzero_finite));
}

const std::set<std::string>& reasons() {
  static const std::set<std::string> r = {"every", "skip", "overflow", "scale_change"};
  return r;
}

}  // namespace

const char* json_type_name(const json& v) {
  return type_name(v);
}

void check_schema_key(const Where& w, const json& obj) {
  need_schema(w, obj);
}

const json& check_object_key(const Where& w, const json& obj, const char* key) {
  return need_object(w, obj, "", key);
}

const json& check_array_key(const Where& w, const json& obj, const char* key) {
  return need_array(w, obj, "", key);
}

std::vector<LayerRow> check_header(const Where& w, const json& h) {
  if (!h.is_object()) w.fail("the header must be an object, got " + std::string(type_name(h)));
  need_type(w, h, "header");
  need_schema(w, h);
  need_string(w, h, "", "version");
  need_object(w, h, "", "config");
  if (h.contains("model")) need_string(w, h, "", "model");  // the model's name (optional)
  need_format(w, h, "format");
  need_format(w, h, "grad_format");
  need_string(w, need_object(w, h, "", "scaler"), "scaler.", "policy");
  need_int(w, h, "", "seed");
  if (need_uint(w, h, "", "trace_every") < 1) w.fail("key 'trace_every' must be >= 1");
  need_bool(w, h, "", "trace_hist");
  const json& layers = need_array(w, h, "", "layers");
  if (layers.empty()) w.fail("key 'layers' is empty: a model has at least one layer");
  std::vector<LayerRow> table;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const Where lw{w.path, w.record + ", layers[" + std::to_string(i) + "]"};
    const json& l = layers[i];
    if (!l.is_object()) lw.fail("a layer must be an object, got " + std::string(type_name(l)));
    const std::int64_t id = need_int(lw, l, "", "id");
    if (id != static_cast<std::int64_t>(i))
      lw.fail("key 'id' is " + std::to_string(id) + ", expected " + std::to_string(i) +
              " (ids are 0..L-1 in model order)");
    LayerRow row;
    row.name = need_string(lw, l, "", "name");
    need_string(lw, l, "", "kind");
    for (const json& in : need_array(lw, l, "", "inputs")) {
      if (!in.is_number_integer() || in.get<std::int64_t>() < -1 || in.get<std::int64_t>() >= id)
        lw.fail("key 'inputs' has " + shown(in) + ": inputs are earlier layer ids or -1 (the model input)");
    }
    need_uint(lw, l, "", "K");
    row.parametric = need_bool(lw, l, "", "parametric");
    const json& params = need_array(lw, l, "", "parameters");
    for (std::size_t k = 0; k < params.size(); ++k) {
      const std::string pp = "parameters[" + std::to_string(k) + "].";
      if (!params[k].is_object()) lw.fail("key '" + pp.substr(0, pp.size() - 1) + "' must be an object");
      need_string(lw, params[k], pp, "name");
      for (const json& d : need_array(lw, params[k], pp, "shape"))
        if (!d.is_number_unsigned()) lw.fail("key '" + pp + "shape' has " + shown(d) + ", not a size");
    }
    // A parametric layer (a local scale) has a weight; a layer with parameters need not be parametric.
    row.has_parameters = !params.empty();
    if (row.parametric && !row.has_parameters)
      lw.fail("key 'parametric' is true but the layer has 0 parameters");
    table.push_back(row);
  }
  return table;
}

// A layer's "shadow" (--shadow, lib/train/shadow.h): "upstream" and/or "weight", each with
// underflow_mass in [0, 1], rel_error ≥ 0 and cosine in [-1, 1] (null where undefined).
void check_shadow(const Where& w, const json& shadow, bool has_parameters) {
  if (!shadow.is_object() || shadow.empty()) w.fail("key 'shadow' must be an object with 'upstream' or 'weight'");
  for (const auto& [kind, m] : shadow.items()) {
    if (kind != "upstream" && kind != "weight")
      w.fail("key 'shadow." + kind + "': allowed are 'upstream' and 'weight'");
    if (kind == "weight" && !has_parameters) w.fail("key 'shadow.weight' on a layer without parameters");
    if (!m.is_object()) w.fail("key 'shadow." + kind + "' must be an object");
    const std::string p = "shadow." + kind + ".";
    const std::pair<const char*, std::pair<double, double>> ranges[] = {
        {"underflow_mass", {0.0, 1.0}}, {"rel_error", {0.0, std::numeric_limits<double>::infinity()}}, {"cosine", {-1.0 - 1e-9, 1.0 + 1e-9}}};
    for (const auto& [key, range] : ranges) {
      need_number_or_null(w, m, p, key);
      if (m[key].is_number() && (m[key].get<double>() < range.first || m[key].get<double>() > range.second))
        w.fail("key '" + p + key + "' is " + m[key].dump() + ", outside its range");
    }
  }
}

// One step record; `previous` is the step number before it (0 for the first).
void check_step(const Where& w0, const json& st, const std::vector<LayerRow>& table, bool with_binades,
                std::uint64_t previous) {
  if (!st.is_object()) w0.fail("a step record must be an object, got " + std::string(type_name(st)));
  need_type(w0, st, "step");
  const std::uint64_t step = need_uint(w0, st, "", "step");
  const Where w{w0.path, "step " + std::to_string(step) + " (" + w0.record + ")"};
  if (step < 1) w.fail("key 'step' must be >= 1 (iterations count from 1)");
  if (step <= previous)
    w.fail("step " + std::to_string(step) + " follows step " + std::to_string(previous) +
           ": steps must increase");
  if (need_uint(w, st, "", "epoch") < 1) w.fail("key 'epoch' must be >= 1");
  need_number_or_null(w, st, "", "loss");
  need_positive(w, st, "", "S0");
  need_positive(w, st, "", "phi");
  need_bool(w, st, "", "skipped");
  const bool found_inf = need_bool(w, st, "", "found_inf");
  const json& first = need(w, st, "", "first_nonfinite_layer");
  if (!first.is_null()) {
    if (!first.is_number_unsigned() || first.get<std::uint64_t>() >= table.size())
      w.fail("key 'first_nonfinite_layer' is " + shown(first) + ", not null or a layer id in 0.." +
             std::to_string(table.size() - 1));
    if (!found_inf) w.fail("key 'first_nonfinite_layer' is " + shown(first) + " but found_inf is false");
  }
  const json& why = need_array(w, st, "", "why");
  if (why.empty()) w.fail("key 'why' is empty: a record says why it was traced");
  for (const json& r : why)
    if (!r.is_string() || !reasons().count(r.get<std::string>()))
      w.fail("key 'why' has " + shown(r) + " (allowed: every, skip, overflow, scale_change)");
  // "stats": false marks a notable iteration traced between samples: its scales, but no statistics.
  const bool with_stats = st.contains("stats") ? need_bool(w, st, "", "stats") : true;
  if (with_stats || st.contains("loss_grad")) check_stats(w, st, "loss_grad", with_binades);

  const json& layers = need_array(w, st, "", "layers");
  std::int64_t previous_id = -1;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const json& l = layers[i];
    const Where li{w.path, w.record + ", layers[" + std::to_string(i) + "]"};
    if (!l.is_object()) li.fail("a layer entry must be an object, got " + std::string(type_name(l)));
    const std::int64_t id = need_int(li, l, "", "id");
    if (id < 0 || id >= static_cast<std::int64_t>(table.size()))
      li.fail("key 'id' is " + std::to_string(id) + ", outside the header's layer table (ids 0.." +
              std::to_string(table.size() - 1) + ")");
    const LayerRow& row = table[static_cast<std::size_t>(id)];
    const Where lw{w.path, w.record + ", layer " + std::to_string(id) + " (" + row.name + ")"};
    if (id <= previous_id)
      lw.fail("layer " + std::to_string(id) + " follows layer " + std::to_string(previous_id) +
              ": layer ids must ascend within a step");
    previous_id = id;
    const double s = need_positive(lw, l, "", "s");
    need_number_or_null(lw, l, "", "unbound_s");
    const double s_in = need_positive(lw, l, "", "S_in");
    const double scale = need_positive(lw, l, "", "S");
    // Compared as logarithms: s * S_in may overflow a double (1e200 * 1e200), its logarithm cannot.
    if (std::abs(std::log(scale) - (std::log(s) + std::log(s_in))) > kScaleProductTolerance) {
      std::ostringstream os;
      os.precision(17);
      os << "key 'S' is " << scale << ", but s * S_in = " << s << " * " << s_in << " = " << s * s_in;
      lw.fail(os.str());
    }
    if (l.contains("act")) check_stats(lw, l, "act", with_binades);
    if (l.contains("wgrad")) {
      if (!row.has_parameters) lw.fail("key 'wgrad' on a layer without parameters");
      check_stats(lw, l, "wgrad", with_binades);
    }
    if (l.contains("wgrad_scale")) {
      if (!row.has_parameters) lw.fail("key 'wgrad_scale' on a layer without parameters");
      need_positive(lw, l, "", "wgrad_scale");
    }
    if (l.contains("shadow")) check_shadow(lw, l["shadow"], row.has_parameters);
    if (l.contains("limit")) {  // what held s (ScaleLimit): absent for the method's own choice
      const json& v = l["limit"];
      if (!(v == "margin" || v == "scale_bound" || v == "accum_bound" || v == "phi"))
        lw.fail("key 'limit' must be \"margin\", \"scale_bound\", \"accum_bound\" or \"phi\", got " + v.dump());
    }
  }
}

// The summary against the step records: the library's check, the one TraceWriter::finish applies.
void check_summary(const Where& w, const json& s, const TraceTally& tally,
                   std::vector<std::string>& warnings) {
  try {
    for (const std::string& warning : check_trace_summary(s, tally))
      warnings.push_back(w.record + ": " + warning);
  } catch (const DataError& e) {
    w.fail(e.what());
  }
}

double stats_underflow_rate(const json& stats) {
  const std::uint64_t nonzero_finite = stats["elements"].get<std::uint64_t>() -
                                       stats["zero"].get<std::uint64_t>() -
                                       stats["nonfinite"].get<std::uint64_t>();
  return nonzero_finite == 0 ? 0.0
                             : static_cast<double>(stats["underflow"].get<std::uint64_t>()) /
                                   static_cast<double>(nonzero_finite);
}

bool stats_overflowed(const json& stats) {
  return stats["overflow"].get<std::uint64_t>() > 0 || stats["nonfinite"].get<std::uint64_t>() > 0;
}

}  // namespace gradscale::cli
