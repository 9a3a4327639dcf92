// The CUDA backend (see backend.h): device memory, the optimizer kernels, the step's records and their
// one copy to the host (enter_measurements), the divergence check. The other steps live in
// backend_scales.cpp, backend_rounding.cpp, backend_gemm.cpp, backend_join.cpp and backend_loss.cpp.
#include "lib/cuda/backend.h"

#include "lib/cuda/collectives.h"

#include <cstring>
#include <limits>

#include "lib/cuda/adam.h"
#include "lib/cuda/array_ops.h"
#include "lib/cuda/elementwise.h"
#include "lib/cuda/layers.h"
#include "lib/cuda/nonfinite.h"
#include "lib/cuda/sgd.h"

namespace gradscale::cuda {

// ---- memory ------------------------------------------------------------------------------------------

float* CudaMemory::allocate(std::size_t n) {
  void* p = nullptr;
  GS_CUDA_CHECK(cudaMalloc(&p, n * sizeof(float)));
  return static_cast<float*>(p);
}

void CudaMemory::release(float* p) noexcept {
  (void)cudaFree(p);
}

void CudaMemory::fill(float* p, std::size_t n, float value) {
  if (value == 0.0f && !std::signbit(value)) {
    GS_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), ctx_.stream()));
    return;
  }
  cuda::fill(p, n, value, ctx_.stream());
}

void CudaMemory::copy(float* dst, const float* src, std::size_t n) {
  GS_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, ctx_.stream()));
}

void CudaMemory::from_host(float* dst, const float* host, std::size_t n) {
  // From pageable memory the call returns once `host` has been read: the caller may reuse it.
  GS_CUDA_CHECK(cudaMemcpyAsync(dst, host, n * sizeof(float), cudaMemcpyHostToDevice, ctx_.stream()));
}

void CudaMemory::to_host(float* host, const float* src, std::size_t n) {
  GS_CUDA_CHECK(cudaMemcpyAsync(host, src, n * sizeof(float), cudaMemcpyDeviceToHost, ctx_.stream()));
  ctx_.synchronize();
}

// ---- optimizer ---------------------------------------------------------------------------------------
namespace {

// Inside Optimizer::step's bracket the updates are queued and launched together at its end (one launch
// per 32 parameters: adam_update_many, sgd_update_many); outside it, each at once.
class CudaOptimizerKernels final : public DeviceOptimizerKernels {
 public:
  explicit CudaOptimizerKernels(CudaContext& ctx) : ctx_(ctx) {}
  void sgd(float* w, const float* g, float* momentum_buffer, std::size_t n, const SgdStep& s) override {
    const SgdJob job{w, g, momentum_buffer, n, s};
    if (queue_) sgd_.push_back(job); else sgd_update_many(&job, 1, ctx_.stream());
  }
  void adam(float* w, const float* g, float* m, float* v, std::size_t n, const AdamStep& s) override {
    const AdamJob job{w, g, m, v, n, s};
    if (queue_) adam_.push_back(job); else adam_update_many(&job, 1, ctx_.stream());
  }
  void begin_step() override {
    sgd_.clear();
    adam_.clear();
    queue_ = true;
  }
  void end_step(bool apply) override {
    queue_ = false;
    std::vector<SgdJob> sgd;
    std::vector<AdamJob> adam;
    sgd.swap(sgd_);  // empty afterwards, even when a launch throws
    adam.swap(adam_);
    if (!apply) return;
    sgd_update_many(sgd.data(), sgd.size(), ctx_.stream());
    adam_update_many(adam.data(), adam.size(), ctx_.stream());
  }

 private:
  CudaContext& ctx_;
  bool queue_ = false;
  std::vector<SgdJob> sgd_;
  std::vector<AdamJob> adam_;
};

}  // namespace

// ---- the backend -------------------------------------------------------------------------------------

CudaBackend::CudaBackend(int device)
    : ctx_(device),
      memory_(ctx_),
      optimizer_(std::make_unique<CudaOptimizerKernels>(ctx_)),
      array_ops_(make_array_ops(ctx_)),
      query_stats_(3),
      join_stats_(kMaxJoinParts),
      now_(8),
      loss_(1),
      loss_host_(1),
      found_inf_(1),
      loss_grad_(&memory_) {
  reserve_records(256);  // every built-in model's step fits
}

CudaBackend::~CudaBackend() = default;

void CudaBackend::set_conv_algorithm(const std::string& algorithm) {
  GS_CHECK_CONFIG(algorithm == "im2col" || algorithm == "implicit",
                  "conv_algorithm must be im2col or implicit, got '" << algorithm << "'");
  implicit_conv_ = algorithm == "implicit";
}

std::string CudaBackend::description() const {
  return "cuda: " + device_description(ctx_.device());
}

std::unique_ptr<Layer> CudaBackend::adopt(std::unique_ptr<Layer> layer, const LayerPlacement& placement) {
  return adopt_layer(*this, std::move(layer), placement);
}

void CudaBackend::reserve_records(std::size_t slots) {
  records_.resize(kStatsOffset + slots * sizeof(DeviceStats));
  records_host_.resize(records_.size());
  record_slots_ = slots;
  overflow_.clear();
}

DeviceStats* CudaBackend::next_slot() {
  const std::size_t i = pending_.size();
  if (i < record_slots_) return reinterpret_cast<DeviceStats*>(records_.data() + kStatsOffset) + i;
  const std::size_t j = i - record_slots_;
  if (j / kChunk >= overflow_.size()) overflow_.emplace_back(kChunk);
  return overflow_[j / kChunk].data() + j % kChunk;
}

