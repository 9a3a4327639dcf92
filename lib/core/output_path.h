// Where a run writes (the result file, checkpoints, traces): the checks made before a run starts, so a
// bad path fails in the first second and not after hours of training, and the one atomic write that
// every output file goes through.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace gradscale {

// An input file of the run that an output must not replace: {path, what it is} ("the --config file").
using InputFile = std::pair<std::string, std::string>;

// Checks that write_file_atomic(path, ...) can succeed: `path` is not empty and does not end in '/';
// nothing is there or a regular file is (a symlink is followed, a dangling one to where its target
// would be; a directory, FIFO, device or socket is refused); it is not one of `inputs`; its directory
// exists (it is created when missing) and a file can be created in it (tried). Throws ConfigError
// starting with `what` (e.g. "--result").
void check_output_file(const std::string& path, const std::string& what,
                       const std::vector<InputFile>& inputs = {});

// Checks that `dir` is a directory (created when missing; a symlink to one is fine) in which a file
// can be created (tried). Throws ConfigError starting with `what` (e.g. "--checkpoint").
void check_output_dir(const std::string& dir, const std::string& what);

// Replaces the file at `path` with `contents`, atomically: the bytes go to a new file with a unique
// name (temp_name_prefix(path) + a unique suffix) in the same directory, which is fsynced and then
// renamed over `path`; the directory is fsynced after the rename. A crash at any moment leaves either
// the old file or the new one. On failure the temp file is removed. A symlink at `path` is followed:
// its target is replaced (created, when the link dangles). Missing parent directories are created.
// Throws DataError naming the path.
void write_file_atomic(const std::string& path, const std::string& contents);

// The file name every temp file of write_file_atomic(path) starts with: "<name of path>.tmp".
std::string temp_name_prefix(const std::string& path);

// The name every probe file of check_output_file / check_output_dir starts with: created in the
// directory to try it and removed at once, so another process may see one there for a moment.
inline constexpr const char* kWriteProbePrefix = ".gradscale-write-test.tmp";

}  // namespace gradscale
