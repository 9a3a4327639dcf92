// Shared by the libFuzzer targets of tests/fuzz: the errors a reader may raise for bad input. Each
// target catches only these; anything else — an internal check (GS_CHECK), a JSON library exception,
// std::bad_alloc, a sanitizer report, a crash — escapes and is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "lib/core/error.h"
#include "lib/scaler/scaler.h"

namespace gradscale::fuzz {

inline std::string_view text_of(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Runs `fn`, swallowing the user-facing errors of bad input.
template <class Fn>
void expect_clean_errors(Fn&& fn) {
  try {
    fn();
  } catch (const ConfigError&) {
  } catch (const DataError&) {
  } catch (const ScalerError&) {
  }
}

}  // namespace gradscale::fuzz
