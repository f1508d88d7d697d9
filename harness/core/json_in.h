// Reading JSON input with the path of every value, so each error names its field the way the
// user wrote it: `models[0].tensors[3].shape[1]: expected a non-negative integer, got -4`.
// Unknown keys are errors too (a typo must not silently become a default), and so is `null`: an
// optional field is left out for its default, never set to null.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "harness/core/bytes.h"
#include "harness/core/json_doc.h"

namespace vf {

// A value's path is built only when something asks for it (an error, path()): a reader walks
// millions of values and names almost none. A JsonIn is the document (shared), the node, and the
// path its root was given; a path is rebuilt from the document's parent links, O(depth).
class JsonIn {
 public:
  // The root of a parsed document (parse_json_doc).
  JsonIn(std::shared_ptr<const JsonDoc> doc, std::string path);
  // A document built in code, or parsed by nlohmann: converted once, whole.
  JsonIn(const nlohmann::json& j, std::string path);

  std::string path() const;

  // Types.
  bool is_null() const { return type() == JsonDoc::Type::null; }
  bool is_boolean() const { return type() == JsonDoc::Type::boolean; }
  bool is_object() const { return type() == JsonDoc::Type::object; }
  bool is_array() const { return type() == JsonDoc::Type::array; }
  bool is_string() const { return type() == JsonDoc::Type::string; }
  bool is_number() const {
    const JsonDoc::Type t = type();
    return t == JsonDoc::Type::unsigned_integer || t == JsonDoc::Type::signed_integer || t == JsonDoc::Type::real;
  }
  bool is_integer() const { return type() == JsonDoc::Type::unsigned_integer || type() == JsonDoc::Type::signed_integer; }
  // An integer that fits in 64 signed bits (not a double).
  std::optional<std::int64_t> i64() const;

  // Objects.
  void expect_object(std::initializer_list<std::string_view> allowed_keys) const;
  bool has(std::string_view key) const;
  JsonIn at(std::string_view key) const;  // required member
  std::optional<JsonIn> opt(std::string_view key) const;  // absent: nullopt; null: an error
  // Every member, in key order (byte order, as nlohmann's std::map keeps them).
  std::size_t member_count() const;
  std::string_view key(std::size_t i) const;  // valid while this value lives
  JsonIn member(std::size_t i) const;

  // Arrays.
  void expect_array() const;
  std::size_t size() const;
  JsonIn at(std::size_t i) const;

  // Scalars.
  std::string str() const;
  std::string_view str_view() const;  // valid while this value lives
  bool boolean() const;
  double number() const;  // finite
  std::uint64_t u64() const;                              // a non-negative integer
  std::uint64_t u64_in(std::uint64_t lo, std::uint64_t hi) const;
  std::uint32_t u32_in(std::uint32_t lo, std::uint32_t hi) const;
  double number_in(double lo, double hi) const;
  Bytes bytes() const;  // an integer byte count or a string like "24GiB"
  // A scalar rendered as text (options stored as strings): "20", "true", "0.5", "max".
  std::string scalar_text() const;

  // What json_excerpt says of the value, and what a type error says it got ("integer -4",
  // "string \"x\"", "an array").
  std::string excerpt() const;
  std::string type_name() const;
  // The value as nlohmann's document.
  nlohmann::json to_json() const;

  [[noreturn]] void fail(const std::string& message) const;

