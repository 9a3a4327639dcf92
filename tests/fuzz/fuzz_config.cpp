// Fuzz target: the training config reader — bounded JSON parsing, then TrainConfig::merge_json (every
// key, including --scaler text, optimizer and schedule objects and model_spec). An accepted config must
// write itself out and read back to the same config.
#include <cstdlib>

#include "lib/core/json_read.h"
#include "lib/train/config.h"
#include "tests/fuzz/fuzz_common.h"

using namespace gradscale;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::expect_clean_errors([&] {
    TrainConfig config;
    config.merge_json(parse_json(fuzz::text_of(data, size), "config", JsonSource::config));
    const nlohmann::json written = config.to_json();
    TrainConfig again;
    again.merge_json(written);
    if (again.to_json() != written) std::abort();
    (void)written.dump();
  });
  return 0;
}
