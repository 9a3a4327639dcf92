// Rounding float32 to a storage format F (SPEC §2): round to nearest, ties to even, gradual underflow,
// and F's overflow rule. This is the one implementation of rounding; everything else calls it.
//
// Emulation model: a tensor "in F" is a float32 array whose values are exactly representable in F.
// quantize(x, F) returns the float32 value of round(x, F). NaN stays NaN with its sign (the payload is
// not promised). For fp32, quantize is the identity.
#pragma once

#include <cstddef>
#include <cstdint>

#include "lib/numeric/format.h"

namespace gradscale {

// Options of the rounding. Only fp8_e4m3 has a choice: saturate (default, OCP satfinite) or NaN.
struct RoundOptions {
  bool e4m3_overflow_to_nan = false;
};

// ---- scalar --------------------------------------------------------------------------------------
float quantize(float x, Format f, RoundOptions opt = {});

// Bit pattern of round(x, F) in F's own encoding (low `bits` bits of the result). NaN encodes as the
// format's canonical quiet NaN with x's sign (fp16: sign|0x7E00|payload top bits; see quantize.cpp).
std::uint32_t encode(float x, Format f, RoundOptions opt = {});
// Float32 value of an F bit pattern (only the low `bits` bits are read).
float decode(std::uint32_t bits, Format f);

// Class of a value already in F (or of an F bit pattern through decode).
enum class ValueClass : std::uint8_t { zero, subnormal, normal, infinite, nan };
ValueClass classify(float value_in_f, Format f);
ValueClass classify_bits(std::uint32_t bits, Format f);
const char* value_class_name(ValueClass c);

// ---- arrays --------------------------------------------------------------------------------------
// out[i] = quantize(in[i], F) for i < n; `in` and `out` may be the same array. fp16 uses the CPU's
// conversion instructions when present, fp8 an AVX2 loop when present (chosen at run time), each
// bit-identical to its portable path and to the scalar quantize.
void quantize(const float* in, float* out, std::size_t n, Format f, RoundOptions opt = {});

// The two fp16 paths, public so tests and benchmarks can compare them.
enum class Fp16Path : std::uint8_t { portable, f16c, avx512 };
void quantize_fp16(const float* in, float* out, std::size_t n, Fp16Path path);
bool fp16_path_available(Fp16Path path);
Fp16Path fp16_best_path();
const char* fp16_path_name(Fp16Path path);

// The two fp8 paths (f: fp8_e5m2 or fp8_e4m3, else Error; `in` may equal `out`), public so tests and
// benchmarks can compare them. Both are one exact integer rounding on the float32 bits (quantize_fp8.cpp).
enum class Fp8Path : std::uint8_t { portable, avx2 };
void quantize_fp8(const float* in, float* out, std::size_t n, Format f, RoundOptions opt, Fp8Path path);
bool fp8_path_available(Fp8Path path);
Fp8Path fp8_best_path();
const char* fp8_path_name(Fp8Path path);

// fp16 bit conversions of the portable path (IEEE binary16, RNE).
std::uint16_t float_to_half_bits(float x);
float half_bits_to_float(std::uint16_t h);

}  // namespace gradscale
