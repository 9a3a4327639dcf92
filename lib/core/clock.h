// Wall-clock helpers shared by the trainer's and the ablation runner's progress lines.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

namespace gradscale {

// Seconds on the monotonic clock; only differences are meaningful.
inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// "m:ss" below an hour, "h:mm:ss" above; "?" for a negative or non-finite estimate.
inline std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto t = static_cast<long long>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", t / 60, t % 60);
  return buf;
}

}  // namespace gradscale
