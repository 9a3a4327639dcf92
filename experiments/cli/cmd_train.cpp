// `gradscale train`: trains a model with a format and a scaler; keys as in docs/config.md, from a
// config file and/or the command line (which overrides). Output paths are checked before training
// starts; the result JSON is written atomically. Exit status: 0, or 3 when the run diverged (the
// result file says so); bad input exits 2 and a bad file 1 (main.cpp, docs/config.md). Under
// `mpirun -np N` it trains data-parallel (docs/distributed.md): rank 0 logs and writes; an error on one
// rank ends every rank (MPI_Abort) after printing it.
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiments/cli/command.h"
#include "experiments/cli/dist_launch.h"
#include "experiments/cli/terminal_text.h"
#include "experiments/cli/train_options.h"
#include "lib/core/error.h"
#include "lib/core/output_path.h"
#include "lib/train/trainer.h"

namespace gradscale::cli {
namespace {

using json = nlohmann::json;

constexpr int kExitDiverged = 3;

// A metric as the metrics line prints it: a number as the stream writes it; "inf" and null as JSON.
std::string shown(const json& v) {
  if (!v.is_number_float()) return v.dump();
  std::ostringstream os;
  os << v.get<double>();
  return os.str();
}

int train(const TrainConfig& config, const po::variables_map& vm, const std::string& result_path,
          Communicator& comm);

int run_train(const std::vector<std::string>& args) {
  po::options_description desc("options (config-file keys in brackets; see docs/config.md)");
  add_train_options(desc);
  desc.add_options()("result", po::value<std::string>(), "write the result JSON here (atomically)")(
      "quiet", po::bool_switch(), "no progress lines")(
      "dist-timeout", po::value<double>()->default_value(300.0),
      "under mpirun: seconds a collective waits for the other ranks before this rank gives up")(
      "gpu-collectives", po::value<std::string>()->default_value("auto"),
      "under mpirun with --device cuda: what sums the weight gradients on the GPUs: nccl, host (through "
      "host memory over MPI; several ranks may share a GPU), auto (nccl when this build has it)");
  po::variables_map vm;
  if (!parse_options("gradscale train [options]", desc, args, vm)) return 0;

  const TrainConfig config = train_config_from(vm);
  if (config.save_every > 0)
    GS_CHECK_CONFIG(!config.checkpoint_dir.empty(), "--save-every needs --checkpoint DIR");
  // Outputs are checked now, not after training: each on its own, then all against each other and
  // against the inputs (a trace or result written over a checkpoint file, a --config, ...).
  std::string result_path;
  if (vm.count("result")) {
    result_path = vm["result"].as<std::string>();
    check_output_file(result_path, "--result", input_files(vm));
  }
  if (config.save_every > 0) check_output_dir(config.checkpoint_dir, "--checkpoint");
  check_trace_path(config.trace_path);
  if (!config.trace_path.empty())
    for (const char* ext : {".jsonl", ".json"})
      check_output_file(config.trace_path + ext, "--trace", input_files(vm));
  train_files(vm, config, result_path).check();

  const std::string collectives = vm["gpu-collectives"].as<std::string>();
  GS_CHECK_CONFIG(collectives == "auto" || collectives == "nccl" || collectives == "host",
                  "--gpu-collectives must be auto, nccl or host, got '" << collectives << "'");
  const double timeout = vm["dist-timeout"].as<double>();
  GS_CHECK_CONFIG(timeout > 0 && timeout <= 1e6, "--dist-timeout must be in (0, 1e6] seconds, got " << timeout);
  const std::unique_ptr<Communicator> comm = make_communicator(timeout);
  if (comm->size() > 1) {
    // One rank's error must end the others, which may be waiting in a collective: print it, then abort.
    try {
      return train(config, vm, result_path, *comm);
    } catch (const std::exception& e) {
      std::cerr << "gradscale train: rank " << comm->rank() << " of " << comm->size() << ": "
                << terminal_message(e.what()) << std::endl;
      comm->abort(dynamic_cast<const ConfigError*>(&e) ? 2 : 1);
    }
  }
  return train(config, vm, result_path, *comm);
}

int train(const TrainConfig& config, const po::variables_map& vm, const std::string& result_path,
          Communicator& comm) {
  const bool rank0 = comm.rank() == 0;
  Trainer trainer(config, vm["quiet"].as<bool>() || !rank0 ? nullptr : &std::cerr, &comm,
                  vm["gpu-collectives"].as<std::string>());
  const json result = trainer.run();
  if (!rank0) return result["diverged"].get<bool>() ? kExitDiverged : 0;
  if (!result["diverged"].get<bool>())
    std::cout << "test_accuracy " << shown(result["test_accuracy"]) << "  test_loss "
              << shown(result["test_loss"]) << "  steps " << result["steps"] << "  skipped "
              << result["skipped_steps"] << "  final_scale " << result["final_scale"] << std::endl;
  if (!result_path.empty()) write_file_atomic(result_path, result.dump(2) + "\n");
  if (result["diverged"].get<bool>()) {
    std::cerr << "gradscale train: diverged at step " << result["diverged_step"] << ": "
              << result["divergence"].get<std::string>() << "\n";
    return kExitDiverged;
  }
  return 0;
}

}  // namespace

GS_REGISTER_COMMAND("train", "train a model with a format and a scaler", run_train);

}  // namespace gradscale::cli
