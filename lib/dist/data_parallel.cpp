// Data-parallel reductions (see data_parallel.h).
#include "lib/dist/data_parallel.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <sstream>

#include "lib/core/checksum.h"

namespace gradscale {
namespace {

constexpr double kNone = -std::numeric_limits<double>::infinity();  // "no value" under max

// Adds the wall time of its scope to `total`.
class Timed {
 public:
  explicit Timed(double& total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~Timed() { total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  double& total_;
  std::chrono::steady_clock::time_point start_;
};

// NaN counts as +inf (nothing fits a non-finite value), as lib/instrument's max|v| does.
double no_nan(double v) {
  return std::isnan(v) ? std::numeric_limits<double>::infinity() : v;
}

// The first key where two config objects differ (a dotted path), for the message of check_same_config.
std::string first_difference(const nlohmann::json& a, const nlohmann::json& b, const std::string& at = "") {
  if (a.is_object() && b.is_object()) {
    for (const auto& [k, v] : a.items()) {
      if (!b.contains(k)) return at + k;
      if (b[k] != v) return first_difference(v, b[k], at + k + ".");
    }
    for (const auto& [k, v] : b.items()) {
      (void)v;
      if (!a.contains(k)) return at + k;
    }
  }
  return at.empty() ? "(the whole config)" : at.substr(0, at.size() - 1);
}

}  // namespace

void DataParallel::count_statistics(std::uint64_t collectives, std::uint64_t bytes) {
  counts_.statistics_collectives += collectives;
  counts_.statistics_bytes += bytes;
}

void DataParallel::reduce_all(const std::vector<TensorStats*>& stats) {
  if (stats.empty() || comm_.size() == 1) return;
  constexpr std::size_t kCounts = 8 + kBinadeCount, kExtremes = 4, kSums = 2;
  std::vector<std::uint64_t> counts;
  std::vector<double> extremes, sums;
  counts.reserve(stats.size() * kCounts);
  for (const TensorStats* s : stats) {
    for (std::uint64_t c : {s->zero, s->underflow, s->subnormal, s->normal, s->overflow, s->nonfinite,
                            s->elements, s->count})
      counts.push_back(c);
    counts.insert(counts.end(), s->binades.begin(), s->binades.end());
    const bool any = s->count > 0;
    extremes.push_back(any ? no_nan(s->max) : kNone);
    extremes.push_back(any ? -no_nan(s->min) : kNone);
    extremes.push_back(any ? no_nan(s->max_abs) : kNone);
    extremes.push_back(s->min_nonzero_abs > 0 ? -s->min_nonzero_abs : kNone);
    sums.push_back(s->sum);
    sums.push_back(s->sum_squares);
  }
  comm_.all_reduce_sum(counts.data(), counts.size());
  comm_.all_reduce_max(extremes.data(), extremes.size());
  all_reduce_sum_ordered(comm_, sums.data(), sums.size());
  count_statistics(3, 8 * (counts.size() + extremes.size() + sums.size()));
  for (std::size_t i = 0; i < stats.size(); ++i) {
    TensorStats& s = *stats[i];
    const std::uint64_t* c = counts.data() + i * kCounts;
    s.zero = c[0], s.underflow = c[1], s.subnormal = c[2], s.normal = c[3], s.overflow = c[4];
    s.nonfinite = c[5], s.elements = c[6], s.count = c[7];
    std::copy(c + 8, c + kCounts, s.binades.begin());
    const double* e = extremes.data() + i * kExtremes;
    const bool any = s.count > 0;
    s.max = any ? e[0] : 0;
    s.min = any ? -e[1] : 0;
    s.max_abs = any ? e[2] : 0;
    s.min_nonzero_abs = e[3] == kNone ? 0 : -e[3];
    s.sum = sums[i * kSums];
    s.sum_squares = sums[i * kSums + 1];
  }
}

void DataParallel::reduce(TensorStats& s) {
  const Timed t(counts_.statistics_seconds);
  reduce_all({&s});
}

void DataParallel::reduce(LogMoments& m) {
  if (comm_.size() == 1) return;
  const Timed t(counts_.statistics_seconds);
  // Back to sums (count·mean, count·(stddev² + mean²)): not the one process's bits, which summed the
  // logarithms in one pass (docs/distributed.md: what is not bit-exact).
  const auto c = static_cast<double>(m.count);
  std::uint64_t count = m.count;
  double sums[2] = {c * m.mean, c * (m.stddev * m.stddev + m.mean * m.mean)};
  comm_.all_reduce_sum(&count, 1);
  all_reduce_sum_ordered(comm_, sums, 2);
  count_statistics(2, 8 * 3);
  m.count = count;
  m.mean = m.stddev = 0;
  if (count) {
    const auto n = static_cast<double>(count);
    m.mean = sums[0] / n;
    m.stddev = std::sqrt(std::max(0.0, sums[1] / n - m.mean * m.mean));
  }
}

void DataParallel::reduce(ProductRange& r) {
  if (comm_.size() == 1) return;
  const Timed t(counts_.statistics_seconds);
  double v[2] = {r.max_abs, r.empty() ? kNone : -r.min_abs};
  comm_.all_reduce_max(v, 2);
  count_statistics(1, 16);
  r.max_abs = v[0];
  r.min_abs = v[1] == kNone ? 0 : -v[1];
}

void DataParallel::reduce_max(double* values, std::size_t n) {
  if (comm_.size() == 1) return;
  const Timed t(counts_.statistics_seconds);
  for (std::size_t i = 0; i < n; ++i) values[i] = no_nan(values[i]);
  comm_.all_reduce_max(values, n);
  count_statistics(1, 8 * n);
}

std::int64_t DataParallel::total(std::int64_t local) {
  if (comm_.size() == 1) return local;
  const Timed t(counts_.statistics_seconds);
  std::uint64_t n = static_cast<std::uint64_t>(local);
  comm_.all_reduce_sum(&n, 1);
  count_statistics(1, 8);
  return static_cast<std::int64_t>(n);
}

// Every field of StepMonitor / LayerRecord that a scaler or controller reads after backward must be
// made the whole batch's here (a per-layer overflow flag: max), or the ranks may decide differently.
void DataParallel::reduce_step(StepMonitor& m) {
  if (comm_.size() == 1) return;
  const Timed t(counts_.statistics_seconds);
  // Integers: found_inf and the correct count. (The weight gradients were summed before they were
  // rounded, so their statistics and popart_als's edge counts of them are already the whole batch's,
  // the same on every rank.)
  std::uint64_t ints[2] = {m.found_inf ? 1u : 0u, static_cast<std::uint64_t>(m.correct)};
  comm_.all_reduce_sum(ints, 2);
  // Maxima: the first non-finite layer, the loss gradient's and every layer's max|g|, and which
  // statistics some rank has.
  // And where the step overflowed (SPEC §6.5's charges and skip rule): whether a stored value was not
  // finite, the loss gradient's overflow, each layer's overflow sites, with their largest maxima.
  constexpr std::size_t kHead = 6, kPerLayer = 7;
  std::vector<double> maxima = {static_cast<double>(m.first_nonfinite_layer), no_nan(m.loss_grad_max_abs),
                                m.has_loss_grad ? 1.0 : 0.0,  m.nonfinite_stored ? 1.0 : 0.0,
                                m.loss_overflow ? 1.0 : 0.0,   no_nan(m.loss_overflow_max_abs)};
  for (const LayerRecord& r : m.records) {
    maxima.push_back(r.sent_grad ? no_nan(r.sent_max_abs) : kNone);
    maxima.push_back(r.has_activation_grad ? 1.0 : 0.0);
    maxima.push_back(r.has_joined_grad ? 1.0 : 0.0);
    maxima.push_back(r.overflow_upstream ? 1.0 : 0.0);
    maxima.push_back(r.overflow_weight ? 1.0 : 0.0);
    maxima.push_back(r.overflow_join ? 1.0 : 0.0);
    maxima.push_back(no_nan(r.overflow_max_abs));
  }
  comm_.all_reduce_max(maxima.data(), maxima.size());
  // The loss: each rank's share of the whole batch's mean, added in rank order.
  double loss = m.loss;
  all_reduce_sum_ordered(comm_, &loss, 1);
  count_statistics(3, 8 * (2 + maxima.size() + 1));
  m.found_inf = ints[0] > 0;
  m.correct = static_cast<std::int64_t>(ints[1]);
  m.first_nonfinite_layer = m.found_inf ? static_cast<int>(maxima[0]) : -1;
  m.loss_grad_max_abs = static_cast<float>(maxima[1]);
  m.has_loss_grad = maxima[2] > 0;
  m.nonfinite_stored = maxima[3] > 0;
  m.loss_overflow = maxima[4] > 0;
  m.loss_overflow_max_abs = static_cast<float>(maxima[5]);
  m.loss = loss;
  std::vector<TensorStats*> stats;
  if (m.record && m.has_loss_grad) stats.push_back(&m.loss_grad);
  for (std::size_t i = 0; i < m.records.size(); ++i) {
    LayerRecord& r = m.records[i];
    const double* v = maxima.data() + kHead + kPerLayer * i;
    if (r.sent_grad) r.sent_max_abs = static_cast<float>(v[0]);
    r.has_activation_grad = v[1] > 0;
    r.has_joined_grad = v[2] > 0;
    r.overflow_upstream = v[3] > 0;
    r.overflow_weight = v[4] > 0;
    r.overflow_join = v[5] > 0;
    r.overflow_max_abs = static_cast<float>(v[6]);
    if (!m.record) continue;
    if (r.has_activation_grad) stats.push_back(&r.activation_grad);
    if (r.has_joined_grad) stats.push_back(&r.joined_grad);
  }
  reduce_all(stats);  // one set of collectives for every statistic of the step
}

void DataParallel::reduce_sum(float* values, std::size_t n) {
  if (comm_.size() == 1) return;
  const Timed t(counts_.gradient_seconds);
  comm_.all_reduce_sum(values, n);
  counts_.gradient_collectives += 1;
  counts_.gradient_bytes += 4 * n;
}

void DataParallel::reduce_sum_on_device(float* device_values, std::size_t n) {
  if (comm_.size() == 1) return;
  if (device_ == nullptr) {
    StatisticsReducer::reduce_sum_on_device(device_values, n);  // throws: no device collectives
    return;
  }
  // Queued on the device (NCCL), or waited for (through the host): the time is what the host spent.
  const Timed t(counts_.gradient_seconds);
  device_->all_reduce_sum(device_values, n);
  counts_.gradient_collectives += 1;
  counts_.gradient_bytes += 4 * n;
}

std::string DataParallel::root_text(const std::string& text) {
  std::uint64_t size = comm_.rank() == 0 ? text.size() : 0;
  comm_.all_reduce_sum(&size, 1);  // rank 0's size (the others add 0)
  std::string root(static_cast<std::size_t>(size), '\0');
  if (comm_.rank() == 0) root = text;
  comm_.broadcast(root.data(), root.size(), 0);
  return root;
}

std::string DataParallel::differing_ranks(bool same, int& count) {
  std::vector<double> differs(static_cast<std::size_t>(comm_.size()));
  const double mine = same ? 0.0 : 1.0;
  comm_.all_gather(&mine, 1, differs.data());
  std::ostringstream ranks;
  count = 0;
  for (std::size_t r = 0; r < differs.size(); ++r)
    if (differs[r] > 0) ranks << (count++ ? ", " : "") << r;
  return ranks.str();
}

void DataParallel::check_same_config(const nlohmann::json& config) {
  if (comm_.size() == 1) return;
  const std::string text = config.dump();
  const std::string root = root_text(text);
  const bool same = root == text;
  int count = 0;
  const std::string ranks = differing_ranks(same, count);
  if (count == 0) return;
  std::ostringstream msg;
  msg << "the ranks were started with different configs: rank" << (count > 1 ? "s " : " ") << ranks
      << " differ" << (count > 1 ? "" : "s") << " from rank 0";
  if (!same) {
    nlohmann::json theirs;
    try {
      theirs = nlohmann::json::parse(root);
    } catch (const nlohmann::json::exception&) {
    }
    const std::string key = first_difference(theirs, config);
    msg << "; on this rank (" << comm_.rank() << ") first at '" << key << "'";
  }
  msg << " (every rank must run the same command and files)";
  throw ConfigError(msg.str());
}

void DataParallel::check_same_input(const std::string& value, const std::string& what) {
  if (comm_.size() == 1) return;
  const std::string root = root_text(value);
  const bool same = root == value;
  int count = 0;
  const std::string ranks = differing_ranks(same, count);
  if (count == 0) return;
  std::ostringstream msg;
  msg << "the ranks read different files: " << what << " differs on rank" << (count > 1 ? "s " : " ") << ranks
      << " from rank 0's (rank 0: " << root;
  if (!same) msg << "; this rank, " << comm_.rank() << ": " << value;
  msg << "); every rank must run the same command on the same files";
  throw ConfigError(msg.str());
}

std::uint64_t DataParallel::weights_checksum(const std::vector<Parameter*>& params) {
  std::uint64_t h = 0;
  for (const Parameter* p : params) {
    const Tensor host = p->value.on_host() ? Tensor() : p->value.to_host();  // a GPU's weights: copied
    const Tensor& v = p->value.on_host() ? p->value : host;
    h = xxh64(v.data(), static_cast<std::size_t>(v.size()) * sizeof(float), h);
  }
  return h;
}

void DataParallel::check_same_weights(const std::vector<Parameter*>& params, const std::string& what) {
  if (comm_.size() == 1) return;
  const std::uint64_t h = weights_checksum(params);
  // Two 32-bit halves, each exact in a double; max and max of the negation give the range over ranks.
  const auto hi = static_cast<double>(h >> 32), lo = static_cast<double>(h & 0xffffffffu);
  double v[4] = {hi, -hi, lo, -lo};
  comm_.all_reduce_max(v, 4);
  count_statistics(1, 32);
  GS_CHECK_AS(DistributedError, v[0] == -v[1] && v[2] == -v[3],
              "the ranks' weights differ " << what << " (rank " << comm_.rank() << " has "
                                           << checksum_text(h)
                                           << "): the ranks did not apply the same updates");
}

}  // namespace gradscale
