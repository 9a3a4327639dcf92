// Fuzz target: the scaler spec parser and every policy's configuration reader (make_scaler on
// command-line text: JSON, a policy name or static:S). An accepted scaler then runs 64 updates; its
// config and state must rebuild it exactly (make_scaler(config()), restore_state(state())).
#include <cstdlib>

#include "lib/scaler/scaler.h"
#include "tests/fuzz/fuzz_common.h"

using namespace gradscale;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  for (const Format format : {Format::fp16, Format::fp8_e4m3}) {
    fuzz::expect_clean_errors([&] {
      const auto scaler = make_scaler(fuzz::text_of(data, size), format);
      for (std::uint64_t i = 0; i < 64; ++i) {
        StepStatistics stats;
        stats.found_inf = i % 5 == 3 || (size > 0 && data[i % size] & 1);
        stats.grad_below_edge = 1000 + i;
        stats.grad_above_edge = i % 7 == 0 ? 1 : 0;
        (void)scaler->loss_scale();
        (void)scaler->update(stats);
      }
      const auto copy = make_scaler(scaler->config(), format);
      copy->restore_state(scaler->state());
      if (copy->state() != scaler->state() || copy->config() != scaler->config()) std::abort();
    });
  }
  return 0;
}