void CudaBackend::start_pass() {
  pending_.clear();
  edge_counting_ = false;
  scales_used_ = scales_on_host_ = 0;
  decisions_.clear();
  notes_.clear();
}

std::vector<TensorStats> CudaBackend::statistics_now(const std::vector<StatsJob>& jobs) {
  if (now_.size() < jobs.size()) now_.resize(jobs.size());
  tensor_stats(ctx_, jobs, now_.data());
  return download_stats(ctx_, now_.data(), jobs.size());
}
void CudaBackend::finish_backward(StepMonitor& monitor) {
  enter_measurements(monitor);
  if (loss_pending_) {  // loss_backward's sums, in the header that enter_measurements brought over
    StepHeader h;
    std::memcpy(&h, records_host_.data(), sizeof h);
    monitor.loss = h.loss.loss_sum / static_cast<double>(loss_batch_);
    monitor.correct = static_cast<std::int64_t>(h.loss.correct);
    loss_pending_ = false;
  }
  // A step that needed overflow slots makes the record array large enough for the next (nothing is
  // queued on the records any more).
  if (!overflow_.empty()) reserve_records(record_slots_ + overflow_.size() * kChunk);
}

void CudaBackend::enter_measurements(StepMonitor& monitor) {
  // The header and the slots in the record array: one copy into page-locked memory, one wait.
  const std::size_t n = pending_.size(), in_records = std::min(n, record_slots_);
  GS_CUDA_CHECK(cudaMemcpyAsync(records_host_.data(), records_.data(),
                                kStatsOffset + in_records * sizeof(DeviceStats), cudaMemcpyDeviceToHost,
                                ctx_.stream()));
  copy_scales_to_host();  // the scales decided on the device: the same wait
  ctx_.synchronize();
  std::vector<TensorStats> all;
  all.reserve(n);
  for (std::size_t i = 0; i < in_records; ++i) {
    DeviceStats d;
    std::memcpy(&d, records_host_.data() + kStatsOffset + i * sizeof(DeviceStats), sizeof d);
    all.push_back(to_tensor_stats(d));
  }
  for (std::size_t c = 0; in_records + c * kChunk < n; ++c) {  // a step larger than any before: more waits
    const std::vector<TensorStats> part =
        download_stats(ctx_, overflow_[c].data(), std::min(kChunk, n - in_records - c * kChunk));
    all.insert(all.end(), part.begin(), part.end());
  }
  for (std::size_t i = 0; i < n; ++i) {
    const Pending& e = pending_[i];
    const TensorStats& s = all[i];
    if (monitor.record) store_gradient_statistics(monitor, e.site, e.node, s);
    // max|d| as lib/instrument's max_abs: infinite when something is not finite.
    const float m = s.nonfinite > 0 ? std::numeric_limits<float>::infinity() : static_cast<float>(s.max_abs);
    check_rounded_max(monitor, e.site, e.node, m, e.quantized, e.precision);
    if (e.site == GradSite::upstream) monitor.record_of(e.node).sent_max_abs = m;
    if (e.site == GradSite::loss) monitor.loss_grad_max_abs = m;
  }
  pending_.clear();
  if (edge_counting_) {  // the counts so far go to the monitor once; the device starts again from zero
    StepHeader h;
    std::memcpy(&h, records_host_.data(), sizeof h);
    monitor.grad_below_edge += h.edge.below;
    monitor.grad_above_edge += h.edge.above;
    edge_counting_ = false;
  }
  resolve_scales(monitor);
}

std::vector<std::int64_t> CudaBackend::first_nonfinite(const std::vector<const Tensor*>& tensors) {
  std::vector<NonFiniteJob> jobs;
  std::vector<std::size_t> on_device;  // which tensors the jobs are
  std::vector<std::int64_t> first(tensors.size(), -1);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = *tensors[i];
    if (t.on_host()) {
      first[i] = gradscale::first_nonfinite(t.data(), static_cast<std::size_t>(t.size()));
    } else {
      GS_CHECK(t.device() == Device::cuda, "first_nonfinite: a tensor of another device");
      jobs.push_back(NonFiniteJob{t.data(), static_cast<std::size_t>(t.size())});
      on_device.push_back(i);
    }
  }
  if (jobs.empty()) return first;
  if (nonfinite_.size() < jobs.size()) nonfinite_.resize(jobs.size());
  cuda::first_nonfinite(jobs.data(), jobs.size(), nonfinite_.data(), ctx_.stream());
  std::vector<unsigned long long> got(jobs.size());
  GS_CUDA_CHECK(cudaMemcpyAsync(got.data(), nonfinite_.data(), got.size() * sizeof(unsigned long long),
                                cudaMemcpyDeviceToHost, ctx_.stream()));
  ctx_.synchronize();
  for (std::size_t j = 0; j < jobs.size(); ++j)
    first[on_device[j]] = got[j] == kAllFinite ? -1 : static_cast<std::int64_t>(got[j]);
  return first;
}

std::unique_ptr<DeviceCollectives> CudaBackend::device_collectives(Communicator& comm, const std::string& kind) {
  return make_device_collectives(ctx_, comm, kind);
}

std::unique_ptr<Backend> make_cuda_backend(int device) {
  return std::make_unique<CudaBackend>(device);
}

}  // namespace gradscale::cuda

// What make_backend("cuda") calls (lib/backend/cpu_backend.cpp): the caller owns the result.
extern "C" gradscale::Backend* gradscale_make_cuda_backend(int device) {
  return gradscale::cuda::make_cuda_backend(device).release();
}

// What cuda_device_count() calls (lib/backend/cpu_backend.cpp).
extern "C" int gradscale_cuda_device_count() {
  return gradscale::cuda::device_count();
}
