// The hook through which data-parallel training makes a statistic of a batch split over ranks equal
// to the statistic of the whole batch (docs/distributed.md). The engine calls it right after it
// computes a statistic a decision depends on — a controller's query (lib/layers/precision_ops.cpp),
// the fp32 loss gradient that S0 is chosen from (lib/train/verdict.cpp), the maxima a backward join
// picks its target scale from (lib/model/join.cpp) — so every rank takes the same decision as one
// process with the whole batch would. It also sums each weight gradient before it is rounded
// (lib/layers/precision_ops.cpp accumulate_weight_grad). Null in a single process: nothing is called.
#pragma once

#include <cstddef>
#include <string>

#include "lib/core/error.h"

#include "lib/instrument/histogram.h"
#include "lib/instrument/log_moments.h"
#include "lib/instrument/product_range.h"

namespace gradscale {

class StatisticsReducer {
 public:
  virtual ~StatisticsReducer() = default;
  // In place, over the ranks: counts and binades summed (exact), extremes combined (exact), sum and
  // sum of squares added in rank order (the same on every rank; not the one process's order).
  virtual void reduce(TensorStats& s) = 0;
  // count summed; mean and stddev from the ranks' sums of ln|v| and of its square, in rank order.
  virtual void reduce(LogMoments& m) = 0;
  // Smallest non-zero and largest |g·w| over the ranks (exact).
  virtual void reduce(ProductRange& r) = 0;
  // values[i] = max over ranks (exact). NaN counts as +inf.
  virtual void reduce_max(double* values, std::size_t n) = 0;
  // values[i] = Σ over ranks, fp32: a weight gradient accumulated over each rank's rows, summed before
  // its one rounding to the gradient format (so it is rounded as the whole batch's would be). The order
  // of the sum is the backend's (the same on every rank, not the one process's GEMM order).
  virtual void reduce_sum(float* values, std::size_t n) = 0;
  // The same for a weight gradient in device memory (a GPU backend's), summed where it is. A reducer
  // without device collectives cannot: it throws Error, naming what is missing.
  virtual void reduce_sum_on_device(float* device_values, std::size_t n);
};

inline void StatisticsReducer::reduce_sum_on_device(float*, std::size_t n) {
  throw Error("data-parallel training: a weight gradient of " + std::to_string(n) +
              " values is in device memory, and this reducer has no collectives for device memory");
}

}  // namespace gradscale
