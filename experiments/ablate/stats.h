// The ablation table's statistics beyond mean ± std (docs/ablations.md, "The table"): the quantiles of
// Student's t distribution, the mean difference of paired runs (one pair per seed) with its 95%
// confidence interval, and the first evaluated step at which a run reaches a target accuracy.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace gradscale::ablate {

// The p-quantile of Student's t distribution with `df` degrees of freedom (df >= 1, 0 < p < 1),
// computed from the regularized incomplete beta function to about 1e-12 (t_{0.975, 4} = 2.7764451…).
// Throws std::invalid_argument outside those ranges.
double t_quantile(double p, int df);

// The mean of a − b over the seeds both have a finite value for, the sample std of the differences,
// and the 95% confidence interval mean ± t_{0.975, n−1} · std / √n. With fewer than 2 pairs the
// numbers are NaN and `why` says so.
struct PairedDifference {
  int n = 0;  // pairs
  double mean = std::numeric_limits<double>::quiet_NaN();
  double std = std::numeric_limits<double>::quiet_NaN();
  double lo = std::numeric_limits<double>::quiet_NaN();
  double hi = std::numeric_limits<double>::quiet_NaN();
  std::string why;  // empty when the interval is there
  bool contains_zero() const { return why.empty() && lo <= 0 && hi >= 0; }
};
PairedDifference paired_difference(const std::map<std::uint64_t, double>& a,
                                   const std::map<std::uint64_t, double>& b);

// One test evaluation of a run: after `step` iterations, the test accuracy.
struct Evaluation {
  std::int64_t step = 0;
  double accuracy = std::numeric_limits<double>::quiet_NaN();
};

// The first evaluated step (evaluations in any order) whose accuracy is >= target; none when no
// evaluation reaches it or the target is not finite.
std::optional<std::int64_t> steps_to_target(const std::vector<Evaluation>& evaluations, double target);

}  // namespace gradscale::ablate
