// Text from a file shown on the terminal (layer and model names of a trace): control characters are
// written as escapes, so a file cannot move the cursor, ring the bell or forge table lines, and a long
// name is elided, so that it does not pad every row of a table to its length.
#pragma once

#include <cstddef>
#include <string>

namespace gradscale::cli {

// The longest name shown whole in a table.
inline constexpr std::size_t kMaxShownName = 48;

// `text` with bytes below 0x20 and 0x7f written as \n, \r, \t, \e or \xNN and a backslash as \\; then
// cut to `max_chars` characters, the cut marked by "...".
std::string terminal_text(const std::string& text, std::size_t max_chars = kMaxShownName);

// An error message for the terminal: bytes below 0x20 (but the newline) and 0x7f written as \e, \r,
// \t or \xNN, so text quoted from a file cannot act on the terminal; nothing is cut.
std::string terminal_message(const std::string& text);

}  // namespace gradscale::cli
