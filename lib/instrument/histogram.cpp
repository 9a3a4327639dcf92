// One pass over a float32 tensor: round-to-F class counts, binade histogram and double moments
// (SPEC §3). The class of |v| is found by comparing its bit pattern (monotone in |v| for non-negative
// floats) with three thresholds that are derived from quantize() itself, so "what underflows" has one
// definition in the whole library.
#include "lib/instrument/histogram.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <omp.h>

#include <nlohmann/json.hpp>

#include "lib/instrument/class_counts.h"
#include "lib/instrument/float_bits.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace gradscale {
namespace {

inline int binade_of(std::uint32_t a) {  // floor(log2|v|) of a non-zero finite |v| given by its bits
  const int field = static_cast<int>(a >> 23);
  if (field != 0) return field - 127;
  return (31 - __builtin_clz(a)) - 149;
}

inline int bin_index(int e) {
  return std::clamp(e, kBinadeMin, kBinadeMax) - kBinadeMin;
}

constexpr std::size_t kLanes = 8;
constexpr std::size_t kBlock = 2048;

// Per-lane accumulators of the counting/moment loop. Lane l sees elements i with i % 8 == l of each
// block; the AVX2 kernel keeps the same lanes in its registers, so both paths add in the same order
// and give bit-identical sums.
struct LaneAccumulators {
  std::uint64_t ge[5][kLanes] = {};  // a != 0, a >= first_nonzero, first_normal, first_overflow, inf
  double sum[kLanes] = {}, sq[kLanes] = {};
  float lo[kLanes], hi[kLanes];
  std::uint32_t
      nz_m1[kLanes];  // min of (a − 1) as unsigned: 0 wraps to the top, so this is min non-zero a − 1
  LaneAccumulators() {
    std::fill(lo, lo + kLanes, std::numeric_limits<float>::infinity());
    std::fill(hi, hi + kLanes, -std::numeric_limits<float>::infinity());
    std::fill(nz_m1, nz_m1 + kLanes, 0xFFFFFFFFu);
  }
};

inline void accumulate_one(LaneAccumulators& acc, std::size_t l, std::uint32_t a, float xv,
                           const RoundThresholds& th) {
  const bool finite = a < kInfBits;
  acc.ge[0][l] += a != 0;
  acc.ge[1][l] += a >= th.first_nonzero;
  acc.ge[2][l] += a >= th.first_normal;
  acc.ge[3][l] += a >= th.first_overflow;
  acc.ge[4][l] += !finite;
  acc.nz_m1[l] = std::min(acc.nz_m1[l], a - 1u);
  if (finite) {
    const double d = xv;
    acc.sum[l] += d;
    acc.sq[l] += d * d;
    acc.lo[l] = std::min(acc.lo[l], xv);
    acc.hi[l] = std::max(acc.hi[l], xv);
  }
}

inline std::uint32_t abs_bits(float v) {
  std::uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b & kAbsBits;
}

void accumulate_block_portable(LaneAccumulators& acc, const float* x, std::size_t m,
                               const RoundThresholds& th) {
  for (std::size_t i = 0; i < m; ++i) accumulate_one(acc, i % kLanes, abs_bits(x[i]), x[i], th);
}

#if defined(__x86_64__)
// The same loop, 8 lanes in AVX2 registers; m is a multiple of 8. Counters are int32 within a block.
__attribute__((target("avx2"))) void accumulate_block_avx2(LaneAccumulators& acc, const float* x,
                                                           std::size_t m, const RoundThresholds& th) {
  // a >= t  <=>  a > t - 1
  const __m256i t_nonzero = _mm256_set1_epi32(static_cast<int>(th.first_nonzero - 1));
  const __m256i t_normal = _mm256_set1_epi32(static_cast<int>(th.first_normal - 1));
  const __m256i t_overflow = _mm256_set1_epi32(static_cast<int>(th.first_overflow - 1));
  const __m256i t_inf = _mm256_set1_epi32(static_cast<int>(kInfBits - 1));
  const __m256i zero = _mm256_setzero_si256();
  const __m256 pinf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  __m256i c0 = zero, c1 = zero, c2 = zero, c3 = zero, c4 = zero;
  __m256d s_lo = _mm256_loadu_pd(acc.sum), s_hi = _mm256_loadu_pd(acc.sum + 4);
  __m256d q_lo = _mm256_loadu_pd(acc.sq), q_hi = _mm256_loadu_pd(acc.sq + 4);
  __m256 lo = _mm256_loadu_ps(acc.lo), hi = _mm256_loadu_ps(acc.hi);
  __m256i nz = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc.nz_m1));
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i abs_mask = _mm256_set1_epi32(static_cast<int>(kAbsBits));
  for (std::size_t i = 0; i < m; i += kLanes) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    const __m256i av = _mm256_and_si256(_mm256_castps_si256(xv), abs_mask);  // |x|'s bits
    nz = _mm256_min_epu32(nz, _mm256_sub_epi32(av, one));
    // a <= 0x7FFFFFFF, so signed compares are exact; a mask is -1, so subtracting it counts.
    c0 = _mm256_sub_epi32(c0, _mm256_cmpgt_epi32(av, zero));
    c1 = _mm256_sub_epi32(c1, _mm256_cmpgt_epi32(av, t_nonzero));
    c2 = _mm256_sub_epi32(c2, _mm256_cmpgt_epi32(av, t_normal));
    c3 = _mm256_sub_epi32(c3, _mm256_cmpgt_epi32(av, t_overflow));
    const __m256i nonfinite = _mm256_cmpgt_epi32(av, t_inf);
    c4 = _mm256_sub_epi32(c4, nonfinite);
    const __m256 finite = _mm256_castsi256_ps(_mm256_xor_si256(nonfinite, _mm256_set1_epi32(-1)));
    const __m256 xf = _mm256_and_ps(xv, finite);  // non-finite -> 0 (adds nothing)
    const __m256d d_lo = _mm256_cvtps_pd(_mm256_castps256_ps128(xf));
    const __m256d d_hi = _mm256_cvtps_pd(_mm256_extractf128_ps(xf, 1));
    s_lo = _mm256_add_pd(s_lo, d_lo);
    s_hi = _mm256_add_pd(s_hi, d_hi);
    q_lo = _mm256_add_pd(q_lo, _mm256_mul_pd(d_lo, d_lo));
    q_hi = _mm256_add_pd(q_hi, _mm256_mul_pd(d_hi, d_hi));
    lo = _mm256_min_ps(lo, _mm256_blendv_ps(pinf, xv, finite));
    hi = _mm256_max_ps(hi, _mm256_blendv_ps(_mm256_sub_ps(_mm256_setzero_ps(), pinf), xv, finite));
  }
  _mm256_storeu_pd(acc.sum, s_lo);
  _mm256_storeu_pd(acc.sum + 4, s_hi);
  _mm256_storeu_pd(acc.sq, q_lo);
  _mm256_storeu_pd(acc.sq + 4, q_hi);
  _mm256_storeu_ps(acc.lo, lo);
  _mm256_storeu_ps(acc.hi, hi);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc.nz_m1), nz);
  alignas(32) std::int32_t c[5][kLanes];
  const __m256i cs[5] = {c0, c1, c2, c3, c4};
  for (int k = 0; k < 5; ++k) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(c[k]), cs[k]);
    for (std::size_t l = 0; l < kLanes; ++l) acc.ge[k][l] += static_cast<std::uint64_t>(c[k][l]);
  }
}
#endif

