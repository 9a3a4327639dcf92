// lib/cuda's ArrayOps (lib/backend/array_ops.h): the precision model's steps on raw float32 arrays in
// device memory, with the kernels CudaBackend's own layers use (quantize, the SPEC §3 statistics,
// popart_als's edge counts), so a backward pass computed elsewhere (PyTorch's, through ExternalBackward)
// gets the same counts and bits as gradscale's. Work is queued on the context's stream (the caller's,
// after set_stream); a rounding's measurements wait in device slots until flush() (one copy, one wait),
// and an entry that returns something measured (a maximum, statistics) waits for it.
#pragma once

#ifndef GRADSCALE_HAS_CUDA
#error "lib/cuda is the CUDA backend: configure with -DGRADSCALE_CUDA=ON (or AUTO with nvcc on PATH)"
#endif

#include <memory>

#include "lib/backend/array_ops.h"
#include "lib/cuda/context.h"

namespace gradscale::cuda {

// Borrows `ctx` (it must outlive the result).
std::unique_ptr<ArrayOps> make_array_ops(CudaContext& ctx);

}  // namespace gradscale::cuda
