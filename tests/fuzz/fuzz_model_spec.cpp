// Fuzz target: the model spec reader — bounded JSON parsing, then build_model (every layer type, key,
// input name and size limit), and the layer table of the model it built.
#include "lib/core/json_read.h"
#include "lib/model/spec.h"
#include "tests/fuzz/fuzz_common.h"

using namespace gradscale;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::expect_clean_errors([&] {
    Rng rng(1);
    const auto model = build_model(parse_json(fuzz::text_of(data, size), "model spec", JsonSource::config), rng);
    (void)model->layer_table().dump();
    (void)model->num_parameters();
  });
  return 0;
}
