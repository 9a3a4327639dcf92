// Fuzz target: the IDX reader — the input as an image file and as a label file (plain, or gzip when it
// starts with the gzip magic bytes), through read_idx_images and read_idx_labels.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "lib/data/idx.h"
#include "tests/fuzz/fuzz_common.h"

using namespace gradscale;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = "/tmp/gradscale_fuzz_idx_" + std::to_string(::getpid());
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  fuzz::expect_clean_errors([&] { (void)read_idx_images(path); });
  fuzz::expect_clean_errors([&] { (void)read_idx_labels(path, 10); });
  return 0;
}
