// Data-parallel training over a Communicator (docs/distributed.md): each rank holds the whole model
// and trains on its rows of every batch. What makes N ranks take the decisions one process with the
// whole batch takes:
// - inside backward, every statistic a decision depends on is reduced as soon as it is computed
//   (StatisticsReducer: the controllers' queries, the loss gradient S0 is chosen from, the join maxima);
// - after backward, one reduction of the step's summary: found_inf, the per-layer max|g| and, on
//   recording steps, the per-layer statistics (reduce_step);
// - each weight gradient is summed over the ranks in fp32 before its one rounding to the gradient
//   format (reduce_sum, inside backward): the whole batch's gradient is rounded, checked and applied;
//   the loss is the mean over the whole batch (the loss gradient is divided by the whole batch's count).
// Integer counts and maxima are reduced exactly; sums of doubles are added in rank order (the same
// bits on every rank and in every run, not the one process's order); fp32 gradient sums are the
// backend's all-reduce. On a GPU (the CUDA backend) the statistics are reduced on the host, after the
// backend copies them there, and the weight gradients in device memory by the backend's
// DeviceCollectives (NCCL, or through the host: use_device).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/dist/communicator.h"
#include "lib/instrument/statistics_reducer.h"
#include "lib/instrument/step_monitor.h"
#include "lib/optim/parameter.h"

namespace gradscale {

// What the reductions of a run cost, per rank (the benchmark's figures).
struct ReductionCounts {
  std::uint64_t statistics_collectives = 0, statistics_bytes = 0;  // in backward and the step summary
  std::uint64_t gradient_collectives = 0, gradient_bytes = 0;      // the weight gradients
  // Wall time in those collectives, waiting for the other ranks included.
  double statistics_seconds = 0, gradient_seconds = 0;
};

class DataParallel final : public StatisticsReducer {
 public:
  // Borrows `comm` (it must outlive this object).
  explicit DataParallel(Communicator& comm) : comm_(comm) {}

  Communicator& communicator() { return comm_; }
  int rank() const { return comm_.rank(); }
  int ranks() const { return comm_.size(); }

  // StatisticsReducer.
  void reduce(TensorStats& s) override;
  void reduce(LogMoments& m) override;
  void reduce(ProductRange& r) override;
  void reduce_max(double* values, std::size_t n) override;
  void reduce_sum(float* values, std::size_t n) override;  // counted as gradient bytes
  // Through the device collectives given to use_device (counted as gradient bytes).
  void reduce_sum_on_device(float* device_values, std::size_t n) override;

  // The collectives for weight gradients in device memory (borrowed; null: none, the host backend's).
  void use_device(DeviceCollectives* device) { device_ = device; }
  DeviceCollectives* device() const { return device_; }

  // Σ over ranks of `local` (the whole batch's sample count from each rank's rows).
  std::int64_t total(std::int64_t local);
  // After backward: found_inf (and the first non-finite layer: backward runs the layers in descending
  // id order, so the largest of the ranks' first ids), the loss (each rank's share of the mean) and
  // correct count, every layer's and the loss gradient's max|g|, and on recording steps the statistics
  // of the gradients each rank holds rows of (activation, joined, loss gradients) merged. The weight
  // gradients' are already the whole batch's (reduce_sum ran before they were taken), and so are their
  // factors r. Also where the step overflowed (SPEC §6.5: whether a stored value was not finite, the
  // loss gradient's and each layer's overflow sites with their largest maxima), max-reduced, so every
  // rank charges the same back-offs. Layer decisions (s, S) are already the same on every rank.
  void reduce_step(StepMonitor& monitor);

  // The start-up checks (docs/distributed.md, "What is checked at the start"): every rank must run the
  // same command on the same files. Collective: every rank calls them in the same order, and every
  // rank throws when one differs. ConfigError (bad input: `gradscale train` exits 2).
  //
  // Unless every rank was started with the same `config` (canonical JSON text): the message names the
  // ranks that differ from rank 0 and, on each of them, the first key that differs.
  void check_same_config(const nlohmann::json& config);
  // Unless `value`, what this rank read from a file of its own (the data's content checksum, the
  // checkpoint it resumes), is rank 0's: the message names `what` (the file), the ranks that differ,
  // rank 0's value and, on a rank that differs, its own.
  void check_same_input(const std::string& value, const std::string& what);
  // DistributedError unless every rank holds bit-identical weights (their checksum): after `what`.
  void check_same_weights(const std::vector<Parameter*>& params, const std::string& what);
  // The checksum of the weights that check_same_weights compares.
  static std::uint64_t weights_checksum(const std::vector<Parameter*>& params);

  const ReductionCounts& counts() const { return counts_; }

 private:
  // Several statistics in one go: counts summed, extremes max-reduced, sums in rank order.
  void reduce_all(const std::vector<TensorStats*>& stats);
  void count_statistics(std::uint64_t collectives, std::uint64_t bytes);
  // Rank 0's `text` on every rank (broadcast), and the ranks whose `same` is false, as "1, 3" (and
  // their number in `count`).
  std::string root_text(const std::string& text);
  std::string differing_ranks(bool same, int& count);

  Communicator& comm_;
  DeviceCollectives* device_ = nullptr;
  ReductionCounts counts_;
};

}  // namespace gradscale
