// The CPU execution target of lib/cuda (docs/gpu.md): forced-included into every lib/cuda .cu file,
// which the host C++ compiler then compiles unchanged but for its launches (rewrite_launches.cmake
// turns `k<<<grid, block, shared, stream>>>(args)` into `k ^ ::gs_emu::Launch(grid, block, shared,
// stream)(args)`). It gives kernels what nvcc would: the CUDA headers' types, threadIdx and friends,
// __syncthreads, the warp operations the kernels use, per-block __shared__ memory, atomics and the
// device math. Kernels run on fibers, one per CUDA thread, scheduled by executor.cpp.
#pragma once

// The toolkit's headers first, as the host sees them (their types are the ones lib/cuda's .cpp files
// and the tests compile against); only then the definitions nvcc gives device code.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <math_constants.h>
#include <vector_types.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "tests/cuda_on_cpu/executor.h"

// lib/cuda's device headers (reduce.cuh, round.cuh) refuse a compiler that is not compiling CUDA.
#define __CUDACC__ 1

// In the host headers these spell nothing (or are missing); here __shared__ memory is one static
// object per variable, which is per block because the blocks of a launch run one after the other.
#undef __shared__
#define __shared__ static
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#ifndef __forceinline__
#define __forceinline__ inline __attribute__((always_inline))
#endif

// The built-in variables of the running CUDA thread (the executor sets them before it resumes one).
#define threadIdx (::gs_emu::current().thread_idx)
#define blockIdx (::gs_emu::current().block_idx)
#define blockDim (::gs_emu::current().block_dim)
#define gridDim (::gs_emu::current().grid_dim)
#define warpSize 32

// ---- barriers and warp operations (executor.cpp gives them CUDA's semantics) ----------------------
inline void __syncthreads() {
  ::gs_emu::block_barrier(::gs_emu::BarrierOp::plain, 0);
}
inline int __syncthreads_or(int predicate) {
  return ::gs_emu::block_barrier(::gs_emu::BarrierOp::any, predicate != 0);
}
inline int __syncthreads_and(int predicate) {
  return ::gs_emu::block_barrier(::gs_emu::BarrierOp::all, predicate != 0);
}
inline int __syncthreads_count(int predicate) {
  return ::gs_emu::block_barrier(::gs_emu::BarrierOp::count, predicate != 0);
}
// A memory fence orders one thread's writes as every other block sees them; the blocks of a launch
// run one after the other here, so each sees all of an earlier block's writes already.
inline void __threadfence() {}

template <class T>
T gs_emu_shuffle(::gs_emu::ShuffleOp op, unsigned mask, T v, int arg, int width) {
  static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "shuffles move 1 to 8 bytes");
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof v);
  bits = ::gs_emu::warp_shuffle(op, mask, bits, arg, width);
  T r;
  std::memcpy(&r, &bits, sizeof r);
  return r;
}
template <class T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  return gs_emu_shuffle(::gs_emu::ShuffleOp::index, mask, v, src_lane, width);
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return gs_emu_shuffle(::gs_emu::ShuffleOp::up, mask, v, static_cast<int>(delta), width);
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return gs_emu_shuffle(::gs_emu::ShuffleOp::down, mask, v, static_cast<int>(delta), width);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return gs_emu_shuffle(::gs_emu::ShuffleOp::bfly, mask, v, lane_mask, width);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return static_cast<unsigned>(
      ::gs_emu::warp_shuffle(::gs_emu::ShuffleOp::ballot, mask, predicate != 0, 0, 32));
}
inline int __any_sync(unsigned mask, int predicate) {
  return __ballot_sync(mask, predicate) != 0;
}
inline int __all_sync(unsigned mask, int predicate) {
  return __ballot_sync(mask, predicate) == (mask & ::gs_emu::live_lanes());
}

// ---- atomics: the threads of a launch run one at a time, so a read-modify-write is atomic ---------
template <class T>
T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <class T>
T atomicMin(T* p, T v) {
  const T old = *p;
  *p = v < old ? v : old;
  return old;
}
template <class T>
T atomicMax(T* p, T v) {
  const T old = *p;
  *p = old < v ? v : old;
  return old;
}
template <class T>
T atomicExch(T* p, T v) {
  const T old = *p;
  *p = v;
  return old;
}
template <class T>
T atomicCAS(T* p, T compare, T v) {
  const T old = *p;
  if (old == compare) *p = v;
  return old;
}

