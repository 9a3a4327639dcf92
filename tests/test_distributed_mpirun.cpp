// Data-parallel training under `mpirun -np 2` (lib/dist, docs/distributed.md): two ranks with half a
// batch each take the decisions one process with the whole batch takes — S0, every layer's s and S,
// φ, found_inf, the skip — and the statistics those are taken from are the same (counts and extremes
// exactly); weights agree within the tolerance of a different fp32 summation order; checkpoints resume
// with another number of ranks; ranks started with different configs or data, and a rank that stops,
// end the run with a clear error; --gpu-collectives (skipped, visibly, without mpirun or an MPI build).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/dist/communicator.h"
#include "lib/dist/data_parallel.h"
#include "lib/model/spec.h"
#include "lib/optim/optimizer.h"
#include "lib/train/scaled_training.h"
#include "lib/train/trainer.h"
#include "tests/cli_run.h"
#include "tests/idx_dir.h"
#include "tests/skip.h"
#include "tests/temp_dir.h"
#include "tests/thread_ranks.h"

namespace {

using json = nlohmann::json;
using gradscale::test::on_two_ranks;
using gradscale::testing::TempDir;
using gradscale::test::run_shell;

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

// `mpirun -np N` as this machine needs it: more ranks than cores (--oversubscribe), and as root the
// flags OpenMPI asks for; no shared-memory single-copy (refused inside many containers).
std::string mpirun(int ranks) {
  if (run_shell("command -v mpirun >/dev/null").status != 0)
    gradscale::test::skip_test("no mpirun (scripts/setup.sh installs openmpi-bin)");
  if (run_shell("ldd \"$GS\" | grep -q libmpi").status != 0)
    gradscale::test::skip_test("this gradscale was built without MPI (CMake found none)");
  return std::string("env OMPI_MCA_btl_vader_single_copy_mechanism=none mpirun --oversubscribe") +
         (::geteuid() == 0 ? " --allow-run-as-root" : "") + " -np " + std::to_string(ranks) + " ";
}

std::vector<json> trace_steps(const std::string& path) {
  std::vector<json> steps;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line);
    if (j.value("type", "") == "step") steps.push_back(j);
  }
  return steps;
}

// A deep fp8 network whose layers need scales above 1: the controller's decisions vary over layers
// and steps, so equal decisions are not equal by default.
const std::string kRun =
    "train --model deep-mlp:depth=6,width=64,gain=0.5 --data synthetic:1024 --format fp8_e5m2 "
    "--batch 64 --threads 1 --trace-every 1 --quiet ";

struct Compared {
  int decisions = 0, scaled = 0, statistics = 0;
};

