// Reading JSON input with the path of every value, so each error names its field the way the
// user wrote it: `models[0].tensors[3].shape[1]: expected a non-negative integer, got -4`.
// Unknown keys are errors too (a typo must not silently become a default), and so is `null`: an
// optional field is left out for its default, never set to null.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "harness/core/bytes.h"

namespace vf {

class JsonIn {
 public:
  JsonIn(const nlohmann::json& j, std::string path) : j_(&j), path_(std::move(path)) {}

  const nlohmann::json& raw() const { return *j_; }
  const std::string& path() const { return path_; }

  // Objects.
  void expect_object(std::initializer_list<std::string_view> allowed_keys) const;
  bool is_object() const { return j_->is_object(); }
  bool has(std::string_view key) const;
  JsonIn at(std::string_view key) const;  // required member
  std::optional<JsonIn> opt(std::string_view key) const;  // absent: nullopt; null: an error

  // Arrays.
  void expect_array() const;
  std::size_t size() const;
  JsonIn at(std::size_t i) const;

  // Scalars.
  bool is_string() const { return j_->is_string(); }
  std::string str() const;
  bool boolean() const;
  double number() const;  // finite
  std::uint64_t u64() const;                              // a non-negative integer
  std::uint64_t u64_in(std::uint64_t lo, std::uint64_t hi) const;
  std::uint32_t u32_in(std::uint32_t lo, std::uint32_t hi) const;
  double number_in(double lo, double hi) const;
  Bytes bytes() const;  // an integer byte count or a string like "24GiB"
  // A scalar rendered as text (options stored as strings): "20", "true", "0.5", "max".
  std::string scalar_text() const;

  [[noreturn]] void fail(const std::string& message) const;

 private:
  std::string type_name() const;
  std::string child(std::string_view key) const;
  const nlohmann::json* j_;
  std::string path_;
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

// Parses JSON text, refusing a duplicate key (JsonDuplicateKey). Syntax errors and numbers too
// large for a double throw nlohmann's own exceptions (parse_error, out_of_range): for readers that
// word their errors themselves (the JSONL trace); the others use parse_json_text.
nlohmann::json parse_json_unique(std::string_view text);
// Parses text as JSON; a syntax error becomes InputError(origin, "invalid JSON at byte N: ..."), a
// duplicate key InputError(path of the key, "key given twice in one object ...").
nlohmann::json parse_json_text(std::string_view text, std::string_view origin);
// Reads a whole file (InputError if it can't be read; the path is the field).
std::string read_text_file(const std::string& path);
// Writes atomically: a temporary in the same directory, fsync, rename. InfraError on failure.
void write_file_atomic(const std::string& path, std::string_view content);

}  // namespace vf
