// Terminal-safe text (see terminal_text.h).
#include "experiments/cli/terminal_text.h"

#include <cstdio>

namespace gradscale::cli {

namespace {

// A control character (below 0x20, or 0x7f) as an escape: \n, \r, \t, \e or \xNN.
std::string escaped(unsigned char c) {
  switch (c) {
    case '\n':
      return "\\n";
    case '\r':
      return "\\r";
    case '\t':
      return "\\t";
    case 0x1b:
      return "\\e";
    default: {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      return buf;
    }
  }
}

bool is_control(unsigned char c) {
  return c < 0x20 || c == 0x7f;
}

}  // namespace

std::string terminal_message(const std::string& text) {
  std::string out;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    out += is_control(c) && c != '\n' ? escaped(c) : std::string(1, ch);
  }
  return out;
}

std::string terminal_text(const std::string& text, std::size_t max_chars) {
  std::string out;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\\') {
      out += "\\\\";
    } else if (is_control(c)) {
      out += escaped(c);
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
