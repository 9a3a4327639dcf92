// PyTorch runs in an ablation (see torch_runs.h): static checks, the interpreter, the child's command
// line, and the check-time build through `python -m gradscale.run --check-runs`.
#include "experiments/ablate/torch_runs.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "lib/core/error.h"
#include "lib/core/file_read.h"
#include "lib/core/json_read.h"
#include "lib/train/config.h"

namespace gradscale::ablate {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kDataForms =
    "fashion-mnist[:CxHxW], mnist:DIR[:CxHxW], synthetic[:N], text:PATH[:ctx=N], or {\"python\": "
    "\"file.py:function\", ...arguments}";

bool is_file(const std::string& path) {
  std::error_code ec;
  return !path.empty() && fs::is_regular_file(path, ec);
}

// "path/file.py:function" with an existing file: the factory's reference, checked without Python.
void check_factory_ref(const json& ref, const std::string& key) {
  GS_CHECK_CONFIG(ref.is_string(), "config key '" << key << "': \"python\" must be \"path/file.py:function\", got "
                                                  << json_excerpt(ref));
  const std::string s = ref.get<std::string>();
  const auto colon = s.rfind(':');
  GS_CHECK_CONFIG(colon != std::string::npos && colon > 0 && colon + 1 < s.size(),
                  "config key '" << key << "': \"python\": '" << text_excerpt(s)
                                 << "' must be \"path/file.py:function\"");
  const std::string path = s.substr(0, colon);
  GS_CHECK_CONFIG(is_file(path), "config key '" << key << "': \"python\": '" << text_excerpt(path)
                                                << "' is not a file (a path relative to the directory "
                                                   "gradscale ablate runs in)");
}

void check_torch_model(const json& model) {
  GS_CHECK_CONFIG(is_torch_model(model), "config key 'model': a PyTorch model is {\"torchvision\": NAME, ...} or "
                                         "{\"python\": \"file.py:function\", ...}, got "
                                             << json_excerpt(model));
  GS_CHECK_CONFIG(!(model.contains("torchvision") && model.contains("python")),
                  "config key 'model': give \"torchvision\" or \"python\", not both");
  if (model.contains("torchvision")) {
    GS_CHECK_CONFIG(model["torchvision"].is_string() && !model["torchvision"].get<std::string>().empty(),
                    "config key 'model': \"torchvision\" must name a model, got " << json_excerpt(model["torchvision"]));
    return;
  }
  check_factory_ref(model["python"], "model");
}

void check_torch_data(const json& data) {
  if (data.is_object()) {
    GS_CHECK_CONFIG(data.contains("python"), "config key 'data': an object must have \"python\": "
                                             "\"file.py:function\" (allowed: "
                                                 << kDataForms << ")");
    check_factory_ref(data["python"], "data");
    return;
  }
  GS_CHECK_CONFIG(data.is_string(), "config key 'data': must be " << kDataForms << ", got " << json_excerpt(data));
  const std::string spec = data.get<std::string>();
  static const std::regex shape(R"([13]x\d{2,4}x\d{2,4})");
  const auto colon = spec.find(':');
  const std::string head = spec.substr(0, colon), rest = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if (head == "fashion-mnist") {
    GS_CHECK_CONFIG(rest.empty() || std::regex_match(rest, shape),
                    "config key 'data': '" << text_excerpt(spec) << "': the image shape must be CxHxW (C 1 or 3)");
    return;
  }
  if (head == "synthetic") {
    static const std::regex form(R"((\d{1,8})?(:[13]x\d{2,4}x\d{2,4})?)");
    GS_CHECK_CONFIG(std::regex_match(rest, form),
                    "config key 'data': '" << text_excerpt(spec) << "': expected synthetic[:N][:CxHxW]");
    return;
  }
  if (head == "mnist") {
    std::string dir = rest;
    std::smatch m;
    static const std::regex with_shape(R"((.*):[13]x\d{2,4}x\d{2,4})");
    if (std::regex_match(rest, m, with_shape)) dir = m[1];
    std::error_code ec;
    GS_CHECK_CONFIG(!dir.empty() && fs::is_directory(dir, ec),
                    "config key 'data': '" << text_excerpt(spec) << "' names no directory");
    return;
  }
  if (head == "text") {
    std::string path = rest;
    std::smatch m;
    static const std::regex with_ctx(R"((.*):ctx=(\d{1,4}))");
    if (std::regex_match(rest, m, with_ctx)) path = m[1];
    GS_CHECK_CONFIG(is_file(path), "config key 'data': '" << text_excerpt(spec) << "': '" << text_excerpt(path)
                                                          << "' is not a file");
    return;
  }
  throw ConfigError("config key 'data': unknown data spec '" + text_excerpt(spec) + "' for a PyTorch run (allowed: " +
                    kDataForms + ")");
}

// The checkout's python/ directory: next to the binary's build folder, or the source tree's.
std::string python_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  std::vector<fs::path> candidates;
  if (!ec) candidates.push_back(exe.parent_path().parent_path() / "python");
#ifdef GRADSCALE_SOURCE_DIR
  candidates.push_back(fs::path(GRADSCALE_SOURCE_DIR) / "python");
#endif
  for (const fs::path& p : candidates)
    if (fs::is_regular_file(p / "gradscale" / "run.py", ec)) return p.string();
  return "";
}

std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    const fs::path p = fs::path(dir.empty() ? "." : dir) / name;
    if (::access(p.c_str(), X_OK) == 0) return p.string();
  }
  return "";
}

}  // namespace

bool is_torch_model(const json& model) {
  return model.is_object() && (model.contains("torchvision") || model.contains("python"));
}

