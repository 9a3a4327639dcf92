// A tensor's values as a host vector (a device tensor copied back first), for the CUDA backend tests.
#pragma once

#include <vector>

#include <gradscale/gradscale.h>

namespace gradscale::test {

inline std::vector<float> host_values(const Tensor& t) {
  const Tensor h = t.to_host();
  return std::vector<float>(h.data(), h.data() + h.size());
}

}  // namespace gradscale::test
