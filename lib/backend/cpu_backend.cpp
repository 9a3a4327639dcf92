// The host backend: today's layers run as they are, and the seam's other entries are the host functions
// every CPU path has always used (lib/model/join, lib/layers/softmax_cross_entropy, lib/instrument), so
// the CPU's numerics are unchanged bit for bit.
#include <omp.h>

#include "lib/backend/backend.h"
#include "lib/backend/cuda_loader.h"
#include "lib/instrument/histogram.h"
#include "lib/model/join.h"

namespace gradscale {
namespace {

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::cpu; }
  std::string description() const override {
    return "cpu (" + std::to_string(omp_get_max_threads()) + " threads)";
  }
  DeviceMemory* memory() override { return nullptr; }
  std::unique_ptr<Layer> adopt(std::unique_ptr<Layer> layer, const LayerPlacement&) override { return layer; }
  void join(const std::vector<const ScaledGrad*>& parts, ScaledGrad& out, const Precision& p,
            StepMonitor& monitor, int node_id, StatisticsReducer* reducer) override {
    join_scaled_grads(parts, out, p, monitor, node_id, reducer);
  }
  LossResult softmax_cross_entropy(const Tensor& logits, const std::vector<std::int32_t>& labels) override {
    return gradscale::softmax_cross_entropy(logits, labels.data(), 1.0, Precision{}, nullptr, nullptr, -1);
  }
  void loss_backward(const Tensor& logits, const std::vector<std::int32_t>& labels, double loss_scale,
                     const Precision& p, ScaledGrad& grad, StepMonitor& monitor, int layer_id,
                     std::int64_t mean_over) override {
    const LossResult r = gradscale::softmax_cross_entropy(logits, labels.data(), loss_scale, p, &grad, &monitor,
                                                          layer_id, mean_over);
    monitor.loss = r.loss;
    monitor.correct = r.correct;
  }
  LossResult loss_gradient_fp32(const Tensor& logits, const std::vector<std::int32_t>& labels,
                                Tensor& host_grad, std::int64_t mean_over) override {
    return softmax_cross_entropy_fp32(logits, labels.data(), 1.0, &host_grad, mean_over);
  }
  void finish_backward(StepMonitor&) override {}  // round_gradient filled the monitor as it went
  void synchronize() override {}
  std::vector<std::int64_t> first_nonfinite(const std::vector<const Tensor*>& tensors) override {
    std::vector<std::int64_t> first;
    first.reserve(tensors.size());
    for (const Tensor* t : tensors) {
      const Tensor copy = t->on_host() ? Tensor() : t->to_host();  // another backend's tensor: a copy
      const Tensor& h = t->on_host() ? *t : copy;
      first.push_back(gradscale::first_nonfinite(h.data(), static_cast<std::size_t>(h.size())));
    }
    return first;
  }
  DeviceOptimizerKernels* optimizer_kernels() override { return nullptr; }
  ArrayOps& array_ops() override { return host_array_ops(); }
  std::unique_ptr<DeviceCollectives> device_collectives(Communicator&, const std::string& kind) override {
    GS_CHECK_CONFIG(kind == "auto" || kind == "host",
                    "--gpu-collectives " << kind << " sums a GPU's gradients: the model is on the cpu, whose "
                                         << "gradients the communicator sums (allowed here: auto, host)");
    return nullptr;
  }
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

void Backend::set_conv_algorithm(const std::string& algorithm) {
  GS_CHECK_CONFIG(algorithm == "im2col", "conv_algorithm '" << algorithm << "' runs on the cuda device only; "
                                                              << device_name(device())
                                                              << "'s convolutions are im2col and a GEMM");
}

bool cuda_backend_built() {
  return cuda_backend_present();
}

int cuda_device_count() {
  if (!cuda_backend_present()) return 0;
  const CudaEntries& cuda = cuda_entries();
  return cuda.device_count != nullptr ? cuda.device_count() : 0;  // a backend that cannot load has no device
}

std::unique_ptr<Backend> make_backend(const std::string& device) {
  if (device == "cpu") return std::make_unique<CpuBackend>();
  int index = -1;
  if (device == "cuda") {
    index = 0;
  } else if (device.rfind("cuda:", 0) == 0 && device.size() > 5 && device.size() <= 8 &&
             device.find_first_not_of("0123456789", 5) == std::string::npos) {
    index = std::stoi(device.substr(5));
  }
  GS_CHECK_CONFIG(index >= 0, "unknown device '" << device << "' (allowed: cpu, cuda, cuda:N)");
  const CudaEntries& cuda = cuda_entries();
  GS_CHECK_CONFIG(cuda.make_backend != nullptr, "device '" << device << "': " << cuda.why);
  return std::unique_ptr<Backend>(cuda.make_backend(index));
}

}  // namespace gradscale
