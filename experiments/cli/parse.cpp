// Shared CLI helpers (see parse.h).
#include "experiments/cli/parse.h"

#include <cerrno>
#include <cstdlib>
#include <iostream>

#include "lib/core/error.h"
#include "lib/core/json_read.h"

namespace gradscale::cli {
namespace {

constexpr const char* kStray = "stray-argument";

}  // namespace

bool parse_options(const std::string& usage, const po::options_description& desc,
                   const std::vector<std::string>& args, po::variables_map& vm,
                   const po::positional_options_description* positional) {
  po::options_description shown(desc);
  shown.add_options()("help,h", "show this help");
  // Without a positional description, Boost drops stray words ("train out.json" would ignore out.json):
  // they are collected under a hidden option and refused by name.
  po::options_description all(shown);
  po::positional_options_description stray;
  if (!positional) {
    all.add_options()(kStray, po::value<std::vector<std::string>>(), "");
    stray.add(kStray, -1);
  }
  auto parser = po::command_line_parser(args).options(all).positional(positional ? *positional : stray);
  po::store(parser.run(), vm);
  if (vm.count("help")) {
    std::cout << "usage: " << usage << "\n\n" << shown << "\n";
    return false;
  }
  if (vm.count(kStray))
    throw ConfigError("unexpected argument '" + vm[kStray].as<std::vector<std::string>>().front() +
                      "': this command takes only options (see --help)");
  po::notify(vm);
  return true;
}

std::int64_t parse_count(const std::string& text, const char* what, std::int64_t lo, std::int64_t hi) {
  const bool negative = !text.empty() && text[0] == '-';
  const std::string digits = negative ? text.substr(1) : text;
  const bool whole = !digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos;
  // Past 18 digits the value is out of any range here; strtoll would clip it.
  const bool in_range = whole && digits.size() <= 18 && [&] {
    const std::int64_t v = (negative ? -1 : 1) * std::strtoll(digits.c_str(), nullptr, 10);
    return v >= lo && v <= hi;
  }();
  GS_CHECK_CONFIG(in_range, what << " must be a whole number in [" << lo << ", " << hi << "], got '"
                                 << text_excerpt(text) << "'");
  return (negative ? -1 : 1) * std::strtoll(digits.c_str(), nullptr, 10);
}

double parse_real(const std::string& text, const char* what) {
  const char* s = text.c_str();
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s, &end);
  GS_CHECK_CONFIG(!text.empty() && end == s + text.size(),
                  what << ": cannot parse '" << text << "' as a number (decimal, or hex float like 0x1p-25)");
  return v;
}

float parse_float32(const std::string& text, const char* what) {
  const char* s = text.c_str();
  char* end = nullptr;
  const float v = std::strtof(s, &end);
  GS_CHECK_CONFIG(!text.empty() && end == s + text.size(),
                  what << ": cannot parse '" << text << "' as a number (decimal, or hex float like 0x1p-25)");
  return v;
}

}  // namespace gradscale::cli
