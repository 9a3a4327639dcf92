// fp16 array rounding: the portable path (the generic rounding rule) and the x86 conversion
// instruction paths (F16C, AVX-512F), chosen at run time. Tests prove them bit-identical on every
// fp16 pattern and on random floats with specials.
#include <cstring>

#include "lib/core/error.h"
#include "lib/numeric/quantize.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define GS_X86 1
#endif

namespace gradscale {
namespace {

void quantize_fp16_portable(const float* in, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = quantize(in[i], Format::fp16);
}

#ifdef GS_X86
__attribute__((target("avx,f16c"))) void quantize_fp16_f16c(const float* in, float* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(in + i);
    const __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  if (i < n) {  // tail through a padded block, so every element takes the same instruction
    float block[8] = {};
    std::memcpy(block, in + i, (n - i) * sizeof(float));
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(block), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_ps(block, _mm256_cvtph_ps(h));
    std::memcpy(out + i, block, (n - i) * sizeof(float));
  }
}

// GCC 12 reports a false "may be used uninitialized" inside its own avx512fintrin.h conversions (clang,
// which builds the fuzz targets, has no such warning and would warn about the unknown name).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
__attribute__((target("avx512f"))) void quantize_fp16_avx512(const float* in, float* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(in + i);
    const __m256i h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm512_storeu_ps(out + i, _mm512_cvtph_ps(h));
  }
  if (i < n) {  // tail through a padded block, like the F16C path
    float block[16] = {};
    std::memcpy(block, in + i, (n - i) * sizeof(float));
    const __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(block), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm512_storeu_ps(block, _mm512_cvtph_ps(h));
    std::memcpy(out + i, block, (n - i) * sizeof(float));
  }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

#ifdef GS_X86
// CPUID leaf 1, ECX bit 29, read once: quantize_fp16 checks its path at every call, and CPUID traps to
// the hypervisor in a virtual machine (about 2 µs a call on one). (clang's __builtin_cpu_supports does not
// know "f16c"; GCC's does.)
bool cpu_has_f16c() {
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
  }();
  return yes;
}
#endif

}  // namespace

bool fp16_path_available(Fp16Path path) {
  switch (path) {
    case Fp16Path::portable:
      return true;
#ifdef GS_X86
    case Fp16Path::f16c:
      return __builtin_cpu_supports("avx") && cpu_has_f16c();
    case Fp16Path::avx512:
      return __builtin_cpu_supports("avx512f");
#else
    default:
      return false;
#endif
  }
  return false;
}

Fp16Path fp16_best_path() {
  static const Fp16Path best = fp16_path_available(Fp16Path::avx512) ? Fp16Path::avx512
                               : fp16_path_available(Fp16Path::f16c) ? Fp16Path::f16c
                                                                     : Fp16Path::portable;
  return best;
}

const char* fp16_path_name(Fp16Path path) {
  switch (path) {
    case Fp16Path::portable:
      return "portable";
    case Fp16Path::f16c:
      return "f16c";
    case Fp16Path::avx512:
      return "avx512";
  }
  return "?";
}

void quantize_fp16(const float* in, float* out, std::size_t n, Fp16Path path) {
  GS_CHECK(fp16_path_available(path),
           "fp16 path " << fp16_path_name(path) << " is not available on this CPU");
  switch (path) {
    case Fp16Path::portable:
      quantize_fp16_portable(in, out, n);
      return;
#ifdef GS_X86
    case Fp16Path::f16c:
      quantize_fp16_f16c(in, out, n);
      return;
    case Fp16Path::avx512:
      quantize_fp16_avx512(in, out, n);
      return;
#else
    default:
      quantize_fp16_portable(in, out, n);
      return;
#endif
  }
}

}  // namespace gradscale
