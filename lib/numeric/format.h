// Number formats of gradscale (SPEC §2): one descriptor per storage format F. The precision model,
// the instrumentation and every scaler read format facts (max finite, min subnormal, ...) from here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gradscale {

enum class Format : std::uint8_t { fp32, fp16, bf16, fp8_e5m2, fp8_e4m3 };

// What rounding does with a finite value beyond the largest finite one.
enum class OverflowRule : std::uint8_t {
  infinity,  // IEEE: becomes ±inf (fp32, fp16, bf16, fp8_e5m2)
  saturate,  // clamps to ±max finite (fp8_e4m3, OCP "satfinite"; also maps ±inf to ±max)
  nan,       // becomes NaN (fp8_e4m3 with the non-saturating option)
};

struct FormatInfo {
  Format format;
  const char* name;  // "fp16", ...
  int bits;          // storage width
  int exponent_bits;
  int mantissa_bits;  // explicit fraction bits
  int bias;
  double max_finite;
  double min_normal;
  double min_subnormal;
  OverflowRule overflow;
  bool has_infinity;
  int min_exponent() const { return 1 - bias; }  // exponent of min_normal
};

const FormatInfo& format_info(Format f);
const char* format_name(Format f);
// Parses "fp32", "fp16", "bf16", "fp8_e5m2", "fp8_e4m3"; throws ConfigError listing the allowed names.
Format parse_format(std::string_view name);
const std::vector<Format>& all_formats();
// "fp32, fp16, bf16, fp8_e5m2, fp8_e4m3" (for error messages and --help).
std::string format_names();

}  // namespace gradscale