bool is_torch_run(const json& config) {
  return config.is_object() && config.contains("model") && is_torch_model(config["model"]);
}

bool is_torch_only_key(const std::string& key) {
  return key == "eval_examples";  // eval_every is a key of gradscale train too
}

void check_torch_setting(const std::string& key, const json& value) {
  if (key == "model") return check_torch_model(value);
  if (key == "data") return check_torch_data(value);
  if (is_torch_only_key(key)) {
    GS_CHECK_CONFIG(value.is_number_integer() && value.get<std::int64_t>() >= 0,
                    "config key '" << key << "' must be an integer >= 0, got " << json_excerpt(value));
    return;
  }
}

void validate_torch_config(const json& config) {
  check_torch_model(config["model"]);
  GS_CHECK_CONFIG(!config.contains("model_spec") || config["model_spec"].is_null(),
                  "config key 'model_spec': a PyTorch run's model is its \"model\" object; remove model_spec");
  json rest = config;
  for (const char* key : {"model", "data", "eval_examples"}) {
    if (!rest.contains(key)) continue;
    check_torch_setting(key, rest[key]);
    rest.erase(key);
  }
  // Every other key as gradscale train reads it (the Python side reads them the same way).
  TrainConfig c;
  c.merge_json(rest);
}

std::string default_python() {
  if (const char* env = std::getenv("GRADSCALE_PYTHON"); env && *env) return env;
  std::error_code ec;
  const std::string dir = python_dir();
  if (!dir.empty()) {
    const fs::path venv = fs::path(dir).parent_path() / ".venv" / "bin" / "python";
    if (fs::exists(venv, ec)) return venv.string();
  }
  return find_on_path("python3");
}

void export_python_path() {
  const std::string dir = python_dir();
  if (dir.empty()) return;
  const char* had = std::getenv("PYTHONPATH");
  const std::string value = had && *had ? dir + ":" + had : dir;
  ::setenv("PYTHONPATH", value.c_str(), 1);
}

std::vector<std::string> torch_run_argv(const std::string& python, const std::string& config,
                                        const std::string& result, const std::string& trace, int threads) {
  std::vector<std::string> argv = {python, "-m", "gradscale.run", config, "--result", result, "--trace", trace};
  if (threads > 0) argv.insert(argv.end(), {"--threads", std::to_string(threads)});
  return argv;
}

void check_torch_runs(const Ablation& ablation, const std::string& python, const std::string& scratch_dir) {
  json runs = json::array();
  std::set<std::string> seen;  // one run per distinct (model, data, device): each is built once
  for (const AblationRun& r : ablation.runs) {
    if (!is_torch_run(r.config)) continue;
    const std::string key = json::array({r.config["model"], r.config.value("data", json()),
                                         r.config.value("device", json())}).dump();
    if (!seen.insert(key).second) continue;
    runs.push_back({{"name", r.name}, {"config", r.config}});
  }
  if (runs.empty()) return;
  GS_CHECK_CONFIG(!python.empty() && ::access(python.c_str(), X_OK) == 0,
                  "the ablation has PyTorch runs (e.g. '" << runs[0]["name"].get<std::string>()
                                                          << "') but no Python interpreter was found ('" << python
                                                          << "'): give --python or set GRADSCALE_PYTHON");
  fs::create_directories(scratch_dir);
  const fs::path list = fs::path(scratch_dir) / ("torch-check-" + std::to_string(::getpid()) + ".json");
  const fs::path log = fs::path(scratch_dir) / ("torch-check-" + std::to_string(::getpid()) + ".log");
  {
    std::ofstream f(list);
    f << runs.dump() << "\n";
    GS_CHECK_DATA(f.good(), "cannot write '" << list.string() << "'");
  }
  const std::vector<std::string> args = {python, "-m", "gradscale.run", "--check-runs", list.string()};
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  GS_CHECK_DATA(out >= 0, "cannot create '" << log.string() << "': " << std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out, 1);
    ::dup2(out, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(out);
  int status = 0;
  while (pid > 0 && ::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::string text;
  {
    std::ifstream f(log);
    std::stringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  }
  std::error_code ec;
  fs::remove(list, ec);
  fs::remove(log, ec);
  const int code = pid > 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  // Success is the checker's own line, not only exit 0: a --python that is some other program (/bin/true,
  // echo) exits 0 having checked nothing, and every run would then end without a result.
  const std::string ok = "ok: checked " + std::to_string(runs.size()) + " run" + (runs.size() == 1 ? "" : "s");
  if (code == 0 && text.find(ok) != std::string::npos) return;
  std::string lines;
  std::stringstream ss(text);
  for (std::string line; std::getline(ss, line);) {
    const std::string prefix = "gradscale.run: ";
    if (line.compare(0, prefix.size(), prefix) == 0) lines += (lines.empty() ? "" : "\n") + line.substr(prefix.size());
  }
  if (code == 2 && !lines.empty()) throw ConfigError(lines);
  std::string last = text;
  while (!last.empty() && last.back() == '\n') last.pop_back();
  if (const auto nl = last.rfind('\n'); nl != std::string::npos) last = last.substr(nl + 1);
  if (last.empty()) last = "(no output)";
  throw ConfigError("the ablation's PyTorch runs cannot start: '" + python + " -m gradscale.run --check-runs' " +
                    (code < 0   ? std::string("did not run")
                     : code == 0 ? std::string("exited 0 without saying '" + ok + "' (is it a Python with gradscale?)")
                                 : "exited " + std::to_string(code)) +
                    ": " + text_excerpt(last, 300));
}

}  // namespace gradscale::ablate
