// The collision check of a command's inputs and outputs (see command_files.h).
#include "lib/core/command_files.h"

#include <filesystem>
#include <utility>

#include "lib/core/error.h"

namespace gradscale {
namespace fs = std::filesystem;
namespace {

bool same_file(const std::string& a, const std::string& b) {
  if (real_path(a) == real_path(b)) return true;
  std::error_code ec;
  return fs::equivalent(a, b, ec) && !ec;  // hard links to one file
}

// The path of `file` inside `dir` ("" when it is not inside).
std::string inside(const std::string& file, const std::string& dir) {
  const std::string f = real_path(file), d = real_path(dir);
  const std::string prefix = d.size() > 1 && d.back() != '/' ? d + "/" : d;
  if (f.size() <= prefix.size() || f.compare(0, prefix.size(), prefix) != 0) return "";
  return f.substr(prefix.size());
}

}  // namespace

std::string real_path(const std::string& path) {
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  if (ec) return path;
  // Twice: the first pass resolves "missing/../" in the part that does not exist, which can leave a
  // symlink that exists (missing/../link.json → link.json); the second pass follows it.
  fs::path real = fs::weakly_canonical(absolute, ec);
  if (!ec) real = fs::weakly_canonical(real, ec);
  return (ec ? absolute.lexically_normal() : real).string();
}

void CommandFiles::input(const std::string& path, const std::string& what) {
  if (!path.empty()) files_.push_back({path, what, false});
}

void CommandFiles::output(const std::string& path, const std::string& what) {
  if (!path.empty()) files_.push_back({path, what, true});
}

void CommandFiles::directory(const std::string& dir, const std::string& what, DirectoryOwns owns,
                             bool writes) {
  if (!dir.empty()) dirs_.push_back({dir, what, std::move(owns), writes});
}

void CommandFiles::check() const {
  for (std::size_t i = 0; i < files_.size(); ++i) {
    const File& a = files_[i];
    for (std::size_t j = i + 1; j < files_.size(); ++j) {
      const File& b = files_[j];
      GS_CHECK_CONFIG(!(a.writes || b.writes) || !same_file(a.path, b.path),
                      a.what << " '" << a.path << "' and " << b.what << " '" << b.path
                             << "' are the same file: each output needs a path of its own, and no "
                                "output may replace an input");
    }
    for (const Dir& d : dirs_) {
      if (!a.writes && !d.writes) continue;
      const std::string relative = inside(a.path, d.path);
      GS_CHECK_CONFIG(relative.empty() || !d.owns(relative),
                      a.what << " '" << a.path << "' is the file '" << relative << "' of " << d.what << " '"
                             << d.path << "', which this command " << (d.writes ? "writes" : "reads")
                             << ": give it a path outside");
    }
  }
}

}  // namespace gradscale
