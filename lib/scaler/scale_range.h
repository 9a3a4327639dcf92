// The range of a loss scale: a scale multiplies gradients held in float32 and is divided out again in
// float32 (SPEC §4), so it must be a normal float32 number — below 2^-126 its float32 value loses
// precision or becomes 0 and the unscale gives inf (0·inf = NaN); above FLT_MAX it is inf. Every
// configured scale (static, initial, bounds) is checked against this range when the scaler is made;
// an accumulated scale that leaves it makes the engine skip the step (lib/layers/precision_ops.cpp).
#pragma once

#include <limits>
#include <string>

namespace gradscale {

inline constexpr double kMinLossScale = std::numeric_limits<float>::min();  // 2^-126
inline constexpr double kMaxLossScale = std::numeric_limits<float>::max();

// Whether `scale` can be represented and unscaled in float32: kMinLossScale <= scale <= kMaxLossScale.
inline bool scale_in_float_range(double scale) {
  return scale >= kMinLossScale && scale <= kMaxLossScale;
}

// Throws ConfigError "scaler '<policy>': '<key>' is <value>, outside ..." unless scale_in_float_range.
void check_scale_range(const std::string& policy, const char* key, double scale);

}  // namespace gradscale
