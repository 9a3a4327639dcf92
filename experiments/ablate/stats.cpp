// The ablation table's statistics (see stats.h).
#include "experiments/ablate/stats.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace gradscale::ablate {
namespace {

// The continued fraction of the incomplete beta function (modified Lentz), as in Press et al.,
// Numerical Recipes, §6.4.
double beta_fraction(double a, double b, double x) {
  constexpr double kTiny = 1e-300, kEps = 1e-16;
  double c = 1, d = 1 - (a + b) * x / (a + 1);
  if (std::fabs(d) < kTiny) d = kTiny;
  d = 1 / d;
  double h = d;
  for (int m = 1; m <= 10000; ++m) {
    const double m2 = 2.0 * m;
    double aa = m * (b - m) * x / ((a + m2 - 1) * (a + m2));
    d = 1 + aa * d;
    c = 1 + aa / c;
    if (std::fabs(d) < kTiny) d = kTiny;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1 / d;
    h *= d * c;
    aa = -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1));
    d = 1 + aa * d;
    c = 1 + aa / c;
    if (std::fabs(d) < kTiny) d = kTiny;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1 / d;
    const double step = d * c;
    h *= step;
    if (std::fabs(step - 1) < kEps) break;
  }
  return h;
}

// I_x(a, b), the regularized incomplete beta function.
double incomplete_beta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double front =
      std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x));
  if (x < (a + 1) / (a + b + 2)) return front * beta_fraction(a, b, x) / a;
  return 1 - front * beta_fraction(b, a, 1 - x) / b;
}

// P(T <= t) for t >= 0: 1 − I_{df/(df+t²)}(df/2, 1/2) / 2.
double t_cdf_upper_half(double t, int df) {
  const double v = df;
  return 1 - 0.5 * incomplete_beta(v / 2, 0.5, v / (v + t * t));
}

}  // namespace

double t_quantile(double p, int df) {
  if (!(p > 0 && p < 1)) throw std::invalid_argument("t_quantile: p must lie in (0, 1)");
  if (df < 1) throw std::invalid_argument("t_quantile: df must be >= 1");
  if (p == 0.5) return 0;
  if (p < 0.5) return -t_quantile(1 - p, df);
  double lo = 0, hi = 1;
  while (t_cdf_upper_half(hi, df) < p) hi *= 2;  // the cdf is increasing: bracket, then bisect
  for (int i = 0; i < 200 && hi - lo > 1e-13 * hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    (t_cdf_upper_half(mid, df) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

PairedDifference paired_difference(const std::map<std::uint64_t, double>& a,
                                   const std::map<std::uint64_t, double>& b) {
  std::vector<double> d;
  for (const auto& [seed, x] : a) {
    const auto it = b.find(seed);
    if (it != b.end() && std::isfinite(x) && std::isfinite(it->second)) d.push_back(x - it->second);
  }
  PairedDifference r;
  r.n = static_cast<int>(d.size());
  if (r.n < 2) {
    r.why = std::to_string(r.n) + (r.n == 1 ? " pair" : " pairs");
    return r;
  }
  double sum = 0;
  for (const double v : d) sum += v;
  r.mean = sum / r.n;
  double ss = 0;
  for (const double v : d) ss += (v - r.mean) * (v - r.mean);
  r.std = std::sqrt(ss / (r.n - 1));
  const double half = t_quantile(0.975, r.n - 1) * r.std / std::sqrt(static_cast<double>(r.n));
  r.lo = r.mean - half;
  r.hi = r.mean + half;
  return r;
}

std::optional<std::int64_t> steps_to_target(const std::vector<Evaluation>& evaluations, double target) {
  if (!std::isfinite(target)) return std::nullopt;
  std::optional<std::int64_t> first;
  for (const Evaluation& e : evaluations)
    if (e.accuracy >= target && (!first || e.step < *first)) first = e.step;
  return first;
}

}  // namespace gradscale::ablate
