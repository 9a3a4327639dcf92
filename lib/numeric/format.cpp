// Format descriptors (SPEC §2 table). The numbers are the IEEE / OCP definitions; tests re-derive
// them from the bit layouts so a typo here cannot survive.
#include "lib/numeric/format.h"

#include <array>
#include <cmath>

#include "lib/core/error.h"
#include "lib/core/json_read.h"

namespace gradscale {
namespace {

constexpr std::array<FormatInfo, 5> kFormats = {{
    {Format::fp32, "fp32", 32, 8, 23, 127, 3.4028234663852886e38, 0x1p-126, 0x1p-149, OverflowRule::infinity,
     true},
    {Format::fp16, "fp16", 16, 5, 10, 15, 65504.0, 0x1p-14, 0x1p-24, OverflowRule::infinity, true},
    {Format::bf16, "bf16", 16, 8, 7, 127, 3.3895313892515355e38, 0x1p-126, 0x1p-133, OverflowRule::infinity,
     true},
    {Format::fp8_e5m2, "fp8_e5m2", 8, 5, 2, 15, 57344.0, 0x1p-14, 0x1p-16, OverflowRule::infinity, true},
    {Format::fp8_e4m3, "fp8_e4m3", 8, 4, 3, 7, 448.0, 0x1p-6, 0x1p-9, OverflowRule::saturate, false},
}};

}  // namespace

const FormatInfo& format_info(Format f) {
  return kFormats[static_cast<std::size_t>(f)];
}

const char* format_name(Format f) {
  return format_info(f).name;
}

const std::vector<Format>& all_formats() {
  static const std::vector<Format> formats = {Format::fp32, Format::fp16, Format::bf16, Format::fp8_e5m2,
                                              Format::fp8_e4m3};
  return formats;
}

std::string format_names() {
  std::string s;
  for (Format f : all_formats()) s += (s.empty() ? "" : ", ") + std::string(format_name(f));
  return s;
}

Format parse_format(std::string_view name) {
  for (Format f : all_formats())
    if (name == format_name(f)) return f;
  throw ConfigError("unknown format '" + text_excerpt(name) + "' (allowed: " + format_names() + ")");
}

}  // namespace gradscale