// Every step's decisions equal; the activation-gradient statistics too (counts and extremes exactly;
// sums, which two ranks add in another order, to a relative 1e-12). The weight gradients' statistics
// are of the fp32 gradient summed over the ranks, whose last bits differ from one GEMM over the whole
// batch: a value may cross a class edge (counts to 1e-4 of the elements), extremes and sums to a
// relative 1e-5 (not the smallest non-zero |g|, which comes from sums that nearly cancel).
Compared compare_traces(const std::string& one, const std::string& two, std::size_t steps) {
  const auto a = trace_steps(one), b = trace_steps(two);
  REQUIRE(a.size() == steps);
  REQUIRE(b.size() == steps);
  Compared c;
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("step " << a[i]["step"]);
    for (const char* k : {"step", "S0", "skipped", "found_inf", "phi", "first_nonfinite_layer"}) {
      INFO(k);
      CHECK(a[i][k] == b[i][k]);
    }
    REQUIRE(a[i]["layers"].size() == b[i]["layers"].size());
    for (std::size_t l = 0; l < a[i]["layers"].size(); ++l) {
      const json &x = a[i]["layers"][l], &y = b[i]["layers"][l];
      INFO("layer " << x["id"]);
      for (const char* k : {"s", "unbound_s", "S", "S_in"}) {
        INFO(k);
        CHECK(x.value(k, json()) == y.value(k, json()));
      }
      ++c.decisions;
      c.scaled += x.value("s", 1.0) > 1.0;
      for (const std::string site : {"act", "wgrad"}) {
        if (!x.contains(site)) continue;
        REQUIRE(y.contains(site));
        ++c.statistics;
        const bool exact = site == "act";
        const double elements = x[site]["elements"].get<double>();
        for (const char* k : {"elements", "zero", "underflow", "subnormal", "normal", "overflow", "nonfinite", "count"}) {
          INFO(site << "." << k);
          if (exact)
            CHECK(x[site][k] == y[site][k]);
          else
            CHECK(std::fabs(x[site][k].get<double>() - y[site][k].get<double>()) <= 1e-4 * elements);
        }
        for (const char* k : {"max", "min", "max_abs", "min_nonzero_abs", "sum", "sum_squares"}) {
          const double u = x[site][k].get<double>(), v = y[site][k].get<double>();
          INFO(site << "." << k << " " << u << " vs " << v);
          const bool sum = k[0] == 's';
          if (exact && !sum)
            CHECK(u == v);
          else if (exact || std::string(k) != "min_nonzero_abs")
            CHECK(std::fabs(u - v) <= (exact ? 1e-12 : 1e-5) * std::max(std::fabs(u), std::fabs(v)));
        }
      }
    }
  }
  return c;
}

// The master weights of a checkpoint, read back through the trainer (resumed, no further step).
std::vector<std::vector<float>> checkpoint_weights(const std::string& dir) {
  gradscale::TrainConfig c;
  std::ifstream in(dir + "/checkpoint.json");
  const json meta = json::parse(in);
  c.merge_json(meta["config"]);
  c.resume_dir = dir;
  c.trace_path.clear();
  c.checkpoint_dir.clear();
  c.save_every = 0;
  gradscale::Trainer t(c);
  std::vector<std::vector<float>> w;
  for (const gradscale::Parameter* p : t.model().parameters())
    w.emplace_back(p->value.data(), p->value.data() + p->value.size());
  return w;
}

}  // namespace

TEST_CASE("mpirun -np 2: the decisions and statistics of one process with the whole batch", "[dist][cli]") {
  const std::string mpi = mpirun(2);
  TempDir tmp;
  const std::string scaler = "--scaler '{\"policy\":\"adaptive\",\"method\":\"measured\"}' ";
  // lr 0: the weights stay the initial ones, so every step's statistics must agree, not only step 1's.
  const std::string still = kRun + scaler + "--max-steps 8 --lr 0 ";
  REQUIRE(run_shell("\"$GS\" " + still + "--trace '" + (tmp / "one") + "'").status == 0);
  const auto two = run_shell(mpi + "\"$GS\" " + still + "--trace '" + (tmp / "two") + "'");
  INFO(joined(two.lines));
  REQUIRE(two.status == 0);
  const Compared still_c = compare_traces(tmp / "one.jsonl", tmp / "two.jsonl", 8);
  CHECK(still_c.scaled > 8);  // the controller did scale: the decisions compared are not all 1

  // Training (Adam, lr 1e-3, weight gradients in fp32 so the summation order shows): the same
  // decisions over 16 steps; the weights within the tolerance below.
  const std::string train = kRun + scaler + "--max-steps 16 --weight-grads fp32 --save-every 16 ";
  REQUIRE(run_shell("\"$GS\" " + train + "--trace '" + (tmp / "t1") + "' --checkpoint '" + (tmp / "c1") + "'")
              .status == 0);
  const auto dp = run_shell(mpi + "\"$GS\" " + train + "--trace '" + (tmp / "t2") + "' --checkpoint '" +
                            (tmp / "c2") + "' --result '" + (tmp / "r2.json") + "'");
  INFO(joined(dp.lines));
  REQUIRE(dp.status == 0);
  const Compared c = compare_traces(tmp / "t1.jsonl", tmp / "t2.jsonl", 16);
  CHECK(c.scaled > 16);
  std::ifstream rin(tmp / "r2.json");
  CHECK(json::parse(rin)["ranks"] == 2);
  const auto w1 = checkpoint_weights(tmp / "c1"), w2 = checkpoint_weights(tmp / "c2");
  REQUIRE(w1.size() == w2.size());
  double max_diff = 0, max_w = 0;
  for (std::size_t p = 0; p < w1.size(); ++p) {
    REQUIRE(w1[p].size() == w2[p].size());
    for (std::size_t i = 0; i < w1[p].size(); ++i) {
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(w1[p][i] - w2[p][i])));
      max_w = std::max(max_w, static_cast<double>(std::fabs(w1[p][i])));
    }
  }
  // Each step's gradient differs in its last fp32 bits (two partial sums added vs one GEMM over the
  // batch); Adam's update is lr·m/√v, so 16 steps move a weight apart by far less than lr = 1e-3.
  INFO("max |w1 - w2| = " << max_diff << ", max |w| = " << max_w);
  CHECK(max_diff <= 1e-5);
  CHECK(max_w > 0.01);
}

