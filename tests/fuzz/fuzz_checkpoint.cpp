// Fuzz target: the checkpoint reader, end to end — what `gradscale train --resume DIR` reads. At start
// a tiny run writes a real checkpoint; each input then replaces one of its files and a Trainer resumes
// from it. The first byte picks what the rest of the input is:
//   0  checkpoint.json as is (the seal and the JSON reader);
//   1  checkpoint.json, sealed again when it is a JSON object (every field check behind the seal);
//   2  the tensor file (checkpoint.json vouches for its size and content checksum);
//   3  a list of tensors that must survive write_checkpoint + read_checkpoint_tensors bit for bit
//      (ranks 0-2, dimensions 0-3: empty tensors included).
// With GRADSCALE_FUZZ_WRITE_SEEDS=DIR set, the start also writes one seed per mode into DIR.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "lib/core/checksum.h"
#include "lib/core/json_read.h"
#include "lib/train/checkpoint.h"
#include "lib/train/trainer.h"
#include "tests/fuzz/fuzz_common.h"

using namespace gradscale;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

fs::path scratch_dir(const std::string& name) {
  const fs::path base = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
  const fs::path dir = base / ("gradscale_fuzz_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

struct Fixture {
  fs::path dir, round_trip_dir;
  TrainConfig config;  // the run that resumes
  std::string meta_text, tensor_file, tensor_bytes;

  Fixture() : dir(scratch_dir("ckpt")), round_trip_dir(scratch_dir("tensors")) {
    config.model = "tiny";
    config.model_spec = json::parse(R"({"name": "tiny", "input": [1, 28, 28], "layers": [{"type": "flatten"},
        {"type": "linear", "name": "fc1", "out": 2}, {"type": "relu"}, {"type": "linear", "name": "fc2", "out": 10}]})");
    config.data = "synthetic:64";
    config.batch = 16;
    config.epochs = 2;
    config.threads = 1;
    config.format = Format::fp16;
    config.scaler = {{"policy", "torch"}, {"init_scale", 1 << 10}, {"growth_interval", 2}};
    TrainConfig first = config;
    first.max_steps = 6;
    first.checkpoint_dir = dir.string();
    first.save_every = 6;
    Trainer(first).run();
    config.resume_dir = dir.string();
    meta_text = read_file(dir / kCheckpointJson);
    tensor_file = json::parse(meta_text).at("tensor_file").get<std::string>();
    tensor_bytes = read_file(dir / tensor_file);
    Trainer check(config);  // the untouched checkpoint resumes (else every input would be refused)
    if (const char* seeds = std::getenv("GRADSCALE_FUZZ_WRITE_SEEDS")) {
      write_file(fs::path(seeds) / "json-as-is", '\0' + meta_text);
      write_file(fs::path(seeds) / "json-resealed", '\1' + meta_text);
      write_file(fs::path(seeds) / "tensor-file", '\2' + tensor_bytes);
      write_file(fs::path(seeds) / "tensor-round-trip", std::string("\3\x05\x02\x03\x0e\x01\x00\x07", 8));
    }
  }
};

// Mode 3: tensors from the bytes, written and read back.
void round_trip(const Fixture& fx, const std::string& bytes) {
  std::vector<Tensor> tensors;
  std::vector<std::string> names;
  std::size_t i = 0;
  while (i < bytes.size() && tensors.size() < 4) {
    const auto b = static_cast<unsigned char>(bytes[i++]);
    Shape shape(b % 3);
    for (auto& d : shape) d = i < bytes.size() ? static_cast<unsigned char>(bytes[i++]) % 4 : 1;
    Tensor t(shape);
    for (std::int64_t k = 0; k < t.size(); ++k) t[k] = static_cast<float>(k) * 0.5f - static_cast<float>(b);
    tensors.push_back(std::move(t));
    names.push_back("t" + std::to_string(tensors.size()) + std::string(b % 5, 'x'));
  }
  std::vector<std::pair<std::string, const Tensor*>> out;
  for (std::size_t k = 0; k < tensors.size(); ++k) out.emplace_back(names[k], &tensors[k]);
  write_checkpoint(fx.round_trip_dir.string(), "1", {{"tensors", tensors.size()}}, out);
  std::vector<Tensor> back;
  for (const Tensor& t : tensors) back.emplace_back(t.shape(), -1.0f);
  std::vector<std::pair<std::string, Tensor*>> in;
  for (std::size_t k = 0; k < back.size(); ++k) in.emplace_back(names[k], &back[k]);
  read_checkpoint_tensors(fx.round_trip_dir.string(), read_checkpoint_meta(fx.round_trip_dir.string()), in);
  for (std::size_t k = 0; k < tensors.size(); ++k)
    if (tensors[k].size() > 0 &&
        std::memcmp(tensors[k].data(), back[k].data(), static_cast<std::size_t>(tensors[k].size()) * 4) != 0)
      std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const Fixture fx;
  if (size == 0) return 0;
  const int mode = data[0] % 4;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (mode == 3) {
    round_trip(fx, rest);
    return 0;
  }
  std::string meta_text = fx.meta_text, tensor_bytes = fx.tensor_bytes;
  if (mode == 0) {
    meta_text = rest;
  } else if (mode == 1) {
    meta_text = rest;
    try {
      json meta = parse_json(rest, "checkpoint", JsonSource::data);
      if (meta.is_object()) {
        seal_checkpoint_json(meta);
        meta_text = meta.dump(1);
      }
    } catch (const DataError&) {
    }
  } else {
    tensor_bytes = rest;
    json meta = json::parse(fx.meta_text);
    meta["tensor_bytes"] = rest.size();
    meta["tensor_checksum"] = checksum_text(xxh64(rest.data(), rest.size()));  // vouches for the content too
    seal_checkpoint_json(meta);
    meta_text = meta.dump(1);
  }
  write_file(fx.dir / kCheckpointJson, meta_text);
  write_file(fx.dir / fx.tensor_file, tensor_bytes);
  fuzz::expect_clean_errors([&] { Trainer resumed(fx.config); });
  return 0;
}
