// Text shared by the ablation table's notes and its writers (see table_metrics.h).
#include "experiments/ablate/table_metrics.h"

#include <cstdio>

namespace gradscale::ablate {

std::string printf_text(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string row_name(const TableRow& r) {
  std::string s;
  for (const std::string& l : r.labels) s += (s.empty() ? "" : " / ") + l;
  return s.empty() ? "base" : s;
}

std::string signed_text(double v) {
  return printf_text("%+.4f", v);
}

std::string compare_title(const Table& t) {
  std::string ref;
  for (const auto& [column, label] : t.compare_to) ref += (ref.empty() ? "" : ", ") + column + "=" + label;
  return "Δ final acc vs " + ref + " (95% CI)";
}

}  // namespace gradscale::ablate
