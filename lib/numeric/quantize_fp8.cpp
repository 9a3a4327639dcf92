// fp8 array rounding (fp8_e5m2, fp8_e4m3): an exact integer round-to-nearest-even on the float32 bit
// pattern, as a portable loop and as an AVX2 loop chosen at run time. Tests prove both bit-identical to
// the scalar rule (quantize(float, F) in quantize.cpp) on every rounding threshold and a sweep of floats.
//
// Why the integer rule is exact. Let a be |x|'s float32 bits, E its exponent field, M F's mantissa
// bits, Emin the float32 exponent field of F's min normal and drop = 23 - M.
//  - E >= Emin (F's normal range, and above): F's grid in x's binade is float32's grid with the low
//    `drop` fraction bits cleared. Adding half - 1 plus the lowest kept bit, then clearing those bits,
//    is round to nearest, ties to even; a carry out of the fraction increments the exponent field,
//    which is exactly the first value of the next binade (so the result stays a value of F, or is past
//    max finite, which the overflow rule then handles; inf input lands there too).
//  - E < Emin (F's subnormals): F's grid is k * q with q = 2^(emin - M). With the significand
//    m = 1.fraction * 2^23, |x| / q = m / 2^d where d = drop + (Emin - E), so the same add-and-shift
//    on m gives k = round(|x| / q) in 0 .. 2^M (2^M is F's min normal). k * q is formed without
//    floating-point arithmetic: float32(k) is exact (k <= 8), and adding log2(q) to its exponent field
//    multiplies by q exactly (the result, >= 2^-16, stays a float32 normal); k = 0 gives +0. So the
//    rounding mode and FTZ/DAZ do not matter. d is clamped to 25: m < 2^24 is then below the half,
//    so it rounds to 0 as any larger d would. Float32 subnormals and zero land there too (their m, with
//    an implicit bit they lack, is still below 2^24).
#include <algorithm>
#include <cstring>

#include "lib/core/error.h"
#include "lib/numeric/quantize.h"
#include "lib/numeric/round_rule.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GS_X86 1
#endif

