// The CUDA backend's layers (lib/cuda/backend.h): each is the twin of a host layer (lib/layers) and
// keeps it for what does not depend on the device — name, kind, shapes, the layer table's description —
// while its parameters, activations and gradients live in device memory. Every built-in kind computes on
// the GPU (cuBLAS GEMMs with fp32 accumulation and the lib/cuda kernels, through the backend's shared
// precision steps, in the host layer's order). A layer of another kind — a user's own Layer — runs as a
// HostLayer: the layer itself, on host copies of its inputs and gradients, with the CPU's numerics at
// the cost of the copies.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <memory>

#include "lib/layers/layer.h"

namespace gradscale::cuda {

class CudaBackend;

// The twin of `layer` on `backend` (its parameters copied to the device), or the layer wrapped as a
// HostLayer when there is no twin for its kind. Linear and Conv2d read 16-bit copies of the GEMM
// operands that `placement` guarantees to be in a 16-bit F (CudaBackend::gemm_type).
std::unique_ptr<Layer> adopt_layer(CudaBackend& backend, std::unique_ptr<Layer> layer,
                                   const LayerPlacement& placement);

// Whether layers of this kind compute on the GPU: linear, conv2d, relu, flatten, add, maxpool2d,
// global_avgpool, batchnorm, dropout.
bool runs_on_gpu(const std::string& kind);

}  // namespace gradscale::cuda
