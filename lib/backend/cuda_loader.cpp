// lib/cuda found at run time (cuda_loader.h): the one seam between the host library and the CUDA
// backend. The loaded library resolves the host library's symbols against the copy already in the
// process (the package's libgradscale_core.so): one copy of the library, one policy registry.
#include "lib/backend/cuda_loader.h"

#include <dlfcn.h>
#include <unistd.h>

// Defined by lib/cuda/backend.cpp in gradscale::cuda. Weak: a program without that component links,
// and sees a null address. (gradscale::cuda's link interface asks the linker for the symbol, so its
// object is taken from the static archive; CMakeLists.txt.)
extern "C" gradscale::Backend* gradscale_make_cuda_backend(int device) __attribute__((weak));
extern "C" int gradscale_cuda_device_count() __attribute__((weak));  // the same object defines it

namespace gradscale {
namespace {

constexpr const char* kCudaLibrary = "libgradscale_cuda.so";

// The path of kCudaLibrary in the directory of the file (shared library or program) holding this code.
std::string beside_this_library() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cuda_backend_present), &info) == 0 || info.dli_fname == nullptr) return "";
  const std::string self = info.dli_fname;
  const std::string::size_type slash = self.rfind('/');
  return (slash == std::string::npos ? std::string("./") : self.substr(0, slash + 1)) + kCudaLibrary;
}

CudaEntries load() {
  CudaEntries e;
  if (gradscale_make_cuda_backend != nullptr) {
    e.make_backend = gradscale_make_cuda_backend;
    e.device_count = gradscale_cuda_device_count;
    return e;
  }
  const std::string path = beside_this_library();
  if (path.empty() || access(path.c_str(), F_OK) != 0) {
    e.why = "this program has no CUDA backend (link gradscale::cuda, which a build configured with "
            "-DGRADSCALE_CUDA=ON on a machine with the CUDA toolkit provides)";
    return e;
  }
  // The host library's exported symbols made global first, so that the CUDA library binds every one
  // of them (an inline function's static included) to this copy rather than to a copy of its own.
  Dl_info self{};
  if (dladdr(reinterpret_cast<void*>(&cuda_backend_present), &self) != 0 && self.dli_fname != nullptr) {
    dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);  // already loaded: only promoted
  }
  // RTLD_NOW: a missing CUDA library or symbol is reported here, not at a later call.
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    e.why = "cannot load the CUDA backend " + path + " (" + (why ? why : "no reason given") +
            "): are the CUDA runtime and cuBLAS on the loader's path?";
    return e;
  }
  e.make_backend = reinterpret_cast<Backend* (*)(int)>(dlsym(lib, "gradscale_make_cuda_backend"));
  e.device_count = reinterpret_cast<int (*)()>(dlsym(lib, "gradscale_cuda_device_count"));
  if (e.make_backend == nullptr || e.device_count == nullptr) {
    e = CudaEntries{};
    e.why = path + " lacks gradscale_make_cuda_backend or gradscale_cuda_device_count: not this build's library";
  }
  return e;
}

}  // namespace

bool cuda_backend_present() {
  if (gradscale_make_cuda_backend != nullptr) return true;
  const std::string path = beside_this_library();
  return !path.empty() && access(path.c_str(), F_OK) == 0;
}

const CudaEntries& cuda_entries() {
  static const CudaEntries entries = load();  // thread-safe, once
  return entries;
}

}  // namespace gradscale
