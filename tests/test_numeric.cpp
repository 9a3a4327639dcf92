// Exact rounding (SPEC §2): exhaustive fp16/bf16/fp8 round trips and classification, boundary and tie
// vectors derived from the IEEE rules, the vectorised fp16 paths against the portable one, and the fp8
// array paths against the scalar rule (every threshold ±64 ULP and a strided sweep of all floats).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "lib/core/error.h"
#include "lib/numeric/format.h"
#include "lib/numeric/quantize.h"
#include "lib/numeric/round_rule.h"

using namespace gradscale;

namespace {

std::uint32_t bits_of(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

float float_of(std::uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

// Reference decode from the bit layout alone, in double (independent of the library's decode).
double reference_value(std::uint32_t bits, int e_bits, int m_bits, int bias) {
  const std::uint32_t mant = bits & ((1u << m_bits) - 1u);
  const std::uint32_t field = (bits >> m_bits) & ((1u << e_bits) - 1u);
  const double sign = ((bits >> (e_bits + m_bits)) & 1u) ? -1.0 : 1.0;
  if (field == 0) return sign * std::ldexp(static_cast<double>(mant), 1 - bias - m_bits);
  return sign *
         std::ldexp(1.0 + std::ldexp(static_cast<double>(mant), -m_bits), static_cast<int>(field) - bias);
}

void check_exhaustive(Format f) {
  const FormatInfo& fi = format_info(f);
  const std::uint32_t patterns = 1u << fi.bits;
  const std::uint32_t exp_all = (1u << fi.exponent_bits) - 1u;
  std::uint32_t finite = 0, nans = 0;
  for (std::uint32_t b = 0; b < patterns; ++b) {
    const std::uint32_t field = (b >> fi.mantissa_bits) & exp_all;
    const std::uint32_t mant = b & ((1u << fi.mantissa_bits) - 1u);
    const bool is_nan = fi.has_infinity ? (field == exp_all && mant != 0)
                                        : (field == exp_all && mant == (1u << fi.mantissa_bits) - 1u);
    const bool is_inf = fi.has_infinity && field == exp_all && mant == 0;
    const float v = decode(b, f);
    INFO(fi.name << " pattern 0x" << std::hex << b);
    if (is_nan) {
      ++nans;
      REQUIRE(std::isnan(v));
      REQUIRE(std::signbit(v) == static_cast<bool>(b >> (fi.bits - 1)));
      REQUIRE(classify_bits(b, f) == ValueClass::nan);
      REQUIRE(std::isnan(quantize(v, f)));
      continue;
    }
    if (is_inf) {
      REQUIRE(std::isinf(v));
      REQUIRE(classify_bits(b, f) == ValueClass::infinite);
      REQUIRE(encode(v, f) == b);
      continue;
    }
    ++finite;
    const double ref = reference_value(b, fi.exponent_bits, fi.mantissa_bits, fi.bias);
    REQUIRE(static_cast<double>(v) == ref);
    REQUIRE(std::signbit(v) == static_cast<bool>(b >> (fi.bits - 1)));
    // Round trip F -> fp32 -> F is the identity on every finite value, bit for bit (signed zeros too).
    REQUIRE(encode(v, f) == b);
    REQUIRE(bits_of(quantize(v, f)) == bits_of(v));
    const ValueClass expected =
        field == 0 ? (mant == 0 ? ValueClass::zero : ValueClass::subnormal) : ValueClass::normal;
    REQUIRE(classify_bits(b, f) == expected);
    REQUIRE(std::fabs(ref) <= fi.max_finite);
  }
  const std::uint32_t expected_nans =
      fi.has_infinity ? 2u * ((1u << fi.mantissa_bits) - 1u) : 2u;  // e4m3: S.1111.111 only
  CHECK(nans == expected_nans);
  CHECK(finite == patterns - nans - (fi.has_infinity ? 2u : 0u));
}

// Largest finite value and extreme subnormals re-derived from the bit layout.
void check_descriptor(Format f) {
  const FormatInfo& fi = format_info(f);
  const std::uint32_t exp_all = (1u << fi.exponent_bits) - 1u;
  const std::uint32_t max_bits =
      fi.has_infinity ? (((exp_all - 1u) << fi.mantissa_bits) | ((1u << fi.mantissa_bits) - 1u))
                      : ((exp_all << fi.mantissa_bits) | ((1u << fi.mantissa_bits) - 2u));
  CHECK(reference_value(max_bits, fi.exponent_bits, fi.mantissa_bits, fi.bias) == fi.max_finite);
  CHECK(reference_value(1u, fi.exponent_bits, fi.mantissa_bits, fi.bias) == fi.min_subnormal);
  CHECK(reference_value(1u << fi.mantissa_bits, fi.exponent_bits, fi.mantissa_bits, fi.bias) ==
        fi.min_normal);
}

}  // namespace

TEST_CASE("format descriptors match their bit layouts", "[numeric]") {
  for (Format f : {Format::fp16, Format::bf16, Format::fp8_e5m2, Format::fp8_e4m3}) check_descriptor(f);
  CHECK(format_info(Format::fp32).max_finite == static_cast<double>(std::numeric_limits<float>::max()));
  CHECK(parse_format("bf16") == Format::bf16);
  CHECK_THROWS_AS(parse_format("fp17"), ConfigError);
  CHECK_THROWS_WITH(parse_format("fp17"), Catch::Contains("fp17") && Catch::Contains("fp8_e4m3"));
}

TEST_CASE("fp16: exhaustive round trip and classification over all 65536 patterns", "[numeric]") {
  check_exhaustive(Format::fp16);
}
TEST_CASE("bf16: exhaustive round trip and classification over all 65536 patterns", "[numeric]") {
  check_exhaustive(Format::bf16);
}
TEST_CASE("fp8_e5m2: all 256 patterns", "[numeric]") {
  check_exhaustive(Format::fp8_e5m2);
}
TEST_CASE("fp8_e4m3: all 256 patterns", "[numeric]") {
  check_exhaustive(Format::fp8_e4m3);
}

TEST_CASE("rounding is nearest-even between every pair of adjacent values", "[numeric]") {
  // For each format, take every pair of adjacent non-negative finite values (lo, hi): the midpoint
  // (exact in float32 for these formats) must round to the one with an even mantissa, and the floats
  // just below/above it to lo/hi.
  for (Format f : {Format::fp16, Format::bf16, Format::fp8_e5m2, Format::fp8_e4m3}) {
    const FormatInfo& fi = format_info(f);
    const std::uint32_t max_bits = encode(static_cast<float>(fi.max_finite), f);
    for (std::uint32_t b = 0; b < max_bits; ++b) {
      const float lo = decode(b, f), hi = decode(b + 1, f);
      const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);
      if (static_cast<double>(mid) * 2 != static_cast<double>(lo) + hi) continue;  // bf16 subnormal mids
      INFO(fi.name << " between 0x" << std::hex << b << " and 0x" << b + 1);
      const float even = (b & 1u) ? hi : lo;
      REQUIRE(bits_of(quantize(mid, f)) == bits_of(even));
      REQUIRE(bits_of(quantize(std::nextafter(mid, 0.0f), f)) == bits_of(lo));
      REQUIRE(bits_of(quantize(std::nextafter(mid, INFINITY), f)) == bits_of(hi));
      REQUIRE(bits_of(quantize(-mid, f)) == bits_of(-even));
    }
  }
}

TEST_CASE("boundary vectors from the IEEE rules", "[numeric]") {
  const float inf = std::numeric_limits<float>::infinity();
  SECTION("fp16") {
    const Format f = Format::fp16;
    CHECK(quantize(0x1p-24f, f) == 0x1p-24f);                        // smallest subnormal
    CHECK(quantize(0x1p-25f, f) == 0.0f);                            // half of it: tie to even (0)
    CHECK(std::signbit(quantize(-0x1p-25f, f)));                     // ... keeping the sign
    CHECK(quantize(std::nextafter(0x1p-25f, 1.0f), f) == 0x1p-24f);  // anything above: 2^-24
    CHECK(quantize(0x1.8p-24f, f) == 0x1p-23f);                      // 1.5 ulp: tie to even (2 ulp)
    CHECK(quantize(0x1.4p-24f, f) == 0x1p-24f);
    CHECK(quantize(0x1.ff8p-15f, f) == 0x1.ff8p-15f);  // largest subnormal
    CHECK(quantize(0x1.ffcp-15f, f) == 0x1p-14f);      // tie between largest subnormal and min normal
    CHECK(quantize(65504.0f, f) == 65504.0f);
    CHECK(quantize(65519.996f, f) == 65504.0f);  // just below the overflow threshold
    CHECK(quantize(65520.0f, f) == inf);         // the threshold itself overflows (tie to even)
    CHECK(quantize(-65520.0f, f) == -inf);
    CHECK(quantize(1.0f + 0x1p-11f, f) == 1.0f);              // tie in the normal range, to even
    CHECK(quantize(1.0f + 0x1.8p-10f, f) == 1.0f + 0x1p-9f);  // 1.5 ulp, to even
    CHECK(quantize(inf, f) == inf);
  }
  SECTION("bf16") {
    const Format f = Format::bf16;
    CHECK(quantize(0x1p-133f, f) == 0x1p-133f);
    CHECK(quantize(0x1p-134f, f) == 0.0f);
    CHECK(quantize(std::nextafter(0x1p-134f, 1.0f), f) == 0x1p-133f);
    CHECK(quantize(1.0f + 0x1p-8f, f) == 1.0f);
    CHECK(quantize(1.0f + 0x1.8p-7f, f) == 1.0f + 0x1p-6f);
    CHECK(quantize(0x1.fep127f, f) == 0x1.fep127f);  // max finite
    CHECK(quantize(0x1.ffp127f, f) == inf);          // its overflow threshold (tie to even)
    CHECK(quantize(std::nextafter(0x1.ffp127f, 0.0f), f) == 0x1.fep127f);
    CHECK(quantize(std::numeric_limits<float>::max(), f) == inf);
  }
  SECTION("fp8_e5m2") {
    const Format f = Format::fp8_e5m2;
    CHECK(quantize(0x1p-16f, f) == 0x1p-16f);
    CHECK(quantize(0x1p-17f, f) == 0.0f);
    CHECK(quantize(std::nextafter(0x1p-17f, 1.0f), f) == 0x1p-16f);
    CHECK(quantize(57344.0f, f) == 57344.0f);
    CHECK(quantize(61440.0f, f) == inf);  // 57344 + half ulp: tie to even -> overflow
    CHECK(quantize(std::nextafter(61440.0f, 0.0f), f) == 57344.0f);
  }
  SECTION("fp8_e4m3 saturates (or gives NaN on request)") {
    const Format f = Format::fp8_e4m3;
    CHECK(quantize(0x1p-9f, f) == 0x1p-9f);
    CHECK(quantize(0x1p-10f, f) == 0.0f);
    CHECK(quantize(std::nextafter(0x1p-10f, 1.0f), f) == 0x1p-9f);
    CHECK(quantize(448.0f, f) == 448.0f);
    CHECK(quantize(464.0f, f) == 448.0f);                            // tie between 448 (even) and 480: 448
    CHECK(quantize(std::nextafter(464.0f, INFINITY), f) == 448.0f);  // saturated
    CHECK(quantize(1e9f, f) == 448.0f);
    CHECK(quantize(-1e9f, f) == -448.0f);
    CHECK(quantize(inf, f) == 448.0f);
    CHECK(encode(1e9f, f) == 0x7Eu);
    const RoundOptions to_nan{true};
    CHECK(quantize(464.0f, f, to_nan) == 448.0f);
    CHECK(std::isnan(quantize(std::nextafter(464.0f, INFINITY), f, to_nan)));
    CHECK(encode(1e9f, f, to_nan) == 0x7Fu);
  }
  SECTION("NaN keeps its sign in every format; fp32 is the identity") {
    for (Format f : all_formats()) {
      CHECK(std::isnan(quantize(std::nanf(""), f)));
      CHECK(std::signbit(quantize(-std::nanf(""), f)));
    }
    for (float x : {0x1p-149f, -3.1415927f, 1e38f}) CHECK(bits_of(quantize(x, Format::fp32)) == bits_of(x));
  }
}

TEST_CASE("array quantize equals scalar quantize for every format", "[numeric]") {
  std::mt19937 rng(7);
  std::vector<float> in(100003);
  for (auto& x : in) x = float_of(static_cast<std::uint32_t>(rng()));
  for (Format f : all_formats()) {
    std::vector<float> out(in.size(), -7.0f);
    quantize(in.data(), out.data(), in.size(), f);
    for (std::size_t i = 0; i < in.size(); ++i) {
      INFO(format_name(f) << " input bits 0x" << std::hex << bits_of(in[i]));
      REQUIRE(bits_of(out[i]) == bits_of(quantize(in[i], f)));
    }
  }
}

TEST_CASE("fp16 vectorised paths are bit-identical to the portable path", "[numeric]") {
  std::vector<Fp16Path> fast;
  for (Fp16Path p : {Fp16Path::f16c, Fp16Path::avx512})
    if (fp16_path_available(p)) fast.push_back(p);
  if (fast.empty()) WARN("no F16C/AVX-512 on this CPU: only the portable fp16 path exists here");
  // Every fp16 pattern, its neighbours in float32, and >= 1e7 random floats with specials mixed in.
  std::vector<float> in;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float v = half_bits_to_float(static_cast<std::uint16_t>(h));
    in.push_back(v);
    in.push_back(std::nextafter(v, INFINITY));
    in.push_back(std::nextafter(v, -INFINITY));
  }
  std::mt19937_64 rng(2024);
  const float specials[] = {0.0f,
                            -0.0f,
                            INFINITY,
                            -INFINITY,
                            std::nanf(""),
                            -std::nanf(""),
                            float_of(0x7F800001u),
                            float_of(0xFFBFFFFFu),
                            65520.0f,
                            0x1p-25f,
                            0x1p-149f};
  for (std::size_t i = 0; i < 10'000'000; ++i) {
    const std::uint64_t r = rng();
    if ((r & 63) == 0)
      in.push_back(specials[(r >> 8) % (sizeof specials / sizeof *specials)]);
    else if ((r & 1) == 0)
      in.push_back(float_of(static_cast<std::uint32_t>(r >> 32)));  // any bit pattern
    else                                                            // magnitudes around fp16's range
      in.push_back(std::ldexp(static_cast<float>((r >> 40) & 0xFFFFFF) / 0x1p24f + 1.0f,
                              static_cast<int>((r >> 8) % 50) - 30) *
                   ((r >> 20) & 1 ? -1.0f : 1.0f));
  }
  std::vector<float> ref(in.size(), 1234.0f);
  quantize_fp16(in.data(), ref.data(), in.size(), Fp16Path::portable);
  for (Fp16Path p : fast) {
    for (std::size_t n : {in.size(), in.size() - 5}) {  // exercises the tail too
      std::vector<float> out(n, -1234.0f);
      quantize_fp16(in.data(), out.data(), n, p);
      std::size_t mismatches = 0;
      for (std::size_t i = 0; i < n; ++i) mismatches += bits_of(out[i]) != bits_of(ref[i]);
      INFO("path " << fp16_path_name(p) << ", n = " << n);
      REQUIRE(mismatches == 0);
    }
  }
  REQUIRE(in.size() >= 10'000'000);
}

