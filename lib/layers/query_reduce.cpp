// QueryStatistics::reduce (see layer.h): a controller's query made whole-batch in data-parallel
// training — the statistics a rank computed over its rows, reduced over the ranks.
#include "lib/layers/precision_ops.h"

namespace gradscale {

void QueryStatistics::reduce(StatisticsReducer& reducer, LocalScaleQuery& q) {
  if (q.grad_moments) reducer.reduce(grad_moments);
  if (q.grad_log_moments) reducer.reduce(grad_log_moments);
  if (q.upstream_stats) reducer.reduce(upstream_stats);
  if (q.products) reducer.reduce(products);
  // The weight is the same on every rank: its moments are already the whole model's.
  q.grad = nullptr;
  q.upstream = nullptr;
}

}  // namespace gradscale
