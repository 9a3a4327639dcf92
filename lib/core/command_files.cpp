// The collision check of a command's inputs and outputs (see command_files.h).
#include "lib/core/command_files.h"

#include <algorithm>
#include <filesystem>
#include <utility>
#include <vector>

#include "lib/core/error.h"

namespace gradscale {
namespace fs = std::filesystem;
namespace {

// Symlinks followed on the way to one path at most (the kernel's own limit, ELOOP, is 40).
constexpr int kMaxLinks = 40;

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

// The path inside `dir` of a file there that is a hard link to `file` ("" when none is): only looked
// for when `file` has more than one link.
std::string linked_inside(const std::string& file, const std::string& dir) {
  std::error_code ec;
  const auto links = fs::hard_link_count(file, ec);
  if (ec || links < 2 || !fs::is_regular_file(file, ec)) return "";
  const fs::path root = real_path(dir);
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code same_ec;
    if (it->is_regular_file(same_ec) && fs::equivalent(it->path(), file, same_ec) && !same_ec)
      return it->path().lexically_relative(root).generic_string();
  }
  return "";
}

}  // namespace

std::string real_path(const std::string& path) {
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  if (ec) return path;
  // Component by component, each symlink replaced by its target whether or not the target exists: a
  // write through a dangling link creates its target, so the target is where the output lands.
  // ".." after a resolved prefix is its parent (the prefix holds no symlink by then).
  const fs::path relative = absolute.relative_path();
  std::vector<fs::path> rest(relative.begin(), relative.end());
  std::reverse(rest.begin(), rest.end());  // a stack: the next component last
  fs::path real = absolute.root_path();
  int links = 0;
  while (!rest.empty()) {
    const fs::path part = rest.back();
    rest.pop_back();
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      real = real.parent_path();
      continue;
    }
    const fs::path next = real / part;
    std::error_code link_ec;
    if (links < kMaxLinks && fs::is_symlink(fs::symlink_status(next, link_ec))) {
      const fs::path target = fs::read_symlink(next, link_ec);
      if (!link_ec) {
        ++links;
        if (target.is_absolute()) real = target.root_path();
        const fs::path target_relative = target.relative_path();
        std::vector<fs::path> parts(target_relative.begin(), target_relative.end());
        rest.insert(rest.end(), parts.rbegin(), parts.rend());
        continue;
      }
    }
    real = next;
  }
  return real.lexically_normal().string();
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
      std::string relative = inside(a.path, d.path);
      if (relative.empty()) relative = linked_inside(a.path, d.path);
      GS_CHECK_CONFIG(relative.empty() || !d.owns(relative),
                      a.what << " '" << a.path << "' is the file '" << relative << "' of " << d.what << " '"
                             << d.path << "', which this command " << (d.writes ? "writes" : "reads")
                             << ": give it a path outside");
    }
  }
}

}  // namespace gradscale
