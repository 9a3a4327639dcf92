// The CUDA backend's layers (lib/cuda/backend.h): each is the twin of a host layer (lib/layers) and
// keeps it for what does not depend on the device — name, kind, shapes, the layer table's description —
// while its parameters, activations and gradients live in device memory. Linear, ReLU, Flatten and Add
// compute on the GPU (cuBLAS GEMMs with fp32 accumulation and the lib/cuda kernels, through the
// backend's shared precision steps). Every other kind runs as a HostLayer: the host layer itself, on
// host copies of its inputs and gradients — the same numerics as the CPU backend, at the cost of the
// copies — until its twin is written (the kernels for Conv2d, pooling and BatchNorm are in lib/cuda).
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <memory>

#include "lib/layers/layer.h"

namespace gradscale::cuda {

class CudaBackend;

// The twin of `layer` on `backend` (its parameters copied to the device), or the layer wrapped as a
// HostLayer when there is no twin for its kind.
std::unique_ptr<Layer> adopt_layer(CudaBackend& backend, std::unique_ptr<Layer> layer);

// Whether layers of this kind compute on the GPU ("linear", "relu", "flatten", "add").
bool runs_on_gpu(const std::string& kind);

}  // namespace gradscale::cuda
