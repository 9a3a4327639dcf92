// Rounding float32 to F (SPEC §2). round_magnitude() (round_rule.h, shared with the kernels) is the one
// rounding rule: round to nearest, ties to even, on the integer significand, with F's subnormal quantum
// below its min normal. The array paths (bf16 bit trick, fp16 conversion instructions in
// quantize_fp16.cpp, fp8 integer rounding in quantize_fp8.cpp) are accelerations that tests prove
// bit-identical to it.
#include "lib/numeric/quantize.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "lib/core/error.h"
#include "lib/numeric/round_rule.h"

namespace gradscale {
namespace {

using float32::from_bits;
using float32::kAbs;
using float32::kInf;
using float32::kQuiet;
using float32::kSign;
using float32::round_magnitude;
using float32::to_bits;

// The NaN that rounding x (a NaN) to F gives, as float32 bits. IEEE-like formats keep the sign and the
// top payload bits and set the quiet bit — exactly what the x86 F16C conversions do for fp16, so the
// portable and vectorised paths agree bit for bit. fp8_e4m3 has a single NaN pattern.
std::uint32_t rounded_nan(std::uint32_t x, const FormatInfo& fi) {
  if (fi.format == Format::fp32) return x;
  if (!fi.has_infinity) return (x & kSign) | kInf | kQuiet;
  const std::uint32_t drop = (1u << (23 - fi.mantissa_bits)) - 1u;
  return (x | kQuiet) & ~drop;
}

float quantize_generic(float x, const FormatInfo& fi, RoundOptions opt) {
  const std::uint32_t b = to_bits(x);
  const std::uint32_t a = b & kAbs;
  const std::uint32_t sign = b & kSign;
  if (a > kInf) return from_bits(rounded_nan(b, fi));
  const float max_finite = static_cast<float>(fi.max_finite);
  float r;
  if (a == kInf) {
    r = std::numeric_limits<float>::infinity();
  } else {
    r = round_magnitude(a, fi.mantissa_bits, fi.min_exponent());
    if (r <= max_finite) return from_bits(to_bits(r) | sign);
  }
  // Beyond max finite (or infinite input): F's overflow rule.
  OverflowRule rule = fi.overflow;
  if (fi.format == Format::fp8_e4m3 && opt.e4m3_overflow_to_nan) rule = OverflowRule::nan;
  switch (rule) {
    case OverflowRule::infinity:
      return from_bits(kInf | sign);
    case OverflowRule::saturate:
      return from_bits(to_bits(max_finite) | sign);
    case OverflowRule::nan:
      break;
  }
  return from_bits(rounded_nan(sign | kInf | kQuiet, fi));
}

// bf16 is float32 with the low 16 bits rounded away: RNE on the bit pattern is exact, including
// subnormals and the carry into the exponent (overflow to inf).
inline float quantize_bf16_bits(float x) {
  const std::uint32_t b = to_bits(x);
  if ((b & kAbs) > kInf) return from_bits((b | kQuiet) & 0xFFFF0000u);
  return from_bits((b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u);
}

}  // namespace

float quantize(float x, Format f, RoundOptions opt) {
  if (f == Format::fp32) return x;
  return quantize_generic(x, format_info(f), opt);
}

std::uint32_t encode(float x, Format f, RoundOptions opt) {
  const FormatInfo& fi = format_info(f);
  if (f == Format::fp32) return to_bits(x);
  const float r = quantize(x, f, opt);
  const std::uint32_t rb = to_bits(r);
  const std::uint32_t sign = (rb & kSign) ? (1u << (fi.bits - 1)) : 0u;
  const int m = fi.mantissa_bits;
  const std::uint32_t exp_all = (1u << fi.exponent_bits) - 1u;
  if (std::isnan(r)) {
    if (!fi.has_infinity) return sign | (exp_all << m) | ((1u << m) - 1u);
    return sign | (exp_all << m) | ((rb & 0x7FFFFFu) >> (23 - m));
  }
  if (std::isinf(r)) return sign | (exp_all << m);
  const double v = std::fabs(static_cast<double>(r));
  if (v == 0.0) return sign;
  int ex;
  const double frac = std::frexp(v, &ex);  // v = frac * 2^ex, frac in [0.5, 1)
  const int e = ex - 1;
  if (e >= fi.min_exponent()) {
    const auto mant = static_cast<std::uint32_t>(std::ldexp(frac * 2.0 - 1.0, m));
    return sign | (static_cast<std::uint32_t>(e + fi.bias) << m) | mant;
  }
  return sign | static_cast<std::uint32_t>(std::ldexp(v, m - fi.min_exponent()));
}

float decode(std::uint32_t bits, Format f) {
  const FormatInfo& fi = format_info(f);
  if (f == Format::fp32) return from_bits(bits);
  const int m = fi.mantissa_bits;
  const std::uint32_t mant = bits & ((1u << m) - 1u);
  const std::uint32_t field = (bits >> m) & ((1u << fi.exponent_bits) - 1u);
  const bool negative = (bits >> (fi.bits - 1)) & 1u;
  const std::uint32_t exp_all = (1u << fi.exponent_bits) - 1u;
  const std::uint32_t sign = negative ? kSign : 0u;
  if (fi.has_infinity && field == exp_all) {
    if (mant == 0) return from_bits(sign | kInf);
    return from_bits(sign | kInf | kQuiet | (mant << (23 - m)));
  }
  if (!fi.has_infinity && field == exp_all && mant == (1u << m) - 1u) return from_bits(sign | kInf | kQuiet);
  double v;
  if (field == 0)
    v = std::ldexp(static_cast<double>(mant), fi.min_exponent() - m);
  else
    v = std::ldexp(1.0 + std::ldexp(static_cast<double>(mant), -m), static_cast<int>(field) - fi.bias);
  return from_bits(to_bits(static_cast<float>(v)) | sign);
}

ValueClass classify(float v, Format f) {
  if (std::isnan(v)) return ValueClass::nan;
  if (std::isinf(v)) return ValueClass::infinite;
  if (v == 0.0f) return ValueClass::zero;
  return std::fabs(v) < static_cast<float>(format_info(f).min_normal) ? ValueClass::subnormal
                                                                      : ValueClass::normal;
}

ValueClass classify_bits(std::uint32_t bits, Format f) {
  return classify(decode(bits, f), f);
}

const char* value_class_name(ValueClass c) {
  switch (c) {
    case ValueClass::zero:
      return "zero";
    case ValueClass::subnormal:
      return "subnormal";
    case ValueClass::normal:
      return "normal";
    case ValueClass::infinite:
      return "infinite";
    case ValueClass::nan:
      return "nan";
  }
  return "?";
}

std::uint16_t float_to_half_bits(float x) {
  return static_cast<std::uint16_t>(encode(x, Format::fp16));
}

float half_bits_to_float(std::uint16_t h) {
  return decode(h, Format::fp16);
}

void quantize(const float* in, float* out, std::size_t n, Format f, RoundOptions opt) {
  switch (f) {
    case Format::fp32:
      if (in != out) std::memmove(out, in, n * sizeof(float));
      return;
    case Format::fp16:
      quantize_fp16(in, out, n, fp16_best_path());
      return;
    case Format::bf16:
      for (std::size_t i = 0; i < n; ++i) out[i] = quantize_bf16_bits(in[i]);
      return;
    case Format::fp8_e5m2:
    case Format::fp8_e4m3:
      quantize_fp8(in, out, n, f, opt, fp8_best_path());
      return;
  }
}

}  // namespace gradscale
