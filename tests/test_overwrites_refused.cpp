// No command overwrites what it reads or another of its outputs: every output of a command is checked
// against its other outputs and its inputs before any work (CommandFiles), through symlinks and hard
// links, and `ablate --out` owns its directory (a marker, a lock, the input never written).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "experiments/ablate/out_dir.h"
#include "lib/core/command_files.h"
#include "lib/core/error.h"
#include "lib/core/output_path.h"
#include "lib/train/checkpoint.h"
#include "tests/cli_case.h"
#include "tests/cli_run.h"
#include "tests/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using namespace gradscale::test;
using gradscale::testing::TempDir;

const std::string kTrain = "train --model mlp --data synthetic:512 --batch 32 --threads 1 --quiet";
const std::string kAblation =
    R"({"base":{"data":"synthetic:256","model":"mlp","batch":32,"max_steps":4,"threads":1},)"
    R"("axes":{"scaler":["none","torch"]},"seeds":[0,1]})";

}  // namespace

TEST_CASE("CommandFiles: outputs that are one file, or an input, or a directory's file, are refused",
          "[output]") {
  using gradscale::CommandFiles;
  TempDir tmp;
  write_text(tmp / "in.json", "{}");
  fs::create_symlink(tmp / "in.json", tmp / "link.json");
  CommandFiles a;
  a.input(tmp / "in.json", "the --config file");
  a.output(tmp / "sub/../link.json", "--result");  // through a symlink and ".."
  CHECK_THROWS_WITH(a.check(), Contains("the --config file '" + tmp / "in.json" + "' and --result '" +
                                        tmp / "sub/../link.json" + "' are the same file"));
  CommandFiles b;
  b.output(tmp / "x.json", "--result");
  b.output(tmp / "./x.json", "the --trace file");
  CHECK_THROWS_AS(b.check(), gradscale::ConfigError);
  CommandFiles c;
  c.directory(tmp / "ck", "the --checkpoint directory", gradscale::is_checkpoint_file, true);
  c.output(tmp / "ck/result.json", "--result");  // not a checkpoint file: fine
  CHECK_NOTHROW(c.check());
  c.output(tmp / "ck/tensors-12.bin", "--result");
  CHECK_THROWS_WITH(c.check(), Contains("is the file 'tensors-12.bin' of the --checkpoint directory"));
  CommandFiles d;  // two inputs may be one file
  d.input(tmp / "in.json", "the --config file");
  d.input(tmp / "link.json", "the --model-spec file");
  CHECK_NOTHROW(d.check());
}

TEST_CASE("train: a trace or result over a checkpoint file is refused before training",
          "[cli][output]") {
  TempDir tmp;
  const std::string ck = kTrain + " --max-steps 4 --checkpoint ck --save-every 2";
  check_error(in_dir(tmp, ck + " --trace ck/checkpoint"), 2,
              "the --trace file 'ck/checkpoint.json' is the file 'checkpoint.json' of the --checkpoint directory 'ck'");
  check_error(in_dir(tmp, ck + " --result ck/checkpoint.json"), 2, "of the --checkpoint directory 'ck'");
  check_error(in_dir(tmp, ck + " --result ck/tensors-4.bin"), 2,
              "--result 'ck/tensors-4.bin' is the file 'tensors-4.bin' of the --checkpoint directory 'ck'");
  CHECK_FALSE(fs::exists(tmp / "ck/checkpoint.json"));  // nothing ran
  // The checkpoint is still resumable after a refused run.
  REQUIRE(in_dir(tmp, ck).status == 0);
  check_error(in_dir(tmp, ck + " --trace ck/checkpoint"), 2, "checkpoint.json");
  CHECK(in_dir(tmp, kTrain + " --max-steps 6 --resume ck").status == 0);
}

TEST_CASE("train: a result over the checkpoint it resumes is refused", "[cli][output]") {
  TempDir tmp;
  REQUIRE(in_dir(tmp, kTrain + " --max-steps 4 --checkpoint rr --save-every 2").status == 0);
  const std::string before = read_text(tmp / "rr/checkpoint.json");
  check_error(in_dir(tmp, kTrain + " --max-steps 8 --resume rr --result rr/checkpoint.json"), 2,
              "--result 'rr/checkpoint.json' is the file 'checkpoint.json' of the --resume checkpoint 'rr'");
  CHECK(read_text(tmp / "rr/checkpoint.json") == before);
}

