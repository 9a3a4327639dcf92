// Checkpoint files: a JSON document (counters, scaler/optimizer/data-order/RNG state, config) plus a
// binary file of named float tensors. Written atomically: the tensors go to a new file named after
// the step, then the JSON that names it replaces the old JSON by rename — the commit point — and the
// older tensor file is removed. A crash at any moment leaves the previous checkpoint readable.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/core/output_path.h"  // write_file_atomic, which checkpoints are written with
#include "lib/tensor/tensor.h"

namespace gradscale {

struct Checkpoint {
  nlohmann::json meta;
  std::map<std::string, Tensor> tensors;
};

// Writes `meta` and `tensors` into directory `dir` (created if absent) under the name tag `tag`
// (e.g. the step). Throws DataError on I/O failure.
void write_checkpoint(const std::string& dir, const std::string& tag, const nlohmann::json& meta,
                      const std::vector<std::pair<std::string, const Tensor*>>& tensors);

// Reads the checkpoint of `dir`. Missing, truncated or corrupt files → DataError naming the file.
Checkpoint read_checkpoint(const std::string& dir);

}  // namespace gradscale
