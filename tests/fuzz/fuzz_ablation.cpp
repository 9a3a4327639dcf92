// Fuzz target: the ablation file reader — bounded JSON (as ordered_json, like load_ablation), then
// expand_ablation: top-level keys, axes, variants, seeds, labels, dotted keys, the run-count cap and
// every run's config validated as `gradscale train` reads it. An accepted ablation has runs with
// unique names that fit a file name, and no more than its "max_runs".
#include <cstdlib>
#include <set>

#include <nlohmann/json.hpp>

#include "experiments/ablate/ablation.h"
#include "experiments/ablate/limits.h"
#include "lib/core/json_read.h"
#include "tests/fuzz/fuzz_common.h"

using namespace gradscale;

namespace {

constexpr std::uint64_t kMaxFuzzRuns = 8;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::expect_clean_errors([&] {
    const auto text = fuzz::text_of(data, size);
    check_json_depth(text, "ablation file", JsonSource::config);
    nlohmann::ordered_json doc = nlohmann::ordered_json::parse(text.begin(), text.end(), nullptr, false);
    if (doc.is_discarded()) return;  // invalid JSON: load_ablation's message, nothing to reach beyond
    // Every run's config is validated (a model is built, under ASan): a cap of kMaxFuzzRuns keeps one
    // input fast (a deep-mlp times 64 runs took over 30 s); a "max_runs" that is not a count in range
    // is kept, so that its own check is fuzzed.
    if (doc.is_object()) {
      const auto it = doc.find("max_runs");
      if (it == doc.end() || (it->is_number_unsigned() && it->get<std::uint64_t>() > kMaxFuzzRuns))
        doc["max_runs"] = kMaxFuzzRuns;
    }
    const ablate::Ablation ab = ablate::expand_ablation(doc, "fuzz.json");
    if (ab.runs.size() > doc["max_runs"].get<std::uint64_t>()) std::abort();
    std::set<std::string> names;
    for (const ablate::AblationRun& r : ab.runs) {
      if (!names.insert(r.name).second || r.name.size() > ablate::kMaxRunNameBytes) std::abort();
      (void)r.config.dump();
    }
  });
  return 0;
}
