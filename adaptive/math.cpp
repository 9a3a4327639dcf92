// Numerical helpers of the adaptive controllers (see math.h).
#include "adaptive/math.h"

#include <cmath>
#include <limits>

#include "lib/scaler/scale_rule.h"

namespace gradscale::adaptive {

double erfinv(double x) {
  if (std::isnan(x)) return x;
  if (x <= -1) return -std::numeric_limits<double>::infinity();
  if (x >= 1) return std::numeric_limits<double>::infinity();
  // M. Giles, "Approximating the erfinv function" (single-precision polynomials) as the first guess.
  double w = -std::log((1.0 - x) * (1.0 + x)), p;
  if (w < 5.0) {
    w -= 2.5;
    p = 2.81022636e-08;
    p = 3.43273939e-07 + p * w;
    p = -3.5233877e-06 + p * w;
    p = -4.39150654e-06 + p * w;
    p = 0.00021858087 + p * w;
    p = -0.00125372503 + p * w;
    p = -0.00417768164 + p * w;
    p = 0.246640727 + p * w;
    p = 1.50140941 + p * w;
  } else {
    w = std::sqrt(w) - 3.0;
    p = -0.000200214257;
    p = 0.000100950558 + p * w;
    p = 0.00134934322 + p * w;
    p = -0.00367342844 + p * w;
    p = 0.00573950773 + p * w;
    p = -0.0076224613 + p * w;
    p = 0.00943887047 + p * w;
    p = 1.00167406 + p * w;
    p = 2.83297682 + p * w;
  }
  double y = p * x;
  // Newton on erf(y) = x: two steps take the ~1e-7 guess to double precision.
  const double two_over_sqrt_pi = 1.1283791670955126;
  for (int i = 0; i < 2; ++i) y -= (std::erf(y) - x) / (two_over_sqrt_pi * std::exp(-y * y));
  return y;
}

double underflow_coefficient(double n_uf) {
  return std::sqrt(2.0) * erfinv(n_uf);
}

double normal_quantile_above(double n_uf) {
  return std::sqrt(2.0) * erfinv(1.0 - 2.0 * n_uf);
}

double power_of_two_floor(double s) { return rule_power_of_two_floor(s); }

}  // namespace gradscale::adaptive