// ---- device intrinsics and math: the host's IEEE operations (the build has no FMA contraction) ----
inline float __uint_as_float(unsigned x) {
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}
inline unsigned __float_as_uint(float x) {
  unsigned u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
inline float __int_as_float(int x) {
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}
inline int __float_as_int(float x) {
  int i;
  std::memcpy(&i, &x, sizeof i);
  return i;
}
inline double __longlong_as_double(long long x) {
  double d;
  std::memcpy(&d, &x, sizeof d);
  return d;
}
inline long long __double_as_longlong(double x) {
  long long i;
  std::memcpy(&i, &x, sizeof i);
  return i;
}
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline float __fdiv_rn(float a, float b) {
  return a / b;
}
inline double __dmul_rn(double a, double b) {
  return a * b;
}
inline double __dadd_rn(double a, double b) {
  return a + b;
}
inline int __clz(int x) {
  return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x));
}
inline int __clzll(long long x) {
  return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x));
}
inline int __popc(unsigned x) {
  return __builtin_popcount(x);
}
inline int __ffs(int x) {
  return __builtin_ffs(x);
}

// CUDA's min and max overloads (the device headers give them for each integer and floating type; a
// mixed signed/unsigned pair compares as unsigned, as there).
inline int min(int a, int b) {
  return a < b ? a : b;
}
inline int max(int a, int b) {
  return a < b ? b : a;
}
inline unsigned min(unsigned a, unsigned b) {
  return a < b ? a : b;
}
inline unsigned max(unsigned a, unsigned b) {
  return a < b ? b : a;
}
inline unsigned min(int a, unsigned b) {
  return min(static_cast<unsigned>(a), b);
}
inline unsigned max(int a, unsigned b) {
  return max(static_cast<unsigned>(a), b);
}
inline unsigned min(unsigned a, int b) {
  return min(a, static_cast<unsigned>(b));
}
inline unsigned max(unsigned a, int b) {
  return max(a, static_cast<unsigned>(b));
}
inline long long min(long long a, long long b) {
  return a < b ? a : b;
}
inline long long max(long long a, long long b) {
  return a < b ? b : a;
}
inline unsigned long long min(unsigned long long a, unsigned long long b) {
  return a < b ? a : b;
}
inline unsigned long long max(unsigned long long a, unsigned long long b) {
  return a < b ? b : a;
}
inline long min(long a, long b) {
  return a < b ? a : b;
}
inline long max(long a, long b) {
  return a < b ? b : a;
}
inline unsigned long min(unsigned long a, unsigned long b) {
  return a < b ? a : b;
}
inline unsigned long max(unsigned long a, unsigned long b) {
  return a < b ? b : a;
}
inline float min(float a, float b) {
  return std::fmin(a, b);
}
inline float max(float a, float b) {
  return std::fmax(a, b);
}
inline double min(double a, double b) {
  return std::fmin(a, b);
}
inline double max(double a, double b) {
  return std::fmax(a, b);
}

// ---- launches -------------------------------------------------------------------------------------
namespace gs_emu {

// The arguments of one launch, converted to the kernel's parameter types as a launch converts them.
template <class... A>
struct BoundLaunch {
  LaunchConfig config;
  std::tuple<A...> args;
};

struct Launch {
  LaunchConfig config;
  Launch(dim3 grid, dim3 block, std::size_t shared = 0, cudaStream_t stream = nullptr,
         const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    config.grid = grid;
    config.block = block;
    config.shared = shared;
    config.stream = stream;
    config.file = file;
    config.line = line;
  }
  template <class... A>
  BoundLaunch<std::decay_t<A>...> operator()(A&&... a) const {
    return {config, std::tuple<std::decay_t<A>...>(std::forward<A>(a)...)};
  }
};

template <class P, class A>
void note_pointer_argument(LaunchConfig& c, int index, const A& a) {
  if constexpr (std::is_pointer<P>::value) {
    if constexpr (std::is_convertible<A, P>::value) note_pointer(c, index, static_cast<P>(a));
  }
}

template <class... P, class... A>
void operator^(void (*kernel)(P...), BoundLaunch<A...>&& launch) {
  static_assert(sizeof...(P) == sizeof...(A), "a launch passes one argument per kernel parameter");
  struct Body {
    void (*kernel)(P...);
    std::tuple<P...> params;
    static void run(void* self) {
      Body& b = *static_cast<Body*>(self);
      std::apply([&b](const P&... p) { b.kernel(p...); }, b.params);
    }
  };
  Body body{kernel, std::apply([](A&... a) { return std::tuple<P...>(static_cast<P>(a)...); }, launch.args)};
  LaunchConfig& c = launch.config;
  c.pointer_count = 0;
  int index = 0;
  std::apply([&](const A&... a) { (note_pointer_argument<P>(c, index++, a), ...); }, launch.args);
  run_kernel(c, &Body::run, &body);
}

}  // namespace gs_emu
