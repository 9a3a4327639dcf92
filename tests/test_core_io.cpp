// What the program reads and writes, below the trainer: bounded JSON parsing and cut excerpts
// (json_read.h), XXH64 against the reference implementation's values (checksum.h), checked member
// reads, the atomic file write and the output path checks (output_path.h), and the divergence check.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "lib/core/checksum.h"
#include "lib/core/error.h"
#include "lib/core/json_read.h"
#include "lib/core/output_path.h"
#include "lib/scaler/scaler.h"
#include "lib/train/divergence.h"

using namespace gradscale;
using Catch::Matchers::Contains;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string nested(int depth, const std::string& inner = "") {
  return std::string(static_cast<std::size_t>(depth), '[') + inner +
         std::string(static_cast<std::size_t>(depth), ']');
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("gradscale_io_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("xxh64 gives the reference implementation's values", "[io][checksum]") {
  // Values printed by libxxhash 0.8.1 (XXH64(data, size, seed)).
  CHECK(xxh64("", 0, 0) == 0xef46db3751d8e999ull);
  CHECK(xxh64("", 0, 7) == 0x95f0626f6f0a4409ull);
  CHECK(xxh64("a", 1, 0) == 0xd24ec4f1a98c6e5bull);
  CHECK(xxh64("abc", 3, 0) == 0x44bc2cf5ad770999ull);
  CHECK(xxh64("abc", 3, 7) == 0x9e755206156676d7ull);
  std::string long_input;
  for (int r = 0; r < 3; ++r)
    for (int b = 0; b < 256; ++b) long_input += static_cast<char>(b);
  long_input += "xyz";  // 771 bytes: stripes, then every tail length
  CHECK(xxh64(long_input.data(), long_input.size(), 0) == 0xe921a1b45bd779f8ull);
  CHECK(xxh64(long_input.data(), long_input.size(), 7) == 0xb63555d1bf05377full);
  CHECK(checksum_text(0x44bc2cf5ad770999ull) == "xxh64:44bc2cf5ad770999");
}

TEST_CASE("parse_json bounds the nesting and reports with the source's error kind", "[io][json]") {
  CHECK(parse_json(nested(kMaxJsonDepth), "x", JsonSource::config).is_array());
  CHECK_THROWS_AS(parse_json(nested(kMaxJsonDepth + 1), "x", JsonSource::config), ConfigError);
  CHECK_THROWS_AS(parse_json(nested(kMaxJsonDepth + 1), "x", JsonSource::data), DataError);
  CHECK_THROWS_WITH(parse_json("{\"a\":" + nested(100000) + "}", "--scaler", JsonSource::config),
                    "--scaler is JSON nested deeper than 64 levels");
  // Brackets inside strings, escaped quotes included, are not nesting.
  const std::string text = "[\"" + std::string(1000, '[') + "\\\"" + std::string(1000, '{') + "\"]";
  CHECK(parse_json(text, "x", JsonSource::config)[0].get<std::string>().size() == 2001);
  CHECK_THROWS_WITH(parse_json("[1e400]", "config file 'c.json'", JsonSource::config),
                    Contains("config file 'c.json' is not valid JSON:") && Contains("number overflow"));
  CHECK_THROWS_AS(parse_json("{", "x", JsonSource::data), DataError);
  // The parser's message is cut too (it quotes the last token read).
  try {
    parse_json("\"" + std::string(100000, 'a') + "\\q\"", "x", JsonSource::config);
    FAIL("accepted an invalid escape");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).size() < 500);
  }
}

TEST_CASE("read_json_file refuses files that cannot be JSON configs", "[io][json]") {
  CHECK_THROWS_WITH(read_json_file("/nonexistent/c.json", "config file", JsonSource::config),
                    Contains("config file: cannot open '/nonexistent/c.json'"));
  CHECK_THROWS_WITH(read_json_file("/dev/zero", "config file", JsonSource::config),
                    Contains("is larger than 64 MiB"));
}

TEST_CASE("json_excerpt is short for any value and never throws", "[io][json]") {
  json big = json::array();
  for (int i = 0; i < 100000; ++i) big.push_back(i);
  const std::string e = json_excerpt(big);
  CHECK(e.size() <= kExcerptChars + 3);
  CHECK(e.rfind("[0,1,2,3", 0) == 0);
  CHECK(json_excerpt(json::parse(nested(40, "1"))) == "[[[[...]]]]");
  CHECK(json_excerpt(json{{"a", 1}, {"b", "x"}}) == R"({"a":1,"b":"x"})");
  CHECK(json_excerpt(json(std::string(10000, 'q'))).size() <= kExcerptChars + 3);
  CHECK_NOTHROW(json_excerpt(json(std::string("\xff\xfe bad utf-8"))));
  CHECK(text_excerpt("short") == "short");
  CHECK(text_excerpt(std::string(1000, 'z'), 10) == "zzzzzzzzzz...");
}