// ---- fp8 array paths (quantize_fp8.cpp) against the scalar rule ------------------------------------

namespace {

constexpr std::uint32_t kSignBit = 0x80000000u;

// Float32 patterns where a wrong fp8 rounding would show first: every pattern within ±64 ULP of each
// threshold of both fp8 formats (every value, every midpoint between neighbours: min subnormal / 2,
// the subnormal/normal boundary, max finite and the overflow boundary max + ulp/2), of zero, float32's
// min normal, float32's max and inf, and of the NaN payload bits that rounding keeps or drops; both signs.
std::vector<std::uint32_t> fp8_threshold_patterns() {
  std::vector<std::uint32_t> centres = {0u,          bits_of(0x1p-126f), 0x7F7FFFFFu, 0x7F800000u,
                                        0x7FA00000u, 0x7FC00000u,        0x7FE00000u, 0x7FFFFFFFu};
  for (Format f : {Format::fp8_e5m2, Format::fp8_e4m3}) {
    const FormatInfo& fi = format_info(f);
    const std::uint32_t max_bits = encode(static_cast<float>(fi.max_finite), f);
    for (std::uint32_t b = 0; b <= max_bits; ++b) {
      const double lo = decode(b, f);
      // Above max finite, the next value of an unbounded F: max + one ulp of its binade.
      const double hi = b < max_bits
                            ? static_cast<double>(decode(b + 1, f))
                            : fi.max_finite + std::ldexp(1.0, std::ilogb(fi.max_finite) - fi.mantissa_bits);
      centres.push_back(bits_of(static_cast<float>(lo)));
      centres.push_back(bits_of(static_cast<float>((lo + hi) / 2)));  // exact in float32
    }
  }
  std::vector<std::uint32_t> patterns;
  for (std::uint32_t c : centres)
    for (std::int64_t p = static_cast<std::int64_t>(c) - 64; p <= static_cast<std::int64_t>(c) + 64; ++p)
      if (p >= 0 && p <= 0x7FFFFFFF) {
        patterns.push_back(static_cast<std::uint32_t>(p));
        patterns.push_back(static_cast<std::uint32_t>(p) | kSignBit);
      }
  return patterns;
}

// The fp8 array entries: the public array quantize and each fp8 path this CPU has.
struct PathRun {
  const char* name;
  std::function<void(const float*, float*, std::size_t)> run;
};

std::vector<PathRun> fp8_paths(Format f, RoundOptions opt) {
  std::vector<PathRun> paths;
  paths.push_back(
      {"array quantize", [=](const float* in, float* out, std::size_t n) { quantize(in, out, n, f, opt); }});
  for (Fp8Path p : {Fp8Path::portable, Fp8Path::avx2})
    if (fp8_path_available(p))
      paths.push_back({fp8_path_name(p), [=](const float* in, float* out, std::size_t n) {
                         quantize_fp8(in, out, n, f, opt, p);
                       }});
  return paths;
}

// Runs every fp8 array entry on `patterns` and compares with the scalar quantize, bit for bit: out of
// place into a sentinel-filled output, and in place on an unaligned sub-range whose length is not a
// multiple of the vector width (the elements around it must stay untouched). Returns the number of
// mismatches and reports the first one of each entry.
std::size_t fp8_mismatches(const std::vector<std::uint32_t>& patterns, Format f, RoundOptions opt) {
  const std::size_t n = patterns.size();
  REQUIRE(n >= 16);
  std::vector<float> in(n), ref(n);
  for (std::size_t i = 0; i < n; ++i) {
    in[i] = float_of(patterns[i]);
    ref[i] = quantize(in[i], f, opt);
  }
  std::size_t total = 0;
  for (const PathRun& path : fp8_paths(f, opt)) {
    std::size_t mismatches = 0;
    auto expect = [&](std::size_t i, float got, float want, const char* how) {
      if (bits_of(got) == bits_of(want)) return;
      if (mismatches++ == 0)
        UNSCOPED_INFO(format_name(f) << (opt.e4m3_overflow_to_nan ? " (overflow to NaN)" : "") << ", path "
                                     << path.name << " " << how << ": input 0x" << std::hex << patterns[i]
                                     << " gave 0x" << bits_of(got) << ", scalar rule 0x" << bits_of(want));
    };
    std::vector<float> out(n, float_of(0x7F812345u));  // a signalling NaN: rounding never produces one
    path.run(in.data(), out.data(), n);
    for (std::size_t i = 0; i < n; ++i) expect(i, out[i], ref[i], "out of place");
    std::vector<float> inplace = in;
    const std::size_t first = 1, count = n - 4;  // starts off the vector alignment, odd tail
    path.run(inplace.data() + first, inplace.data() + first, count);
    for (std::size_t i = 0; i < n; ++i)
      expect(i, inplace[i], i >= first && i < first + count ? ref[i] : in[i], "in place");
    total += mismatches;
  }
  return total;
}

struct Fp8Case {
  Format format;
  RoundOptions opt;
};
const Fp8Case kFp8Cases[] = {
    {Format::fp8_e5m2, {false}}, {Format::fp8_e4m3, {false}}, {Format::fp8_e4m3, {true}}};

}  // namespace

