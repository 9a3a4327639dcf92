// Errors of gradscale: one small exception hierarchy and one family of check macros.
// Library code throws; only command-line tools catch (at main), print one line and exit non-zero.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace gradscale {

// Where a check macro failed: the source file's name (no directories: a message never shows a build
// path) and the line. A string literal and an int, so an error stays nothrow-copyable.
struct SourceLocation {
  const char* file = nullptr;
  int line = 0;
};

// `path` without its directories ("lib/scaler/registry.cpp" → "registry.cpp").
constexpr const char* source_file_name(const char* path) {
  const char* name = path;
  for (const char* p = path; *p != '\0'; ++p)
    if (*p == '/' || *p == '\\') name = p + 1;
  return name;
}

// Base of every error the library raises. what() is the message for the user; an error thrown by a
// check macro also knows where the check is (where(): "registry.cpp:70"), for debug output only — the
// CLI prints it when GRADSCALE_DEBUG is set.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  Error(const std::string& what, SourceLocation at) : std::runtime_error(what), at_(at) {}

  // "file:line" of the failed check, or "" for an error raised without one.
  std::string where() const {
    return at_.file == nullptr ? std::string() : std::string(at_.file) + ":" + std::to_string(at_.line);
  }

 private:
  SourceLocation at_;
};
// A configuration value, parameter, option or name that is not allowed (names the key and the range).
class ConfigError : public Error {
 public:
  using Error::Error;
};
// A data file that cannot be read as promised (names the file and the problem).
class DataError : public Error {
 public:
  using Error::Error;
};
// Tensors whose shapes do not fit the operation.
class ShapeError : public Error {
 public:
  using Error::Error;
};
// A value that is not allowed where it was found (NaN in an input, non-finite scale, ...).
class NumericError : public Error {
 public:
  using Error::Error;
};
// A failed CUDA runtime or cuBLAS call.
class CudaError : public Error {
 public:
  using Error::Error;
};

}  // namespace gradscale

// The one generic check: throws `Type` with the streamed message when `cond` fails, and with the
// check's file:line (Error::where(), not in the message). The user-facing kinds (config, data, shape,
// numeric) carry a message written for the user; GS_CHECK is for internal invariants and adds the
// failing expression.
#define GS_CHECK_AS(Type, cond, msg)                                                              \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      std::ostringstream gs_check_os_;                                                            \
      gs_check_os_ << msg;                                                                        \
      throw Type(gs_check_os_.str(),                                                              \
                 ::gradscale::SourceLocation{::gradscale::source_file_name(__FILE__), __LINE__}); \
    }                                                                                             \
  } while (0)

#define GS_CHECK(cond, msg) GS_CHECK_AS(::gradscale::Error, cond, "check `" #cond "` failed: " << msg)
#define GS_CHECK_CONFIG(cond, msg) GS_CHECK_AS(::gradscale::ConfigError, cond, msg)
#define GS_CHECK_DATA(cond, msg) GS_CHECK_AS(::gradscale::DataError, cond, msg)
#define GS_CHECK_SHAPE(cond, msg) GS_CHECK_AS(::gradscale::ShapeError, cond, msg)
#define GS_CHECK_NUMERIC(cond, msg) GS_CHECK_AS(::gradscale::NumericError, cond, msg)
