// Small shared helpers of the CLI verbs: option parsing with Boost.Program_options and value parsing.
#pragma once

#include <boost/program_options.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace gradscale::cli {

namespace po = boost::program_options;

// Parses `args` against `desc`; returns false (after printing "usage + desc" to stdout) when --help
// was given. Unknown options, words that are no option's value nor a declared positional argument, and
// bad values throw boost::program_options::error (main: exit 2).
bool parse_options(const std::string& usage, const po::options_description& desc,
                   const std::vector<std::string>& args, po::variables_map& vm,
                   const po::positional_options_description* positional = nullptr);

// A whole number in [lo, hi] written in decimal digits (no sign but a leading '-', no exponent): the
// value of a count option such as --steps. Throws ConfigError naming `what` and the range otherwise.
std::int64_t parse_count(const std::string& text, const char* what, std::int64_t lo, std::int64_t hi);

// Decimal or C99 hex-float ("0x1p-25"), "inf", "-inf", "nan"; throws ConfigError naming the text.
double parse_real(const std::string& text, const char* what);

// The same for a float32 value, rounded once from the text (no double rounding through double).
float parse_float32(const std::string& text, const char* what);

}  // namespace gradscale::cli