TEST_CASE("json_real writes inf by name and JsonFields reads it back", "[io][json]") {
  const json doc = {{"a", json_real(std::numeric_limits<double>::infinity())},
                    {"b", json_real(-std::numeric_limits<double>::infinity())},
                    {"c", json_real(std::nan(""))},
                    {"d", json_real(2.5)},
                    {"n", 7},
                    {"big", 9223372036854775808ull},
                    {"o", {{"x", "s"}}}};
  CHECK(doc["a"] == "inf");
  CHECK(doc["b"] == "-inf");
  const json round_trip = json::parse(doc.dump());
  const JsonFields f(round_trip, "f.json");
  CHECK(std::isinf(f.real("a")));
  CHECK(f.real("b") < 0);
  CHECK(std::isnan(f.real("c")));
  CHECK(f.real("d") == 2.5);
  CHECK(f.integer("n", 0, 10) == 7);
  CHECK_THROWS_WITH(f.integer("n", 0, 5), "f.json: field 'n' must be an integer in [0, 5], got 7");
  CHECK_THROWS_WITH(f.integer("big", 0, 5), Contains("got 9223372036854775808"));
  CHECK_THROWS_WITH(f.fields("o").boolean("x"), "f.json: field 'o.x' must be true or false, got \"s\"");
  CHECK_THROWS_WITH(f.text("missing"), "f.json: field 'missing' is missing");
  CHECK_THROWS_WITH(f.fields("n"), "f.json: field 'n' must be an object, got 7");
  CHECK_THROWS_AS(f.number("a", 0, 1), DataError);
}

TEST_CASE("write_file_atomic replaces through a unique temp file and leaves nothing on failure",
          "[io][output]") {
  const fs::path dir = fresh_dir("atomic");
  write_file_atomic((dir / "a/b/r.json").string(), "one");
  CHECK(read_text(dir / "a/b/r.json") == "one");
  write_file_atomic((dir / "a/b/r.json").string(), "two");
  CHECK(read_text(dir / "a/b/r.json") == "two");
  CHECK(names_in(dir / "a/b") == std::vector<std::string>{"r.json"});
  // Permissions follow the umask like any new file (not the 0600 of a temp file).
  struct stat st {};
  REQUIRE(::stat((dir / "a/b/r.json").c_str(), &st) == 0);
  const mode_t mask = ::umask(0);
  ::umask(mask);
  CHECK((st.st_mode & 0777) == (0666 & ~mask));
  // A symlink is written through.
  fs::create_symlink("a/b/r.json", dir / "link");
  write_file_atomic((dir / "link").string(), "three");
  CHECK(fs::is_symlink(dir / "link"));
  CHECK(read_text(dir / "a/b/r.json") == "three");
  // The rename fails (a non-empty directory is there): an error, and no temp file is left behind.
  fs::create_directories(dir / "full/x");
  CHECK_THROWS_WITH(write_file_atomic((dir / "full").string(), "data"), Contains("cannot rename"));
  CHECK(names_in(dir) == std::vector<std::string>{"a", "full", "link"});
  CHECK_THROWS_AS(write_file_atomic("", "data"), DataError);
  CHECK_THROWS_AS(write_file_atomic("/proc/self/x", "data"), DataError);
}