namespace gradscale {
namespace {

using float32::kAbs;
using float32::kInf;
using float32::kQuiet;
using float32::kSign;
using float32::to_bits;

constexpr std::uint32_t kFraction = 0x007FFFFFu;
constexpr std::uint32_t kImplicit = 0x00800000u;
constexpr std::uint32_t kMaxDrop = 25;  // see the file head: any larger shift rounds to 0 as well

// The constants of one fp8 format and overflow choice, in float32 bits.
struct Fp8Rule {
  std::uint32_t drop;              // float32 fraction bits below F's last place (normal range)
  std::uint32_t min_normal_field;  // float32 exponent field of F's min normal (Emin)
  std::uint32_t quantum_exponent;  // log2(q) << 23 (two's complement): added to float32 bits, times q
  std::uint32_t max_bits;          // float32 bits of F's max finite
  std::uint32_t overflow_bits;     // what a magnitude past max finite becomes (x's sign is added)
  std::uint32_t nan_keep;          // bits of a NaN input kept (with the exponent and the quiet bit set)
};

// Same rules as quantize_generic(): e5m2 overflows to inf and keeps a NaN's sign and top payload
// bits (like IEEE formats); e4m3 has one NaN (per sign) and saturates to max finite, or gives that NaN
// on request.
Fp8Rule make_rule(Format f, RoundOptions opt) {
  const FormatInfo& fi = format_info(f);
  Fp8Rule r{};
  r.drop = static_cast<std::uint32_t>(23 - fi.mantissa_bits);
  r.min_normal_field = static_cast<std::uint32_t>(fi.min_exponent() + 127);
  r.quantum_exponent = static_cast<std::uint32_t>(fi.min_exponent() - fi.mantissa_bits) << 23;
  r.max_bits = to_bits(static_cast<float>(fi.max_finite));
  OverflowRule rule = fi.overflow;
  if (f == Format::fp8_e4m3 && opt.e4m3_overflow_to_nan) rule = OverflowRule::nan;
  r.overflow_bits = rule == OverflowRule::infinity   ? kInf
                    : rule == OverflowRule::saturate ? r.max_bits
                                                     : kInf | kQuiet;
  r.nan_keep = fi.has_infinity ? ~((1u << r.drop) - 1u) : kSign;
  return r;
}

// All ones where c holds, else 0: a select by masks. The subnormal case is selected this way, not with
// ?:, because compilers move its int-to-float conversion (which "may trap") under a branch and then
// stop vectorising the loop.
inline std::uint32_t mask_if(bool c) {
  return 0u - static_cast<std::uint32_t>(c);
}

// One element: the rule of the file head. Both cases are computed and one is selected, without
// branches, so that compilers can vectorise the loop; the AVX2 loop below is this function, lane by lane.
inline std::uint32_t round_fp8_bits(std::uint32_t b, const Fp8Rule& r) {
  const std::uint32_t a = b & kAbs;
  const std::uint32_t field = a >> 23;
  // F's normal range (and above): add half - 1 + the lowest kept bit, clear the dropped bits.
  const std::uint32_t normal =
      (a + ((1u << (r.drop - 1)) - 1u) + ((a >> r.drop) & 1u)) & ~((1u << r.drop) - 1u);
  // F's subnormals: k = round(m / 2^d), value k * q. The field is clamped below Emin so that d stays in
  // drop + 1 .. 25 (defined shifts) where this case is not the one selected.
  const std::uint32_t below = std::min(field, r.min_normal_field - 1u);
  const std::uint32_t d = std::min(r.drop + (r.min_normal_field - below), kMaxDrop);
  const std::uint32_t m = (a & kFraction) | kImplicit;
  const std::uint32_t k = (m + ((1u << (d - 1)) - 1u) + ((m >> d) & 1u)) >> d;
  const std::uint32_t subnormal =
      (to_bits(static_cast<float>(static_cast<std::int32_t>(k))) + r.quantum_exponent) & mask_if(k != 0);
  const std::uint32_t below_min_normal = mask_if(field < r.min_normal_field);
  std::uint32_t mag = (subnormal & below_min_normal) | (normal & ~below_min_normal);
  mag = mag > r.max_bits ? r.overflow_bits : mag;
  const std::uint32_t nan = (b & r.nan_keep) | kInf | kQuiet;
  return a > kInf ? nan : (b & kSign) | mag;
}

void quantize_fp8_portable(const float* in, float* out, std::size_t n, const Fp8Rule& rule) {
  const Fp8Rule r = rule;  // a local copy: stores to `out` cannot alias it, so the loop can vectorise
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t b;
    std::memcpy(&b, in + i, sizeof b);
    b = round_fp8_bits(b, r);
    std::memcpy(out + i, &b, sizeof b);
  }
}

#ifdef GS_X86
// (A function, not a lambda: a lambda would not inherit the target attribute.)
__attribute__((target("avx2"))) inline __m256i splat(std::uint32_t v) {
  return _mm256_set1_epi32(static_cast<int>(v));
}

__attribute__((target("avx2"))) inline __m256i round_fp8_avx2(__m256i b, const Fp8Rule& r) {
  const __m256i one = splat(1);
  const __m256i drop = splat(r.drop);
  const __m256i a = _mm256_and_si256(b, splat(kAbs));
  const __m256i field = _mm256_srli_epi32(a, 23);
  // F's normal range: add half - 1 + lowest kept bit, clear the dropped bits.
  const __m256i lsb = _mm256_and_si256(_mm256_srlv_epi32(a, drop), one);
  const __m256i normal =
      _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(a, splat((1u << (r.drop - 1)) - 1u)), lsb),
                       splat(~((1u << r.drop) - 1u)));
  // F's subnormals: k = round(m / 2^d), value k * q (exact).
  const __m256i below = _mm256_min_epu32(field, splat(r.min_normal_field - 1u));
  const __m256i d =
      _mm256_min_epu32(_mm256_sub_epi32(splat(r.drop + r.min_normal_field), below), splat(kMaxDrop));
  const __m256i m = _mm256_or_si256(_mm256_and_si256(a, splat(kFraction)), splat(kImplicit));
  const __m256i half_minus_1 = _mm256_sub_epi32(_mm256_sllv_epi32(one, _mm256_sub_epi32(d, one)), one);
  const __m256i k = _mm256_srlv_epi32(
      _mm256_add_epi32(_mm256_add_epi32(m, half_minus_1), _mm256_and_si256(_mm256_srlv_epi32(m, d), one)), d);
  const __m256i subnormal = _mm256_andnot_si256(
      _mm256_cmpeq_epi32(k, _mm256_setzero_si256()),
      _mm256_add_epi32(_mm256_castps_si256(_mm256_cvtepi32_ps(k)), splat(r.quantum_exponent)));
  // Signed compares are exact here: every operand is below 2^31.
  __m256i mag = _mm256_blendv_epi8(normal, subnormal, _mm256_cmpgt_epi32(splat(r.min_normal_field), field));
  mag = _mm256_blendv_epi8(mag, splat(r.overflow_bits), _mm256_cmpgt_epi32(mag, splat(r.max_bits)));
  const __m256i rounded = _mm256_or_si256(mag, _mm256_and_si256(b, splat(kSign)));
  const __m256i nan = _mm256_or_si256(_mm256_and_si256(b, splat(r.nan_keep)), splat(kInf | kQuiet));
  return _mm256_blendv_epi8(rounded, nan, _mm256_cmpgt_epi32(a, splat(kInf)));
}