TEST_CASE("mpirun -np 2: the same skips as one process", "[dist][cli]") {
  const std::string mpi = mpirun(2);
  TempDir tmp;
  // fp16 gradients under torch's scaler from 65536, growing every 3 steps: some steps overflow and are
  // skipped, the others train; the ranks must skip exactly those.
  std::string run = kRun + "--scaler '{\"policy\":\"torch\",\"init_scale\":65536,\"growth_interval\":3}' "
                           "--max-steps 32 ";
  run.replace(run.find("fp8_e5m2"), 8, "fp16");
  run.replace(run.find("synthetic:1024"), 14, "synthetic:2048");
  REQUIRE(run_shell("\"$GS\" " + run + "--trace '" + (tmp / "one") + "'").status == 0);
  const auto two = run_shell(mpi + "\"$GS\" " + run + "--trace '" + (tmp / "two") + "'");
  INFO(joined(two.lines));
  REQUIRE(two.status == 0);
  const auto a = trace_steps(tmp / "one.jsonl"), b = trace_steps(tmp / "two.jsonl");
  REQUIRE(a.size() == 32);
  REQUIRE(b.size() == 32);
  int skipped = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("step " << a[i]["step"]);
    CHECK(a[i]["skipped"] == b[i]["skipped"]);
    CHECK(a[i]["found_inf"] == b[i]["found_inf"]);
    CHECK(a[i]["S0"] == b[i]["S0"]);
    skipped += a[i]["skipped"].get<bool>();
  }
  CHECK(skipped > 0);   // some steps were skipped …
  CHECK(skipped < 16);  // … and most were not
}

