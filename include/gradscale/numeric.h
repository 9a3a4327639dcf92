// gradscale public API — formats, rounding and underflow statistics (SPEC §2–§3).
//
//   Format                  fp32 | fp16 | bf16 | fp8_e5m2 | fp8_e4m3; parse_format("fp16"), format_name(f),
//                           format_info(f) (max finite, min subnormal, ...)
//   quantize(x, F)          float32 value of round(x, F): nearest-even, gradual underflow, F's overflow
//                           rule. The array form quantize(in, out, n, F) may work in place; bit-exact.
//   tensor_stats(v, n, F)   one pass: counts of what rounding to F does (zero, underflow, subnormal,
//                           normal, overflow, nonfinite), the binade histogram, moments in double.
//                           TensorStats::underflow_rate() = underflow / non-zero finite.
//
// Values "in F" are float32 arrays whose values are representable in F; nothing here allocates except
// the returned statistics. Contracts in detail: internal/lib/numeric/*.h and
// internal/lib/instrument/histogram.h.
#pragma once

#include "lib/instrument/histogram.h"
#include "lib/numeric/format.h"
#include "lib/numeric/quantize.h"
