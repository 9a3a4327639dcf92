// Terminal-safe text (see terminal_text.h).
#include "experiments/cli/terminal_text.h"

#include <cstdio>

namespace gradscale::cli {

std::string terminal_text(const std::string& text, std::size_t max_chars) {
  std::string out;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == 0x1b) {
      out += "\\e";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += ch;
    }
    if (out.size() > max_chars) break;  // enough to know it is cut
  }
  if (out.size() <= max_chars) return out;
  std::size_t keep = max_chars >= 3 ? max_chars - 3 : 0;
  while (keep > 0 && (static_cast<unsigned char>(out[keep]) & 0xC0) == 0x80) --keep;  // whole UTF-8
  return out.substr(0, keep) + "...";
}

}  // namespace gradscale::cli