TEST_CASE("mpirun: a checkpoint of 2 ranks resumes in 1, and one of 1 in 2", "[dist][cli]") {
  const std::string mpi = mpirun(2);
  TempDir tmp;
  const std::string run = kRun + "--scaler '{\"policy\":\"adaptive\",\"method\":\"measured\"}' --save-every 8 ";
  // Reference: 16 steps in one process.
  REQUIRE(run_shell("\"$GS\" " + run + "--max-steps 16 --trace '" + (tmp / "ref") + "' --checkpoint '" +
                    (tmp / "ref_ckpt") + "'")
              .status == 0);
  // 8 steps on 2 ranks, then 8 more in one process; and 8 in one process, then 8 more on 2 ranks.
  const auto a = run_shell(mpi + "\"$GS\" " + run + "--max-steps 8 --checkpoint '" + (tmp / "a") + "'");
  INFO(joined(a.lines));
  REQUIRE(a.status == 0);
  const auto a2 = run_shell("\"$GS\" " + run + "--max-steps 16 --checkpoint '" + (tmp / "a") + "' --resume '" +
                            (tmp / "a") + "' --trace '" + (tmp / "ta") + "'");
  INFO(joined(a2.lines));
  REQUIRE(a2.status == 0);
  REQUIRE(run_shell("\"$GS\" " + run + "--max-steps 8 --checkpoint '" + (tmp / "b") + "'").status == 0);
  const auto b2 = run_shell(mpi + "\"$GS\" " + run + "--max-steps 16 --checkpoint '" + (tmp / "b") + "' --resume '" +
                            (tmp / "b") + "' --trace '" + (tmp / "tb") + "'");
  INFO(joined(b2.lines));
  REQUIRE(b2.status == 0);
  // The resumed halves take the reference's decisions at steps 9..16.
  const auto ref = trace_steps(tmp / "ref.jsonl"), ta = trace_steps(tmp / "ta.jsonl"),
             tb = trace_steps(tmp / "tb.jsonl");
  REQUIRE(ref.size() == 16);
  for (const auto* t : {&ta, &tb}) {
    REQUIRE(t->size() == 8);
    for (std::size_t i = 0; i < 8; ++i) {
      const json &x = ref[8 + i], &y = (*t)[i];
      CHECK(x["step"] == y["step"]);
      CHECK(x["S0"] == y["S0"]);
      CHECK(x["skipped"] == y["skipped"]);
      for (std::size_t l = 0; l < x["layers"].size(); ++l) CHECK(x["layers"][l]["s"] == y["layers"][l]["s"]);
    }
  }
}

TEST_CASE("mpirun: ranks started with different configs stop at the start, naming the rank and key",
          "[dist][cli]") {
  const std::string mpi = mpirun(2);
  TempDir tmp;
  // Rank 1 gets another learning rate.
  const auto r = run_shell("timeout 120 " + mpi + "sh -c 'exec \"$0\" " + kRun +
                               "--max-steps 4 --lr 0.00$((OMPI_COMM_WORLD_RANK + 1))' \"$GS\"");
  INFO(joined(r.lines));
  CHECK(r.status == 2);  // bad input; not the timeout: the ranks noticed
  const std::string out = joined(r.lines);
  CHECK(out.find("the ranks were started with different configs: rank 1 differs from rank 0") != std::string::npos);
  CHECK(out.find("first at 'lr'") != std::string::npos);
}

TEST_CASE(
    "mpirun: ranks that read different data or resume different checkpoints stop at the start, "
    "naming the file",
    "[dist][cli]") {
  const std::string mpi = mpirun(2);
  TempDir tmp;
  // The same command line in a working directory per rank, each with its own mnist:d.
  for (const char* r : {"r0", "r1"}) gradscale::test::write_idx_dir(tmp / (std::string(r) + "/d"), 64);
  {
    std::fstream labels(tmp / "r1/d/train-labels-idx1-ubyte",
                        std::ios::in | std::ios::out | std::ios::binary);
    labels.seekp(-1, std::ios::end);
    labels.put(5);  // rank 1's last training label: 5, rank 0's 63 % 10 = 3
  }
  const std::string train = "train --model mlp --data mnist:d --batch 32 --epochs 8 --threads 1 --quiet ";
  auto per_rank = [&](const std::string& args) {
    const std::string script =
        "cd '" + tmp.str() + "/r'\"$OMPI_COMM_WORLD_RANK\" && exec \"$0\" " + train + args;
    return run_shell("timeout 120 " + mpi + "sh -c " + gradscale::test::shell_quote(script) + " \"$GS\"");
  };
  const auto data = per_rank("--max-steps 2");
  INFO(joined(data.lines));
  CHECK(data.status == 2);
  CHECK(joined(data.lines)
            .find("the ranks read different files: the data 'mnist:d' differs on rank 1 from "
                  "rank 0's (rank 0: content checksum xxh64:") != std::string::npos);
  CHECK(joined(data.lines).find("test_accuracy") == std::string::npos);  // no rank trained

  // The same data; each rank's checkpoint "ck" at another step.
  gradscale::test::write_idx_dir(tmp / "r1/d", 64);
  for (const auto& [dir, steps] : {std::pair<const char*, int>{"r0", 2}, {"r1", 4}})
    REQUIRE(run_shell("cd '" + (tmp / dir) + "' && \"$GS\" " + train + "--max-steps " +
                      std::to_string(steps) + " --checkpoint ck --save-every 2")
                .status == 0);
  const auto resumed = per_rank("--max-steps 8 --resume ck");
  INFO(joined(resumed.lines));
  CHECK(resumed.status == 2);
  CHECK(joined(resumed.lines)
            .find("the ranks read different files: the --resume checkpoint 'ck' differs on rank 1 "
                  "from rank 0's (rank 0: step 2, weights xxh64:") != std::string::npos);
  CHECK(joined(resumed.lines).find("this rank, 1: step 4, weights") != std::string::npos);
  CHECK(joined(resumed.lines).find("test_accuracy") == std::string::npos);
  CHECK(joined(resumed.lines).find("MPI_ERR") == std::string::npos);
}