bool use_avx2() {
#if defined(__x86_64__)
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
#else
  return false;
#endif
}

// One block-wise pass over v[0..n): the lane loop (counts, moments, smallest non-zero) and, when
// `histogram`, the binade bins.
TensorStats stats_pass(const float* v, std::size_t n, const RoundThresholds& th, bool histogram) {
  // The tensor is read once, in blocks that stay in L1: a lane-parallel loop counts threshold crossings
  // and adds the moments, then a second loop over the same block counts each value's exponent field in
  // one of 4 tables (no store-to-load stall on runs of one binade), and nothing else: a test per value
  // for float subnormals made that loop three times slower. Field 0 holds the zeros and the float
  // subnormals; the zeros are counted by the lane loop, so subnormals are binned, in a pass of their
  // own, only when there are any.
  LaneAccumulators acc;
  std::uint64_t by_field[4][256] = {};
  TensorStats s;
  const bool avx2 = use_avx2();
  for (std::size_t base = 0; base < n; base += kBlock) {
    const std::size_t m = std::min(kBlock, n - base);
    const float* x = v + base;
#if defined(__x86_64__)
    if (avx2 && m == kBlock)
      accumulate_block_avx2(acc, x, m, th);
    else
#endif
      accumulate_block_portable(acc, x, m, th);
    if (!histogram) continue;
    std::size_t i = 0;
    for (; i + 4 <= m; i += 4) {
      ++by_field[0][abs_bits(x[i]) >> 23];
      ++by_field[1][abs_bits(x[i + 1]) >> 23];
      ++by_field[2][abs_bits(x[i + 2]) >> 23];
      ++by_field[3][abs_bits(x[i + 3]) >> 23];
    }
    for (; i < m; ++i) ++by_field[0][abs_bits(x[i]) >> 23];
  }
  for (int field = 1; field < 255; ++field)
    s.binades[static_cast<std::size_t>(bin_index(field - 127))] +=
        by_field[0][field] + by_field[1][field] + by_field[2][field] + by_field[3][field];

  std::uint64_t c[5] = {};
  float mn = std::numeric_limits<float>::infinity(), mx = -mn;
  std::uint32_t nz_m1 = 0xFFFFFFFFu;
  for (std::size_t l = 0; l < kLanes; ++l) {
    nz_m1 = std::min(nz_m1, acc.nz_m1[l]);
    for (int k = 0; k < 5; ++k) c[k] += acc.ge[k][l];
    s.sum += acc.sum[l];
    s.sum_squares += acc.sq[l];
    mn = std::min(mn, acc.lo[l]);
    mx = std::max(mx, acc.hi[l]);
  }
  set_class_counts(s, std::uint64_t{n}, c);
  if (histogram && by_field[0][0] + by_field[1][0] + by_field[2][0] + by_field[3][0] > s.zero) {
    for (std::size_t i = 0; i < n; ++i) {  // float subnormals: binned by their highest set bit
      const std::uint32_t a = abs_bits(v[i]);
      if (a != 0 && a < 0x00800000u) ++s.binades[static_cast<std::size_t>(bin_index(binade_of(a)))];
    }
  }
  if (s.count > 0) {
    s.min = mn;
    s.max = mx;
    s.max_abs = std::max(-s.min, s.max);
  }
  if (nz_m1 + 1u < kInfBits && nz_m1 != 0xFFFFFFFFu) s.min_nonzero_abs = from_bits(nz_m1 + 1u);
  return s;
}

