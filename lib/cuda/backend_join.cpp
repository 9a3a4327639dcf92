// The CUDA backend's join of the gradients that reach one tensor (see backend.h; SPEC §5): the target
// scale T chosen on the device, or on the host as lib/model/join.cpp chooses it.
#include "lib/cuda/backend.h"

#include <cmath>
#include <limits>
#include "lib/cuda/elementwise.h"
#include "lib/model/join.h"

namespace gradscale::cuda {

void CudaBackend::join(const std::vector<const ScaledGrad*>& parts, ScaledGrad& out, const Precision& p,
                       StepMonitor& monitor, int node_id, StatisticsReducer* reducer) {
  GS_CHECK(!parts.empty(), "join of no gradients");
  for (const ScaledGrad* part : parts)
    GS_CHECK_SHAPE(part->g.shape() == parts[0]->g.shape(), "join: gradient shapes "
                                                               << shape_string(part->g.shape()) << " and "
                                                               << shape_string(parts[0]->g.shape()));
  if (!device_decisions_ || reducer != nullptr || parts.size() > static_cast<std::size_t>(kMaxJoinParts)) {
    host_join(parts, out, p, monitor, node_id, reducer);
    return;
  }
  // T on the device (join_scale.h) from the parts' max|g_i| and scales: no wait.
  std::vector<StatsJob> jobs;
  for (const ScaledGrad* part : parts) {
    if (part->device_scale < 0)
      GS_CHECK_NUMERIC(std::isfinite(part->scale) && part->scale > 0,
                       "join: scale " << part->scale << " is not finite and > 0");
    jobs.push_back(job_of(part->g.data(), part->g.size(), Format::fp32, p.round));
  }
  tensor_stats(ctx_, jobs, join_stats_.data());
  JoinParts table;
  table.count = static_cast<int>(parts.size());
  table.limit = format_info(p.gradient_format()).max_finite;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    table.stats[i] = join_stats_.data() + i;
    table.scales[i] = scale_entry(*parts[i]);
  }
  const int e = new_scale_entry();
  choose_join_scale(table, scale_at(e), ctx_.stream());
  out.g.resize(parts[0]->g.shape());
  out.g.fill(0.0f);
  const auto n = static_cast<std::size_t>(out.g.size());
  for (std::size_t i = 0; i < parts.size(); ++i)
    scale_add_rescaled(parts[i]->g.data(), scale_at(e), table.scales[i], out.g.data(), n, ctx_.stream());
  out.scale = std::numeric_limits<double>::quiet_NaN();  // known on the host after the step's copy
  out.device_scale = e;
  round_gradient(out.g.data(), n, 1.0f, GradSite::join, node_id, p, monitor);
}

void CudaBackend::host_join(const std::vector<const ScaledGrad*>& parts, ScaledGrad& out, const Precision& p,
                            StepMonitor& monitor, int node_id, StatisticsReducer* reducer) {
  std::vector<StatsJob> jobs;
  std::vector<double> scales;
  for (const ScaledGrad* part : parts) {
    jobs.push_back(job_of(part->g.data(), part->g.size(), Format::fp32, p.round));
    scales.push_back(host_scale(*part, monitor));
  }
  std::vector<double> max_abs_parts;
  for (const TensorStats& s : statistics_now(jobs))
    max_abs_parts.push_back(s.nonfinite > 0 ? std::numeric_limits<double>::infinity() : s.max_abs);
  if (reducer) reducer->reduce_max(max_abs_parts.data(), max_abs_parts.size());  // as lib/model/join.cpp
  const double target = join_target_scale(max_abs_parts, scales, p.gradient_format());
  out.g.resize(parts[0]->g.shape());
  out.g.fill(0.0f);
  const auto n = static_cast<std::size_t>(out.g.size());
  for (std::size_t i = 0; i < parts.size(); ++i)
    scale_add(parts[i]->g.data(), static_cast<float>(target / scales[i]), out.g.data(), n, ctx_.stream());
  out.scale = target;
  out.device_scale = -1;
  round_gradient(out.g.data(), n, 1.0f, GradSite::join, node_id, p, monitor);
}

}  // namespace gradscale::cuda
