// The CUDA backend's layers (see layers.h): the kind of a host layer picks its twin (device_layer.h).
#include "lib/cuda/layers.h"

#include <algorithm>
#include <iterator>

#include "lib/cuda/device_layer.h"

namespace gradscale::cuda {

bool runs_on_gpu(const std::string& kind) {
  static const char* const kinds[] = {"linear",    "relu",           "flatten",   "add",    "conv2d",
                                      "maxpool2d", "global_avgpool", "batchnorm", "dropout"};
  return std::find(std::begin(kinds), std::end(kinds), kind) != std::end(kinds);
}

std::unique_ptr<Layer> adopt_layer(CudaBackend& backend, std::unique_ptr<Layer> layer,
                                   const LayerPlacement& placement) {
  const std::string kind = layer->kind();
  if (kind == "linear") return make_linear_twin(backend, std::move(layer), placement);
  if (kind == "relu") return make_relu_twin(backend, std::move(layer), placement);
  if (kind == "flatten") return make_flatten_twin(backend, std::move(layer), placement);
  if (kind == "add") return make_add_twin(backend, std::move(layer), placement);
  if (kind == "conv2d") return make_conv2d_twin(backend, std::move(layer), placement);
  if (kind == "maxpool2d") return make_maxpool2d_twin(backend, std::move(layer), placement);
  if (kind == "global_avgpool") return make_global_avgpool_twin(backend, std::move(layer), placement);
  if (kind == "batchnorm") return make_batchnorm_twin(backend, std::move(layer), placement);
  if (kind == "dropout") return make_dropout_twin(backend, std::move(layer), placement);
  return make_host_layer(backend, std::move(layer));
}

}  // namespace gradscale::cuda
