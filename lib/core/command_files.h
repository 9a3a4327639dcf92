// The files one command reads and writes, checked against each other before any work: one rule for
// every output (a result, a trace, the files of a checkpoint directory, an ablation's directory), so
// that no output replaces another output or an input of the same command. Paths are compared as real
// paths (symlinks followed, dangling ones too; "." and ".." resolved), and existing files also by
// identity (hard links, also to a file that a listed directory holds).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace gradscale {

// Whether a directory's file holds `relative` (its path inside the directory, '/'-separated).
using DirectoryOwns = std::function<bool(const std::string& relative)>;

class CommandFiles {
 public:
  // A file the command reads; `what` names it in messages ("the --config file").
  void input(const std::string& path, const std::string& what);
  // A file the command writes; `what` names it ("--result").
  void output(const std::string& path, const std::string& what);
  // A directory whose files that `owns` accepts the command reads (`writes` false) or writes.
  void directory(const std::string& dir, const std::string& what, DirectoryOwns owns, bool writes);

  // Throws ConfigError naming both paths when two outputs are one file, an output is an input, or an
  // output (an input) is a file that a written (any listed) directory holds.
  void check() const;

 private:
  struct File {
    std::string path, what;
    bool writes;
  };
  struct Dir {
    std::string path, what;
    DirectoryOwns owns;
    bool writes;
  };
  std::vector<File> files_;
  std::vector<Dir> dirs_;
};

// `path` as an absolute path with every symlink in it followed, a dangling one too (its target is
// where a write through it lands), and "."/".." resolved.
std::string real_path(const std::string& path);

}  // namespace gradscale
