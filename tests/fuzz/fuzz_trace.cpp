// Fuzz target: the trace reader of `gradscale inspect` — the input written as TRACE.json and as
// TRACE.jsonl, each read as a stream (scan_trace: bounded, JSON document or JSON Lines with a cut last
// line) and checked against the schema record by record (counts, ids, S = s * S_in, the summary's
// totals). Only DataError may come out of a bad trace.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "experiments/cli/trace_file.h"
#include "tests/fuzz/fuzz_common.h"

using namespace gradscale;

namespace {

// A directory of this process for the two files, made once.
const std::filesystem::path& work_dir() {
  static const std::filesystem::path dir = [] {
    const auto d =
        std::filesystem::temp_directory_path() / ("gradscale-fuzz-trace-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  for (const char* name : {"t.json", "t.jsonl"}) {
    const std::string path = (work_dir() / name).string();
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    }
    fuzz::expect_clean_errors([&] {
      // Each checked step's loss-gradient rate, as inspect computes it: a step that passed the checks
      // must not make the reader fail.
      struct Rates : cli::TraceVisitor {
        void step(const nlohmann::json& st) override {
          if (st.contains("loss_grad") && st["loss_grad"].is_object())
            (void)cli::stats_underflow_rate(st["loss_grad"]);
        }
      } rates;
      (void)cli::scan_trace(path, rates);
    });
  }
  return 0;
}
