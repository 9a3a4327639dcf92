// Checkpoint files: checkpoint.json (counters, scaler/optimizer/data-order/RNG state, config; schema
// kCheckpointSchema) plus a binary file of named float tensors. Written atomically: the tensors go to a
// new file named after the step, then the JSON that names it replaces the old JSON by rename — the
// commit point — and the older tensor file is removed. A crash at any moment leaves the previous
// checkpoint readable. Nothing read back is trusted before it is verified: checkpoint.json carries a
// checksum of its canonical content, the tensor file a checksum of its bytes, and the tensor file's
// size, names and shapes must be exactly what the model expects before anything is allocated.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/core/output_path.h"  // write_file_atomic, which checkpoints are written with
#include "lib/tensor/tensor.h"

namespace gradscale {

inline constexpr const char* kCheckpointSchema = "gradscale.checkpoint/2";
inline constexpr const char* kCheckpointJson = "checkpoint.json";

// Writes `meta` and `tensors` into directory `dir` (created if absent) under the name tag `tag` (the
// step: [A-Za-z0-9_]+). `meta` gets "schema", "tensor_file", "tensor_bytes", "tensor_checksum" (XXH64 of
// the tensor file's bytes: the JSON binds the tensors' content, not only their file's name and size)
// and the "checksum" seal.
// Throws DataError on I/O failure.
void write_checkpoint(const std::string& dir, const std::string& tag, const nlohmann::json& meta,
                      const std::vector<std::pair<std::string, const Tensor*>>& tensors);

// Reads `dir`/checkpoint.json and verifies it before any field is used: bounded JSON (json_read.h), a
// "checksum" that matches the content, the schema kCheckpointSchema, a "tensor_file" named
// tensors-<tag>.bin, an integer "tensor_bytes" and a "tensor_checksum". The other fields are the caller's to check.
// Throws DataError naming the file and the field.
nlohmann::json read_checkpoint_meta(const std::string& dir);

// Fills `tensors` (name → destination, in the order they were written) from the tensor file that
// `meta` (from read_checkpoint_meta) names. Before reading any tensor: the file's size must be what
// `tensors` need and what meta.tensor_bytes says, its checksum must match, and its content checksum
// must be meta.tensor_checksum (a same-named tensor file of another checkpoint is refused); then every stored
// name and shape must equal the expected one. Nothing is allocated beyond the file's bytes (a
// corrupt size cannot ask for more), and on failure no destination is changed. Throws DataError.
void read_checkpoint_tensors(const std::string& dir, const nlohmann::json& meta,
                             const std::vector<std::pair<std::string, Tensor*>>& tensors);

// Sets meta["checksum"] to the checksum of meta's canonical text (compact dump, sorted keys, without
// "checksum"). write_checkpoint does this; tools and tests that edit a checkpoint.json call it again.
void seal_checkpoint_json(nlohmann::json& meta);

// Whether a file named `name` belongs to a checkpoint directory: checkpoint.json, a tensor file
// (tensors-<tag>.bin) or a temp file of either. Nothing else may be written under such a name there.
bool is_checkpoint_file(const std::string& name);

// Removes what a killed save can leave in `dir`: tensor files (tensors-<tag>.bin) other than `keep`,
// and temp files of write_file_atomic for checkpoint.json and tensor files. Returns how many.
int remove_orphaned_checkpoint_files(const std::string& dir, const std::string& keep);

}  // namespace gradscale
