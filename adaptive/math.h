// Small numerical pieces shared by the adaptive controllers (SPEC §6): the inverse error function and
// the two constants the methods derive from n_uf, and rounding a scale down to a power of two.
#pragma once

namespace gradscale::adaptive {

// erf⁻¹(x) for x in (−1, 1), to double precision (a rational first guess refined by Newton steps on
// std::erf); ±inf at ±1.
double erfinv(double x);
// c = √2·erf⁻¹(n_uf): |v| ≤ c·σ holds for a fraction n_uf of a zero-mean normal (1.2533e-3 for 1e-3).
double underflow_coefficient(double n_uf);
// z = Φ⁻¹(1 − n_uf): the standard normal quantile above which a fraction n_uf lies (3.0902 for 1e-3).
double normal_quantile_above(double n_uf);
// 2^floor(log2 s) for a finite s > 0 (1.23 → 1, 0.23 → 0.125); exact.
double power_of_two_floor(double s);

}  // namespace gradscale::adaptive