TEST_CASE("train: a result that is one of the trace files is refused", "[cli][output]") {
  TempDir tmp;
  check_error(in_dir(tmp, kTrain + " --max-steps 4 --trace x --result x.json"), 2,
              "--result 'x.json' and the --trace file 'x.json' are the same file");
  check_error(in_dir(tmp, kTrain + " --max-steps 4 --trace y --result y.jsonl"), 2,
              "--result 'y.jsonl' and the --trace file 'y.jsonl' are the same file");
  CHECK(fs::is_empty(tmp.path()));
}

TEST_CASE("ablate: an input inside --out is never written", "[ablate][cli][output]") {
  TempDir tmp;
  for (const char* name : {"ablation.json", "table.md"}) {
    write_text(tmp / ("d/" + std::string(name)), kAblation);
    check_error(in_dir(tmp, "ablate d/" + std::string(name) + " --out d --no-plots"), 2,
                "the ablation file 'd/" + std::string(name) + "' is the file '" + name + "' of --out 'd'");
    CHECK(read_text(tmp / ("d/" + std::string(name))) == kAblation);
  }
}

TEST_CASE("ablate: --out must be an ablation directory, or new, or empty",
          "[ablate][cli][output]") {
  TempDir tmp;
  write_text(tmp / "s.json", kAblation);
  write_text(tmp / "p/runs/none_seed0/mine.bin", "mine");
  write_text(tmp / "p/table.md", "my table");
  check_error(in_dir(tmp, "ablate s.json --out p --no-plots"), 2,
              "--out 'p' is a directory that gradscale ablate did not create");
  check_error(in_dir(tmp, "ablate s.json --out p --no-plots --table-only"), 2,
              "--table-only: 'p' is not an ablation directory");
  CHECK(read_text(tmp / "p/runs/none_seed0/mine.bin") == "mine");
  CHECK(read_text(tmp / "p/table.md") == "my table");
  // --out "": refused, nothing written in the current directory.
  check_error(in_dir(tmp, "ablate s.json --out '' --no-plots"), 2, "--out: the path is empty");
  CHECK_FALSE(fs::exists(tmp / "table.md"));
  // A directory holding only another gradscale command's write probe (a second shard probing it at
  // that moment, before its lock and marker) is empty for the claim, and the probe is left alone.
  const std::string probe = std::string(gradscale::kWriteProbePrefix) + "-99999-0";
  write_text(tmp / ("q/" + probe), "");
  { const gradscale::ablate::OutDirLock claimed(tmp / "q", /*create=*/true); }
  CHECK(fs::exists(tmp / ("q/" + std::string(gradscale::ablate::kMarkerFile))));
  CHECK(fs::exists(tmp / ("q/" + probe)));
  // An empty directory is claimed; the marker makes it ours, and resume and --table-only work there.
  fs::create_directory(tmp / "e");
  const CliResult first = in_dir(tmp, "ablate s.json --out e --no-plots");
  REQUIRE(first.status == 0);
  CHECK(fs::exists(tmp / ("e/" + std::string(gradscale::ablate::kMarkerFile))));
  CHECK(in_dir(tmp, "ablate s.json --out e --no-plots").status == 0);
  CHECK(in_dir(tmp, "ablate s.json --out e --no-plots --table-only").status == 0);
}

