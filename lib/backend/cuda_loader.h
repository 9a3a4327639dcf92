// Where make_backend("cuda") finds lib/cuda: linked into the program (gradscale::cuda, the CLI's and
// the tests' way), or, for the Python package, in libgradscale_cuda.so beside the shared library that
// holds this code, loaded the first time a CUDA device is asked for (so a CPU-only process maps none of
// the CUDA libraries, and a build with CUDA starts where they are absent).
#pragma once

#include <string>

namespace gradscale {

class Backend;

// lib/cuda's two entries (lib/cuda/backend.cpp), or null ones with `why` saying what is missing.
struct CudaEntries {
  Backend* (*make_backend)(int device) = nullptr;  // the caller owns the result
  int (*device_count)() = nullptr;
  std::string why;
};

// Whether lib/cuda is linked in or lies beside this library; loads nothing.
bool cuda_backend_present();
// lib/cuda's entries, its library loaded (once, for the process) when it is not linked in.
const CudaEntries& cuda_entries();

}  // namespace gradscale