TEST_CASE("output paths are checked before a run", "[io][output]") {
  const fs::path dir = fresh_dir("check_output");
  const std::string r = (dir / "r.json").string();
  CHECK_NOTHROW(check_output_file(r, "--result"));
  CHECK_FALSE(fs::exists(r));  // checking creates nothing but missing directories
  CHECK_NOTHROW(check_output_file((dir / "new/r.json").string(), "--result"));
  CHECK(fs::is_directory(dir / "new"));
  CHECK_THROWS_WITH(check_output_file("", "--result"), "--result: the path is empty");
  CHECK_THROWS_WITH(check_output_file((dir / "d/").string(), "--result"), Contains("ends in '/'"));
  CHECK_THROWS_WITH(check_output_file(dir.string(), "--result"),
                    Contains("is a directory, not a regular file"));
  CHECK_THROWS_WITH(check_output_file("/dev/null", "--result"),
                    "--result '/dev/null' is a character device, not a regular file: refusing to replace it");
  std::ofstream(dir / "in.json") << "{}";
  fs::create_symlink("in.json", dir / "alias.json");
  CHECK_THROWS_WITH(check_output_file((dir / "alias.json").string(), "--result",
                                      {{(dir / "in.json").string(), "the --config file"}}),
                    Contains("is the --config file: refusing to overwrite an input"));
  CHECK_THROWS_WITH(check_output_file("/proc/self/r.json", "--result"),
                    Contains("cannot create files in the directory '/proc/self'"));
  CHECK_NOTHROW(check_output_dir((dir / "ckpt/sub").string(), "--checkpoint"));
  CHECK(fs::is_directory(dir / "ckpt/sub"));
  CHECK_THROWS_WITH(check_output_dir((dir / "in.json").string(), "--checkpoint"),
                    Contains("is a file, not a directory"));
  CHECK_THROWS_WITH(check_output_dir("/proc/self", "--checkpoint"), Contains("cannot create files"));
  CHECK(names_in(dir) == std::vector<std::string>{"alias.json", "ckpt", "in.json", "new"});
}

TEST_CASE("divergence: a non-finite master weight, or a loss that stays non-finite", "[train][diverge]") {
  Parameter w{"fc.weight", Tensor({3}, 1.0f), Tensor({3}, 0.0f)};
  Parameter b{"fc.bias", Tensor({2}, 0.0f), Tensor({2}, 0.0f)};
  const std::vector<Parameter*> params = {&w, &b};
  DivergenceCheck check;
  CHECK_FALSE(check.observe(1, 0.5, true, params));
  b.value[1] = std::numeric_limits<float>::infinity();
  CHECK_FALSE(check.observe(2, 0.5, false, params));  // a skipped step changed nothing: not looked at
  CHECK(check.observe(3, 0.5, true, params));
  CHECK(check.diverged());
  CHECK(check.step() == 3);
  CHECK(check.reason() == "parameter 'fc.bias' is not finite after the update (element 1 is inf)");

  DivergenceCheck loss;
  const double nan = std::nan("");
  for (std::int64_t step = 1; step < kNonFiniteLossLimit; ++step)
    CHECK_FALSE(loss.observe(step, nan, false, {}));
  CHECK_FALSE(loss.observe(kNonFiniteLossLimit, 1.0, true, {}));  // one finite loss resets the count
  CHECK(loss.nonfinite_loss_steps() == 0);
  loss.restore(kNonFiniteLossLimit - 1);  // as a checkpoint restores it
  CHECK(loss.observe(100, nan, false, {}));
  CHECK(loss.reason() == "the loss was not finite for 5 iterations in a row (since step 96)");
}

// A message is for the user: no source path in it. The check macros keep the file:line of the failed
// check in Error::where() for debug output (the CLI prints it with GRADSCALE_DEBUG set).
TEST_CASE("check macros keep file:line out of the message and in Error::where()", "[core]") {
  try {
    GS_CHECK(1 + 1 == 3, "arithmetic is " << 2);
    FAIL("no exception");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == "check `1 + 1 == 3` failed: arithmetic is 2");
    CHECK_THAT(e.where(), Catch::Matchers::StartsWith("test_core_io.cpp:"));
  }
  try {
    GS_CHECK_CONFIG(false, "key 'batch' must be >= 1");
    FAIL("no exception");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()) == "key 'batch' must be >= 1");
    CHECK_THAT(e.where(), Catch::Matchers::StartsWith("test_core_io.cpp:"));
  }
  CHECK(Error("thrown by hand").where().empty());
  CHECK(std::string(source_file_name("/a/b/lib/scaler/registry.cpp")) == "registry.cpp");
  // A bad policy name given to the registry: the message names it and what a name may hold, without
  // a source path (where() has the file and line).
  try {
    register_scaler("Not A Name", [](const json&, Format) { return std::unique_ptr<Scaler>(); });
    FAIL("no exception");
  } catch (const Error& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Contains("scaler policy names are [a-z0-9_]+, got 'Not A Name'"));
    CHECK(what.find(".cpp") == std::string::npos);
    CHECK(what.find('/') == std::string::npos);
    CHECK_THAT(e.where(), Catch::Matchers::StartsWith("registry.cpp:"));
  }
}
