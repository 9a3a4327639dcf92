// The CUDA backend's 16-bit GEMM operands (see backend.h; SPEC §4: products of F values, fp32
// accumulation).
#include "lib/cuda/backend.h"

#include "lib/cuda/convert.h"

namespace gradscale::cuda {

DeviceType CudaBackend::gemm_type(Format a, Format b, bool exact) const {
  if (!gemm16_ || !exact || a != b) return DeviceType::f32;
  if (a == Format::fp16) return DeviceType::f16;
  if (a == Format::bf16) return DeviceType::bf16;
  return DeviceType::f32;  // fp8 and fp32: fp32 GEMMs
}

const void* CudaBackend::gemm_operand(const float* data, std::size_t n, DeviceType type, int slot) {
  if (type == DeviceType::f32) return data;
  std::uint16_t* out = gemm_slot(slot, n);
  to_16bit(data, n, type, out);
  return out;
}

std::uint16_t* CudaBackend::gemm_slot(int slot, std::size_t n) {
  GS_CHECK(slot == 0 || slot == 1, "CudaBackend::gemm_slot: slot " << slot << " (0 or 1)");
  DeviceBuffer<std::uint16_t>& buffer = gemm_slots_[slot];
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

void CudaBackend::to_16bit(const float* data, std::size_t n, DeviceType type, std::uint16_t* out) {
  GS_CHECK(type == DeviceType::f16 || type == DeviceType::bf16, "CudaBackend::to_16bit: not a 16-bit type");
  if (type == DeviceType::f16)
    to_fp16(data, reinterpret_cast<__half*>(out), n, ctx_.stream());
  else
    to_bf16(data, reinterpret_cast<__nv_bfloat16*>(out), n, ctx_.stream());
}

}  // namespace gradscale::cuda
