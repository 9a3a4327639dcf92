// Errors of gradscale: one small exception hierarchy and one family of check macros.
// Library code throws; only command-line tools catch (at main), print one line and exit non-zero.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace gradscale {

// Base of every error the library raises.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
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

// The one generic check: throws `Type` with the streamed message when `cond` fails. The user-facing
// kinds (config, data, shape, numeric) carry a message written for the user; GS_CHECK is for internal
// invariants and adds the failing expression and file:line.
#define GS_CHECK_AS(Type, cond, msg)   \
  do {                                 \
    if (!(cond)) {                     \
      std::ostringstream gs_check_os_; \
      gs_check_os_ << msg;             \
      throw Type(gs_check_os_.str());  \
    }                                  \
  } while (0)

#define GS_CHECK(cond, msg)             \
  GS_CHECK_AS(::gradscale::Error, cond, \
              "check `" #cond "` failed: " << msg << " [" << __FILE__ << ":" << __LINE__ << "]")
#define GS_CHECK_CONFIG(cond, msg) GS_CHECK_AS(::gradscale::ConfigError, cond, msg)
#define GS_CHECK_DATA(cond, msg) GS_CHECK_AS(::gradscale::DataError, cond, msg)
#define GS_CHECK_SHAPE(cond, msg) GS_CHECK_AS(::gradscale::ShapeError, cond, msg)
#define GS_CHECK_NUMERIC(cond, msg) GS_CHECK_AS(::gradscale::NumericError, cond, msg)
