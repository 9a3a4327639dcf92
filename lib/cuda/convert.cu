// float32 ↔ fp16 / bf16 storage (see convert.h), elementwise over the conversions of convert.cuh.
#include "lib/cuda/convert.h"

#include <cstdint>

#include "lib/core/error.h"
#include "lib/cuda/check.h"
#include "lib/cuda/convert.cuh"
#include "lib/cuda/launch.h"

namespace gradscale::cuda {
namespace {

using bits16::bf16_bits;
using bits16::bf16_value;
using bits16::fp16_bits;
using bits16::fp16_value;

// The element conversions of convert.h, their bit rules in convert.cuh.
struct ToFp16 {
  __device__ __half operator()(float x) const { return __ushort_as_half(fp16_bits(x)); }
};
struct ToBf16 {
  __device__ __nv_bfloat16 operator()(float x) const { return __ushort_as_bfloat16(bf16_bits(x)); }
};
struct FromFp16 {
  __device__ float operator()(__half h) const { return fp16_value(__half_as_ushort(h)); }
};
struct FromBf16 {
  __device__ float operator()(__nv_bfloat16 h) const { return bf16_value(__bfloat16_as_ushort(h)); }
};

template <class In, class Out, class Convert>
__global__ void convert_kernel(const In* in, Out* out, std::size_t n, Convert convert) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = convert(in[i]);
}

template <class In, class Out, class Convert>
void launch_convert(const In* in, Out* out, std::size_t n, Convert convert, cudaStream_t stream) {
  convert_kernel<In, Out, Convert><<<grid_for(n, 4), kBlock, 0, stream>>>(in, out, n, convert);
  GS_CUDA_CHECK_LAUNCH();
}

template <class In, class Out, class Convert>
void checked_convert(const char* name, Convert convert, const In* in, Out* out, std::size_t n,
                     cudaStream_t stream) {
  if (n == 0) return;
  GS_CHECK(in != nullptr && out != nullptr,
           "cuda::" << name << " of " << n << " elements got a null pointer");
  launch_convert(in, out, n, convert, stream);
}

}  // namespace

void to_fp16(const float* in, __half* out, std::size_t n, cudaStream_t stream) {
  checked_convert("to_fp16", ToFp16{}, in, out, n, stream);
}
void to_bf16(const float* in, __nv_bfloat16* out, std::size_t n, cudaStream_t stream) {
  checked_convert("to_bf16", ToBf16{}, in, out, n, stream);
}
void from_fp16(const __half* in, float* out, std::size_t n, cudaStream_t stream) {
  checked_convert("from_fp16", FromFp16{}, in, out, n, stream);
}
void from_bf16(const __nv_bfloat16* in, float* out, std::size_t n, cudaStream_t stream) {
  checked_convert("from_bf16", FromBf16{}, in, out, n, stream);
}

}  // namespace gradscale::cuda
