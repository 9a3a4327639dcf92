// Parsing --shard K/N (see shard.h).
#include "experiments/ablate/shard.h"

#include <cerrno>
#include <cstdlib>

#include "lib/core/error.h"

namespace gradscale::ablate {
namespace {

constexpr long kMaxShards = 100000;

// A decimal integer made of digits only ("" and "+3", "3x" are not), or -1.
long whole_number(const std::string& s) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::strtol(s.c_str(), nullptr, 10);
}

}  // namespace

Shard parse_shard(const std::string& text) {
  const auto slash = text.find('/');
  const long k = slash == std::string::npos ? -1 : whole_number(text.substr(0, slash));
  const long n = slash == std::string::npos ? -1 : whole_number(text.substr(slash + 1));
  GS_CHECK_CONFIG(k >= 0 && n >= 0, "--shard '" << text << "': expected K/N with whole numbers, e.g. 2/8 (the "
                                                << "2nd of 8 shards)");
  GS_CHECK_CONFIG(n >= 1 && n <= kMaxShards,
                  "--shard '" << text << "': N must be in [1, " << kMaxShards << "], got " << n);
  GS_CHECK_CONFIG(k >= 1 && k <= n, "--shard '" << text << "': K must be in [1, " << n
                                                << "] (shards are numbered from 1), got " << k);
  return Shard{static_cast<int>(k), static_cast<int>(n), /*given=*/true};
}

}  // namespace gradscale::ablate
