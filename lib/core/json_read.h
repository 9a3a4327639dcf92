// Reading JSON that the program did not write itself (config files, --scaler/--optimizer/--schedule
// text, model specs, checkpoints): nesting is bounded when the text is parsed, because the JSON library
// recurses when it copies or prints a value and a 100,000-deep array overflows the stack; messages show
// values through json_excerpt, which is cut to a few lines. JsonFields reads the members of an object
// from a file with a type and range check each, naming the member by its dotted path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace gradscale {

// Deepest nesting of arrays and objects accepted anywhere (the deepest JSON gradscale writes is 6).
inline constexpr int kMaxJsonDepth = 64;
// Largest JSON file read (configs, specs, checkpoint.json): a larger file, or /dev/zero, is refused.
inline constexpr std::size_t kMaxJsonFileBytes = std::size_t{64} << 20;
// Longest excerpt of a value or of a text shown in an error message.
inline constexpr std::size_t kExcerptChars = 160;

// Which error a bad document raises: ConfigError for what the user wrote (command line, config, spec;
// the CLI exits 2), DataError for a file the program wrote and reads back (a checkpoint; exit 1).
enum class JsonSource { config, data };

// Parses `text` as one JSON document. Invalid JSON, a number out of double range (1e400) and nesting
// deeper than kMaxJsonDepth throw the error of `source`, whose message starts with `what` (e.g.
// "config file 'a.json'", "--scaler") and quotes at most kExcerptChars of the parser's message.
nlohmann::json parse_json(std::string_view text, const std::string& what, JsonSource source);

// Throws the error of `source` (message starting with `what`) when arrays and objects in `text` nest
// deeper than kMaxJsonDepth: for a reader that parses with another JSON type (ordered_json) itself.
void check_json_depth(std::string_view text, const std::string& what, JsonSource source);

// As parse_json, but text that is not valid JSON or nests too deeply gives a discarded value
// (is_discarded()) instead of an error, for readers that decide themselves (a trace's cut last line).
nlohmann::json parse_json_or_discarded(std::string_view text);

// Reads the file at `path` (at most kMaxJsonFileBytes) and parses it like parse_json. A file that
// cannot be read throws the error of `source` naming `what` and the path.
nlohmann::json read_json_file(const std::string& path, const std::string& what, JsonSource source);

// `value` as compact JSON for a message: at most `max_chars` characters (then "..."), nested values
// below a few levels shown as [...] / {...}, invalid UTF-8 replaced. Never throws for any value.
std::string json_excerpt(const nlohmann::json& value, std::size_t max_chars = kExcerptChars);
// `text` cut to at most `max_chars` characters (then "...").
std::string text_excerpt(std::string_view text, std::size_t max_chars = kExcerptChars);

// A double for a result or checkpoint document: the number when finite; +-inf as the strings "inf" and
// "-inf" (the spelling of scaler states and `gradscale replay`); NaN as null.
nlohmann::json json_real(double x);

// Checked reads of the members of one JSON object read from a file. Every failure throws DataError
// "<file>: field '<path>' <problem>", where <path> is the dotted path of the member ("batcher.epoch").
// Borrows the object: it must outlive the reader.
class JsonFields {
 public:
  // `object` must be a JSON object (else DataError naming `path`, or the file when `path` is empty).
  JsonFields(const nlohmann::json& object, std::string file, std::string path = "");

  bool has(const char* key) const { return object_.contains(key); }
  const nlohmann::json& any(const char* key) const;  // present, of any type
  const nlohmann::json& object(const char* key) const;
  const nlohmann::json& array(const char* key) const;
  std::string text(const char* key) const;
  bool boolean(const char* key) const;
  // An integer in [lo, hi].
  std::int64_t integer(const char* key, std::int64_t lo, std::int64_t hi) const;
  // A finite number in [lo, hi].
  double number(const char* key, double lo, double hi) const;
  // What json_real wrote: a number, "inf", "-inf", or null (NaN).
  double real(const char* key) const;
  // The member object, read the same way.
  JsonFields fields(const char* key) const;

  std::string path(const char* key) const;  // the dotted path of a member
  const std::string& file() const { return file_; }
  // Throws DataError "<file>: field '<path of key>' <problem>".
  [[noreturn]] void fail(const char* key, const std::string& problem) const;

 private:
  const nlohmann::json& object_;
  std::string file_;
  std::string path_;
};

}  // namespace gradscale