__attribute__((target("avx2"))) void quantize_fp8_avx2(const float* in, float* out, std::size_t n,
                                                       const Fp8Rule& rule) {
  const Fp8Rule r = rule;  // a local copy, like the portable loop: its constants stay in registers
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), round_fp8_avx2(b, r));
  }
  if (i < n) {  // tail through a padded block, so every element takes the same instructions
    float block[8] = {};
    std::memcpy(block, in + i, (n - i) * sizeof(float));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(block), round_fp8_avx2(b, r));
    std::memcpy(out + i, block, (n - i) * sizeof(float));
  }
}
#endif

}  // namespace

bool fp8_path_available(Fp8Path path) {
  switch (path) {
    case Fp8Path::portable:
      return true;
#ifdef GS_X86
    case Fp8Path::avx2:
      return __builtin_cpu_supports("avx2");
#else
    default:
      return false;
#endif
  }
  return false;
}

Fp8Path fp8_best_path() {
  static const Fp8Path best = fp8_path_available(Fp8Path::avx2) ? Fp8Path::avx2 : Fp8Path::portable;
  return best;
}

const char* fp8_path_name(Fp8Path path) {
  switch (path) {
    case Fp8Path::portable:
      return "portable";
    case Fp8Path::avx2:
      return "avx2";
  }
  return "?";
}

void quantize_fp8(const float* in, float* out, std::size_t n, Format f, RoundOptions opt, Fp8Path path) {
  GS_CHECK(f == Format::fp8_e5m2 || f == Format::fp8_e4m3,
           "quantize_fp8 takes fp8_e5m2 or fp8_e4m3, not " << format_name(f));
  GS_CHECK(fp8_path_available(path), "fp8 path " << fp8_path_name(path) << " is not available on this CPU");
  const Fp8Rule rule = make_rule(f, opt);
  switch (path) {
    case Fp8Path::portable:
      quantize_fp8_portable(in, out, n, rule);
      return;
#ifdef GS_X86
    case Fp8Path::avx2:
      quantize_fp8_avx2(in, out, n, rule);
      return;
#else
    default:
      quantize_fp8_portable(in, out, n, rule);
      return;
#endif
  }
}

}  // namespace gradscale