TEST_CASE("ablate: a second process on one --out exits 2 naming the holder",
          "[ablate][cli][output]") {
  TempDir tmp;
  write_text(tmp / "s.json", kAblation);
  const std::string lock = tmp / ("out/" + std::string(gradscale::ablate::kLockFile));
  {
    const gradscale::ablate::OutDirLock held(tmp / "out", /*create=*/true);
    // Another process: refused while this one holds the lock, with this process's pid.
    check_error(in_dir(tmp, "ablate s.json --out out --no-plots"), 2,
                "--out 'out' is in use by another gradscale ablate (pid " + std::to_string(::getpid()) + ")");
    CHECK_FALSE(fs::exists(tmp / "out/runs"));
    // --table-only takes no lock: it rebuilds the tables while an ablation runs.
    CHECK(in_dir(tmp, "ablate s.json --out out --no-plots --table-only").status == 0);
    // In this process too: a second lock on the same directory is refused.
    CHECK_THROWS_WITH(gradscale::ablate::OutDirLock(tmp / "out", true), Contains("is in use"));
  }
  // Released at scope exit (and by the kernel when a holder dies): the directory is usable again.
  CHECK(in_dir(tmp, "ablate s.json --out out --no-plots").status == 0);
  const int fd = ::open(lock.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  CHECK(::flock(fd, LOCK_EX | LOCK_NB) == 0);  // the finished command left no lock behind
  ::close(fd);
}

TEST_CASE("train: an output over the model spec a config file names is refused", "[cli][output]") {
  TempDir tmp;
  const std::string spec = R"({"input":[1,28,28],"layers":[{"type":"flatten"},{"type":"linear","out":10}]})";
  write_text(tmp / "spec.json", spec);
  write_text(tmp / "c.json", R"({"model_spec": "spec.json", "data": "synthetic:64", "batch": 32, "max_steps": 1})");
  check_error(in_dir(tmp, "train --config c.json --threads 1 --quiet --result spec.json"), 2,
              "--result 'spec.json' is the config's model_spec file");
  check_error(in_dir(tmp, "train --config c.json --threads 1 --quiet --trace spec"), 2,
              "--trace 'spec.json' is the config's model_spec file");
  CHECK(read_text(tmp / "spec.json") == spec);
}

TEST_CASE("real_path follows every symlink, dangling ones too, and resolves '..' after them", "[output]") {
  using gradscale::real_path;
  TempDir tmp;
  const std::string root = real_path(tmp.str());
  fs::create_symlink("ck/checkpoint.json", tmp / "r.json");  // dangling: ck does not exist
  CHECK(real_path(tmp / "r.json") == root + "/ck/checkpoint.json");
  fs::create_symlink("r.json", tmp / "chain.json");  // a link to a dangling link
  CHECK(real_path(tmp / "chain.json") == root + "/ck/checkpoint.json");
  fs::create_symlink(root + "/ck", tmp / "d");  // a dangling directory link, absolute
  CHECK(real_path(tmp / "d/x.json") == root + "/ck/x.json");
  CHECK(real_path(tmp / "d/../y.json") == root + "/y.json");
  fs::create_symlink("loop", tmp / "loop");  // a loop ends; the path stays usable in a message
  CHECK_FALSE(real_path(tmp / "loop").empty());
}

TEST_CASE("train: an output through a dangling symlink or a hard link is refused like the file itself",
          "[cli][output]") {
  TempDir tmp;
  const std::string ck = kTrain + " --max-steps 4 --checkpoint ck --save-every 2";
  // r.json → ck/checkpoint.json, which the run itself creates: the result would replace the checkpoint.
  fs::create_symlink("ck/checkpoint.json", tmp / "r.json");
  check_error(in_dir(tmp, ck + " --result r.json"), 2,
              "--result 'r.json' is the file 'checkpoint.json' of the --checkpoint directory 'ck'");
  CHECK_FALSE(fs::exists(tmp / "ck/checkpoint.json"));  // nothing ran
  // A directory link: d → ck.
  fs::create_symlink("ck", tmp / "d");
  check_error(in_dir(tmp, ck + " --result d/tensors-4.bin"), 2, "of the --checkpoint directory 'ck'");
  // link.json → x.json, one of the --trace x files.
  fs::create_symlink("x.json", tmp / "link.json");
  check_error(in_dir(tmp, kTrain + " --max-steps 4 --trace x --result link.json"), 2,
              "--result 'link.json' and the --trace file 'x.json' are the same file");
  CHECK_FALSE(fs::exists(tmp / "x.json"));
  // A hard link to a checkpoint file, outside the checkpoint's directory.
  REQUIRE(in_dir(tmp, ck).status == 0);
  fs::create_hard_link(tmp / "ck/checkpoint.json", tmp / "h.json");
  check_error(in_dir(tmp, ck + " --result h.json"), 2,
              "--result 'h.json' is the file 'checkpoint.json' of the --checkpoint directory 'ck'");
  CHECK(in_dir(tmp, kTrain + " --max-steps 6 --resume ck").status == 0);  // still resumable
}
