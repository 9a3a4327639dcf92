// Test helper: the bit patterns of every parameter of a model, in parameter order, for bit-for-bit
// comparisons of two runs (resume versus uninterrupted, the public API versus the trainer).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "lib/model/model.h"
#include "lib/train/trainer.h"

namespace gradscale::testing {

inline std::vector<std::uint32_t> weight_bits(Model& model) {
  std::vector<std::uint32_t> bits;
  for (Parameter* p : model.parameters()) {
    const std::size_t at = bits.size();
    bits.resize(at + static_cast<std::size_t>(p->value.size()));
    std::memcpy(bits.data() + at, p->value.data(), static_cast<std::size_t>(p->value.size()) * sizeof(float));
  }
  return bits;
}

inline std::vector<std::uint32_t> weight_bits(Trainer& trainer) { return weight_bits(trainer.model()); }

}  // namespace gradscale::testing