 private:
  struct Root {
    std::shared_ptr<const JsonDoc> doc;
    JsonDoc::Index node;
    std::string path;
  };
  JsonIn(std::shared_ptr<const Root> root, JsonDoc::Index node) : r_(std::move(root)), n_(node) {}
  const JsonDoc& doc() const { return *r_->doc; }
  JsonDoc::Type type() const { return doc().type(n_); }
  std::string number_text() const;
  std::string child(std::string_view key) const;
  std::shared_ptr<const Root> r_;
  JsonDoc::Index n_;
};

// A key given twice in one JSON object. nlohmann keeps the last value silently; every reader of
// user JSON refuses it instead. `path` names the key the way JsonIn does ("device.total",
// "models[0].id").
class JsonDuplicateKey : public std::runtime_error {
 public:
  explicit JsonDuplicateKey(std::string path)
      : std::runtime_error(path + ": key given twice in one object"), path_(std::move(path)) {}
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// How deep arrays and objects may nest in any document vramfuzz reads. The deepest one it writes
// (summary.json: findings[].case.trace.rows[][]) nests 6 levels; a hand-written or generated file
// has no reason to go past a few more. A limit keeps every later walk of a document (validation,
// copies, error messages) short, whatever the input.
inline constexpr int kMaxJsonDepth = 64;

// A NUL byte in JSON text, at 1-based offset `byte`. JSON has none (a string writes it \u0000);
// nlohmann's parser takes one for the end of the input, which would let anything after it through
// unread (`{...}\0garbage` read as `{...}`).
class JsonNulByte : public std::runtime_error {
 public:
  explicit JsonNulByte(std::size_t byte)
      : std::runtime_error("a NUL byte at byte " + std::to_string(byte) + " (JSON text has none; a string writes it \\u0000)"),
        byte_(byte) {}
  std::size_t byte() const { return byte_; }

 private:
  std::size_t byte_;
};

// An array or object opened deeper than kMaxJsonDepth. `byte` is the 1-based offset of the bracket
// that went too deep (the text before it is valid JSON so far); `path` names where it is.
class JsonTooDeep : public std::runtime_error {
 public:
  JsonTooDeep(std::string path, std::size_t byte)
      : std::runtime_error(describe(path, byte)), path_(std::move(path)), byte_(byte) {}
  const std::string& path() const { return path_; }
  std::size_t byte() const { return byte_; }

 private:
  static std::string describe(const std::string& path, std::size_t byte);
  std::string path_;
  std::size_t byte_;
};

// A value as an error message may quote it: scalars as JSON (a long string cut to its first 48
// characters, with its length), arrays and objects by their size only ("an array of 30000
// elements"). Messages never carry a whole value: a hostile one could be megabytes.
std::string json_excerpt(const nlohmann::json& value);

// Parses JSON text, refusing a duplicate key (JsonDuplicateKey), nesting deeper than
// kMaxJsonDepth (JsonTooDeep) and a NUL byte (JsonNulByte). Syntax errors and numbers too large for a double throw nlohmann's
// own exceptions (parse_error, out_of_range): for readers that word their errors themselves (the
// JSONL trace); the others use parse_json_text. Time and memory are linear in the text: a key's
// path is built only when an error names it.
nlohmann::json parse_json_unique(std::string_view text);
// parse_json_unique's fast path, for its tests: the same document where it is sure of the text,
// nullopt where nlohmann must parse it (any error, a \u escape, a byte >= 0x80 in a string, a
// number at the edge of its type: JsonDoc::parse).
std::optional<nlohmann::json> parse_json_fast(std::string_view text);
// Parses text as JSON; a syntax error or a NUL byte becomes InputError(origin, "invalid JSON at
// byte N: ..."), a duplicate key InputError(path of the key, "key given twice in one object ..."),
// too deep a nesting InputError(origin, "... nested deeper than 64 levels at byte N (at PATH)").
nlohmann::json parse_json_text(std::string_view text, std::string_view origin);
// parse_json_unique into the flat document JsonIn reads (its exceptions, for readers that word
// their errors themselves: a predictor's reply).
std::shared_ptr<const JsonDoc> parse_json_doc_unique(std::string_view text);
// The same acceptance and errors as parse_json_text, into the flat document JsonIn reads: the
// text's own fast parse where it is sure of it, nlohmann's (then converted) where it is not.
std::shared_ptr<const JsonDoc> parse_json_doc(std::string_view text, std::string_view origin);
// Reads a whole file (InputError if it can't be read, or is a directory; the path is the field).
std::string read_text_file(const std::string& path);
// Writes atomically: a temporary in the same directory, fsync, rename. InfraError on failure.
void write_file_atomic(const std::string& path, std::string_view content);

}  // namespace vf