TEST_CASE("mpirun: a rank that stops ends the others with a timeout error, not a hang", "[dist][cli]") {
  const std::string mpi = mpirun(2);
  TempDir tmp;
  // Rank 1 is stopped (SIGSTOP) once rank 0 has traced a step, so both are past MPI_Init; rank 0 then
  // waits in a collective for at most --dist-timeout, says so, and aborts the job.
  const std::string trace = tmp / "t";
  std::string run = kRun;
  run.replace(run.find("synthetic:1024"), 14, "synthetic:60000");  // steps enough to outlast the stop
  const std::string script = "\"$0\" " + run + "--epochs 100 --trace '" + trace +
                             "' --dist-timeout 3 & p=$!; if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then "
                             "while [ ! -s '" + trace + ".jsonl' ]; do sleep 0.1; done; kill -STOP $p; fi; wait $p";
  const auto r = run_shell("timeout 120 " + mpi + "sh -c " + gradscale::test::shell_quote(script) + " \"$GS\"");
  INFO(joined(r.lines));
  CHECK(r.status != 0);
  CHECK(r.status != 124);
  CHECK(joined(r.lines).find("rank 0 of 2: ") != std::string::npos);
  CHECK(joined(r.lines).find("did not complete within 3 s: another rank died, hangs") != std::string::npos);
}

TEST_CASE("train: --gpu-collectives takes auto, nccl or host, and names a bad value", "[dist][cli]") {
  const auto r = gradscale::test::run_cli("train --data synthetic:64 --max-steps 1 --quiet --gpu-collectives gloo");
  CHECK(r.status == 2);
  CHECK(joined(r.lines).find("--gpu-collectives must be auto, nccl or host, got 'gloo'") != std::string::npos);
  // One process reduces nothing: the option is accepted and unused.
  CHECK(gradscale::test::run_cli("train --data synthetic:64 --max-steps 1 --quiet --gpu-collectives host").status == 0);
}

TEST_CASE("mpirun: --gpu-collectives nccl on a model on the CPU stops at the start, saying why", "[dist][cli]") {
  const std::string mpi = mpirun(2);
  const auto r = run_shell("timeout 120 " + mpi + "\"$GS\" train --data synthetic:256 --batch 32 --max-steps 2 "
                           "--threads 1 --quiet --gpu-collectives nccl");
  INFO(joined(r.lines));
  CHECK(r.status != 0);
  CHECK(r.status != 124);  // not the timeout
  CHECK(joined(r.lines).find("--gpu-collectives nccl sums a GPU's gradients: the model is on the cpu") !=
        std::string::npos);
}