// Splits a large tensor over the threads in whole blocks and merges the parts in thread order.
TensorStats split_pass(const float* v, std::size_t n, const RoundThresholds& th, bool histogram) {
  constexpr std::size_t kParallelMin = std::size_t{1} << 17;
  const int threads = omp_get_max_threads();
  if (n < kParallelMin || threads == 1 || omp_in_parallel()) return stats_pass(v, n, th, histogram);
  const auto t = static_cast<std::size_t>(threads);
  // Whole blocks, and t of them cover n: ceil(n / t) rounded up to a block (ceil(n / t) first: with
  // n / t rounded down, a multiple of kBlock, the last n % t values were read by no thread).
  const std::size_t chunk = ((n + t - 1) / t + kBlock - 1) / kBlock * kBlock;
  std::vector<TensorStats> parts(t);
#pragma omp parallel num_threads(threads)
  {
    const auto i = static_cast<std::size_t>(omp_get_thread_num());
    const std::size_t begin = std::min(n, chunk * i), end = std::min(n, begin + chunk);
    parts[i] = stats_pass(v + begin, end - begin, th, histogram);
  }
  TensorStats s = parts[0];
  for (std::size_t i = 1; i < t; ++i) s.merge(parts[i]);
  return s;
}

}  // namespace

TensorStats tensor_stats(const float* v, std::size_t n, Format f, RoundOptions opt) {
  return split_pass(v, n, round_thresholds(f, opt), true);
}

TensorStats tensor_moments(const float* v, std::size_t n) {
  TensorStats s = split_pass(v, n, round_thresholds(Format::fp32, {}), false);
  s.zero = s.underflow = s.subnormal = s.normal = s.overflow = 0;  // not computed here (see header)
  return s;
}

double TensorStats::mean() const {
  return count ? sum / static_cast<double>(count) : 0.0;
}

double TensorStats::variance() const {
  if (count == 0) return 0.0;
  const double m = mean();
  return std::max(0.0, sum_squares / static_cast<double>(count) - m * m);
}

double TensorStats::underflow_rate() const {
  const std::uint64_t nz = nonzero_finite();
  return nz ? static_cast<double>(underflow) / static_cast<double>(nz) : 0.0;
}

std::uint64_t TensorStats::binade(int e) const {
  return binades[static_cast<std::size_t>(bin_index(e))];
}

void TensorStats::merge(const TensorStats& o) {
  if (o.count > 0) {
    min = count ? std::min(min, o.min) : o.min;
    max = count ? std::max(max, o.max) : o.max;
    max_abs = std::max(max_abs, o.max_abs);
  }
  if (o.min_nonzero_abs > 0)
    min_nonzero_abs = min_nonzero_abs > 0 ? std::min(min_nonzero_abs, o.min_nonzero_abs) : o.min_nonzero_abs;
  zero += o.zero;
  underflow += o.underflow;
  subnormal += o.subnormal;
  normal += o.normal;
  overflow += o.overflow;
  nonfinite += o.nonfinite;
  elements += o.elements;
  count += o.count;
  sum += o.sum;
  sum_squares += o.sum_squares;
  for (std::size_t b = 0; b < binades.size(); ++b) binades[b] += o.binades[b];
}

nlohmann::json stats_to_json(const TensorStats& s, bool with_binades) {
  nlohmann::json j = {{"elements", s.elements},
                      {"zero", s.zero},
                      {"underflow", s.underflow},
                      {"subnormal", s.subnormal},
                      {"normal", s.normal},
                      {"overflow", s.overflow},
                      {"nonfinite", s.nonfinite},
                      {"count", s.count},
                      {"sum", s.sum},
                      {"sum_squares", s.sum_squares},
                      {"min", s.min},
                      {"max", s.max},
                      {"max_abs", s.max_abs},
                      {"min_nonzero_abs", s.min_nonzero_abs},
                      {"underflow_rate", s.underflow_rate()}};
  if (with_binades) {
    nlohmann::json b = nlohmann::json::object();
    for (int e = kBinadeMin; e <= kBinadeMax; ++e)
      if (const auto c = s.binade(e)) b[std::to_string(e)] = c;
    j["binades"] = std::move(b);
  }
  return j;
}

}  // namespace gradscale