TEST_CASE("fp8 array paths equal the scalar rule within ±64 ULP of every threshold", "[numeric]") {
  if (!fp8_path_available(Fp8Path::avx2)) WARN("no AVX2 on this CPU: only the portable fp8 path exists here");
  const std::vector<std::uint32_t> patterns = fp8_threshold_patterns();
  REQUIRE(patterns.size() > 100'000);
  for (const Fp8Case& c : kFp8Cases) CHECK(fp8_mismatches(patterns, c.format, c.opt) == 0);
}

TEST_CASE("fp8 array paths equal the scalar rule on a strided sweep of all 2^32 float patterns",
          "[numeric]") {
  // Stride 251 (odd, so every residue of the low bits is visited): 17.1M patterns, NaNs and infs
  // included, in chunks so the memory stays small.
  constexpr std::uint64_t kStride = 251;
  constexpr std::size_t kChunk = 1u << 20;
  std::vector<std::uint32_t> chunk;
  std::size_t total = 0;
  for (std::uint64_t b = 0; b < (1ull << 32); b += kStride) {
    chunk.push_back(static_cast<std::uint32_t>(b));
    if (chunk.size() == kChunk || b + kStride >= (1ull << 32)) {
      for (const Fp8Case& c : kFp8Cases) REQUIRE(fp8_mismatches(chunk, c.format, c.opt) == 0);
      total += chunk.size();
      chunk.clear();
    }
  }
  CHECK(total == ((1ull << 32) + kStride - 1) / kStride);
}

TEST_CASE("fp8 array paths: NaN, inf, overflow and boundary tie vectors", "[numeric]") {
  const float inf = std::numeric_limits<float>::infinity();
  struct Row {
    float in;
    std::uint32_t e5m2, e4m3, e4m3_to_nan;  // expected float32 bits
  };
  const std::uint32_t nan = 0x7FC00000u, neg_nan = 0xFFC00000u;
  const Row rows[] = {
      // NaN: e5m2 keeps the sign and top two payload bits and sets the quiet bit; e4m3 has one NaN.
      {float_of(0xFFA12345u), 0xFFE00000u, neg_nan, neg_nan},
      {float_of(0x7F800001u), nan, nan, nan},
      // inf and finite overflow: e5m2 -> inf; e4m3 -> ±448, or NaN on request.
      {inf, bits_of(inf), bits_of(448.0f), nan},
      {-inf, bits_of(-inf), bits_of(-448.0f), neg_nan},
      {61440.0f, bits_of(inf), bits_of(448.0f), nan},  // e5m2: max + ulp/2, a tie to even: overflow
      {-1e30f, bits_of(-inf), bits_of(-448.0f), neg_nan},
      {464.0f, bits_of(448.0f), bits_of(448.0f), bits_of(448.0f)},  // e4m3: max + ulp/2 ties to 448
      {std::nextafter(464.0f, inf), bits_of(448.0f), bits_of(448.0f), nan},
      // Ties at the subnormal/normal boundary: e5m2 3.5 q -> 4 q = 2^-14; e4m3 7.5 q -> 2^-6.
      {0x1.cp-15f, bits_of(0x1p-14f), bits_of(0.0f), bits_of(0.0f)},
      {0x1.ep-7f, bits_of(0x1p-6f), bits_of(0x1p-6f), bits_of(0x1p-6f)},  // e5m2: 1.111b -> 10.0b
      {-0x1p-17f, bits_of(-0.0f), bits_of(-0.0f), bits_of(-0.0f)},        // e5m2: min subnormal / 2
  };
  std::vector<float> in;
  for (const Row& row : rows) in.push_back(row.in);
  for (std::size_t c = 0; c < 3; ++c) {
    const Fp8Case& fc = kFp8Cases[c];
    for (const PathRun& path : fp8_paths(fc.format, fc.opt)) {
      std::vector<float> out(in.size(), 0.0f);
      path.run(in.data(), out.data(), in.size());
      for (std::size_t i = 0; i < in.size(); ++i) {
        const std::uint32_t expected = c == 0 ? rows[i].e5m2 : c == 1 ? rows[i].e4m3 : rows[i].e4m3_to_nan;
        INFO(format_name(fc.format) << (fc.opt.e4m3_overflow_to_nan ? " (overflow to NaN)" : "") << ", path "
                                    << path.name << ", input 0x" << std::hex << bits_of(in[i]));
        CHECK(bits_of(out[i]) == expected);
        CHECK(bits_of(quantize(in[i], fc.format, fc.opt)) == expected);
      }
    }
  }
  std::vector<float> x(4, 1.0f);
  CHECK_THROWS_AS(quantize_fp8(x.data(), x.data(), x.size(), Format::fp16, {}, Fp8Path::portable), Error);
}

// round_magnitude_fast (lib/numeric/round_rule.h, the kernels' rounding) against round_magnitude, the
// rule itself: every significand of each binade where the two could part — from two binades below F's
// subnormal quantum to one above F's min normal (the fp32 addition's range and its edge with the bit
// pattern's) — and, for every other exponent field, 4 099 significands with both ends. Over all 2^31
// finite magnitudes the two were compared once, for the four formats: no difference.
TEST_CASE("round_magnitude_fast gives round_magnitude's bits in every binade where they could part",
          "[numeric]") {
  using float32::round_magnitude;
  using float32::round_magnitude_fast;
  using float32::to_bits;
  for (const Format f : {Format::fp16, Format::bf16, Format::fp8_e5m2, Format::fp8_e4m3}) {
    const FormatInfo& fi = format_info(f);
    const float32::FastRounding fast = float32::fast_rounding(fi.mantissa_bits, fi.min_exponent());
    const int quantum = fi.min_exponent() - fi.mantissa_bits;
    const int low = std::max(0, quantum + 127 - 2), high = fi.min_exponent() + 127 + 1;  // exponent fields
    std::uint64_t compared = 0, differ = 0;
    std::uint32_t first = 0;
    const auto compare = [&](std::uint32_t a) {
      ++compared;
      if (to_bits(round_magnitude(a, fi.mantissa_bits, fi.min_exponent())) != to_bits(round_magnitude_fast(a, fast))) {
        if (differ++ == 0) first = a;
      }
    };
    for (std::uint32_t field = 0; field < 255; ++field) {
      const std::uint32_t base = field << 23;
      if (static_cast<int>(field) >= low && static_cast<int>(field) <= high) {
        for (std::uint32_t m = 0; m <= 0x7FFFFFu; ++m) compare(base | m);
      } else {
        for (std::uint32_t m = 0; m <= 0x7FFFFFu; m += 4099) compare(base | m);
        compare(base | 0x7FFFFFu);
      }
    }
    INFO(fi.name << ": " << compared << " magnitudes compared, first difference at 0x" << std::hex << first);
    CHECK(differ == 0);
    CHECK(compared > static_cast<std::uint64_t>(high - low + 1) * 0x800000u);  // the full binades were walked
  }
}
