#include "harness/core/json_in.h"

#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include "harness/core/error.h"

namespace vf {

namespace {

// A key as a path shows it: cut to its first 48 bytes when longer (a hostile file's key can be
// megabytes, and every message that names the field would repeat it).
std::string path_key(std::string_view key) {
  constexpr std::size_t kMax = 48;
  if (key.size() <= kMax) return std::string(key);
  std::size_t cut = kMax;
  while (cut > 0 && (static_cast<unsigned char>(key[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 sequence
  return fmt::format("{}...({} bytes)", key.substr(0, cut), key.size());
}

// A string as JSON text, for messages (bytes that are not UTF-8 replaced, as json_excerpt does).
std::string quoted(std::string_view s) {
  return nlohmann::json(std::string(s)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

JsonIn::JsonIn(std::shared_ptr<const JsonDoc> doc, std::string path) : n_(0) {
  const JsonDoc::Index root = doc->root();
  r_ = std::make_shared<const Root>(Root{std::move(doc), root, std::move(path)});
}

JsonIn::JsonIn(const nlohmann::json& j, std::string path) : JsonIn(JsonDoc::from_json(j), std::move(path)) {}

void JsonIn::fail(const std::string& message) const { throw InputError(path(), message); }

std::string JsonIn::number_text() const {
  switch (type()) {
    case JsonDoc::Type::unsigned_integer: return fmt::format("{}", doc().unsigned_value(n_));
    case JsonDoc::Type::signed_integer: return fmt::format("{}", doc().signed_value(n_));
    default: return nlohmann::json(doc().real(n_)).dump();  // nlohmann's rendering of a double ("1e+300", "2.0")
  }
}

std::string JsonIn::type_name() const {
  switch (type()) {
    case JsonDoc::Type::null: return "null";
    case JsonDoc::Type::boolean: return "a boolean";
    case JsonDoc::Type::unsigned_integer:
    case JsonDoc::Type::signed_integer: return fmt::format("integer {}", number_text());
    case JsonDoc::Type::real: return fmt::format("number {}", number_text());
    case JsonDoc::Type::string: return fmt::format("string {}", excerpt());
    case JsonDoc::Type::array: return "an array";
    case JsonDoc::Type::object: return "an object";
  }
  return "a value";
}

std::string JsonIn::excerpt() const {
  switch (type()) {
    case JsonDoc::Type::array: {
      const std::size_t n = doc().size(n_);
      return fmt::format("an array of {} element{}", n, n == 1 ? "" : "s");
    }
    case JsonDoc::Type::object: {
      const std::size_t n = doc().size(n_);
      return fmt::format("an object with {} key{}", n, n == 1 ? "" : "s");
    }
    case JsonDoc::Type::string: {
      constexpr std::size_t kMax = 48;
      const std::string_view text = doc().string(n_);
      if (text.size() <= kMax) return quoted(text);
      std::size_t cut = kMax;
      while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 sequence
      return fmt::format("{}... ({} bytes)", quoted(text.substr(0, cut)), text.size());
    }
    case JsonDoc::Type::null: return "null";
    case JsonDoc::Type::boolean: return doc().boolean(n_) ? "true" : "false";
    default: return number_text();
  }
}

nlohmann::json JsonIn::to_json() const { return doc().to_json(n_); }

std::string JsonIn::path() const {
  // The steps from this value up to the root JsonIn was given, then rendered root first.
  const JsonDoc& d = doc();
  std::vector<JsonDoc::Index> steps;
  for (JsonDoc::Index n = n_; n != r_->node; n = d.parent(n)) steps.push_back(n);
  std::string out = r_->path;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const JsonDoc::Index up = d.parent(*it);
    if (d.type(up) == JsonDoc::Type::array) {
      out += fmt::format("[{}]", d.slot(*it));
    } else {
      if (!out.empty()) out += '.';
      out += path_key(d.key(up, d.slot(*it)));
    }
  }
  return out;
}

std::string JsonIn::child(std::string_view key) const {
  std::string p = path();
  return p.empty() ? path_key(key) : fmt::format("{}.{}", p, path_key(key));
}

void JsonIn::expect_object(std::initializer_list<std::string_view> allowed_keys) const {
  if (!is_object()) fail("expected an object, got " + type_name());
  const JsonDoc& d = doc();
  const std::uint32_t n = d.size(n_);
  for (std::uint32_t i = 0; i < n; ++i) {
    const std::string_view k = d.key(n_, i);
    bool known = false;
    for (std::string_view a : allowed_keys) known = known || k == a;
    if (!known) {
      std::string list;
      for (std::string_view a : allowed_keys) list += (list.empty() ? "" : ", ") + std::string(a);
      throw InputError(child(k), fmt::format("unknown field (expected one of: {})", list));
    }
  }
}

bool JsonIn::has(std::string_view key) const { return is_object() && doc().find(n_, key).has_value(); }

JsonIn JsonIn::at(std::string_view key) const {
  if (!is_object()) fail("expected an object, got " + type_name());
  const std::optional<JsonDoc::Index> v = doc().find(n_, key);
  if (!v) throw InputError(child(key), "required field is missing");
  return JsonIn(r_, *v);
}

std::optional<JsonIn> JsonIn::opt(std::string_view key) const {
  if (!is_object()) fail("expected an object, got " + type_name());
  const std::optional<JsonDoc::Index> v = doc().find(n_, key);
  if (!v) return std::nullopt;
  // null is not "the default": a generated file with `"allocator": null` would otherwise run as
  // raw without a word. No field of our formats gives null a meaning on input.
  if (doc().type(*v) == JsonDoc::Type::null) throw InputError(child(key), "null is not allowed (leave the field out for its default)");
  return JsonIn(r_, *v);
}

std::size_t JsonIn::member_count() const {
  if (!is_object()) fail("expected an object, got " + type_name());
  return doc().size(n_);
}

std::string_view JsonIn::key(std::size_t i) const {
  if (i >= member_count()) fail(fmt::format("no member {} (the object has {})", i, doc().size(n_)));
  return doc().key(n_, i);
}

JsonIn JsonIn::member(std::size_t i) const {
  if (i >= member_count()) fail(fmt::format("no member {} (the object has {})", i, doc().size(n_)));
  return JsonIn(r_, doc().value(n_, i));
}

void JsonIn::expect_array() const {
  if (!is_array()) fail("expected an array, got " + type_name());
}

std::size_t JsonIn::size() const {
  expect_array();
  return doc().size(n_);
}

JsonIn JsonIn::at(std::size_t i) const {
  expect_array();
  if (i >= doc().size(n_)) fail(fmt::format("no element {} (the array has {})", i, doc().size(n_)));
  return JsonIn(r_, doc().element(n_, i));
}

std::string JsonIn::str() const { return std::string(str_view()); }

std::string_view JsonIn::str_view() const {
  if (!is_string()) fail("expected a string, got " + type_name());
  return doc().string(n_);
}

bool JsonIn::boolean() const {
  if (!is_boolean()) fail("expected true or false, got " + type_name());
  return doc().boolean(n_);
}

double JsonIn::number() const {
  switch (type()) {
    case JsonDoc::Type::unsigned_integer: return static_cast<double>(doc().unsigned_value(n_));
    case JsonDoc::Type::signed_integer: return static_cast<double>(doc().signed_value(n_));
    case JsonDoc::Type::real: {
      const double v = doc().real(n_);
      if (!std::isfinite(v)) fail("expected a finite number");
      return v;
    }
    default: fail("expected a number, got " + type_name());
  }
}

std::optional<std::int64_t> JsonIn::i64() const {
  if (type() == JsonDoc::Type::signed_integer) return doc().signed_value(n_);
  if (type() == JsonDoc::Type::unsigned_integer && doc().unsigned_value(n_) <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return static_cast<std::int64_t>(doc().unsigned_value(n_));
  }
  return std::nullopt;
}

std::uint64_t JsonIn::u64() const {
  switch (type()) {
    case JsonDoc::Type::unsigned_integer: return doc().unsigned_value(n_);
    case JsonDoc::Type::signed_integer: {
      // Documents built in code hold signed integers (and text "-0" parses as one): only a value
      // below zero is negative.
      const std::int64_t v = doc().signed_value(n_);
      if (v >= 0) return static_cast<std::uint64_t>(v);
      fail(fmt::format("must not be negative, got {}", v));
    }
    case JsonDoc::Type::real: {
      const double v = doc().real(n_);
      // nlohmann reads integers beyond 2^64 as floats: that is an overflow, not a fraction.
      if (v >= 18446744073709551616.0) fail(fmt::format("value overflows 64 bits: {}", number_text()));
      if (v < 0) fail(fmt::format("must not be negative, got {}", number_text()));
      fail(fmt::format("expected a whole number, got {}", number_text()));
    }
    default: fail("expected a non-negative integer, got " + type_name());
  }
}

std::uint64_t JsonIn::u64_in(std::uint64_t lo, std::uint64_t hi) const {
  const std::uint64_t v = u64();
  if (v < lo || v > hi) fail(fmt::format("must be between {} and {}, got {}", lo, hi, v));
  return v;
}

std::uint32_t JsonIn::u32_in(std::uint32_t lo, std::uint32_t hi) const {
  return static_cast<std::uint32_t>(u64_in(lo, hi));
}

double JsonIn::number_in(double lo, double hi) const {
  const double v = number();
  if (v < lo || v > hi) fail(fmt::format("must be between {} and {}, got {}", lo, hi, v));
  return v;
}

Bytes JsonIn::bytes() const {
  if (is_string()) return parse_size(doc().string(n_), path());
  if (is_number()) return u64();
  fail("expected a size (bytes, or a string like \"24GiB\"), got " + type_name());
}

std::string JsonIn::scalar_text() const {
  if (is_string()) return std::string(doc().string(n_));
  if (is_boolean()) return doc().boolean(n_) ? "true" : "false";
  if (is_number()) return number_text();
  fail("expected a string, number or boolean, got " + type_name());
}

std::string JsonTooDeep::describe(const std::string& path, std::size_t byte) {
  // The path of the 65th level is mostly "[0][0]...": its start says where the nesting began.
  constexpr std::size_t kShown = 64;
  const std::string shown = path.size() <= kShown + 16 ? path : path.substr(0, kShown) + "...";
  return fmt::format("arrays and objects nested deeper than {} levels at byte {}{}", kMaxJsonDepth, byte,
                     path.empty() ? "" : fmt::format(" (at {})", shown));
}

std::string json_excerpt(const nlohmann::json& v) {
  using nlohmann::json;
  if (v.is_array()) return fmt::format("an array of {} element{}", v.size(), v.size() == 1 ? "" : "s");
  if (v.is_object()) return fmt::format("an object with {} key{}", v.size(), v.size() == 1 ? "" : "s");
  if (v.is_string()) {
    constexpr std::size_t kMax = 48;
    const std::string& text = v.get_ref<const std::string&>();
    if (text.size() <= kMax) return v.dump(-1, ' ', false, json::error_handler_t::replace);
    std::size_t cut = kMax;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 sequence
    return fmt::format("{}... ({} bytes)", json(text.substr(0, cut)).dump(-1, ' ', false, json::error_handler_t::replace),
                       text.size());
  }
  return v.dump();  // a number, a boolean or null: short
}

namespace {

// Calls `stop(i)` for each byte of `text` outside strings (quotes included in their strings), in
// order, until it returns true; returns that i, or npos.
template <class Stop>
std::size_t find_outside_strings(std::string_view text, Stop&& stop) {
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
      continue;
    }
    if (stop(i)) return i;
  }
  return std::string_view::npos;
}

// The 1-based offset of the first bracket that opens level kMaxJsonDepth + 1, brackets inside
// strings not counted (0: none). Asked only once the parser has refused that bracket, so the text
// before it is valid JSON and the count is exact.
std::size_t too_deep_offset(std::string_view text) {
  int depth = 0;
  const std::size_t at = find_outside_strings(text, [&](std::size_t i) {
    if (text[i] == '[' || text[i] == '{') return ++depth > kMaxJsonDepth;
    if (text[i] == ']' || text[i] == '}') --depth;
    return false;
  });
  return at == std::string_view::npos ? 0 : at + 1;
}

// Builds the document from the parser's SAX events, as nlohmann's own DOM builder does, and
// knows for each open array or object the element or key it is at. A key given twice is found in
// the object being built (no second copy of the keys), and the path of a key is built from the
// frames only when an error names it, so a frame costs the same at any depth and the whole read is
// linear in the text. (nlohmann's callback parser, which this replaces, rescans the parent array
// at every object's end: quadratic in an array of objects, 67% of a 100,000-module scenario's
// read.) Depth is capped at kMaxJsonDepth.
class UniqueDomBuilder {
 public:
  using json = nlohmann::json;

  UniqueDomBuilder(json& root, std::string_view text) : root_(root), text_(text) {}

  bool null() { return add(json(nullptr)); }
  bool boolean(bool v) { return add(json(v)); }
  bool number_integer(json::number_integer_t v) { return add(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return add(json(v)); }
  bool number_float(json::number_float_t v, const json::string_t& /*text*/) { return add(json(v)); }
  bool string(json::string_t& v) { return add(json(std::move(v))); }
  bool binary(json::binary_t& v) { return add(json::binary(std::move(v))); }

  bool start_object(std::size_t /*elements*/) { return open(json::value_t::object); }
  bool start_array(std::size_t /*elements*/) { return open(json::value_t::array); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(json::string_t& k) {
    Frame& f = stack_.back();
    auto& object = f.container->get_ref<json::object_t&>();
    const auto [it, inserted] = object.emplace(std::move(k), nullptr);
    f.key = &it->first;
    if (!inserted) throw JsonDuplicateKey(path());
    slot_ = &it->second;
    return true;
  }

  // Syntax errors and number overflows: nlohmann's own exception, of its own type.
  template <class Exception>
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/, const Exception& ex) {
    throw ex;
  }

 private:
  struct Frame {
    json* container;
    const std::string* key = nullptr;  // objects: the current key
    std::size_t index = 0;             // arrays: the current element
  };

  // Puts a value where the parser is: the root, the next element of the open array, or the
  // member of the open object whose key came last.
  json* put(json&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json* parent = stack_.back().container;
    if (parent->is_array()) {
      auto& array = parent->get_ref<json::array_t&>();
      array.push_back(std::move(v));
      return &array.back();
    }
    *slot_ = std::move(v);
    return slot_;
  }
  bool add(json&& v) {
    put(std::move(v));
    next_element();
    return true;
  }
  bool open(json::value_t type) {
    if (stack_.size() >= static_cast<std::size_t>(kMaxJsonDepth)) throw JsonTooDeep(path(), too_deep_offset(text_));
    json* container = put(json(type));
    stack_.push_back(Frame{container});
    return true;
  }
  bool close() {
    stack_.pop_back();
    next_element();
    return true;
  }
  // A value (scalar or closed container) ended: in an array, the next one has the next index.
  void next_element() {
    if (!stack_.empty() && !stack_.back().container->is_object()) ++stack_.back().index;
  }
  // Where the parser is: each open object's current key, each open array's current element.
  std::string path() const {
    std::string out;
    for (const Frame& f : stack_) {
      if (f.container->is_object()) {
        if (f.key != nullptr) out += (out.empty() ? "" : ".") + path_key(*f.key);
      } else {
        out += fmt::format("[{}]", f.index);
      }
    }
    return out;
  }

  json& root_;
  std::string_view text_;
  std::vector<Frame> stack_;
  json* slot_ = nullptr;  // the member the next value of the open object goes to
};

}  // namespace


// The common case, about twice as fast as nlohmann's lexer: JsonDoc's strict parse (json_doc.h)
// takes only what it is sure of, and its document is converted; nlohmann parses the rest, and its
// document and errors (with their byte offsets) are the reference.
std::optional<nlohmann::json> parse_json_fast(std::string_view text) {
  const std::shared_ptr<const JsonDoc> doc = JsonDoc::parse(text);
  if (!doc) return std::nullopt;
  return doc->to_json(doc->root());
}

namespace {

// nlohmann's parse, refusing a duplicate key, too deep a nesting and a NUL byte.
nlohmann::json parse_json_slow(std::string_view text) {
  nlohmann::json root;
  UniqueDomBuilder builder(root, text);
  nlohmann::json::sax_parse(text.begin(), text.end(), &builder);
  // nlohmann stops at a NUL byte as at the end: what it read is valid, and the NUL is the error.
  if (const std::size_t nul = text.find('\0'); nul != std::string_view::npos) throw JsonNulByte(nul + 1);
  return root;
}

// The 0-based offset of the number `literal` in `text`, outside strings and not inside a longer
// token (npos if none): where nlohmann's number overflow is. `{"name": "1e400", "seed": 1e400}`
// names the second, not the name.
std::size_t number_offset(std::string_view text, std::string_view literal) {
  const auto part_of_number = [](char c) { return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'; };
  return find_outside_strings(text, [&](std::size_t i) {
    return text.compare(i, literal.size(), literal) == 0 && (i == 0 || !part_of_number(text[i - 1])) &&
           (i + literal.size() == text.size() || !part_of_number(text[i + literal.size()]));
  });
}

std::string nul_message(std::size_t byte) {
  return fmt::format("invalid JSON at byte {}: a NUL byte (JSON text has none; a string writes it \\u0000)", byte);
}

// `parse()`'s document; its errors as InputError naming `origin` and the byte (parse_json_text).
template <class Parse>
auto worded(std::string_view text, std::string_view origin, Parse&& parse) {
  try {
    return parse();
  } catch (const JsonDuplicateKey& e) {
    throw InputError(e.path(), fmt::format("key given twice in one object (in {}; keep one)", origin));
  } catch (const JsonTooDeep& e) {
    throw InputError(std::string(origin), e.what());
  } catch (const JsonNulByte& e) {
    throw InputError(std::string(origin), nul_message(e.byte()));
  } catch (const nlohmann::json::parse_error& e) {
    // A NUL where nlohmann still wanted input (`[1\0]`) is its "unexpected end of input" there.
    if (e.byte >= 1 && e.byte <= text.size() && text[e.byte - 1] == '\0') throw InputError(std::string(origin), nul_message(e.byte));
    // e.byte is 1-based position of the failure; e.what() carries nlohmann's diagnosis.
    std::string what = e.what();
    const auto pos = what.find("; ");
    if (pos != std::string::npos) what = what.substr(pos + 2);
    throw InputError(std::string(origin), fmt::format("invalid JSON at byte {}: {}", e.byte, what));
  } catch (const nlohmann::json::out_of_range& e) {
    // A number too large for a double ("number overflow parsing '1e999'", error 406): nlohmann
    // names the literal, not its position, so find the literal in the text.
    std::string what = e.what();
    const auto pos = what.find("] ");
    if (pos != std::string::npos) what = what.substr(pos + 2);
    const auto q1 = what.find('\'');
    const auto q2 = q1 == std::string::npos ? q1 : what.find('\'', q1 + 1);
    const auto at = q2 == std::string::npos ? std::string_view::npos : number_offset(text, std::string_view(what).substr(q1 + 1, q2 - q1 - 1));
    if (at == std::string_view::npos) throw InputError(std::string(origin), fmt::format("invalid JSON: {}", what));
    throw InputError(std::string(origin), fmt::format("invalid JSON at byte {}: {}", at + 1, what));
  }
}

}  // namespace

nlohmann::json parse_json_unique(std::string_view text) {
  if (std::optional<nlohmann::json> fast = parse_json_fast(text)) return std::move(*fast);
  return parse_json_slow(text);
}

nlohmann::json parse_json_text(std::string_view text, std::string_view origin) {
  return worded(text, origin, [&] { return parse_json_unique(text); });
}

std::shared_ptr<const JsonDoc> parse_json_doc_unique(std::string_view text) {
  if (std::shared_ptr<const JsonDoc> doc = JsonDoc::parse(text)) return doc;
  // Declined: an error (nlohmann's parse throws it), or text the fast parser leaves to nlohmann
  // (a \u escape, UTF-8 in a string, a number at the edge of its type).
  return JsonDoc::from_json(parse_json_slow(text));
}

std::shared_ptr<const JsonDoc> parse_json_doc(std::string_view text, std::string_view origin) {
  return worded(text, origin, [&] { return parse_json_doc_unique(text); });
}

std::string read_text_file(const std::string& path) {
  // A directory opens like a file on Linux and reads as nothing: say what it is instead of
  // "invalid JSON at byte 1" (or, for a reader that takes any bytes, an empty input).
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw InputError(path, "is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "cannot open file");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw InputError(path, "cannot read file");
  return ss.str();
}

void write_file_atomic(const std::string& path, std::string_view content) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  if (ec) throw InfraError(fmt::format("cannot create directory {}: {}", target.parent_path().string(), ec.message()));
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw InfraError(fmt::format("cannot write {}: {}", tmp, std::strerror(errno)));
  const char* p = content.data();
  std::size_t left = content.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw InfraError(fmt::format("cannot write {}: {}", tmp, std::strerror(err)));
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw InfraError(fmt::format("cannot flush {}: {}", tmp, std::strerror(errno)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw InfraError(fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(err)));
  }
}

}  // namespace vf
