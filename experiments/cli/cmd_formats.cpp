// `gradscale formats`: the table of storage formats (SPEC §2), or how given values round to one.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiments/cli/command.h"
#include "experiments/cli/parse.h"
#include "lib/core/error.h"
#include "lib/instrument/histogram.h"
#include "lib/numeric/format.h"
#include "lib/numeric/quantize.h"

namespace gradscale::cli {
namespace {

const char* overflow_rule_name(OverflowRule r) {
  switch (r) {
    case OverflowRule::infinity:
      return "inf";
    case OverflowRule::saturate:
      return "saturate";
    case OverflowRule::nan:
      return "nan";
  }
  return "?";
}

nlohmann::json json_number(float v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return static_cast<double>(v);
}

std::string hex_bits(std::uint32_t bits, int width_bits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*X", (width_bits + 3) / 4, bits);
  return buf;
}

void print_table() {
  std::printf("%-9s %4s %4s %4s %5s %-14s %-14s %-14s %s\n", "format", "bits", "exp", "man", "bias",
              "max finite", "min normal", "min subnormal", "overflow");
  for (Format f : all_formats()) {
    const FormatInfo& fi = format_info(f);
    std::printf("%-9s %4d %4d %4d %5d %-14.8g %-14.8g %-14.8g %s\n", fi.name, fi.bits, fi.exponent_bits,
                fi.mantissa_bits, fi.bias, fi.max_finite, fi.min_normal, fi.min_subnormal,
                overflow_rule_name(fi.overflow));
  }
}

int run_formats(const std::vector<std::string>& args) {
  po::options_description desc("options");
  std::string format_text = "fp16";
  std::vector<std::string> values;
  bool e4m3_nan = false;
  desc.add_options()("format", po::value(&format_text), ("format to round to: " + format_names()).c_str())(
      "round", po::value(&values)->composing(),
      "value to round (repeatable; decimal or hex float, inf, nan)")(
      "json", po::bool_switch(), "print one JSON object per --round value")(
      "e4m3-nan", po::bool_switch(&e4m3_nan), "fp8_e4m3 overflow gives NaN instead of saturating");
  po::variables_map vm;
  if (!parse_options("gradscale formats [--format F --round V ... [--json]]", desc, args, vm)) return 0;
  const Format f = parse_format(format_text);
  if (values.empty()) {
    print_table();
    return 0;
  }
  const RoundOptions opt{e4m3_nan};
  const FormatInfo& fi = format_info(f);
  std::vector<nlohmann::json> rows;
  for (const std::string& text : values) {
    // The input is a float32 (the emulation model rounds float32 to F): parsed with one rounding.
    const float x = parse_float32(text, "--round");
    const float r = quantize(x, f, opt);
    rows.push_back({{"input", text},
                    {"float32", json_number(x)},
                    {"format", fi.name},
                    {"value", json_number(r)},
                    {"bits", hex_bits(encode(x, f, opt), fi.bits)},
                    {"class", value_class_name(classify(r, f))},
                    {"rounding", round_class_name(classify_rounding(x, f, opt))}});
  }
  for (const auto& row : rows) {
    if (vm["json"].as<bool>())
      std::cout << row.dump() << "\n";
    else
      std::cout << row["input"].get<std::string>() << " -> " << row["value"].dump() << " (" << fi.name << " "
                << row["bits"].get<std::string>() << ", " << row["class"].get<std::string>() << ", "
                << row["rounding"].get<std::string>() << ")\n";
  }
  return 0;
}

}  // namespace

GS_REGISTER_COMMAND("formats", "the number formats, and how values round to one", run_formats);

}  // namespace gradscale::cli
